{{/*
Credentials of the Kelvin APIs (docs/security.md). One token per role; the chart
generates them into its own Secret unless auth.existingSecret names one you manage.
*/}}

{{/*
A value the chart generates into its Secret, (dict "root" $ "key" <Secret key>): the
live Secret's value when the release already exists (lookup: `helm upgrade` keeps it),
else 43 random characters (~256 bits). Memoised on the root context, so every template
of one render sees the same value. Offline (`helm template`) lookup finds nothing and
every render generates anew: GitOps sites use existingSecret. Any generated secret of
the chart (MQTT passwords too) should come from here.
*/}}
{{- define "kelvin.generated" -}}
{{- $cache := get .root "kelvinGenerated" | default dict -}}
{{- if not (hasKey $cache .key) -}}
{{- $live := lookup "v1" "Secret" .root.Release.Namespace (include "kelvin.fullname" .root) -}}
{{- $value := "" -}}
{{- if and $live $live.data (hasKey $live.data .key) -}}
{{- $value = index $live.data .key | b64dec -}}
{{- end -}}
{{- if not $value -}}
{{- $value = randAlphaNum 43 -}}
{{- end -}}
{{- $_ := set $cache .key $value -}}
{{- $_ := set .root "kelvinGenerated" $cache -}}
{{- end -}}
{{- get $cache .key -}}
{{- end }}

{{- define "kelvin.authRoles" -}}read write admin{{- end }}

{{/* The Secret key of a role's token, (dict "root" $ "role" "read"). */}}
{{- define "kelvin.tokenKey" -}}
{{- get .root.Values.auth (printf "%sTokenKey" .role) -}}
{{- end }}

{{/*
A role's token as this render knows it, (dict "root" $ "role" "read"): generated, or
from the existingSecret when the cluster has it (lookup); "" when unknown here.
*/}}
{{- define "kelvin.token" -}}
{{- $key := include "kelvin.tokenKey" . -}}
{{- if .root.Values.auth.existingSecret -}}
{{- $s := lookup "v1" "Secret" .root.Release.Namespace (tpl .root.Values.auth.existingSecret .root) -}}
{{- if and $s $s.data (hasKey $s.data $key) -}}
{{- index $s.data $key | b64dec -}}
{{- end -}}
{{- else -}}
{{- include "kelvin.generated" (dict "root" .root "key" $key) -}}
{{- end -}}
{{- end }}

{{/*
The auth environment of a Kelvin container, (dict "root" $ "sends" (list <roles>)): every
service checks all three roles, but it gets in plain only the tokens it sends to other
services ("sends"); the others as sha256 verifiers, so a pusher on a compute node never
holds the admin token. With existingSecret every token comes from it in plain (its hash
cannot be computed here).
*/}}
{{- define "kelvin.authEnv" -}}
{{- $a := .root.Values.auth -}}
{{- if eq $a.mode "token" }}
{{- range $role := splitList " " (include "kelvin.authRoles" .) }}
{{- $key := include "kelvin.tokenKey" (dict "root" $.root "role" $role) }}
- name: KELVIN_AUTH_{{ upper $role }}_TOKEN
{{- if $a.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ tpl $a.existingSecret $.root | quote }}
      key: {{ $key | quote }}
{{- else if has $role ($.sends | default list) }}
  valueFrom:
    secretKeyRef:
      name: {{ include "kelvin.fullname" $.root | quote }}
      key: {{ $key | quote }}
{{- else }}
  value: {{ printf "sha256:%s" (include "kelvin.generated" (dict "root" $.root "key" $key) | sha256sum) | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Secret data (plain values) of the generated tokens; nothing with existingSecret or mode none. */}}
{{- define "kelvin.authSecretData" -}}
{{- $a := .Values.auth -}}
{{- $data := dict -}}
{{- if and (eq $a.mode "token") (not $a.existingSecret) -}}
{{- range $role := splitList " " (include "kelvin.authRoles" .) -}}
{{- $key := include "kelvin.tokenKey" (dict "root" $ "role" $role) -}}
{{- $_ := set $data $key (include "kelvin.generated" (dict "root" $ "key" $key)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $data -}}
{{- end }}

{{/*
Host names the services answer to (auth.allowed_hosts): localhost (port-forward), every
component's Service by its short and namespaced names, any Service of the namespace
under .svc, the ingress hosts and auth.allowedHosts.
*/}}
{{- define "kelvin.allowedHosts" -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list "localhost" -}}
{{- $components := list "collect-agent" "query-api" "allocator" "pusher" -}}
{{- if .Values.slurmBridge.enabled }}{{ $components = append $components "slurm-bridge" }}{{ end -}}
{{- range $c := $components -}}
{{- $name := include "kelvin.componentName" (dict "root" $ "component" $c) -}}
{{- $hosts = concat $hosts (list $name (printf "%s.%s" $name $ns)) -}}
{{- end -}}
{{- $hosts = concat $hosts (list (printf ".%s.svc" $ns) (printf ".%s.svc.%s" $ns .Values.auth.clusterDomain)) -}}
{{- if .Values.queryApi.ingress.enabled -}}
{{- range .Values.queryApi.ingress.hosts -}}
{{- $hosts = append $hosts (tpl .host $) -}}
{{- end -}}
{{- end -}}
{{- $hosts = concat $hosts .Values.auth.allowedHosts -}}
{{- toYaml (uniq $hosts) -}}
{{- end }}

{{/* The `auth` section of kelvin.yaml (tokens are not in it: KELVIN_AUTH_*_TOKEN). */}}
{{- define "kelvin.authConfig" -}}
{{- $a := .Values.auth -}}
{{- $out := dict "mode" $a.mode "open_reads" $a.openReads "token_file" "/tmp/kelvin-auth/tokens.json" -}}
{{- $_ := set $out "allowed_hosts" (include "kelvin.allowedHosts" . | fromYamlArray) -}}
{{- $_ := set $out "allowed_origins" $a.allowedOrigins -}}
{{- toYaml $out -}}
{{- end }}
