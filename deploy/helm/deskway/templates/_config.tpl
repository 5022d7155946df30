{{/* The files of a role's ConfigMap, as a YAML map of file name to
content: deskway.yaml, or, for brokers on PostgreSQL (a StatefulSet),
one per pod, named after it, each naming the other pods as its peers.
Called with (dict "root" . "role" NAME). */}}
{{- define "deskway.configFiles" -}}
{{- $files := dict -}}
{{- if and (eq .role "broker") (include "deskway.brokerPostgres" .root) -}}
{{- range $i := until (int $.root.Values.broker.replicas) -}}
{{- $_ := set $files (printf "%s-broker-%d.yaml" (include "deskway.fullname" $.root) $i) (include "deskway.roleConfig" (dict "root" $.root "role" "broker" "pod" $i)) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $files "deskway.yaml" (include "deskway.roleConfig" (dict "root" .root "role" .role)) -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}

{{/* Each role's deskway.yaml. Secrets are file: references to
/etc/deskway/secrets, never values; extraConfig (the chart's, then the
role's) is merged over it at the top level, so any deskway key can be
set. Called with (dict "root" . "role" NAME), and "pod" N for broker pod
N of a StatefulSet. */}}
{{- define "deskway.roleConfig" -}}
{{- $v := .root.Values -}}
{{- $base := include (printf "deskway.config.%s" .role) . | fromYaml -}}
{{- if hasKey $base "Error" -}}
{{- fail (printf "the %s configuration the chart built is not YAML: %s" .role $base.Error) -}}
{{- end -}}
{{- $cfg := deepCopy $base -}}
{{- range list $v.extraConfig (index $v .role).extraConfig -}}
{{- if . -}}
{{- $cfg = mergeOverwrite $cfg (deepCopy .) -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "deskway.config.common" -}}
{{- $v := .root.Values -}}
state_dir: /var/lib/deskway
log: {level: {{ $v.log.level }}, format: json}
{{- /* Stream clients check the server against deskway's own CA (stream
cert issue), whose certificate the stream makes when tls is unset. */}}
{{- if or (ne .role "stream") $v.tls.existingSecret }}
tls: {cert: /etc/deskway/tls/tls.crt, key: /etc/deskway/tls/tls.key}
{{- end }}
admin:
  listen: ":{{ $v.metrics.port }}"
  tokens:
  {{- range $f := (include "deskway.secretFiles" . | fromYamlArray) }}
  {{- if hasPrefix "admin-token-" $f.path }}
  - file:/etc/deskway/secrets/{{ $f.path }}
  {{- end }}
  {{- end }}
  {{- if and (include "deskway.console" .root) (eq .role "broker") }}
  console_tokens: [file:/etc/deskway/secrets/console-token]
  {{- end }}
{{- if has .role (list "gateway" "broker" "web") }}
auth:
  {{- if has .role (list "gateway" "broker") }}
  token_key: file:/etc/deskway/secrets/token-key
  {{- end }}
  domain: {{ $v.auth.domain | quote }}
  {{- with $v.auth.users }}
  users:
  {{- range $i, $u := . }}
  - name: {{ $u.name | quote }}
    {{- if or $u.ntHash $u.ntHashKey }}
    nt_hash: file:/etc/deskway/secrets/user-{{ $i }}
    {{- else }}
    password: file:/etc/deskway/secrets/user-{{ $i }}
    {{- end }}
    {{- with $u.groups }}
    groups: {{ toJson . }}
    {{- end }}
    {{- with $u.zone }}
    zone: {{ . | quote }}
    {{- end }}
  {{- end }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "deskway.config.gateway" -}}
{{- $v := .root.Values -}}{{- $g := $v.gateway -}}
{{ include "deskway.config.common" . }}
gateway:
  listen: ":{{ $g.port }}"
  public_name: {{ $g.publicName | quote }}
  {{- if gt (int $g.replicas) 1 }}
  farm_peers: ["{{ include "deskway.fullname" .root }}-gateway-peers:{{ $g.port }}"]
  {{- end }}
  {{- with $g.proxyProtocolFrom }}
  proxy_protocol_from: {{ toJson . }}
  {{- end }}
  {{- if and $v.web.enabled $v.web.publicURL }}
  browser_origins: [{{ $v.web.publicURL | trimSuffix "/" | quote }}]
  {{- end }}
  {{- with $g.connectionPolicies }}
  connection_policies: {{ toJson . }}
  {{- end }}
  {{- with $g.resourcePolicies }}
  resource_policies: {{ toJson . }}
  {{- end }}
{{- if $g.farmDatabase.urlKey }}
farm:
  database: file:/etc/deskway/secrets/farm-database-url
{{- else if $g.farmDatabase.url }}
farm:
  database: {{ $g.farmDatabase.url | quote }}
{{- end }}
{{- end -}}

