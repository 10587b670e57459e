{{/* Scrape settings shared by ServiceMonitor and PodMonitor endpoints. */}}
{{- define "kelvin.scrapeEndpoint" -}}
port: http
path: /metrics
scheme: http
{{- with .interval }}
interval: {{ . }}
{{- end }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
honorLabels: {{ .honorLabels }}
{{- with .relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Components that have a Service to scrape through. */}}
{{- define "kelvin.scrapedComponents" -}}
{{- $out := list "collect-agent" "query-api" -}}
{{- if .Values.allocator.enabled }}{{ $out = append $out "allocator" }}{{ end -}}
{{- if and .Values.pusher.enabled .Values.pusher.service.enabled }}{{ $out = append $out "pusher" }}{{ end -}}
{{- toJson $out -}}
{{- end }}
