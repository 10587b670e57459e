{{/*
The pod spec of a Kelvin component: one container running `kelvin run <component>`
with its config, a writable /tmp, probes, and the component's scheduling settings.
(dict "root" $ "component" <name> "values" <component values> and optionally
"env" / "ports" / "mounts" / "volumes" / "initContainers" / "podExtra": YAML strings)
*/}}
{{- define "kelvin.podSpec" -}}
serviceAccountName: {{ include "kelvin.serviceAccountName" .root }}
automountServiceAccountToken: false
{{- include "kelvin.imagePullSecrets" .root }}
securityContext:
  {{- include "kelvin.podSecurityContext" . | nindent 2 }}
{{- with .podExtra | default "" | trim }}
{{ . }}
{{- end }}
{{- include "kelvin.scheduling" . }}
terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
{{- with .initContainers | default "" | trim }}
initContainers:
  {{- . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .component }}
    {{- include "kelvin.image" . | nindent 4 }}
    {{- include "kelvin.args" . | nindent 4 }}
    {{- $env := .env | default "" | trim }}
    {{- if or $env .values.extraEnv }}
    env:
      {{- with $env }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with .values.extraEnv }}
      {{- tpl (toYaml .) $.root | nindent 6 }}
      {{- end }}
    {{- end }}
    ports:
      {{- .ports | trim | nindent 6 }}
    {{- include "kelvin.probes" . | nindent 4 }}
    {{- with .values.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    securityContext:
      {{- include "kelvin.containerSecurityContext" . | nindent 6 }}
    volumeMounts:
      {{- include "kelvin.baseVolumeMounts" . | nindent 6 }}
      {{- with .mounts | default "" | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with .values.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  {{- include "kelvin.baseVolumes" .root | nindent 2 }}
  {{- with .volumes | default "" | trim }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- with .values.extraVolumes }}
  {{- tpl (toYaml .) $.root | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Standard object metadata of a component: name, namespace, labels. */}}
{{- define "kelvin.metadata" -}}
name: {{ include "kelvin.componentName" . }}
namespace: {{ .root.Release.Namespace }}
labels:
  {{- include "kelvin.componentLabels" . | nindent 2 }}
{{- end }}

{{/* A ClusterIP/NodePort/LoadBalancer Service spec head from a service block. */}}
{{- define "kelvin.serviceSpecHead" -}}
type: {{ .service.type | default "ClusterIP" }}
{{- if and .service.externalTrafficPolicy (ne (.service.type | default "ClusterIP") "ClusterIP") }}
externalTrafficPolicy: {{ .service.externalTrafficPolicy }}
{{- end }}
{{- if and .service.loadBalancerSourceRanges (eq .service.type "LoadBalancer") }}
loadBalancerSourceRanges:
  {{- toYaml .service.loadBalancerSourceRanges | nindent 2 }}
{{- end }}
selector:
  {{- include "kelvin.componentSelectorLabels" . | nindent 2 }}
{{- end }}
