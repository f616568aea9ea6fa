{{/*
Checks that need more than one value (the schema checks single values). Each message names the value to fix.
*/}}
{{- define "elastic-training.validate" -}}
{{- $v := .Values -}}
{{- $job := include "elastic-training.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $job) -}}
{{- fail (printf "job name %q (the release name or fullnameOverride) must be a DNS label: lowercase letters, digits and '-', starting with a letter" $job) -}}
{{- end -}}
{{- range $name, $g := $v.workerGroups -}}
{{- if has $name (list "worker" "launcher" "scheduler" "server" "rdzv") -}}
{{- fail (printf "workerGroups.%s: the group name %q is reserved (use workers for the main group)" $name $name) -}}
{{- end -}}
{{- end -}}
{{- $plan := include "elastic-training.plan" . | fromYaml -}}
{{- $members := 0 -}}
{{- range $g := $plan.groups -}}
{{- $name := printf "%s-%s" $job $g.name -}}
{{- if $g.member -}}
{{- $members = add1 $members -}}
{{- $r := int $g.replicas -}}{{- $lo := int $g.minReplicas -}}{{- $hi := int $g.maxReplicas -}}
{{- if gt $lo $hi -}}
{{- fail (printf "%s: minReplicas (%d) is greater than maxReplicas (%d)" $g.path $lo $hi) -}}
{{- end -}}
{{- if or (lt $r $lo) (gt $r $hi) -}}
{{- fail (printf "%s: replicas %d is outside minReplicas..maxReplicas (%d..%d); a running job keeps the range it was installed with (uninstall and install again to widen it)" $g.path $r $lo $hi) -}}
{{- end -}}
{{- end -}}
{{- if eq $g.kind "Job" -}}
{{- $host := printf "%s-%d" $name (sub (max (int $g.replicas) (int $g.maxReplicas)) 1) -}}
{{- if gt (len $host) 63 -}}
{{- fail (printf "%s: pod hostname %q is longer than 63 characters; use a shorter release name (fullnameOverride) or group name" $g.path $host) -}}
{{- end -}}
{{- else if gt (len $name) 52 -}}
{{- fail (printf "%s: StatefulSet name %q is longer than 52 characters; use a shorter release name (fullnameOverride) or group name" $g.path $name) -}}
{{- end -}}
{{- end -}}
{{- if and (gt $members 0) (lt (int $plan.minNodes) 1) -}}
{{- fail "minReplicas: the worker groups' minReplicas add up to 0; at least one member must be required (workers.minReplicas >= 1)" -}}
{{- end -}}
{{- if $.Release.IsUpgrade -}}
{{- /* min/max nodes are in every pod template; a Job's template cannot change, a StatefulSet's would restart its pods. */ -}}
{{- range $g := $plan.groups -}}
{{- if $g.member -}}
{{- $live := lookup (ternary "batch/v1" "apps/v1" (eq $g.kind "Job")) $g.kind $.Release.Namespace (printf "%s-%s" $job $g.name) -}}
{{- $ann := dig "spec" "template" "metadata" "annotations" dict ($live | default dict) -}}
{{- $liveMin := index $ann "elastic-training.io/min-nodes" | default "" -}}
{{- $liveMax := index $ann "elastic-training.io/max-nodes" | default "" -}}
{{- if and $liveMin (or (ne $liveMin (toString (int $plan.minNodes))) (ne $liveMax (toString (int $plan.maxNodes)))) -}}
{{- fail (printf "minReplicas/maxReplicas: this job was installed with min-nodes %s and max-nodes %s (now %d and %d); they are in every pod template, which Kubernetes does not let a running Job change: keep them, or uninstall and install again" $liveMin $liveMax (int $plan.minNodes) (int $plan.maxNodes)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.framework "mxnet") $.Release.IsUpgrade -}}
{{- /* MXNet is not elastic: DMLC_NUM_WORKER / DMLC_NUM_SERVER are in every pod template, and a Job's template is immutable. */ -}}
{{- range $g := $plan.groups -}}
{{- if or $g.member (eq $g.role "server") -}}
{{- $kind := ternary "Job" "StatefulSet" (eq $g.kind "Job") -}}
{{- $live := lookup (ternary "batch/v1" "apps/v1" (eq $g.kind "Job")) $kind $.Release.Namespace (printf "%s-%s" $job $g.name) -}}
{{- if $live -}}
{{- $have := int (ternary (dig "spec" "completions" 0 $live) (dig "spec" "replicas" 0 $live) (eq $g.kind "Job")) -}}
{{- if ne $have (int $g.replicas) -}}
{{- fail (printf "%s.replicas: MXNet jobs are not elastic (DMLC_NUM_WORKER and DMLC_NUM_SERVER are fixed when the job starts); %s %s-%s runs %d, to run %d: helm uninstall and install again" $g.path $kind $job $g.name $have (int $g.replicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $members 0 -}}
{{- fail "no worker group: enable workers or add one under workerGroups" -}}
{{- end -}}
{{- $backend := $v.rendezvous.backend -}}
{{- /* The backend is torchrun's: other frameworks use only the sidecar's membership, whatever it says. */ -}}
{{- if and (eq $backend "c10d") (eq $v.framework "pytorch") $v.rendezvous.tls.secretName -}}
{{- fail "rendezvous.tls works with backend etcd-v2 or etcd, not c10d (torch's TCPStore has no TLS): set rendezvous.backend=etcd-v2 (the trainer image then needs python-etcd)" -}}
{{- end -}}
{{- if eq $v.framework "mpi" -}}
{{- if not (or $v.mpi.launcher.command $v.command (include "elastic-training.hasScript" .)) -}}
{{- fail "mpi.launcher.command is empty: give the launcher's command (e.g. [mpirun, python3, train.py]) or a script" -}}
{{- end -}}
{{- end -}}
{{- if include "elastic-training.hasScript" . -}}
{{- $size := len $v.script -}}
{{- range $name, $c := $v.scriptFiles -}}
{{- $size = add $size (len $c) (len $name) -}}
{{- if eq $name $v.scriptName -}}
{{- if $v.script -}}
{{- fail (printf "scriptFiles.%s has the same name as the script (scriptName); rename one of them" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt $size 1000000 -}}
{{- fail (printf "script and scriptFiles hold %d bytes; a ConfigMap holds at most 1 MiB: put large files on the data volume (persistence)" $size) -}}
{{- end -}}
{{- if not (or $v.script (hasKey $v.scriptFiles $v.scriptName)) -}}
{{- if not (or $v.command $v.workers.command) -}}
{{- fail (printf "scriptFiles has no file named %q (scriptName): set scriptName to the file to run, or give command" $v.scriptName) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.persistence.enabled (not $v.persistence.existingClaim) (not $v.persistence.size) -}}
{{- fail "persistence.size is empty: give a size (e.g. 10Gi) or persistence.existingClaim" -}}
{{- end -}}
{{- end -}}
