{{/*
Where the spool lives: "shared" (one RWX claim, a directory per pod), "claims" (a
StatefulSet's claim per pod), "claim" (one claim, one Deployment pod), "emptyDir".
*/}}
{{- define "kelvin.collectAgentSpoolMode" -}}
{{- $c := .Values.collectAgent -}}
{{- if $c.spool.shared.enabled -}}shared
{{- else if and $c.spool.persistence.enabled (eq $c.kind "StatefulSet") -}}claims
{{- else if $c.spool.persistence.enabled -}}claim
{{- else -}}emptyDir
{{- end -}}
{{- end }}

{{/* Why a spool configuration cannot work, or nothing. */}}
{{- define "kelvin.collectAgentCheck" -}}
{{- $c := .Values.collectAgent -}}
{{- if and (eq (include "kelvin.collectAgentSpoolMode" .) "claim") (or $c.autoscaling.enabled (gt (int $c.replicas) 1)) -}}
{{- fail "collectAgent.spool.persistence.enabled with kind=Deployment gives one claim to one pod: set collectAgent.replicas=1 and autoscaling off, collectAgent.kind=StatefulSet for one spool PVC per pod, or collectAgent.spool.shared for one ReadWriteMany claim" -}}
{{- end -}}
{{- if lt (int $c.terminationGracePeriodSeconds) (int $c.spool.drainMarginSeconds) -}}
{{- fail "collectAgent.terminationGracePeriodSeconds is shorter than collectAgent.spool.drainMarginSeconds: the agent would have no time to drain its spool" -}}
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
  mountPath: {{ ternary "/var/lib/kelvin/spools" "/var/lib/kelvin/spool" (eq (include "kelvin.collectAgentSpoolMode" .) "shared") }}
{{- if and .Values.mqtt.builtin.tls.enabled (ne .Values.mqtt.mode "external") }}
- name: mqtt-tls
  mountPath: /var/run/secrets/kelvin/mqtt-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Pod volumes; a StatefulSet's spool PVCs come from its volumeClaimTemplates instead. */}}
{{- define "kelvin.collectAgentVolumes" -}}
{{- $c := .Values.collectAgent -}}
{{- $mode := include "kelvin.collectAgentSpoolMode" . -}}
{{- $name := include "kelvin.componentName" (dict "root" . "component" "collect-agent") -}}
{{- if eq $mode "shared" }}
- name: spool
  persistentVolumeClaim:
    claimName: {{ $c.spool.shared.existingClaim | default (printf "%s-spools" $name) }}
{{- else if eq $mode "claim" }}
- name: spool
  persistentVolumeClaim:
    claimName: {{ $c.spool.persistence.existingClaim | default (printf "%s-spool" $name) }}
{{- else if eq $mode "emptyDir" }}
- name: spool
  emptyDir:
    {{- toYaml $c.spool.emptyDir | nindent 4 }}
{{- end }}
{{- if and .Values.mqtt.builtin.tls.enabled (ne .Values.mqtt.mode "external") }}
- name: mqtt-tls
  secret:
    secretName: {{ include "kelvin.mqttTlsSecretName" . }}
{{- end }}
{{- end }}

{{/* Spool settings that follow from the volume: drain time, peers, what an emptyDir risks. */}}
{{- define "kelvin.collectAgentSpoolConfig" -}}
{{- $c := .Values.collectAgent -}}
{{- $mode := include "kelvin.collectAgentSpoolMode" . -}}
{{- $out := dict "drain_timeout_s" (sub (int $c.terminationGracePeriodSeconds) (int $c.spool.drainMarginSeconds)) -}}
{{- if eq $mode "shared" -}}
{{- $_ := set $out "spool_peers_dir" "/var/lib/kelvin/spools" -}}
{{- $_ := set $out "orphan_scan_s" $c.spool.shared.orphanScanSeconds -}}
{{- end -}}
{{- if eq $mode "emptyDir" -}}
{{- $_ := set $out "spool_ephemeral" true -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/*
The drain Job of one retained spool claim: `kelvin spool drain` on it, which writes what
is spooled there to storage and exits 0 once it is empty (or at once if an agent holds
it). Shared by the Helm hook (drain-job.yaml) and the janitor's template (janitor.yaml).
(dict "root" $ "name" <Job name> "claim" <claim name> "hook" <bool>)
*/}}
{{- define "kelvin.collectAgentDrainJob" -}}
{{- $root := .root -}}
{{- $ctx := dict "root" $root "component" "collect-agent-drain" "values" $root.Values.collectAgent -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kelvin.componentLabels" $ctx | nindent 4 }}
  {{- if .hook }}
  annotations:
    helm.sh/hook: post-install,post-upgrade
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
  {{- end }}
spec:
  backoffLimit: 20
  ttlSecondsAfterFinished: 86400
  template:
    metadata:
      labels:
        {{- include "kelvin.componentLabels" $ctx | nindent 8 }}
    spec:
      restartPolicy: OnFailure
      serviceAccountName: {{ include "kelvin.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with include "kelvin.imagePullSecrets" $root | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      securityContext:
        {{- include "kelvin.podSecurityContext" $ctx | nindent 8 }}
      containers:
        - name: drain
          {{- include "kelvin.image" $ctx | nindent 10 }}
          args: [spool, drain, /var/lib/kelvin/spool, --config, /etc/kelvin/kelvin.yaml]
          {{- with include "kelvin.storageEnv" $root | trim }}
          env:
            {{- . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- include "kelvin.containerSecurityContext" $ctx | nindent 12 }}
          volumeMounts:
            {{- include "kelvin.baseVolumeMounts" $root | nindent 12 }}
            - name: spool
              mountPath: /var/lib/kelvin/spool
      volumes:
        {{- include "kelvin.baseVolumes" $root | nindent 8 }}
        - name: spool
          persistentVolumeClaim:
            claimName: {{ .claim }}
{{- end }}
