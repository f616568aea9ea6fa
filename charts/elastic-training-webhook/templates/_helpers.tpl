{{- define "elastic-training-webhook.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "elastic-training-webhook.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "elastic-training-webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elastic-training-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "elastic-training-webhook.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "elastic-training-webhook.selectorLabels" . }}
app.kubernetes.io/component: admission-webhook
app.kubernetes.io/part-of: elastic-training
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "elastic-training-webhook.tlsSecret" -}}
{{- printf "%s-tls" (include "elastic-training-webhook.fullname" .) }}
{{- end }}