{{- define "deskway.config.broker" -}}
{{- $v := .root.Values -}}{{- $b := $v.broker -}}
{{ include "deskway.config.common" . }}
broker:
  listen: ":{{ $b.port }}"
  gateway: {{ $v.gateway.publicName | quote }}
  {{- if $b.database.urlKey }}
  database: file:/etc/deskway/secrets/broker-database-url
  {{- else if $b.database.url }}
  database: {{ $b.database.url | quote }}
  {{- end }}
  {{- with $b.proxyProtocolFrom }}
  proxy_protocol_from: {{ toJson . }}
  {{- end }}
  {{- if $v.web.enabled }}
  frontend_tokens: [file:/etc/deskway/secrets/frontend-token]
  {{- end }}
  {{- if and (include "deskway.brokerPeers" .root) (hasKey . "pod") }}
  {{- $peers := list }}
  {{- range $i := until (int $b.replicas) }}
  {{- if ne $i (int $.pod) }}
  {{- $peers = append $peers (include "deskway.brokerPodURL" (list $.root $i)) }}
  {{- end }}
  {{- end }}
  {{- /* The other brokers, asked in a database outage before a user this
  one holds no session of is placed. Every broker serves the chart's
  certificate, which names the broker Service rather than each pod. */}}
  peers: {{ toJson $peers }}
  peer_ca: /etc/deskway/tls/tls.crt
  peer_server_name: "{{ include "deskway.fullname" .root }}-broker"
  peer_timeout: {{ $b.peers.timeout | quote }}
  {{- end }}
  delivery_groups: {{ toJson $b.deliveryGroups }}
{{- end -}}

{{- define "deskway.config.web" -}}
{{- $v := .root.Values -}}{{- $w := $v.web -}}{{- $full := include "deskway.fullname" .root -}}
{{ include "deskway.config.common" . }}
web:
  listen: ":{{ $w.port }}"
  title: {{ $w.title | quote }}
  {{- with $w.publicURL }}
  public_url: {{ . | quote }}
  {{- end }}
  broker: "https://{{ $full }}-broker:{{ $v.broker.service.port }}"
  broker_ca: /etc/deskway/tls/tls.crt
  frontend_token: file:/etc/deskway/secrets/frontend-token
  cookie_key: file:/etc/deskway/secrets/cookie-key
  {{- if include "deskway.console" .root }}
  console:
    {{- with $w.console.admins }}
    admins: {{ toJson . }}
    {{- end }}
    {{- with $w.console.helpdesk }}
    helpdesk: {{ toJson . }}
    {{- end }}
    {{- with $w.console.readonly }}
    readonly: {{ toJson . }}
    {{- end }}
    api: "https://{{ $full }}-broker:{{ $v.metrics.port }}"
    api_ca: /etc/deskway/tls/tls.crt
    token: file:/etc/deskway/secrets/console-token
  {{- end }}
{{- end -}}

{{- define "deskway.config.stream" -}}
{{- $v := .root.Values -}}{{- $s := $v.stream -}}
{{ include "deskway.config.common" . }}
stream:
  listen: ":{{ $s.port }}"
  store: /var/lib/deskway/store
  {{- if gt (int $s.replicas) 1 }}
  shared_cache: true
  {{- end }}
  vdisks: {{ toJson $s.vdisks }}
{{- end -}}
