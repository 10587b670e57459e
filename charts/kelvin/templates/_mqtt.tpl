{{/*
The built-in MQTT endpoint's credentials, ACL and TLS, and how the chart's own
publishers (pushers, allocator) use them.

credentials=derived (default): every publisher logs in with its own user name (a
pusher: its node's name; the allocator: mqtt.builtin.allocatorUser) and the password
HMAC-SHA256(node secret, user) that an init container writes into an in-memory
volume; only the init containers see the node secret. The agents' ACL keeps each
node to its own prefix. credentials=shared: everyone uses mqtt.publisherAuth (one of
builtin.users), which may publish anywhere. credentials=none: the endpoint is open.
*/}}

{{- define "kelvin.mqttBuiltin" -}}
{{- if ne .Values.mqtt.mode "external" }}true{{ end -}}
{{- end }}

{{- define "kelvin.mqttDerived" -}}
{{- if and (include "kelvin.mqttBuiltin" .) (eq .Values.mqtt.builtin.credentials "derived") }}true{{ end -}}
{{- end }}

{{/* Secret name and key of the node secret. */}}
{{- define "kelvin.mqttNodeSecretRef" -}}
{{- $n := .Values.mqtt.builtin.nodeSecret -}}
{{- toJson (dict "name" (ternary (tpl $n.existingSecret .) (include "kelvin.fullname" .) (not (empty $n.existingSecret))) "key" $n.key) -}}
{{- end }}

{{/* Adds the generated node secret to the chart Secret's data (dict "root" $ "data" $data);
kept across upgrades (kelvin.generated), so derived passwords stay valid. */}}
{{- define "kelvin.mqttSecretData" -}}
{{- $root := .root -}}
{{- $n := $root.Values.mqtt.builtin.nodeSecret -}}
{{- if and (include "kelvin.mqttDerived" $root) (not $n.existingSecret) -}}
{{- $_ := set .data $n.key (include "kelvin.generated" (dict "root" $root "key" $n.key)) -}}
{{- end -}}
{{- end }}

{{/* (dict "root" $ "env" NAME) */}}
{{- define "kelvin.mqttNodeSecretEnv" -}}
{{- $ref := include "kelvin.mqttNodeSecretRef" .root | fromJson }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name | quote }}
      key: {{ $ref.key | quote }}
{{- end }}

{{/* The collect agent's node secret (derived credentials). */}}
{{- define "kelvin.mqttAgentEnv" -}}
{{- if include "kelvin.mqttDerived" . }}
{{- include "kelvin.mqttNodeSecretEnv" (dict "root" . "env" "KELVIN_COLLECT_AGENT_MQTT_NODE_SECRET") }}
{{- end }}
{{- end }}

{{/* The collect agent's MQTT settings: ACL, TLS paths, peers to spread connections over. */}}
{{- define "kelvin.mqttAgentConfig" -}}
{{- $b := .Values.mqtt.builtin -}}
{{- $out := dict -}}
{{- $nodeTopics := $b.acl.nodeTopics -}}
{{- if not $nodeTopics -}}
{{- /* a node publishes under pusher.prefix: its $(NODE_NAME) is the user name */ -}}
{{- $prefix := .Values.pusher.prefix | default "/$(NODE_NAME)" -}}
{{- if not (contains "$(NODE_NAME)" $prefix) -}}
{{- fail (printf "pusher.prefix %q does not contain $(NODE_NAME): set mqtt.builtin.acl.nodeTopics to the filters a node's user may publish under" $prefix) -}}
{{- end -}}
{{- $nodeTopics = list (printf "%s/#" (replace "$(NODE_NAME)" "%u" $prefix)) -}}
{{- end -}}
{{- $users := deepCopy ($b.acl.users | default dict) -}}
{{- if eq $b.credentials "derived" -}}
{{- $_ := set $users $b.allocatorUser (dict "topics" (list "#") "jobs" true) -}}
{{- else if and (eq $b.credentials "shared") .Values.mqtt.publisherAuth.username -}}
{{- $_ := set $users .Values.mqtt.publisherAuth.username (dict "topics" (list "#") "jobs" true) -}}
{{- end -}}
{{- $_ := set $out "mqtt_acl" (dict "node_topics" $nodeTopics "users" $users) -}}
{{- if eq $b.credentials "none" -}}
{{- $_ := set $out "mqtt_anonymous" true -}}
{{- end -}}
{{- if $b.tls.enabled -}}
{{- $_ := set $out "mqtt_tls_cert" "/var/run/secrets/kelvin/mqtt-tls/tls.crt" -}}
{{- $_ := set $out "mqtt_tls_key" "/var/run/secrets/kelvin/mqtt-tls/tls.key" -}}
{{- end -}}
{{- if eq .Values.collectAgent.kind "StatefulSet" -}}
{{- $svc := include "kelvin.componentName" (dict "root" . "component" "collect-agent") -}}
{{- $_ := set $out "mqtt_peers_dns" (printf "%s-headless.%s.svc.%s" $svc .Release.Namespace $b.clusterDomain) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/* A publisher's MQTT client settings (dict "root" $ "component" "pusher"|"allocator"). */}}
{{- define "kelvin.mqttClientConfig" -}}
{{- $root := .root -}}
{{- $b := $root.Values.mqtt.builtin -}}
{{- $out := dict -}}
{{- if include "kelvin.mqttDerived" $root -}}
{{- $_ := set $out "mqtt_password_file" "/var/run/kelvin/mqtt/password" -}}
{{- if eq .component "allocator" -}}
{{- $_ := set $out "mqtt_username" $b.allocatorUser -}}
{{- end -}}
{{- end -}}
{{- if and (include "kelvin.mqttBuiltin" $root) $b.tls.enabled -}}
{{- $_ := set $out "mqtt_tls" true -}}
{{- $_ := set $out "mqtt_tls_ca" (printf "/var/run/secrets/kelvin/mqtt-ca/%s" $b.tls.caKey) -}}
{{- if and $b.tls.serverName (eq .component "pusher") -}}
{{- $_ := set $out "mqtt_tls_server_name" $b.tls.serverName -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/* Init container writing a publisher's derived password (dict "ctx" $ctx "user" NAME). */}}
{{- define "kelvin.mqttCredentialsInit" -}}
{{- $root := .ctx.root -}}
- name: mqtt-credentials
  {{- include "kelvin.image" .ctx | nindent 2 }}
  command: ["python", "-m", "services.common.mqtt_credentials", "--user", {{ .user | quote }}, "--out", "/var/run/kelvin/mqtt/password"]
  env:
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    {{- include "kelvin.mqttNodeSecretEnv" (dict "root" $root "env" "KELVIN_MQTT_NODE_SECRET") | trim | nindent 4 }}
  securityContext:
    {{- include "kelvin.containerSecurityContext" .ctx | nindent 4 }}
  volumeMounts:
    - name: mqtt-credentials
      mountPath: /var/run/kelvin/mqtt
{{- end }}

