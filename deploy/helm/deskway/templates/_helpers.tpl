{{/* Names and labels shared by every object. */}}
{{- define "deskway.fullname" -}}
{{- printf "%s-deskway" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "deskway.labels" -}}
app.kubernetes.io/name: deskway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "deskway.selector" -}}
app.kubernetes.io/name: deskway
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "deskway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "deskway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret the chart makes for what the values leave to it. */}}
{{- define "deskway.secretName" -}}
{{- include "deskway.fullname" . -}}-secrets
{{- end -}}

{{- define "deskway.tlsSecret" -}}
{{- default (printf "%s-tls" (include "deskway.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{/* A value the chart keeps in its Secret: the one given, else the one
the release already has (so an upgrade keeps it), else a new random one.
Called with (list root key given). */}}
{{- define "deskway.keep" -}}
{{- $root := index . 0 -}}{{- $key := index . 1 -}}{{- $given := index . 2 -}}
{{- if $given -}}
{{- $given -}}
{{- else -}}
{{- $old := lookup "v1" "Secret" $root.Release.Namespace (include "deskway.secretName" $root) -}}
{{- if and $old $old.data (hasKey $old.data $key) -}}
{{- index $old.data $key | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The console is on when any group is given a console role. */}}
{{- define "deskway.console" -}}
{{- with .Values.web.console -}}
{{- if and $.Values.web.enabled (or .admins .helpdesk .readonly) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Every secret file a role's pod reads, as a YAML list of
{secret, key, path}: path is under /etc/deskway/secrets. The config
names the same paths as file: references, so no secret is in it. */}}
{{- define "deskway.secretFiles" -}}
{{- $root := .root -}}{{- $v := .root.Values -}}{{- $own := include "deskway.secretName" .root -}}
{{- $files := list -}}
{{- if has .role (list "gateway" "broker") -}}
{{- $files = append $files (dict "secret" (default $own $v.tokenKey.existingSecret) "key" (ternary $v.tokenKey.key "token-key" (ne $v.tokenKey.existingSecret "")) "path" "token-key") -}}
{{- end -}}
{{- if $v.admin.existingSecret -}}
{{- range $i, $k := $v.admin.existingSecretKeys -}}
{{- $files = append $files (dict "secret" $v.admin.existingSecret "key" $k "path" (printf "admin-token-%d" $i)) -}}
{{- end -}}
{{- else -}}
{{- range $i, $t := (default (list "") $v.admin.tokens) -}}
{{- $files = append $files (dict "secret" $own "key" (printf "admin-token-%d" $i) "path" (printf "admin-token-%d" $i)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.web.enabled (has .role (list "broker" "web")) -}}
{{- $files = append $files (dict "secret" $own "key" "frontend-token" "path" "frontend-token") -}}
{{- if include "deskway.console" $root -}}
{{- $files = append $files (dict "secret" $own "key" "console-token" "path" "console-token") -}}
{{- end -}}
{{- end -}}
{{- if and (eq .role "broker") $v.broker.database.urlKey -}}
{{- $files = append $files (dict "secret" $v.broker.database.existingSecret "key" $v.broker.database.urlKey "path" "broker-database-url") -}}
{{- end -}}
{{- if and (eq .role "gateway") $v.gateway.farmDatabase.urlKey -}}
{{- $files = append $files (dict "secret" $v.gateway.farmDatabase.existingSecret "key" $v.gateway.farmDatabase.urlKey "path" "farm-database-url") -}}
{{- end -}}
{{- if eq .role "web" -}}
{{- $files = append $files (dict "secret" (default $own $v.web.cookieKey.existingSecret) "key" (ternary $v.web.cookieKey.key "cookie-key" (ne $v.web.cookieKey.existingSecret "")) "path" "cookie-key") -}}
{{- end -}}
{{- if has .role (list "gateway" "broker" "web") -}}
{{- range $i, $u := $v.auth.users -}}
{{- if $u.existingSecret -}}
{{- $files = append $files (dict "secret" $u.existingSecret "key" (default "password" $u.key) "path" (printf "user-%d" $i)) -}}
{{- else -}}
{{- $files = append $files (dict "secret" $own "key" (printf "user-%d" $i) "path" (printf "user-%d" $i)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $v.secretFiles -}}
{{- if or (not .roles) (has $.role .roles) -}}
{{- $files = append $files (dict "secret" .secret "key" .key "path" .path) -}}
{{- end -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}

{{/* "true" when the brokers share PostgreSQL, by its URL or by a Secret
holding the whole URL; empty for SQLite. */}}
{{- define "deskway.brokerPostgres" -}}
{{- if or .Values.broker.database.url .Values.broker.database.urlKey -}}true{{- end -}}
{{- end -}}

{{/* "true" when the brokers ask each other in a database outage
(broker.peers): more than one on PostgreSQL, with broker.peers.enabled. */}}
{{- define "deskway.brokerPeers" -}}
{{- if and .Values.broker.enabled (include "deskway.brokerPostgres" .) .Values.broker.peers.enabled (gt (int .Values.broker.replicas) 1) -}}true{{- end -}}
{{- end -}}

{{/* The URL of broker pod N of the StatefulSet, by its stable name under
the governing Service. Called with (list root N). */}}
{{- define "deskway.brokerPodURL" -}}
{{- $root := index . 0 -}}{{- $full := include "deskway.fullname" $root -}}
{{- printf "https://%s-broker-%d.%s-broker-peers:%d" $full (index . 1) $full (int $root.Values.broker.port) -}}
{{- end -}}

{{/* PGPASSWORD from the Secret that holds the database password: the
URL in the config names no password, and PostgreSQL's client library
takes it from the environment. Called with a database block. */}}
{{- define "deskway.pgEnv" -}}
{{- if and .db.url (or .db.existingSecret .db.password) }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ default (include "deskway.secretName" .root) .db.existingSecret }}
      key: {{ ternary (default "password" .db.passwordKey) .own (ne .db.existingSecret "") }}
{{- end }}
{{- end -}}

{{/* The checksum that restarts a role's pods when its config or any
Secret it reads changes: the rendered config, the values the chart's
Secret is made from, and the data of every Secret the pods mount, as the
cluster has it. */}}
{{- define "deskway.checksum" -}}
{{- $root := .root -}}
{{- $parts := list (include "deskway.configFiles" .) (toJson $root.Values.tokenKey.value) (toJson $root.Values.admin.tokens) (toJson $root.Values.auth.users) (toJson $root.Values.web.cookieKey.value) (toJson $root.Values.broker.database) (toJson $root.Values.gateway.farmDatabase) -}}
{{- $names := list (include "deskway.tlsSecret" $root) (include "deskway.secretName" $root) $root.Values.broker.database.existingSecret $root.Values.gateway.farmDatabase.existingSecret -}}
{{- range (include "deskway.secretFiles" . | fromYamlArray) -}}
{{- $names = append $names .secret -}}
{{- end -}}
{{- range ($names | compact | uniq | sortAlpha) -}}
{{- $s := lookup "v1" "Secret" $root.Release.Namespace . -}}
{{- $parts = append $parts (printf "%s=%s" . (toJson (default dict ($s).data))) -}}
{{- end -}}
{{- join "\n" $parts | sha256sum -}}
{{- end -}}

{{/* The pod spec every role shares. Called with
(dict "root" . "role" NAME "port" PORT "spec" ROLE_VALUES "args" ARGS),
and "perPod" true where each pod of a StatefulSet has a file of its own
(deskway.configFiles). */}}
{{- define "deskway.pod" -}}
{{- $root := .root -}}{{- $v := .root.Values -}}
metadata:
  labels:
    {{- include "deskway.selector" . | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "deskway.checksum" . }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "deskway.serviceAccountName" $root }}
  automountServiceAccountToken: false
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .grace }}
  terminationGracePeriodSeconds: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- if $v.topologySpread.enabled }}
  topologySpreadConstraints:
  {{- range $v.topologySpread.topologyKeys }}
  - maxSkew: {{ $v.topologySpread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $v.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "deskway.selector" $ | nindent 8 }}
  {{- end }}
  {{- end }}
  {{- with (default $v.nodeSelector .spec.nodeSelector) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (default $v.tolerations .spec.tolerations) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (default $v.affinity .spec.affinity) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
  - name: deskway
    image: "{{ $v.image.repository }}:{{ default $root.Chart.AppVersion $v.image.tag }}"
    imagePullPolicy: {{ $v.image.pullPolicy }}
    args: {{ toJson .args }}
    {{- $env := include "deskway.pgEnv" .db | trim }}
    {{- if or $env .perPod }}
    env:
    {{- if .perPod }}
    # Each pod reads its own file of the ConfigMap, named after it.
    - name: DESKWAY_POD
      valueFrom:
        fieldRef: {fieldPath: metadata.name}
    {{- end }}
    {{- with $env }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- end }}
    ports:
    - name: {{ .role }}
      containerPort: {{ .port }}
      protocol: TCP
    - name: metrics
      containerPort: {{ $v.metrics.port }}
      protocol: TCP
    securityContext:
      {{- toYaml $v.securityContext | nindent 6 }}
    startupProbe:
      {{- include "deskway.probe" . | nindent 6 }}
      periodSeconds: 2
      failureThreshold: 60
    readinessProbe:
      {{- include "deskway.probe" . | nindent 6 }}
      periodSeconds: 5
    livenessProbe:
      tcpSocket: {port: {{ .role }}}
      periodSeconds: 10
      failureThreshold: 3
    resources:
      {{- toYaml .spec.resources | nindent 6 }}
    volumeMounts:
    - name: config
      mountPath: /etc/deskway/deskway.yaml
      {{- if .perPod }}
      subPathExpr: $(DESKWAY_POD).yaml
      {{- else }}
      subPath: deskway.yaml
      {{- end }}
      readOnly: true
    - name: secrets
      mountPath: /etc/deskway/secrets
      readOnly: true
    - name: tls
      mountPath: /etc/deskway/tls
      readOnly: true
    - name: state
      mountPath: /var/lib/deskway
    - name: tmp
      mountPath: /tmp
  volumes:
  - name: config
    configMap:
      name: {{ include "deskway.fullname" $root }}-{{ .role }}
  - name: secrets
    projected:
      defaultMode: 0440
      sources:
      {{- range (include "deskway.secretFiles" . | fromYamlArray) }}
      - secret:
          name: {{ .secret }}
          items:
          - {key: {{ .key | quote }}, path: {{ .path | quote }}}
      {{- end }}
  - name: tls
    secret:
      secretName: {{ include "deskway.tlsSecret" $root }}
      defaultMode: 0440
      items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
  - name: tmp
    emptyDir: {sizeLimit: 64Mi}
{{- end -}}

{{/* The probe of a role: HTTPS /healthz where the role serves HTTP,
else a TCP connect. */}}
{{- define "deskway.probe" -}}
{{- if eq .role "stream" -}}
tcpSocket: {port: {{ .role }}}
{{- else -}}
httpGet: {path: /healthz, port: {{ .role }}, scheme: HTTPS}
{{- end -}}
{{- end -}}

{{/* What the values cannot work with, in one message; config.yaml and
secrets.yaml both start with it. */}}
{{- define "deskway.check" -}}
{{- $problems := list -}}
{{- if and .Values.broker.enabled (gt (int .Values.broker.replicas) 1) (not (include "deskway.brokerPostgres" .)) -}}
{{- $problems = append $problems "more than one broker needs broker.database.url, or broker.database.existingSecret and urlKey (PostgreSQL they share; SQLite is one broker's)" -}}
{{- end -}}
{{- range $name, $db := dict "broker.database" .Values.broker.database "gateway.farmDatabase" .Values.gateway.farmDatabase -}}
{{- if and $db.urlKey (not $db.existingSecret) -}}
{{- $problems = append $problems (printf "%s.urlKey needs %s.existingSecret, the Secret holding the whole postgres:// URL" $name $name) -}}
{{- end -}}
{{- if and $db.urlKey $db.url -}}
{{- $problems = append $problems (printf "%s takes url or urlKey, not both: leave url empty when existingSecret's urlKey holds the whole URL" $name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.stream.enabled (not .Values.stream.storeClaim) -}}
{{- $problems = append $problems "stream needs stream.storeClaim, the PersistentVolumeClaim of its store" -}}
{{- end -}}
{{- if and .Values.web.enabled (not .Values.broker.enabled) -}}
{{- $problems = append $problems "web needs broker.enabled: the portal launches through this release's broker" -}}
{{- end -}}
{{- if and .Values.admin.existingSecret (not .Values.admin.existingSecretKeys) -}}
{{- $problems = append $problems "admin.existingSecret needs admin.existingSecretKeys, the keys holding admin tokens" -}}
{{- end -}}
{{- range $i, $u := .Values.auth.users -}}
{{- if not (or $u.password $u.ntHash $u.existingSecret) -}}
{{- $problems = append $problems (printf "auth.users[%d] (%s) needs password, ntHash or existingSecret" $i $u.name) -}}
{{- end -}}
{{- end -}}
{{- with $problems -}}
{{- fail (printf "\nthe deskway chart cannot render these values; set:\n- %s" (join "\n- " .)) -}}
{{- end -}}
{{- end -}}
