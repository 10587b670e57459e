{{/*
Names, labels, images and the pod pieces every component shares.
Component helpers take a dict: (dict "root" $ "component" "collect-agent" "values" .Values.collectAgent).
*/}}

{{- define "kelvin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object name prefix: the release name when it already contains the chart name. */}}
{{- define "kelvin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* <fullname>-<component>, e.g. kelvin-collect-agent. */}}
{{- define "kelvin.componentName" -}}
{{- printf "%s-%s" (include "kelvin.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kelvin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades, so never the chart version. */}}
{{- define "kelvin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kelvin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kelvin.labels" -}}
helm.sh/chart: {{ include "kelvin.chart" . }}
{{ include "kelvin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kelvin
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kelvin.componentSelectorLabels" -}}
{{ include "kelvin.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kelvin.componentLabels" -}}
{{ include "kelvin.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kelvin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kelvin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from (dict "image" <block> "root" $); the Kelvin image's tag
defaults to the chart's appVersion. A digest pins the image.
*/}}
{{- define "kelvin.imageRef" -}}
{{- $registry := .root.Values.global.imageRegistry | default .image.registry -}}
{{- $ref := .image.repository -}}
{{- if $registry }}{{ $ref = printf "%s/%s" $registry $ref }}{{ end -}}
{{- $tag := .image.tag | default .defaultTag | toString -}}
{{- if eq $tag "latest" -}}
{{- fail (printf "image %s: the tag \"latest\" is refused; pin a release tag or a digest" $ref) -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $ref .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref $tag -}}
{{- end -}}
{{- end }}

{{/* The Kelvin image of a component: its `image` block merged over the top-level one. */}}
{{- define "kelvin.image" -}}
{{- $image := deepCopy .root.Values.image -}}
{{- include "kelvin.merge" (dict "dst" $image "src" (.values.image | default dict)) -}}
image: {{ include "kelvin.imageRef" (dict "image" $image "root" .root "defaultTag" .root.Chart.AppVersion) | quote }}
imagePullPolicy: {{ $image.pullPolicy }}
{{- end }}

{{- define "kelvin.podSecurityContext" -}}
{{- $ctx := deepCopy .root.Values.podSecurityContext -}}
{{- include "kelvin.merge" (dict "dst" $ctx "src" (.values.podSecurityContext | default dict)) -}}
{{- toYaml $ctx }}
{{- end }}

{{- define "kelvin.containerSecurityContext" -}}
{{- $ctx := deepCopy .root.Values.containerSecurityContext -}}
{{- include "kelvin.merge" (dict "dst" $ctx "src" (.values.securityContext | default dict)) -}}
{{- toYaml $ctx }}
{{- end }}

{{- define "kelvin.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod metadata: labels and the checksums that roll pods when their config or secrets change. */}}
{{- define "kelvin.podMetadata" -}}
labels:
  {{- include "kelvin.componentLabels" . | nindent 2 }}
  {{- with .values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ include "kelvin.config" .root | sha256sum }}
  checksum/secret: {{ include "kelvin.secretData" .root | sha256sum }}
  {{- with .values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Scheduling fields shared by every pod spec. */}}
{{- define "kelvin.scheduling" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- tpl (toYaml .) $.root | nindent 2 }}
{{- end }}
{{- end }}

{{/* The three probes of a Kelvin container (startupProbe optional). */}}
{{- define "kelvin.probes" -}}
livenessProbe:
  {{- toYaml .values.livenessProbe | nindent 2 }}
readinessProbe:
  {{- toYaml .values.readinessProbe | nindent 2 }}
{{- with .values.startupProbe }}
startupProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* `args` of a Kelvin container: the image's entrypoint is `kelvin`. */}}
{{- define "kelvin.args" -}}
args:
  - run
  - {{ .component }}
  - --config
  - /etc/kelvin/kelvin.yaml
{{- end }}

{{/* Volumes every Kelvin pod has: its configuration and a writable /tmp. */}}
{{- define "kelvin.baseVolumes" -}}
- name: config
  configMap:
    name: {{ include "kelvin.fullname" . }}-config
- name: tmp
  emptyDir: {}
{{- end }}

{{- define "kelvin.baseVolumeMounts" -}}
- name: config
  mountPath: /etc/kelvin
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
A PVC storage class from a persistence block: empty = the cluster default,
"-" = no class (static provisioning).
*/}}
{{- define "kelvin.storageClass" -}}
{{- if .storageClass }}
{{- if eq "-" .storageClass }}
storageClassName: ""
{{- else }}
storageClassName: {{ .storageClass | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* PVC spec body from a persistence block. */}}
{{- define "kelvin.pvcSpec" -}}
accessModes:
  {{- toYaml .accessModes | nindent 2 }}
{{- include "kelvin.storageClass" . }}
resources:
  requests:
    storage: {{ .size | quote }}
{{- end }}

{{/*
Addresses between Kelvin's own pods use the bare Service name: every component
runs in the release namespace, and the rendered config then does not depend on
it (the plain manifests in k8s/ are generated from this chart).
*/}}

{{/* host:port of the MQTT endpoint pushers and the allocator publish to. */}}
{{- define "kelvin.mqttEndpoint" -}}
{{- if eq .Values.mqtt.mode "external" -}}
{{- printf "%s:%d" .Values.mqtt.external.host (int .Values.mqtt.external.port) -}}
{{- else -}}
{{- printf "%s:%d" (include "kelvin.componentName" (dict "root" . "component" "collect-agent")) (int .Values.collectAgent.service.mqttPort) -}}
{{- end -}}
{{- end }}

{{/* In-cluster URL of a component's HTTP Service; "fqdn" true adds the namespace (for NOTES). */}}
{{- define "kelvin.serviceURL" -}}
{{- $host := include "kelvin.componentName" . -}}
{{- if .fqdn }}{{ $host = printf "%s.%s.svc" $host .root.Release.Namespace }}{{ end -}}
{{- printf "http://%s:%d" $host (int .port) -}}
{{- end }}

{{/*
Deep-merge (dict "dst" <map> "src" <map>): src wins, nested maps merge, lists and
scalars replace, and false/0/"" override too (sprig's mergeOverwrite ignores
them on some Helm versions). Mutates dst; renders nothing.
*/}}
{{- define "kelvin.merge" -}}
{{- $dst := .dst -}}
{{- range $key, $value := .src -}}
{{- if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) -}}
{{- include "kelvin.merge" (dict "dst" (get $dst $key) "src" $value) -}}
{{- else -}}
{{- $_ := set $dst $key (deepCopy $value) -}}
{{- end -}}
{{- end -}}
{{- end }}
