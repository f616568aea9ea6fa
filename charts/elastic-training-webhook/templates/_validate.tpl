{{/*
Checks the schema cannot express (it checks single values). Each message names the value to fix and what to set.
Included by deployment.yaml, so a refused value fails every render (helm install, upgrade, template, lint).
*/}}
{{- define "elastic-training-webhook.validate" -}}
{{- $v := .Values -}}
{{- $fullname := include "elastic-training-webhook.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) -}}
{{- fail (printf "name %q (the release name, or fullnameOverride) must be a DNS-1035 label for the webhook's Service: lowercase letters, digits and '-', starting with a letter; set fullnameOverride" $fullname) -}}
{{- end -}}

{{- /* Ports: the webhook binds each one itself; two equal ports crash it at start. */ -}}
{{- $ports := dict "webhook.port" (int $v.webhook.port) "healthPort" (int $v.healthPort) -}}
{{- if $v.metrics.enabled -}}
{{- $_ := set $ports "metrics.port" (int $v.metrics.port) -}}
{{- end -}}
{{- $names := keys $ports | sortAlpha -}}
{{- range $i, $a := $names -}}
{{- range $b := slice $names (add1 $i) -}}
{{- if eq (get $ports $a) (get $ports $b) -}}
{{- fail (printf "%s and %s are both %d: the webhook listens on each itself and would crash at start with \"address already in use\"; set one of them to a free port (defaults: webhook.port=9443, healthPort=8081, metrics.port=8080)" $a $b (get $ports $a)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.metrics.enabled (eq (int $v.metrics.port) 443) -}}
{{- fail "metrics.port is 443, the Service's https port: the Service would list port 443 twice and the API server refuses it; set metrics.port to another port (default 8080)" -}}
{{- end -}}

{{- /* logLevel: exactly what cmd/webhook's --zap-log-level (controller-runtime's zap flag) accepts. */ -}}
{{- $level := $v.logLevel -}}
{{- $ok := false -}}
{{- if kindIs "string" $level -}}
{{- /* The flag's own test: a name, or strconv.Atoi without error (sign, digits, within int64) and > 0. */ -}}
{{- $digits := regexReplaceAll "^[+]?0*" $level "" -}}
{{- $int := and (regexMatch "^[+]?0*[1-9][0-9]*$" $level) (or (lt (len $digits) 19) (and (eq (len $digits) 19) (le $digits "9223372036854775807"))) -}}
{{- $ok = or (has (lower $level) (list "debug" "info" "error" "panic")) $int -}}
{{- else if or (kindIs "float64" $level) (kindIs "int64" $level) (kindIs "int" $level) -}}
{{- $ok = and (eq (float64 $level) (float64 (int64 $level))) (gt (int64 $level) 0) -}}
{{- end -}}
{{- if not $ok -}}
{{- fail (printf "logLevel %v: the webhook's --zap-log-level accepts debug, info, error or panic (any case) or an integer verbosity >= 1 (higher logs more; 0 and warn are refused and it would not start); set logLevel to one of them (default info)" $level) -}}
{{- end -}}

{{- /* A PodDisruptionBudget that keeps every replica up blocks every node drain. With one replica the chart
leaves the PDB out (pdbEnabled); with more, refuse a minAvailable that covers them all. */ -}}
{{- if include "elastic-training-webhook.pdbEnabled" . -}}
{{- $min := $v.podDisruptionBudget.minAvailable -}}
{{- $replicas := int $v.replicaCount -}}
{{- $blocks := false -}}
{{- if kindIs "string" $min -}}
{{- /* Kubernetes rounds a percentage of minAvailable up: ceil(p*r/100) >= r. */ -}}
{{- $p := int (trimSuffix "%" $min) -}}
{{- $blocks = gt (mul $p $replicas) (mul 100 (sub $replicas 1)) -}}
{{- else -}}
{{- $blocks = ge (int $min) $replicas -}}
{{- end -}}
{{- if $blocks -}}
{{- fail (printf "podDisruptionBudget.minAvailable %v with replicaCount %d keeps every replica up, so no node drain could evict one; raise replicaCount, lower podDisruptionBudget.minAvailable (e.g. 1), or set podDisruptionBudget.enabled=false" $min $replicas) -}}
{{- end -}}
{{- end -}}

{{- if and $v.metrics.serviceMonitor.enabled (not $v.metrics.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled=true: with metrics off the webhook serves no /metrics to scrape; set metrics.enabled=true or metrics.serviceMonitor.enabled=false" -}}
{{- end -}}

{{- /* Names and paths the chart uses itself: a duplicate is refused by the API server. */ -}}
{{- range $v.extraVolumes -}}
{{- if eq .name "tls" -}}
{{- fail "extraVolumes: the volume name \"tls\" is the chart's own (the serving certificate); give the extra volume another name" -}}
{{- end -}}
{{- end -}}
{{- range $v.extraVolumeMounts -}}
{{- if eq (clean .mountPath) "/etc/elastic-training-webhook/tls" -}}
{{- fail "extraVolumeMounts: /etc/elastic-training-webhook/tls is where the chart mounts the serving certificate; mount the extra volume elsewhere" -}}
{{- end -}}
{{- end -}}
{{- end -}}
