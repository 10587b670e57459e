{{/* Why a spool configuration cannot work, or nothing. */}}
{{- define "kelvin.collectAgentCheck" -}}
{{- $c := .Values.collectAgent -}}
{{- if and $c.spool.persistence.enabled (ne $c.kind "StatefulSet") (or $c.autoscaling.enabled (gt (int $c.replicas) 1)) -}}
{{- fail "collectAgent.spool.persistence.enabled with kind=Deployment gives one claim to one pod: set collectAgent.replicas=1 and autoscaling off, or collectAgent.kind=StatefulSet for one spool PVC per pod" -}}
{{- end -}}
{{- include "kelvin.mqttChecks" . -}}
{{- end }}

{{- define "kelvin.collectAgentPorts" -}}
- name: http
  containerPort: {{ .Values.collectAgent.service.httpPort }}
  protocol: TCP
{{- if ne .Values.mqtt.mode "external" }}
- name: mqtt
  containerPort: {{ .Values.collectAgent.service.mqttPort }}
  protocol: TCP
{{- end }}
{{- end }}

{{- define "kelvin.collectAgentMounts" -}}
- name: spool
  mountPath: /var/lib/kelvin/spool
{{- if and .Values.mqtt.builtin.tls.enabled (ne .Values.mqtt.mode "external") }}
- name: mqtt-tls
  mountPath: /var/run/secrets/kelvin/mqtt-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Pod volumes; a StatefulSet's spool PVC comes from its volumeClaimTemplates instead. */}}
{{- define "kelvin.collectAgentVolumes" -}}
{{- $c := .Values.collectAgent -}}
{{- if not (and $c.spool.persistence.enabled (eq $c.kind "StatefulSet")) }}
- name: spool
{{- if $c.spool.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ $c.spool.persistence.existingClaim | default (printf "%s-spool" (include "kelvin.componentName" (dict "root" . "component" "collect-agent"))) }}
{{- else }}
  emptyDir:
    {{- toYaml $c.spool.emptyDir | nindent 4 }}
{{- end }}
{{- end }}
{{- if and .Values.mqtt.builtin.tls.enabled (ne .Values.mqtt.mode "external") }}
- name: mqtt-tls
  secret:
    secretName: {{ include "kelvin.mqttTlsSecretName" . }}
{{- end }}
{{- end }}
