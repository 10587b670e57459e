{{/* Host volumes of the pusher: /proc and /sys read-only, its state, /sys writable for the setup step. */}}
{{- define "kelvin.pusherVolumes" -}}
{{- $p := .values -}}
- name: proc
  hostPath:
    path: {{ $p.hostProc }}
    type: Directory
- name: sys
  hostPath:
    path: {{ $p.hostSys }}
    type: Directory
- name: state
{{- if $p.stateHostPath }}
  hostPath:
    path: {{ $p.stateHostPath }}
    type: DirectoryOrCreate
{{- else }}
  emptyDir: {}
{{- end }}
{{- if $p.rapl.enabled }}
- name: sys-rw
  hostPath:
    path: {{ $p.hostSys }}
    type: Directory
{{- end }}
{{- end }}

{{/*
Init container run as root before the pusher: makes the RAPL counters readable by
the pusher's group and/or hands the host state directory to the pusher's user.
It needs CAP_CHOWN, and CAP_FOWNER for the state directory: once it belongs to the
pusher (the chown, or the previous pod start), root may chmod it only with FOWNER.
*/}}
{{- define "kelvin.pusherSetup" -}}
- name: node-setup
  {{- include "kelvin.image" .ctx | nindent 2 }}
  command: ["/bin/sh", "-ec"]
  args:
    - |
      {{- .script | nindent 6 }}
  securityContext:
    {{- $sc := deepCopy .ctx.values.nodeSetup.securityContext }}
    {{- $caps := ternary (list "CHOWN" "FOWNER") (list "CHOWN") (not (empty .state)) }}
    {{- $_ := set $sc "capabilities" (dict "drop" (list "ALL") "add" $caps) }}
    {{- toYaml $sc | nindent 4 }}
  volumeMounts:
    {{- if .rapl }}
    - name: sys-rw
      mountPath: /host/sys-rw
    {{- end }}
    {{- if .state }}
    - name: state
      mountPath: /host/pusher-state
    {{- end }}
{{- end }}
