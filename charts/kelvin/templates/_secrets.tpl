{{/*
Secrets reach the containers as KELVIN_* environment variables (which override
kelvin.yaml), either from a Secret the user manages (existingSecret) or from the
chart's own Secret holding the inline values. Nothing secret is in the ConfigMap.
*/}}

{{/*
One env entry from a Secret key. (dict "root" $ "env" NAME "existing" <secret> "key" <key>
"inline" <value> "optional" <bool>): with "existing", the key of that Secret (skipped when
"key" is empty); otherwise, when "inline" is set, the same key of the chart's Secret.
*/}}
{{- define "kelvin.secretEnv" -}}
{{- if .existing }}
{{- if .key }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ tpl .existing .root | quote }}
      key: {{ .key | quote }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}
{{- else if .inline }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "kelvin.fullname" .root | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- end }}

{{/*
Credentials of shard i as a YAML list of {field, env, existing, key, inline}: the fields
this shard actually has (a key named for an existing Secret, or an inline value).
*/}}
{{- define "kelvin.shardCredentials" -}}
{{- $auth := .shard.auth | default dict -}}
{{- $creds := list -}}
{{- range $field := list "username" "password" "token" -}}
{{- $key := get $auth (printf "%sKey" $field) | default "" -}}
{{- $inline := get $auth $field | default "" -}}
{{- if or (and $auth.existingSecret $key) (and (not $auth.existingSecret) $inline) -}}
{{- $env := printf "KELVIN_SHARD_%d_%s" (int $.index) (upper $field) -}}
{{- $creds = append $creds (dict "field" $field "env" $env "existing" ($auth.existingSecret | default "") "key" (ternary $key (printf "shard-%d-%s" (int $.index) $field) (not (empty $auth.existingSecret))) "inline" $inline) -}}
{{- end -}}
{{- end -}}
{{- toYaml $creds -}}
{{- end }}

