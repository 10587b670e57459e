{{/*
The Slurm bridge (docs/slurm.md): its kelvin.yaml section, its credentials (a Secret:
the JWT as a file, slurmrestd's URL and the prolog's notify token as environment), and
the checks that fail the render early.
*/}}

{{- define "kelvin.slurmBridgeSecretName" -}}
{{- $b := .Values.slurmBridge -}}
{{- if $b.existingSecret -}}
{{- tpl $b.existingSecret . -}}
{{- else -}}
{{- printf "%s-slurm" (include "kelvin.fullname" .) -}}
{{- end -}}
{{- end }}

{{- define "kelvin.slurmBridgeConfig" -}}
{{- $b := .Values.slurmBridge -}}
{{- if not .Values.allocator.enabled -}}
{{- fail "slurmBridge.enabled needs allocator.enabled: the allocator chooses the nodes" -}}
{{- end -}}
{{- if eq (empty $b.nodeNames) (empty $b.nodeMap) -}}
{{- fail "slurmBridge: set exactly one of nodeNames (a Slurm host list in hall order, e.g. n[001-400]) and nodeMap ({slurm node: hall index or rowR/rackK/slotS})" -}}
{{- end -}}
{{- if not (has $b.jwt.kind (list "token" "key")) -}}
{{- fail (printf "slurmBridge.jwt.kind %q: expected token (a JWT someone renews in the Secret) or key (Slurm's jwt_hs256.key: the bridge signs its own)" $b.jwt.kind) -}}
{{- end -}}
{{- $out := dict "host" "0.0.0.0" "port" $b.service.port "mode" $b.mode "slurm_api" "rest" "jwt_user" $b.jwt.user "poll_interval_s" $b.pollIntervalSeconds "partitions" $b.partitions -}}
{{- $_ := set $out "allocator_url" (include "kelvin.serviceURL" (dict "root" . "component" "allocator" "port" .Values.allocator.service.port)) -}}
{{- $file := printf "/var/run/secrets/kelvin/slurm/%s" $b.jwt.secretKey -}}
{{- if eq $b.jwt.kind "key" -}}
{{- $_ := set $out "jwt_key_file" $file -}}
{{- else -}}
{{- $_ := set $out "token_file" $file -}}
{{- end -}}
{{- with $b.wakePort }}{{ $_ := set $out "wake_port" (int .) }}{{ end -}}
{{- with $b.nodeNames }}{{ $_ := set $out "node_names" . }}{{ end -}}
{{- with $b.nodeMap }}{{ $_ := set $out "node_map" . }}{{ end -}}
{{- include "kelvin.merge" (dict "dst" $out "src" $b.config) -}}
{{- toYaml $out -}}
{{- end }}

{{/* slurmrestd's URL and the notify token from the Secret; the admin token in plain (the
bridge sends it to the allocator), the others as verifiers. */}}
{{- define "kelvin.slurmBridgeEnv" -}}
{{- $b := .Values.slurmBridge }}
{{- include "kelvin.authEnv" (dict "root" . "sends" (list "admin")) }}
- name: KELVIN_SLURM_BRIDGE_SLURMRESTD_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "kelvin.slurmBridgeSecretName" . | quote }}
      key: {{ $b.slurmrestdUrlKey | quote }}
- name: KELVIN_SLURM_BRIDGE_NOTIFY_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "kelvin.slurmBridgeSecretName" . | quote }}
      key: {{ $b.notifyTokenKey | quote }}
      optional: true
{{- end }}

{{- define "kelvin.slurmBridgeMounts" -}}
- name: slurm-jwt
  mountPath: /var/run/secrets/kelvin/slurm
  readOnly: true
{{- end }}

{{/* Only the JWT: a Secret volume follows updates of the Secret, which the bridge reads again. */}}
{{- define "kelvin.slurmBridgeVolumes" -}}
- name: slurm-jwt
  secret:
    secretName: {{ include "kelvin.slurmBridgeSecretName" .root | quote }}
    defaultMode: 0400
    items:
      - key: {{ .values.jwt.secretKey | quote }}
        path: {{ .values.jwt.secretKey | quote }}
{{- end }}
