{{/*
Checks of one group's pod against the webhook's rules (_contract.tpl, generated from the webhook's own constants):
what the webhook would deny after `helm install` succeeded (the reason only in `kubectl describe job`), or what
would silently not do what the values say, fails here with the value to fix. Input: the podTemplate's dict.
*/}}
{{- define "elastic-training.checkGroup" -}}
{{- $c := include "elastic-training.contract" . | fromJson -}}
{{- $rv := .root.Values -}}
{{- $g := .g -}}
{{- $gv := $g.values | default dict -}}
{{- $p := $g.path -}}
{{- if eq $rv.containerName $c.sidecarContainer -}}
{{- fail (printf "containerName: %q is the name of the rendezvous sidecar the webhook injects: choose another" $rv.containerName) -}}
{{- end -}}
{{- /* The volumes and mounts the chart adds itself, by name and path, and the value that adds each. */ -}}
{{- $own := list -}}
{{- if include "elastic-training.hasScript" .root -}}{{- $own = append $own (dict "name" "script" "path" (include "elastic-training.scriptDir" .root) "by" "script") -}}{{- end -}}
{{- if $rv.persistence.enabled -}}{{- $own = append $own (dict "name" "data" "path" $rv.persistence.mountPath "by" "persistence.enabled") -}}{{- end -}}
{{- if and (eq $rv.framework "pytorch") $rv.checkpoint.memory -}}{{- $own = append $own (dict "name" "elastic-training-checkpoints" "path" "" "by" "checkpoint.memory") -}}{{- end -}}
{{- if (include "elastic-training.shm" . | fromYaml).enabled -}}{{- $own = append $own (dict "name" "dshm" "path" "/dev/shm" "by" (printf "shm.enabled (or %s.shm.enabled)" $p)) -}}{{- end -}}
{{- if and (eq $rv.framework "mpi") $rv.mpi.ssh.enabled -}}{{- $own = concat $own (list (dict "name" "ssh" "path" $rv.mpi.ssh.mountPath "by" "mpi.ssh.enabled") (dict "name" "ssh-key" "path" "" "by" "mpi.ssh.enabled")) -}}{{- end -}}
{{- range $where := list (dict "path" "volumes" "list" $rv.volumes) (dict "path" (printf "%s.volumes" $p) "list" $gv.volumes) -}}
{{- range $where.list -}}
{{- if has .name $c.reservedVolumes -}}
{{- fail (printf "%s: volume name %q is reserved for the volume the webhook adds (reserved: %s): rename it" $where.path .name (join ", " $c.reservedVolumes)) -}}
{{- end -}}
{{- $name := .name -}}
{{- range $own -}}
{{- if eq .name $name -}}
{{- fail (printf "%s: volume name %q is the chart's own volume (%s adds it): rename yours" $where.path $name .by) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $where := list (dict "path" "volumeMounts" "list" $rv.volumeMounts) (dict "path" (printf "%s.volumeMounts" $p) "list" $gv.volumeMounts) -}}
{{- range $where.list -}}
{{- if has (.mountPath | trimSuffix "/") $c.reservedMountPaths -}}
{{- fail (printf "%s: mountPath %s is where the webhook mounts the rendezvous files (reserved: %s): mount %q elsewhere" $where.path .mountPath (join ", " $c.reservedMountPaths) .name) -}}
{{- end -}}
{{- $m := . -}}
{{- range $own -}}
{{- if and .path (eq (trimSuffix "/" $m.mountPath) (trimSuffix "/" .path)) -}}
{{- fail (printf "%s: mountPath %s is where the chart mounts its own volume %q (%s): mount %q elsewhere" $where.path $m.mountPath .name .by $m.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $where := list (dict "path" "env" "list" $rv.env) (dict "path" (printf "%s.env" $p) "list" $gv.env) -}}
{{- range $i, $e := $where.list -}}
{{- if and (hasKey $e "value") (not (kindIs "string" $e.value)) (not (kindIs "invalid" $e.value)) -}}
{{- fail (printf "%s[%d].value: %v is a %s; an environment variable's value is a string, the API server would refuse every pod: quote it (--set-string %s[%d].value=%v, or \"%v\" in a values file)" $where.path $i $e.value (kindOf $e.value) $where.path $i $e.value $e.value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $image := merge (deepCopy ($gv.image | default dict)) $rv.image -}}
{{- if hasPrefix "sha256:" (toString $image.tag) -}}
{{- fail (printf "%s.image.tag: %q is a digest, which the chart would render as %s:%s: set image.digest to it instead (repository@digest)" $p $image.tag $image.repository $image.tag) -}}
{{- end -}}
{{- $max := int $c.maxSlots -}}
{{- $gpus := int ($gv.gpus | default 0) -}}
{{- if gt $gpus $max -}}
{{- fail (printf "%s.gpus: %d is more than a pod may have (%d)" $p $gpus $max) -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $gv.slots)) (gt (int $gv.slots) $max) -}}
{{- fail (printf "%s.slots: %d is more than a pod may have (%d)" $p (int $gv.slots) $max) -}}
{{- end -}}
{{- if and (gt $gpus 0) (kindIs "invalid" $gv.slots) (not (include "elastic-training.isAccelerator" (dict "name" $rv.gpuResource "rules" $c.accelerators))) -}}
{{- fail (printf "gpuResource: %q is not an accelerator resource the webhook counts (%s, %s*), so %s.gpus would give 1 slot and, misspelt, pods that stay Pending: fix the name, or set %s.slots if it is one of the webhook's extraAccelerators" $rv.gpuResource (join ", " $c.accelerators.exact) (join "*, " $c.accelerators.prefixes) $p $p) -}}
{{- end -}}
{{- $limits := ($gv.resources | default $rv.resources | default dict).limits | default dict -}}
{{- if and (gt $gpus 0) (hasKey $limits $rv.gpuResource) (ne (toString (index $limits $rv.gpuResource)) (toString $gpus)) -}}
{{- fail (printf "%s.gpus is %d but resources.limits says %s: %v; set the count in one place (gpus)" $p $gpus $rv.gpuResource (index $limits $rv.gpuResource)) -}}
{{- end -}}
{{- $command := $gv.command | default $rv.command -}}
{{- if and $rv.script $command (not (and (eq $rv.framework "mpi") (eq $g.role "worker"))) -}}
{{- if not (contains $rv.scriptName (join " " (concat $command ($gv.args | default $rv.args | default list)))) -}}
{{- fail (printf "script is set but %s.command %v does not run it (the chart runs the script only when command is empty): drop command, or run %s/%s in it" $p $command (include "elastic-training.scriptDir" .root) $rv.scriptName) -}}
{{- end -}}
{{- end -}}
{{- range $kind := list "podAnnotations" "podLabels" -}}
{{- range $where := list (dict "path" $kind "map" (index $rv $kind)) (dict "path" (printf "%s.%s" $p $kind) "map" (index $gv $kind)) -}}
{{- range $k, $_ := $where.map -}}
{{- if eq $k $c.mutatedAnnotation -}}
{{- fail (printf "%s: %s is the webhook's record that it mutated a pod; set by hand it would skip the rendezvous wiring: remove it" $where.path $k) -}}
{{- else if hasPrefix (printf "%s/" $c.domain) $k -}}
{{- fail (printf "%s: %s is the chart's to set from its values (a key of %s/ here would clash with it, or is a typo): remove it" $where.path $k $c.domain) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $where := list (dict "path" "priorityClassName" "v" $rv.priorityClassName) (dict "path" (printf "%s.priorityClassName" $p) "v" $gv.priorityClassName) (dict "path" "serviceAccountName" "v" $rv.serviceAccountName) (dict "path" (printf "%s.serviceAccountName" $p) "v" $gv.serviceAccountName) -}}
{{- include "elastic-training.checkName" $where -}}
{{- end -}}
{{- range (concat ($rv.imagePullSecrets | default list) ($gv.imagePullSecrets | default list)) -}}
{{- include "elastic-training.checkName" (dict "path" "imagePullSecrets" "v" .name) -}}
{{- end -}}
{{- include "elastic-training.checkContainers" . -}}
{{- if eq $rv.framework "pytorch" -}}
{{- include "elastic-training.checkTorchrunFlags" (dict "path" (printf "%s.command/args" $p) "argv" (concat ($gv.command | default $rv.command | default list) ($gv.args | default $rv.args | default list))) -}}
{{- include "elastic-training.checkTorchrunFlags" (dict "path" "scriptLauncher" "argv" ($rv.scriptLauncher | default list)) -}}
{{- end -}}
{{- end -}}

