{{/*
kelvin.yaml: the one configuration file every Kelvin container reads
(`--config /etc/kelvin/kelvin.yaml`). Keys are the services' settings fields
(services/<service>/settings.py and services/common/storage/settings.py); secrets are not
here but in KELVIN_* environment variables (_secrets.tpl), which take precedence.
*/}}

{{/*
One InfluxDB block of the storage settings. (dict "v" <values> "base" <values> "url" <url>):
every field of "v" falls back to "base" (shards inherit storage.influxdb).
*/}}
{{- define "kelvin.influxSettings" -}}
{{- $v := .v -}}
{{- $b := .base -}}
{{- $out := dict "url" .url -}}
{{- $optional := list "retentionPolicy" "retentionDuration" "org" -}}
{{- range $field, $key := dict "database" "database" "measurement" "measurement" "createDatabase" "create_database" "timeoutSeconds" "timeout_s" "retries" "retries" "retentionPolicy" "retention_policy" "retentionDuration" "retention_duration" "org" "org" -}}
{{- $value := ternary (get $v $field) (get $b $field) (hasKey $v $field) -}}
{{- /* empty optional strings stay unset (None: the server's default) */ -}}
{{- if or $value (not (has $field $optional)) -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{- define "kelvin.storageConfig" -}}
{{- $s := .Values.storage -}}
{{- $out := dict "backend" $s.backend -}}
{{- if eq $s.backend "influxdb" -}}
{{- $url := $s.influxdb.url -}}
{{- if .Values.influxdb.enabled -}}
{{- $url = include "kelvin.serviceURL" (dict "root" . "component" "influxdb" "port" .Values.influxdb.service.port) -}}
{{- end -}}
{{- if not $url -}}
{{- fail "storage.influxdb.url is empty: set it to your InfluxDB (e.g. http://influxdb.monitoring.svc:8086) or set influxdb.enabled=true for the bundled one" -}}
{{- end -}}
{{- $_ := set $out "influxdb" (include "kelvin.influxSettings" (dict "v" $s.influxdb "base" $s.influxdb "url" $url) | fromYaml) -}}
{{- else if eq $s.backend "clickhouse" -}}
{{- $c := $s.clickhouse -}}
{{- if not $c.urls -}}
{{- fail "storage.backend=clickhouse needs storage.clickhouse.urls (the HTTP endpoints of your ClickHouse nodes, e.g. http://chi-kelvin-kelvin-0-0.clickhouse.svc:8123)" -}}
{{- end -}}
{{- $ch := dict "urls" $c.urls "database" $c.database "create_tables" $c.createTables "rollups" $c.rollups "timeout_s" $c.timeoutSeconds "retries" $c.retries -}}
{{- if $c.cluster -}}
{{- $_ := set $ch "cluster" $c.cluster -}}
{{- $_ := set $ch "insert_quorum" $c.insertQuorum -}}
{{- end -}}
{{- if $c.rawTtlSeconds -}}
{{- $_ := set $ch "raw_ttl_s" $c.rawTtlSeconds -}}
{{- end -}}
{{- $_ := set $out "clickhouse" $ch -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{- define "kelvin.collectAgentConfig" -}}
{{- $c := .Values.collectAgent -}}
{{- $m := .Values.mqtt -}}
{{- $out := dict "host" "0.0.0.0" "port" $c.service.httpPort "spool_dir" "/var/lib/kelvin/spool" "spool_max_bytes" (int64 $c.spool.maxBytes) "fsync" $c.spool.fsync -}}
{{- $out = merge $out (include "kelvin.collectAgentSpoolConfig" . | fromYaml) -}}
{{- if eq $m.mode "external" -}}
{{- if not $m.external.host -}}
{{- fail "mqtt.mode=external needs mqtt.external.host (the broker the pushers publish to)" -}}
{{- end -}}
{{- $_ := set $out "mqtt_enabled" false -}}
{{- $broker := dict "host" $m.external.host "port" $m.external.port "tls" $m.external.tls "group" $m.external.group "prefixes" $m.external.prefixes "session_expiry_s" $m.external.sessionExpirySeconds "keepalive_s" $m.external.keepaliveSeconds -}}
{{- $_ := set $out "broker" $broker -}}
{{- else -}}
{{- $_ := set $out "mqtt_enabled" true -}}
{{- $_ := set $out "mqtt_port" $c.service.mqttPort -}}
{{- $out = merge $out (include "kelvin.mqttAgentConfig" . | fromYaml) -}}
{{- end -}}
{{- include "kelvin.merge" (dict "dst" $out "src" $c.config) -}}
{{- toYaml $out -}}
{{- end }}

{{- define "kelvin.queryApiConfig" -}}
{{- $q := .Values.queryApi -}}
{{- $out := dict "host" "0.0.0.0" "port" $q.service.port -}}
{{- $_ := set $out "allocator_url" (include "kelvin.serviceURL" (dict "root" . "component" "allocator" "port" .Values.allocator.service.port)) -}}
{{- $_ := set $out "collect_agent_url" (include "kelvin.serviceURL" (dict "root" . "component" "collect-agent" "port" .Values.collectAgent.service.httpPort)) -}}
{{- include "kelvin.merge" (dict "dst" $out "src" $q.config) -}}
{{- toYaml $out -}}
{{- end }}

{{- define "kelvin.allocatorConfig" -}}
{{- $a := .Values.allocator -}}
{{- $out := dict "host" "0.0.0.0" "port" $a.service.port "state_dir" "/var/lib/kelvin/allocator" "policy" $a.policy -}}
{{- if $a.hall.configMap -}}
{{- $_ := set $out "hall_file" (printf "/etc/kelvin-hall/%s" $a.hall.file) -}}
{{- end -}}
{{- $_ := set $out "brokers" (list (include "kelvin.mqttEndpoint" .)) -}}
{{- $out = merge $out (include "kelvin.mqttClientConfig" (dict "root" . "component" "allocator") | fromYaml) -}}
{{- $_ := set $out "query_api_url" (include "kelvin.serviceURL" (dict "root" . "component" "query-api" "port" .Values.queryApi.service.port)) -}}
{{- include "kelvin.merge" (dict "dst" $out "src" $a.config) -}}
{{- toYaml $out -}}
{{- end }}

{{- define "kelvin.pusherConfig" -}}
{{- $p := .Values.pusher -}}
{{- $out := dict "host" "0.0.0.0" "port" $p.port "state_dir" "/var/lib/kelvin/pusher" -}}
{{- $plugins := dict -}}
{{- range $name, $section := $p.plugins -}}
{{- if kindIs "map" $section -}}
{{- $section = deepCopy $section -}}
{{- if and (eq (get $section "plugin" | default $name) "sysfs") (not (hasKey $section "rapl")) -}}
{{- $_ := set $section "rapl" $p.rapl.enabled -}}
{{- end -}}
{{- $_ := set $plugins $name $section -}}
{{- end -}}
{{- end -}}
{{- with $plugins }}{{ $_ := set $out "plugins" . }}{{ end -}}
{{- $_ := set $out "brokers" (list (include "kelvin.mqttEndpoint" .)) -}}
{{- $out = merge $out (include "kelvin.mqttClientConfig" (dict "root" . "component" "pusher") | fromYaml) -}}
{{- $_ := set $out "allocator_url" (include "kelvin.serviceURL" (dict "root" . "component" "allocator" "port" .Values.allocator.service.port)) -}}
{{- include "kelvin.merge" (dict "dst" $out "src" $p.config) -}}
{{- toYaml $out -}}
{{- end }}

{{- define "kelvin.config" -}}
{{- $v := .Values -}}
{{- $cfg := dict -}}
{{- $_ := set $cfg "logging" (dict "level" $v.logging.level "json_format" $v.logging.jsonFormat "access_log" $v.logging.accessLog) -}}
{{- $_ := set $cfg "auth" (include "kelvin.authConfig" . | fromYaml) -}}
{{- $_ := set $cfg "storage" (include "kelvin.storageConfig" . | fromYaml) -}}
{{- $_ := set $cfg "collect_agent" (include "kelvin.collectAgentConfig" . | fromYaml) -}}
{{- $_ := set $cfg "query_api" (include "kelvin.queryApiConfig" . | fromYaml) -}}
{{- if $v.allocator.enabled -}}
{{- $_ := set $cfg "allocator" (include "kelvin.allocatorConfig" . | fromYaml) -}}
{{- end -}}
{{- if $v.pusher.enabled -}}
{{- $_ := set $cfg "pusher" (include "kelvin.pusherConfig" . | fromYaml) -}}
{{- end -}}
{{- if $v.slurmBridge.enabled -}}
{{- $_ := set $cfg "slurm_bridge" (include "kelvin.slurmBridgeConfig" . | fromYaml) -}}
{{- /* the allocator then follows Slurm (docs/slurm.md) */ -}}
{{- $_ := set $cfg.allocator "cluster" "external" -}}
{{- end -}}
{{- include "kelvin.merge" (dict "dst" $cfg "src" $v.config) -}}
{{- toYaml $cfg -}}
{{- end }}
