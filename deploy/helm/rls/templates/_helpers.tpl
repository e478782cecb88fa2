{{/* The chart's name, and the release's full name (at most 63 characters, a DNS label). */}}
{{- define "rls.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rls.fullname" -}}
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

{{/* The Service Envoy calls: in aiGateway mode the name Envoy AI Gateway's QuotaPolicy filter dials. */}}
{{- define "rls.serviceName" -}}
{{- if eq .Values.mode "aiGateway" }}
{{- .Values.aiGateway.serviceName }}
{{- else if .Values.service.name }}
{{- .Values.service.name }}
{{- else }}
{{- include "rls.fullname" . }}
{{- end }}
{{- end }}

{{- define "rls.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rls.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rls.labels" -}}
{{ include "rls.selectorLabels" . }}
app.kubernetes.io/version: {{ include "rls.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rls.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* Redis: the bundled one's names and labels. */}}
{{- define "rls.redisName" -}}
{{- printf "%s-redis" (include "rls.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rls.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "rls.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The Secret holding the external Redis URL, and its key. */}}
{{- define "rls.redisSecretName" -}}
{{- if .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecret }}
{{- else }}
{{- printf "%s-redis-url" (include "rls.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "rls.redisSecretKey" -}}
{{- if .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecretKey }}
{{- else }}
{{- "url" }}
{{- end }}
{{- end }}

{{/* The rules ConfigMap: the user's own, or the chart's. */}}
{{- define "rls.rulesConfigMap" -}}
{{- if .Values.rules.existingConfigMap }}
{{- .Values.rules.existingConfigMap }}
{{- else }}
{{- printf "%s-rules" (include "rls.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The port Prometheus scrapes: a metrics port of its own when set, else http. */}}
{{- define "rls.metricsPortName" -}}
{{- if .Values.service.metricsPort }}metrics{{ else }}http{{ end }}
{{- end }}

{{/*
Whether a monitoring.coreos.com/v1 kind is rendered: asked for, and either the API is served
by the cluster (helm install/upgrade/template --api-versions) or the user forces it.
*/}}
{{- define "rls.monitoringAPI" -}}
{{- if or .Values.monitoring.force (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/* Refuse values that cannot work, with what to change. */}}
{{- define "rls.validate" -}}
{{- $modes := list "standalone" "envoyGateway" "aiGateway" }}
{{- if not (has .Values.mode $modes) }}
{{- fail (printf "mode %q: want one of %s" .Values.mode (join ", " $modes)) }}
{{- end }}
{{- $redis := list "none" "external" "bundled" }}
{{- if not (has .Values.redis.mode $redis) }}
{{- fail (printf "redis.mode %q: want one of %s" .Values.redis.mode (join ", " $redis)) }}
{{- end }}
{{- if and (eq .Values.redis.mode "external") (not .Values.redis.external.existingSecret) (not .Values.redis.external.url) }}
{{- fail "redis.mode external: set redis.external.existingSecret (a Secret holding the URL) or redis.external.url" }}
{{- end }}
{{- if and (eq .Values.redis.mode "none") (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) }}
{{- fail "redis.mode none keeps every counter in its own pod's memory, so each replica would allow the whole limit: use one replica without autoscaling, or set redis.mode external (or bundled, to try it)" }}
{{- end }}
{{- if and (eq .Values.mode "envoyGateway") (eq .Values.redis.mode "none") }}
{{- fail "mode envoyGateway: Envoy Gateway's rate limiting is global, counted in Redis: set redis.mode external (or bundled, to try it)" }}
{{- end }}
{{- if and (eq .Values.mode "standalone") (not .Values.rules.existingConfigMap) (eq (len (get .Values.rules "files" | default dict)) 0) }}
{{- fail "mode standalone needs rules: set rules.files (inline rule files) or rules.existingConfigMap" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled: set tls.secretName, a kubernetes.io/tls Secret (tls.crt, tls.key)" }}
{{- end }}
{{- if and .Values.tls.clientCA.enabled (not .Values.tls.enabled) }}
{{- fail "tls.clientCA.enabled (mTLS) needs tls.enabled" }}
{{- end }}
{{- if and .Values.tls.http (not .Values.tls.enabled) }}
{{- fail "tls.http (the HTTP listener over TLS) needs tls.enabled, whose certificate it uses" }}
{{- end }}
{{- if and .Values.tls.http .Values.monitoring.serviceMonitor.enabled (include "rls.monitoringAPI" .) (not .Values.service.metricsPort) }}
{{- fail "tls.http with monitoring.serviceMonitor.enabled: set service.metricsPort, a plain-HTTP listener of /metrics alone for Prometheus to scrape" }}
{{- end }}
{{- if and (eq .Values.mode "envoyGateway") .Values.tls.enabled }}
{{- fail "mode envoyGateway: TLS comes from Envoy Gateway's envoy-rate-limit Secret (envoyGateway.certsSecret); leave tls.enabled false" }}
{{- end }}
{{- if and (eq .Values.mode "aiGateway") (ne .Release.Namespace .Values.aiGateway.namespace) }}
{{- fail (printf "mode aiGateway: install into namespace %q, where Envoy AI Gateway's controller (--quotaRateLimitServiceAddr) expects %s; this release is in %q (or set aiGateway.namespace to match the controller's flag)" .Values.aiGateway.namespace .Values.aiGateway.serviceName .Release.Namespace) }}
{{- end }}
{{- end }}
