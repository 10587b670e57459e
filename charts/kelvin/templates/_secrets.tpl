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
Storage credentials for the containers that open storage (collect agent, query API).
*/}}
{{- define "kelvin.storageEnv" -}}
{{- $s := .Values.storage -}}
{{- if eq $s.backend "influxdb" }}
{{- $a := $s.influxdb.auth }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_INFLUXDB__USERNAME" "existing" $a.existingSecret "key" $a.usernameKey "inline" $a.username "optional" true) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_INFLUXDB__PASSWORD" "existing" $a.existingSecret "key" $a.passwordKey "inline" $a.password "optional" true) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_INFLUXDB__TOKEN" "existing" $a.existingSecret "key" $a.tokenKey "inline" $a.token "optional" true) }}
{{- else if eq $s.backend "clickhouse" }}
{{- $a := $s.clickhouse.auth }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_CLICKHOUSE__USERNAME" "existing" $a.existingSecret "key" $a.usernameKey "inline" $a.username "optional" true) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_STORAGE_CLICKHOUSE__PASSWORD" "existing" $a.existingSecret "key" $a.passwordKey "inline" $a.password "optional" true) }}
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
{{- include "kelvin.mqttAgentEnv" . }}
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
{{- if include "kelvin.mqttDerived" . }}
- name: KELVIN_PUSHER_MQTT_USERNAME
  value: "$(NODE_NAME)"
{{- else }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_PUSHER_MQTT_USERNAME" "existing" $pub.existingSecret "key" $pub.usernameKey "inline" $pub.username) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_PUSHER_MQTT_PASSWORD" "existing" $pub.existingSecret "key" $pub.passwordKey "inline" $pub.password) }}
{{- end }}
{{- include "kelvin.authEnv" (dict "root" .) }}
{{- end }}

{{/* The allocator: its token verifiers (it reads the query API: the read token), and its MQTT login for its decision sensors and job records (derived: the init container's file; else mqtt.publisherAuth). */}}
{{- define "kelvin.allocatorEnv" -}}
{{- $pub := .Values.mqtt.publisherAuth }}
{{- include "kelvin.authEnv" (dict "root" . "sends" (list "read")) }}
{{- if not (include "kelvin.mqttDerived" .) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_ALLOCATOR_MQTT_USERNAME" "existing" $pub.existingSecret "key" $pub.usernameKey "inline" $pub.username) }}
{{- include "kelvin.secretEnv" (dict "root" . "env" "KELVIN_ALLOCATOR_MQTT_PASSWORD" "existing" $pub.existingSecret "key" $pub.passwordKey "inline" $pub.password) }}
{{- end }}
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
{{- $ca := $v.storage.clickhouse.auth -}}
{{- if and (eq $v.storage.backend "clickhouse") (not $ca.existingSecret) -}}
{{- with $ca.username }}{{ $_ := set $data $ca.usernameKey . }}{{ end -}}
{{- with $ca.password }}{{ $_ := set $data $ca.passwordKey . }}{{ end -}}
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
{{- include "kelvin.mqttSecretData" (dict "root" . "data" $data) -}}
{{- range $key, $value := $data }}
{{ $key }}: {{ $value | toString | b64enc | quote }}
{{- end }}
{{- end }}
