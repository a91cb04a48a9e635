{{/* The chart's name (app.kubernetes.io/name of the agent). */}}
{{- define "otel-numa.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name when it already contains the chart name, else release-chart. */}}
{{- define "otel-numa.fullname" -}}
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

{{/* The namespace of every object: namespaceOverride, else the release's. */}}
{{- define "otel-numa.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-numa.gatewayName" -}}
{{- printf "%s-gateway" (include "otel-numa.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-numa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-numa.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Helm's bookkeeping labels, on objects only (never on pod templates: a chart bump alone must not roll the pods). */}}
{{- define "otel-numa.chartLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "otel-numa.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-numa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{/* Labels of the agent's pods (the kustomize base's, plus podLabels). */}}
{{- define "otel-numa.podLabels" -}}
app.kubernetes.io/name: {{ include "otel-numa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: otel-numa
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "otel-numa.labels" -}}
{{ include "otel-numa.podLabels" . }}
{{ include "otel-numa.chartLabels" . }}
{{- end }}

{{- define "otel-numa.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-numa.name" . }}-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "otel-numa.gatewayPodLabels" -}}
{{ include "otel-numa.gatewaySelectorLabels" . }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: otel-numa
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "otel-numa.gatewayLabels" -}}
{{ include "otel-numa.gatewayPodLabels" . }}
{{ include "otel-numa.chartLabels" . }}
{{- end }}

{{/*
[registry/]repository:tag, or @digest when the image value has one; global.imageRegistry (a mirror) wins over
the image's own registry. Arguments: (dict "image" .Values.image "root" $ "tag" DEFAULT_TAG).
*/}}
{{- define "otel-numa.imageReference" -}}
{{- $registry := default .image.registry (dig "imageRegistry" "" (.root.Values.global | default dict)) }}
{{- $name := .image.repository }}
{{- with $registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end }}
{{- if .image.digest }}
{{- printf "%s@%s" $name .image.digest }}
{{- else }}
{{- printf "%s:%s" $name (default .tag .image.tag) }}
{{- end }}
{{- end }}

{{/* The agent's image; refused until the operator names one. */}}
{{- define "otel-numa.image" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is not set, and no public registry publishes an otel-numa image. Build and push one: `bash scripts/build-image.sh --tag REGISTRY/otel-numa:TAG --push`, then install with --set image.repository=REGISTRY/otel-numa --set image.tag=TAG" }}
{{- end }}
{{- include "otel-numa.imageReference" (dict "image" .Values.image "root" . "tag" .Chart.AppVersion) }}
{{- end }}

{{/* A Kubernetes quantity (128Mi, 1G, 134217728) in bytes. */}}
{{- define "otel-numa.bytes" -}}
{{- $quantity := toString . }}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $suffix := regexFind "(Ki|Mi|Gi|Ti|k|M|G|T)$" $quantity }}
{{- mulf (float64 (trimSuffix $suffix $quantity)) (get $units $suffix | default 1) | floor | int64 }}
{{- end }}

{{/* A number as PromQL reads it: 300, not 3e+02. */}}
{{- define "otel-numa.number" -}}
{{- $value := float64 . }}
{{- if eq $value (floor $value) }}{{ int64 $value }}{{ else }}{{ $value }}{{ end }}
{{- end }}

{{/* The Prometheus page is served over HTTPS: by the agent (tls.enabled) or by the RBAC proxy. */}}
{{- define "otel-numa.scheme" -}}
{{- if or .Values.tls.enabled .Values.rbacProxy.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{- define "otel-numa.clientCASecret" -}}
{{- default .Values.tls.secretName .Values.tls.clientCA.secretName }}
{{- end }}

{{/* Where the agent pushes OTLP: the configured endpoint, else this chart's gateway. */}}
{{- define "otel-numa.otlpEndpoint" -}}
{{- if .Values.otlp.endpoint }}
{{- .Values.otlp.endpoint }}
{{- else if .Values.gateway.enabled }}
{{- $port := ternary 4317 4318 (eq .Values.otlp.protocol "grpc") }}
{{- printf "http://%s.%s.svc:%d" (include "otel-numa.gatewayName" .) (include "otel-numa.namespace" .) $port }}
{{- else if has "otlp" .Values.exporters }}
{{- fail "exporters includes otlp: set otlp.endpoint, or gateway.enabled=true for this chart's collector gateway" }}
{{- end }}
{{- end }}

{{/*
Scrape settings shared by the ServiceMonitor and the PodMonitor endpoint. The job label is always
"otel-numa" (the alert rules select up{job="otel-numa"}); k8s_node_name comes from the pod's node, so even
`up` names the node, and honorLabels keeps the agent's own k8s_node_name on its series.
Arguments: (dict "root" $ "monitor" .Values.serviceMonitor "kind" "ServiceMonitor").
*/}}
{{- define "otel-numa.scrapeEndpoint" -}}
{{- $root := .root }}
{{- $monitor := .monitor -}}
path: /metrics
scheme: {{ include "otel-numa.scheme" $root }}
interval: {{ $monitor.interval }}
scrapeTimeout: {{ $monitor.scrapeTimeout }}
honorLabels: true
relabelings:
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: k8s_node_name
  - action: replace
    targetLabel: job
    replacement: otel-numa
  {{- with $monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if eq (include "otel-numa.scheme" $root) "https" }}
{{- $tls := dict }}
{{- if $root.Values.tls.enabled }}
{{- $_ := set $tls "ca" (dict "secret" (dict "name" $root.Values.tls.secretName "key" $root.Values.tls.caKey)) }}
{{- $_ := set $tls "serverName" (printf "%s.%s.svc" (include "otel-numa.fullname" $root) (include "otel-numa.namespace" $root)) }}
{{- else }}
{{- /* kube-rbac-proxy without a certificate of ours serves a self-signed one */}}
{{- $_ := set $tls "insecureSkipVerify" true }}
{{- end }}
{{- $tls = mergeOverwrite $tls (deepCopy $monitor.tlsConfig) }}
{{- if and $root.Values.tls.enabled $root.Values.tls.clientCA.enabled (not (or $tls.cert $tls.certFile)) }}
{{- fail (printf "tls.clientCA.enabled: the agent requires client certificates, so %s.tlsConfig needs cert and keySecret (Prometheus's client certificate)" (untitle .kind)) }}
{{- end }}
tlsConfig:
  {{- toYaml $tls | nindent 2 }}
{{- end }}
{{- with $monitor.authorization }}
authorization:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
