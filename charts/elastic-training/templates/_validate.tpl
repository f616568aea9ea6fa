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
{{- /* Not in the schema: its validator reports a propertyNames error at the wrong path, and a pattern error without why. */ -}}
{{- if gt (len $name) 20 -}}
{{- fail (printf "workerGroups.%s: a group name is at most 20 characters, this one has %d (its Job or StatefulSet and pods are named <job>-%s-<index>, which must stay a DNS label): use a shorter name" $name (len $name) $name) -}}
{{- end -}}
{{- end -}}
{{- /* helm's --set keeps a decimal as a string (the schema checks numbers and the string's form) */ -}}
{{- with $v.rendezvous.monitorInterval -}}
{{- if and (kindIs "string" .) (or (lt (float64 .) 0.1) (gt (float64 .) 3600.0)) -}}
{{- fail (printf "rendezvous.monitorInterval: %s seconds is outside 0.1..3600" .) -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.rendezvous.leaseTTL) 1 -}}
{{- $ttl := (include "elastic-training.contract" . | fromJson).leaseTTL -}}
{{- fail (printf "rendezvous.leaseTTL: 1 second is below etcd's shortest lease (%d): set %d to %d, or 0 for the sidecar's default (%d)" (int $ttl.min) (int $ttl.min) (int $ttl.max) (int $ttl.default)) -}}
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
{{- $hint := "" -}}
{{- if $.Release.IsUpgrade -}}
{{- $hint = (printf "; helm upgrade without --reuse-values starts from the chart's defaults and this command's values alone, so the job's own %s.minReplicas and maxReplicas are gone: add --reuse-values (helm upgrade <release> <chart> --reuse-values --set %s.replicas=%d)" $g.path $g.path $r) -}}
{{- end -}}
{{- fail (printf "%s: replicas %d is outside minReplicas..maxReplicas (%d..%d): raise %s.maxReplicas or lower %s.minReplicas (on a running job that changes every pod template, so the upgrade is refused with what to do)%s" $g.path $r $lo $hi $g.path $g.path $hint) -}}
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
{{- if and (eq $v.framework "mxnet") $.Release.IsUpgrade -}}
{{- /* MXNet is not elastic: DMLC_NUM_WORKER / DMLC_NUM_SERVER are in every pod template, and a Job's template is immutable. */ -}}
{{- range $g := $plan.groups -}}
{{- if or $g.member (eq $g.role "server") -}}
{{- $kind := ternary "Job" "StatefulSet" (eq $g.kind "Job") -}}
{{- $live := lookup (ternary "batch/v1" "apps/v1" (eq $g.kind "Job")) $kind $.Release.Namespace (printf "%s-%s" $job $g.name) -}}
{{- if $live -}}
{{- $have := int (ternary (dig "spec" "completions" 0 $live) (dig "spec" "replicas" 0 $live) (eq $g.kind "Job")) -}}
{{- if ne $have (int $g.replicas) -}}
{{- fail (printf "%s.replicas: MXNet jobs are not elastic (DMLC_NUM_WORKER and DMLC_NUM_SERVER are fixed when the job starts); %s %s-%s runs %d, to run %d: %s" $g.path $kind $job $g.name $have (int $g.replicas) (include "elastic-training.newRunAdvice" $)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $members 0 -}}
{{- fail "no worker group: enable workers or add one under workerGroups" -}}
{{- end -}}
{{- $backend := include "elastic-training.backend" . -}}
{{- /* The backend is torchrun's: other frameworks use only the sidecar's membership, whatever it says. */ -}}
{{- if and (has $backend (list "c10d" "elastic-training")) (eq $v.framework "pytorch") $v.rendezvous.tls.secretName -}}
{{- fail (printf "rendezvous.tls works with backend etcd-v2 or etcd, not %s (torch's TCPStore has no TLS): set rendezvous.backend=etcd-v2 (the trainer image then needs python-etcd)" $backend) -}}
{{- end -}}
{{- if eq $v.framework "mpi" -}}
{{- if not (or $v.mpi.launcher.command $v.command) -}}
{{- if include "elastic-training.hasScript" . -}}
{{- fail (printf "framework mpi with a script and no mpi.launcher.command would run the script with python3 on the launcher alone, one process: give mpi.launcher.command, e.g. [mpirun, python3, %s/%s] (every MPI pod mounts the script)" (include "elastic-training.scriptDir" .) $v.scriptName) -}}
{{- end -}}
{{- fail "mpi.launcher.command is empty: give the launcher's command (e.g. [mpirun, python3, train.py])" -}}
{{- end -}}
{{- end -}}
{{- /* MXNet's values on another framework's job are ignored: a mistake (the framework, or the values) that would go
unseen. Anything but values.yaml's defaults (.Files cannot read values.yaml) is refused. */ -}}
{{- $mx := $v.mxnet -}}
{{- if and (ne $v.framework "mxnet") (or (ne (int $mx.psPort) 9091) $mx.scheduler (ne (toJson $mx.servers) "{\"replicas\":1}") (gt (len $mx) 3)) -}}
{{- fail (printf "mxnet: values for framework mxnet on a %s job are ignored (%s): set framework=mxnet, or drop them" $v.framework (toJson $v.mxnet)) -}}
{{- end -}}
{{- if and $v.scriptLauncher (not (include "elastic-training.hasScript" .)) -}}
{{- fail (printf "scriptLauncher %v runs the script, but there is none: add --set-file script=train.py (examples/script-run.yaml runs a local script), or drop scriptLauncher and give command" $v.scriptLauncher) -}}
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
{{- if $v.checkpoint.memory -}}
{{- if ne $v.framework "pytorch" -}}
{{- fail (printf "checkpoint.memory: in-memory checkpoints are for PyTorch jobs (elastic_training.checkpoint), not framework %s: unset it" $v.framework) -}}
{{- end -}}
{{- with $v.checkpoint.persistDir -}}
{{- $dir := . -}}
{{- $on := false -}}
{{- $mounts := concat ($v.volumeMounts | default list) ($v.workers.volumeMounts | default list) -}}
{{- if $v.persistence.enabled -}}{{- $mounts = append $mounts (dict "mountPath" $v.persistence.mountPath) -}}{{- end -}}
{{- range $mounts -}}
{{- $mp := trimSuffix "/" (.mountPath | default "") -}}
{{- if and $mp (not .readOnly) (or (eq $dir $mp) (hasPrefix (printf "%s/" $mp) $dir)) -}}{{- $on = true -}}{{- end -}}
{{- end -}}
{{- if not $on -}}
{{- fail (printf "checkpoint.persistDir: %s is on no writable volume of the workers (volumeMounts, workers.volumeMounts, persistence.mountPath): copies there would be lost with the pod; mount a shared volume there, or leave it empty for persistence.enabled's" $dir) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $c := include "elastic-training.contract" . | fromJson -}}
{{- if $v.hostNetwork -}}
{{- if ne $v.framework "pytorch" -}}
{{- fail (printf "hostNetwork: a %s job's pods listen on fixed ports (MPI's sshd on 22, MXNet's psPort), which two jobs on one node would share: host networking is for PyTorch jobs" $v.framework) -}}
{{- end -}}
{{- $b := int $v.hostNetworkPortBase -}}
{{- $more := sub (int $c.portSpan) 1 -}}
{{- if and $b (or (lt $b (index $c.portBase 0 | int)) (gt $b (index $c.portBase 1 | int))) -}}
{{- fail (printf "hostNetworkPortBase: %d is outside %v..%v (above the privileged ports, below the kernel's ephemeral range; the sidecar takes it and the %d after it)" $b (index $c.portBase 0) (index $c.portBase 1) $more) -}}
{{- end -}}
{{- $np := $c.nodePortRange -}}
{{- if and $b (not $.Release.IsUpgrade) (ge (add $b $more) (int (index $np 0))) (le $b (int (index $np 1))) -}}
{{- fail (printf "hostNetworkPortBase: %d..%d overlaps Kubernetes' NodePort range (%v-%v), whose ports kube-proxy holds on every node: choose a base below %d (or 0, which picks one)" $b (add $b $more) (index $np 0) (index $np 1) (sub (int (index $np 0)) $more)) -}}
{{- end -}}
{{- end -}}
{{- /* Whoever runs as the serving pods' account can move the job's rendezvous (rbac.yaml): never the namespace's
default account, which every other pod runs as, unless the user names it. An upgrade of a job installed so keeps it. */ -}}
{{- if and (not $.Release.IsUpgrade) (eq (include "elastic-training.servingServiceAccount" (dict "root" . "plan" $plan)) "default") -}}
{{- $named := list $v.serviceAccountName $v.serviceAccount.name -}}
{{- range $plan.groups }}{{ if .rdzvHost }}{{ $named = append $named ((.values | default dict).serviceAccountName) }}{{ end }}{{ end -}}
{{- if not (has "default" $named) -}}
{{- fail "serviceAccount.create is false and no account is named, so the pods would run as the namespace's default account and the rendezvous Role (the Lease, the EndpointSlice, lost pods) would be bound to it: every other pod of the namespace could then move the job's rendezvous. Leave serviceAccount.create true (the default), or name an account of the job's own (serviceAccount.name or serviceAccountName; naming default yourself is accepted)" -}}
{{- end -}}
{{- end -}}
{{- if and $v.queue.kueue $v.queue.volcano -}}
{{- fail (printf "queue.kueue (%s) and queue.volcano (%s) are both set: a job is queued by one of them; set the other to \"\"" $v.queue.kueue $v.queue.volcano) -}}
{{- end -}}
{{- if and $v.tests.enabled (gt (int $v.tests.minMembers) (int $plan.maxNodes)) -}}
{{- fail (printf "tests.minMembers (%d) is more than the job can ever have (%d, the worker groups' maxReplicas): helm test could never pass" (int $v.tests.minMembers) (int $plan.maxNodes)) -}}
{{- end -}}
{{- if and $v.persistence.enabled (not $v.persistence.existingClaim) (has "ReadWriteOncePod" $v.persistence.accessModes) (gt (len $plan.groups) 1 | or (gt (int $plan.maxNodes) 1)) -}}
{{- fail "persistence.accessModes: ReadWriteOncePod lets one pod mount the volume, and this job has several: use ReadWriteMany (or ReadWriteOnce when every pod runs on one node)" -}}
{{- end -}}
{{- include "elastic-training.checkSharedVolume" (dict "root" . "plan" $plan) -}}
{{- if eq $v.framework "mxnet" -}}
{{- if $v.workerGroups -}}
{{- fail (printf "workerGroups (%s): MXNet jobs have one worker group, workers (DMLC_WORKER_ID is a worker's index, so a second group would repeat the ids)" (keys $v.workerGroups | sortAlpha | join ", ")) -}}
{{- end -}}
{{- with index $c.reservedPorts (toString (int $v.mxnet.psPort)) -}}
{{- fail (printf "mxnet.psPort: %d is %s, in the same pod: choose another port" (int $v.mxnet.psPort) .) -}}
{{- end -}}
{{- end -}}
{{- include "elastic-training.checkName" (dict "path" "rendezvous.tls.secretName" "v" $v.rendezvous.tls.secretName) -}}
{{- include "elastic-training.checkName" (dict "path" "rendezvous.priorityClassName" "v" $v.rendezvous.priorityClassName) -}}
{{- /* A pod with no command, args or script runs the image's entrypoint: in the default image a shell that exits 0,
so the Job would end Complete having trained nothing. MPI workers run sshd (mpi.workerCommand). */ -}}
{{- if not (include "elastic-training.hasScript" .) -}}
{{- range $g := $plan.groups -}}
{{- $gv := $g.values | default dict -}}
{{- if not (or $gv.command $gv.args $v.command $v.args (and (eq $v.framework "mpi") (eq $g.role "worker"))) -}}
{{- fail (printf "%s: nothing to run: set command (e.g. --set-json 'command=[\"torchrun\",\"/app/train.py\"]'), or script (the chart runs it with %s), or args for an image whose entrypoint trains; the image's own entrypoint (%s) would start, and the job would end Complete having trained nothing" $g.path (eq $v.framework "pytorch" | ternary "torchrun" "python3") (printf "%s:%s" $v.image.repository (toString $v.image.tag))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The data volume every pod mounts (persistence), against the StorageClass it comes from, read from the cluster
at install (helm template reads none and checks nothing here): a class whose provisioner makes disks that attach to
one node (EBS, PD, Azure Disk, Cinder) fails a ReadWriteOnce volume on the second node's pods (Multi-Attach, at
runtime), and no block or local provisioner gives ReadWriteMany (the claim stays Pending, with no word at install).
ReadWriteOnce elsewhere (NFS, EFS, local paths, which pin the pods to the volume's node) works. . = dict "root"
"plan". */}}
{{- define "elastic-training.checkSharedVolume" -}}
{{- $v := .root.Values -}}
{{- $pv := $v.persistence -}}
{{- if and $pv.enabled (not $pv.existingClaim) $pv.checkStorageClass -}}
{{- $class := dict -}}
{{- if $pv.storageClassName -}}
{{- $class = lookup "storage.k8s.io/v1" "StorageClass" "" $pv.storageClassName | default dict -}}
{{- else -}}
{{- range (lookup "storage.k8s.io/v1" "StorageClass" "" "").items | default list -}}
{{- if eq (index (.metadata.annotations | default dict) "storageclass.kubernetes.io/is-default-class") "true" -}}{{- $class = . -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if $class -}}
{{- $which := printf "StorageClass %s (%s, provisioner %s)" $class.metadata.name (ternary "persistence.storageClassName" "the cluster's default" (not (empty $pv.storageClassName))) $class.provisioner -}}
{{- $attach := list "ebs.csi.aws.com" "kubernetes.io/aws-ebs" "pd.csi.storage.gke.io" "kubernetes.io/gce-pd" "disk.csi.azure.com" "kubernetes.io/azure-disk" "cinder.csi.openstack.org" "kubernetes.io/cinder" -}}
{{- $local := list "rancher.io/local-path" "kubernetes.io/no-provisioner" -}}
{{- $classes := "Amazon EFS: efs.csi.aws.com, Google Filestore: filestore.csi.storage.gke.io, FSx for Lustre: fsx.csi.aws.com, Azure Files: file.csi.azure.com, NFS; docs/gpu-cluster.md" -}}
{{- $pods := 0 -}}
{{- range .plan.groups }}{{ $pods = add $pods (int .maxReplicas) }}{{ end -}}
{{- $oneNode := hasKey ($v.nodeSelector | default dict) "kubernetes.io/hostname" -}}
{{- if and (has "ReadWriteMany" $pv.accessModes) (has $class.provisioner (concat $attach $local)) -}}
{{- fail (printf "persistence.accessModes: ReadWriteMany from %s stays Pending: that provisioner makes volumes that one node mounts. Set persistence.storageClassName to a class that gives ReadWriteMany (%s), or persistence.existingClaim" $which $classes) -}}
{{- end -}}
{{- if and (has "ReadWriteOnce" $pv.accessModes) (gt (int $pods) 1) (not $oneNode) (has $class.provisioner $attach) -}}
{{- fail (printf "persistence.accessModes: ReadWriteOnce from %s attaches the data volume to one node, and this job's pods (up to %d) may run on several, where the others fail with Multi-Attach: use ReadWriteMany from a class that gives it (persistence.storageClassName: %s), or persistence.existingClaim, or pin every pod to one node (nodeSelector kubernetes.io/hostname)" $which (int $pods) $classes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