{{/*
Storage credentials for the containers that open storage (collect agent, query API).
Sharded: the shard list goes in KELVIN_STORAGE_SHARDED__SHARDS as JSON whose
credentials are $(VAR) references Kubernetes expands from the env entries before
it, so they must not contain `"` or `\`.
*/}}
{{- define "kelvin.storageEnv" -}}
{{- $s := .Values.storage -}}
{{- if eq $s.backend "influxdb" }}
{{- $a := $s.influxdb.auth }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_INFLUXDB__USERNAME" "existing" $a.existingSecret "key" $a.usernameKey "inline" $a.username "optional" true) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_INFLUXDB__PASSWORD" "existing" $a.existingSecret "key" $a.passwordKey "inline" $a.password "optional" true) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_INFLUXDB__TOKEN" "existing" $a.existingSecret "key" $a.tokenKey "inline" $a.token "optional" true) }}
{{- else if eq $s.backend "sharded" }}
{{- $shards := (include "kelvin.storageConfig" . | fromYaml).sharded.shards }}
{{- $any := false }}
{{- range $i, $shard := $s.sharded.shards }}
{{- range $cred := include "kelvin.shardCredentials" (dict "shard" $shard "index" $i) | fromYamlArray }}
{{- $any = true }}
{{- include "kelvin.secretEnv" (dict "root" $ "env" $cred.env "existing" $cred.existing "key" $cred.key "inline" $cred.inline) }}
{{- $_ := set (index $shards $i).influxdb $cred.field (printf "$(%s)" $cred.env) }}
{{- end }}
{{- end }}
{{- if $any }}
- name: KELVIN_STORAGE_SHARDED__SHARDS
  value: {{ toJson $shards | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kelvin.collectAgentEnv" -}}
{{- $m := .Values.mqtt }}
{{- if eq (include "kelvin.collectAgentSpoolMode" .) "shared" }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: KELVIN_COLLECT_AGENT_SPOOL_DIR
  value: /var/lib/kelvin/spools/$(POD_NAME)
{{- end }}
{{- include "kelvin.storageEnv" . }}
{{- include "kelvin.authEnv" (dict "root" .) }}
{{- if eq $m.mode "external" }}
{{- $a := $m.external.auth }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_COLLECT_AGENT_BROKER__USERNAME" "existing" $a.existingSecret "key" $a.usernameKey "inline" $a.username) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_COLLECT_AGENT_BROKER__PASSWORD" "existing" $a.existingSecret "key" $a.passwordKey "inline" $a.password) }}
{{- else }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_COLLECT_AGENT_MQTT_USERS" "existing" $m.builtin.existingSecret "key" $m.builtin.usersKey "inline" (ternary (toJson $m.builtin.users) "" (not (empty $m.builtin.users)))) }}
{{- end }}
{{- end }}

{{/* The pusher: its node's name in its sensor prefix, MQTT credentials, REST token verifiers. */}}
{{- define "kelvin.pusherEnv" -}}
{{- $pub := .Values.mqtt.publisherAuth }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- with .Values.pusher.prefix }}
- name: KELVIN_PUSHER_PREFIX
  value: {{ . | quote }}
{{- end }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_PUSHER_MQTT_USERNAME" "existing" $pub.existingSecret "key" $pub.usernameKey "inline" $pub.username) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_PUSHER_MQTT_PASSWORD" "existing" $pub.existingSecret "key" $pub.passwordKey "inline" $pub.password) }}
{{- include "kelvin.authEnv" (dict "root" .) }}
{{- /* Until the pusher reads the shared auth section itself, its REST API takes the admin
token's verifier (with an existingSecret, the token itself). */}}
{{- if eq .Values.auth.mode "token" }}
- name: KELVIN_PUSHER_TOKEN
{{- if .Values.auth.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ tpl .Values.auth.existingSecret . | quote }}
      key: {{ .Values.auth.adminTokenKey | quote }}
{{- else }}
  value: {{ printf "sha256:%s" (include "kelvin.generated" (dict "root" . "key" .Values.auth.adminTokenKey) | sha256sum) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The allocator: its token verifiers (it reads the query API: the read token), and the pushers' MQTT login for its decision sensors. */}}
{{- define "kelvin.allocatorEnv" -}}
{{- $pub := .Values.mqtt.publisherAuth }}
{{- include "kelvin.authEnv" (dict "root" . "sends" (list "read")) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_ALLOCATOR_MQTT_USERNAME" "existing" $pub.existingSecret "key" $pub.usernameKey "inline" $pub.username) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_ALLOCATOR_MQTT_PASSWORD" "existing" $pub.existingSecret "key" $pub.passwordKey "inline" $pub.password) }}
{{- end }}

{{/* The query API: storage, and its read token in plain (the console's reads of the allocator and collect agent). */}}
{{- define "kelvin.queryApiEnv" -}}
{{- include "kelvin.storageEnv" . }}
{{- include "kelvin.authEnv" (dict "root" . "sends" (list "read")) }}
{{- end }}

{{/* data: of the chart's Secret: generated tokens and the inline values (base64). */}}
{{- define "kelvin.secretData" -}}
{{- $v := .Values -}}
{{- $data := include "kelvin.authSecretData" . | fromYaml -}}
{{- $pub := $v.mqtt.publisherAuth -}}
{{- if not $pub.existingSecret -}}
{{- with $pub.username }}{{ $_ := set $data $pub.usernameKey . }}{{ end -}}
{{- with $pub.password }}{{ $_ := set $data $pub.passwordKey . }}{{ end -}}
{{- end -}}
{{- $ia := $v.storage.influxdb.auth -}}
{{- if and (eq $v.storage.backend "influxdb") (not $ia.existingSecret) -}}
{{- with $ia.username }}{{ $_ := set $data $ia.usernameKey . }}{{ end -}}
{{- with $ia.password }}{{ $_ := set $data $ia.passwordKey . }}{{ end -}}
{{- with $ia.token }}{{ $_ := set $data $ia.tokenKey . }}{{ end -}}
{{- end -}}
{{- if eq $v.storage.backend "sharded" -}}
{{- range $i, $shard := $v.storage.sharded.shards -}}
{{- range $cred := include "kelvin.shardCredentials" (dict "shard" $shard "index" $i) | fromYamlArray -}}
{{- if not $cred.existing }}{{ $_ := set $data $cred.key $cred.inline }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $m := $v.mqtt -}}
{{- if eq $m.mode "external" -}}
{{- $ea := $m.external.auth -}}
{{- if not $ea.existingSecret -}}
{{- with $ea.username }}{{ $_ := set $data $ea.usernameKey . }}{{ end -}}
{{- with $ea.password }}{{ $_ := set $data $ea.passwordKey . }}{{ end -}}
{{- end -}}
{{- else if and $m.builtin.users (not $m.builtin.existingSecret) -}}
{{- $_ := set $data $m.builtin.usersKey (toJson $m.builtin.users) -}}
{{- end -}}
{{- range $key, $value := $data }}
{{ $key }}: {{ $value | toString | b64enc | quote }}
{{- end }}
{{- end }}