{{/* The user's init and extra containers beside what the webhook injects: a name the sidecar or the trainer has,
or a port the rendezvous listens on (the job's own ports: shifted on host networking), is denied by the webhook
after the install succeeded, or silently replaced. . = the podTemplate's dict. */}}
{{- define "elastic-training.checkContainers" -}}
{{- $c := include "elastic-training.contract" . | fromJson -}}
{{- $rv := .root.Values -}}
{{- $gv := .g.values | default dict -}}
{{- $p := .g.path -}}
{{- $ports := include "elastic-training.sidecarPorts" .root | fromYaml -}}
{{- $taken := dict -}}
{{- range $k, $default := $c.ports -}}
{{- with index $c.reservedPorts (toString $default) -}}{{- $_ := set $taken (toString (index $ports $k)) . -}}{{- end -}}
{{- end -}}
{{- if $rv.checkpoint.memory -}}
{{- $_ := set $taken (toString (index $ports "checkpoint")) "the in-memory checkpoints' port (checkpoint.memory)" -}}
{{- end -}}
{{- range $where := list (dict "path" "ports" "list" $rv.ports) (dict "path" (printf "%s.ports" $p) "list" $gv.ports) -}}
{{- range $j, $port := ($where.list | default list) -}}
{{- with (index $taken (toString (int $port.containerPort))) -}}
{{- fail (printf "%s[%d].containerPort: %d is %s (the containers of a pod share its ports; the webhook would deny every pod): use another port" $where.path $j (int $port.containerPort) .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $kind := list "initContainers" "extraContainers" -}}
{{- range $where := list (dict "path" $kind "list" (index $rv $kind)) (dict "path" (printf "%s.%s" $p $kind) "list" (index $gv $kind)) -}}
{{- range $i, $ctr := $where.list -}}
{{- if eq (toString $ctr.name) $c.sidecarContainer -}}
{{- fail (printf "%s[%d].name: %q is the rendezvous sidecar the webhook injects (it would deny the pod, or replace yours): rename it" $where.path $i $ctr.name) -}}
{{- end -}}
{{- if eq (toString $ctr.name) $rv.containerName -}}
{{- fail (printf "%s[%d].name: %q is the trainer's name (containerName): rename it" $where.path $i $ctr.name) -}}
{{- end -}}
{{- range $j, $port := ($ctr.ports | default list) -}}
{{- with (index $taken (toString (int $port.containerPort))) -}}
{{- fail (printf "%s[%d].ports[%d].containerPort: %d is %s (the containers of a pod share its ports; the webhook would deny every pod): use another port" $where.path $i $j (int $port.containerPort) .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* torchrun flags that would override what the webhook sets through PET_* (torchrun's command-line flags win over
its environment), e.g. copied from a PyTorchJob: refused, naming the value that sets it here. Only torchrun's own
flags count: those before the script (or -m module) it runs. . = dict "path" "argv" (a command line; elements
with spaces, as in sh -c "...", are split into words). */}}
{{- define "elastic-training.checkTorchrunFlags" -}}
{{- $owned := dict "nnodes" "workers.minReplicas/maxReplicas (summed over the groups)" "nproc-per-node" "gpus (or slots)" "rdzv-backend" "rendezvous.backend" "rdzv-endpoint" "the rendezvous Service (the webhook)" "rdzv-id" "runId" "rdzv-conf" "rendezvous.* timeouts" "max-restarts" "rendezvous.maxRestarts" "monitor-interval" "rendezvous.monitorInterval" "local-addr" "the pod's own name (the webhook)" "master-addr" "the rendezvous (a static master is not elastic)" "master-port" "the rendezvous (a static master is not elastic)" "node-rank" "the rendezvous (ranks are assigned per round)" "standalone" "the job's rendezvous (standalone trains on one node)" -}}
{{- /* torchrun's flags that take a value, -r and -t included: internal/torchrunargv's, which the webhook reads too. */ -}}
{{- $withValue := (include "elastic-training.contract" dict | fromJson).torchrunValuedFlags -}}
{{- $words := list -}}
{{- range .argv -}}{{- $words = concat $words (splitList " " (toString . | replace "\n" " " | replace "\t" " ") | compact) -}}{{- end -}}
{{- $in := false -}}
{{- $skip := false -}}
{{- $done := false -}}
{{- $path := .path -}}
{{- range $i, $w := $words -}}
{{- if $done -}}
{{- else if not $in -}}
{{- if or (eq (base $w) "torchrun") (and (eq $w "torch.distributed.run") (gt $i 0) (eq (index $words (sub $i 1)) "-m")) (and (eq $w "torch.distributed.launch") (gt $i 0) (eq (index $words (sub $i 1)) "-m")) -}}
{{- $in = true -}}
{{- end -}}
{{- else if $skip -}}
{{- $skip = false -}}
{{- else if hasPrefix "-" $w -}}
{{- $flag := regexReplaceAll "^--?" (regexReplaceAll "=.*$" $w "") "" | replace "_" "-" -}}
{{- with (index $owned $flag) -}}
{{- fail (printf "%s: torchrun's %s would override what the chart and the webhook set (torchrun's flags win over its PET_* environment): remove it; here it comes from %s" $path (regexReplaceAll "=.*$" $w "") .) -}}
{{- end -}}
{{- if and (has $flag $withValue) (not (contains "=" $w)) -}}{{- $skip = true -}}{{- end -}}
{{- else -}}
{{- $done = true -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* . = dict "path" "v": a Kubernetes object name (a DNS subdomain), or empty. */}}
{{- define "elastic-training.checkName" -}}
{{- if and .v (or (gt (len .v) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" .v))) -}}
{{- fail (printf "%s: %q is not a valid object name (a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253): the API server would reject every pod" .path .v) -}}
{{- end -}}
{{- end -}}

{{/* . = dict "name" "rules": "true" when the resource name is an accelerator by the webhook's rules (internal/gpu). */}}
{{- define "elastic-training.isAccelerator" -}}
{{- $n := .name -}}
{{- $share := false -}}
{{- range .rules.shares -}}
{{- if or (eq $n .) (and (hasSuffix "." .) (hasPrefix . $n)) -}}{{- $share = true -}}{{- end -}}
{{- end -}}
{{- $prefixed := false -}}
{{- range .rules.prefixes -}}
{{- if and (hasPrefix . $n) (gt (len $n) (len .)) -}}{{- $prefixed = true -}}{{- end -}}
{{- end -}}
{{- if or (has $n .rules.exact) (and $prefixed (not $share)) -}}true{{- end -}}
{{- end -}}
