{{- define "kelvin.allocatorMounts" -}}
- name: state
  mountPath: /var/lib/kelvin/allocator
{{- include "kelvin.mqttClientMounts" . }}
{{- if .Values.allocator.hall.configMap }}
- name: hall
  mountPath: /etc/kelvin-hall
  readOnly: true
{{- end }}
{{- end }}

{{/* The placements' volume (a PVC unless persistence is off) and the site's hall files. */}}
{{- define "kelvin.allocatorVolumes" -}}
{{- $a := .values -}}
- name: state
{{- if $a.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ $a.persistence.existingClaim | default (printf "%s-state" (include "kelvin.componentName" .)) }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- with $a.hall.configMap }}
- name: hall
  configMap:
    name: {{ tpl . $.root }}
{{- end }}
{{- include "kelvin.mqttClientVolumes" .root }}
{{- end }}