{{/* A publisher's volumes: its password (memory) and the CA it verifies the agents with. */}}
{{- define "kelvin.mqttClientVolumes" -}}
{{- $b := .Values.mqtt.builtin -}}
{{- if include "kelvin.mqttDerived" . }}
- name: mqtt-credentials
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if and (include "kelvin.mqttBuiltin" .) $b.tls.enabled }}
- name: mqtt-ca
  secret:
    secretName: {{ include "kelvin.mqttCaSecretName" . | quote }}
    items:
      - key: {{ $b.tls.caKey | quote }}
        path: {{ $b.tls.caKey | quote }}
{{- end }}
{{- end }}

{{- define "kelvin.mqttClientMounts" -}}
{{- if include "kelvin.mqttDerived" . }}
- name: mqtt-credentials
  mountPath: /var/run/kelvin/mqtt
  readOnly: true
{{- end }}
{{- if and (include "kelvin.mqttBuiltin" .) .Values.mqtt.builtin.tls.enabled }}
- name: mqtt-ca
  mountPath: /var/run/secrets/kelvin/mqtt-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* The collect agents' certificate: the site's (cert-manager's) Secret, or the generated one. */}}
{{- define "kelvin.mqttTlsSecretName" -}}
{{- $t := .Values.mqtt.builtin.tls -}}
{{- if $t.secretName }}{{ tpl $t.secretName . }}{{ else }}{{ include "kelvin.fullname" . }}-mqtt-tls{{ end -}}
{{- end }}

{{- define "kelvin.mqttCaSecretName" -}}
{{- $t := .Values.mqtt.builtin.tls -}}
{{- if $t.caSecretName }}{{ tpl $t.caSecretName . }}{{ else }}{{ include "kelvin.mqttTlsSecretName" . }}{{ end -}}
{{- end }}

{{/* DNS names the publishers may dial the agents by (the certificate's SANs). */}}
{{- define "kelvin.mqttServerNames" -}}
{{- $svc := include "kelvin.componentName" (dict "root" . "component" "collect-agent") -}}
{{- $ns := .Release.Namespace -}}
{{- $d := .Values.mqtt.builtin.clusterDomain -}}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns $d) -}}
{{- with .Values.mqtt.builtin.tls.serverName }}{{ $names = append $names . }}{{ end -}}
{{- toJson (uniq $names) -}}
{{- end }}

{{- define "kelvin.mqttChecks" -}}
{{- $b := .Values.mqtt.builtin -}}
{{- if and (include "kelvin.mqttBuiltin" .) $b.tls.enabled (not $b.tls.secretName) (not $b.tls.generate) -}}
{{- fail "mqtt.builtin.tls.enabled needs mqtt.builtin.tls.secretName (a kubernetes.io/tls Secret, e.g. a cert-manager Certificate's) or mqtt.builtin.tls.generate=true" -}}
{{- end -}}
{{- if and (include "kelvin.mqttBuiltin" .) (eq $b.credentials "shared") (not .Values.mqtt.publisherAuth.username) (not .Values.mqtt.publisherAuth.existingSecret) -}}
{{- fail "mqtt.builtin.credentials=shared needs mqtt.publisherAuth (one of mqtt.builtin.users) for the pushers and the allocator" -}}
{{- end -}}
{{- end }}
