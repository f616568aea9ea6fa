{{/*
Names. Every object's name derives from "elastic-training-webhook.fullname": the release name when it contains the
chart name (the documented `helm install elastic-training-webhook ...` gives elastic-training-webhook), otherwise
<release>-<chart>; fullnameOverride replaces it, nameOverride replaces the chart name in it and in the
app.kubernetes.io/name label.
*/}}
{{- define "elastic-training-webhook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "elastic-training-webhook.fullname" -}}
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

{{/* Where the serving certificate comes from: cert-manager (tls.certManager.enabled), rotator (the webhook
process, tls.rotator.enabled, the default) or helm (generated once by the chart; also with webhook.url, whose host
may be an IP address, which the rotator's certificates cannot name). */}}
{{- define "elastic-training-webhook.tlsSource" -}}
{{- if .Values.tls.certManager.enabled }}cert-manager{{ else if and .Values.tls.rotator.enabled (not .Values.webhook.url) }}rotator{{ else }}helm{{ end }}
{{- end }}

{{/* The TLS Secret. The rotator's has a name of its own: its type is Opaque (a kubernetes.io/tls Secret must carry
data, which the chart leaves to the rotator), and a Secret's type cannot change on upgrade. */}}
{{- define "elastic-training-webhook.tlsSecret" -}}
{{- printf "%s-%s" (include "elastic-training-webhook.fullname" .) (ternary "serving-cert" "tls" (eq (include "elastic-training-webhook.tlsSource" .) "rotator")) }}
{{- end }}

{{/* The ServiceAccount the webhook runs as: the chart's own (create), or one that exists (name, else default). */}}
{{- define "elastic-training-webhook.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elastic-training-webhook.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* logLevel as --zap-log-level gets it: numbers from a values file are float64, printed without an exponent. */}}
{{- define "elastic-training-webhook.logLevel" -}}
{{- if kindIs "string" .Values.logLevel }}
{{- .Values.logLevel }}
{{- else }}
{{- int64 .Values.logLevel }}
{{- end }}
{{- end }}

{{/* The PodDisruptionBudget is rendered only with more than one replica: with one, any minAvailable >= 1 would
block every node drain, and minAvailable 0 protects nothing. */}}
{{- define "elastic-training-webhook.pdbEnabled" -}}
{{- if and .Values.podDisruptionBudget.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/*
An image of ours (dict "image" <values> "root" $): [registry/]repository[:tag][@digest]. The registry is the image's
own `registry`, else global.imageRegistry, each replacing the registry host the repository names (its first part
when that has a '.' or ':' or is localhost), so that one value moves every image to a mirror; the tag defaults to
the chart's appVersion, which the release workflow sets to the version it builds the images with; a digest wins
over the tag.
*/}}
{{- define "elastic-training-webhook.image" -}}
{{- $registry := .image.registry | default ((.root.Values.global | default dict).imageRegistry) -}}
{{- $repo := .image.repository -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = rest $parts | join "/" -}}
{{- end -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString .image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}
{{- end }}

{{/* The webhook's alert rules (metrics.prometheusRule), as the spec of a PrometheusRule: also a rules file of
Prometheus itself (test/integration checks them with promtool and a real Prometheus). */}}
{{- define "elastic-training-webhook.alertRules" -}}
groups:
  - name: elastic-training-webhook
    rules:
      - alert: ElasticTrainingWebhookErrors
        expr: sum(increase(elastic_training_webhook_pods_total{result="errored"}[10m])) > 0
        labels:
          severity: critical
        annotations:
          summary: The elastic-training webhook failed to mutate pods.
          description: Pods of elastic-training jobs were refused for an error of the webhook itself (not a denial of their values) in the last 10 minutes; their Jobs and StatefulSets show FailedCreate. See the webhook's log (kubectl logs -n {{ .Release.Namespace }} deploy/{{ include "elastic-training-webhook.fullname" . }}).
{{- end -}}
