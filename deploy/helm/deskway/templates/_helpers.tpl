{{/* Names and labels shared by every object. */}}
{{- define "deskway.fullname" -}}
{{- printf "%s-deskway" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "deskway.labels" -}}
app.kubernetes.io/name: deskway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "deskway.selector" -}}
app.kubernetes.io/name: deskway
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "deskway.tokenSecret" -}}
{{- if .Values.tokenKey.existingSecret -}}
{{- .Values.tokenKey.existingSecret -}}
{{- else -}}
{{- include "deskway.fullname" . -}}-config
{{- end -}}
{{- end -}}

{{/* The pod spec's common part: the image, the config and the secrets. */}}
{{- define "deskway.container" -}}
- name: deskway
  image: "{{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}"
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  args: [{{ .role | quote }}, "-c", "/etc/deskway/deskway.yaml"]
  ports:
  - name: {{ .role }}
    containerPort: {{ .port }}
    protocol: TCP
  - name: admin
    containerPort: 9443
    protocol: TCP
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
  volumeMounts:
  - name: config
    mountPath: /etc/deskway/deskway.yaml
    subPath: {{ .role }}.yaml
    readOnly: true
  - name: token-key
    mountPath: /etc/deskway/secrets
    readOnly: true
  {{- if .root.Values.tls.existingSecret }}
  - name: tls
    mountPath: /etc/deskway/tls
    readOnly: true
  {{- end }}
  - name: state
    mountPath: /var/lib/deskway
  - name: tmp
    mountPath: /tmp
  {{- with .resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "deskway.volumes" -}}
- name: config
  secret:
    secretName: {{ include "deskway.fullname" .root }}-config
    items:
    - {key: {{ .role }}.yaml, path: {{ .role }}.yaml}
- name: token-key
  secret:
    secretName: {{ include "deskway.tokenSecret" .root }}
    items:
    - {key: token-key, path: token-key}
{{- if .root.Values.tls.existingSecret }}
- name: tls
  secret:
    secretName: {{ .root.Values.tls.existingSecret }}
{{- end }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{/* The configuration every role's file starts with. */}}
{{- define "deskway.common" -}}
state_dir: /var/lib/deskway
log: {level: info, format: json}
admin: {listen: ":9443"}
{{- if .Values.tls.existingSecret }}
tls: {cert: /etc/deskway/tls/tls.crt, key: /etc/deskway/tls/tls.key}
{{- end }}
auth:
  token_key: "file:/etc/deskway/secrets/token-key"
{{- end -}}
