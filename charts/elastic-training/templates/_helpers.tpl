{{/*
Names. <job> is the release name (or fullnameOverride); every object name derives from it
(internal/naming: Workload = <job>-<group>, RendezvousService = <job>-rdzv, HeadlessService = <job>).
*/}}
{{- define "elastic-training.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "elastic-training.fullname" -}}
{{- .Values.fullnameOverride | default .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "elastic-training.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object (not of pod templates: they carry no version so they never change on upgrade). */}}
{{- define "elastic-training.labels" -}}
helm.sh/chart: {{ include "elastic-training.chart" . }}
{{ include "elastic-training.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: elastic-training
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels that select every pod of the job. */}}
{{- define "elastic-training.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elastic-training.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
elastic-training.io/job: {{ include "elastic-training.fullname" . }}
{{- end -}}

{{- define "elastic-training.annotations" -}}
{{- with .Values.annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* Selector of one group's pods (immutable in StatefulSets: no version, no chart). */}}
{{- define "elastic-training.groupSelector" -}}
elastic-training.io/job: {{ include "elastic-training.fullname" .root }}
elastic-training.io/group: {{ .group }}
{{- end -}}

{{/*
Run id: generated once per install and kept: an existing <job>-run ConfigMap wins, then .Values.runId, then a
random suffix. Computed once per render (cached in .Values) so every template sees the same value.
*/}}
{{- define "elastic-training.runId" -}}
{{- if not (hasKey .Values "__runId") -}}
{{- $job := include "elastic-training.fullname" . -}}
{{- $id := .Values.runId -}}
{{- $existing := lookup "v1" "ConfigMap" .Release.Namespace (printf "%s-run" $job) -}}
{{- if and $existing $existing.data (index $existing.data "run-id") -}}
{{- $id = index $existing.data "run-id" -}}
{{- end -}}
{{- if not $id -}}
{{- $id = printf "%s-%s" $job (randAlphaNum 8 | lower) -}}
{{- end -}}
{{- $_ := set .Values "__runId" $id -}}
{{- end -}}
{{- index .Values "__runId" -}}
{{- end -}}

{{/* The MPI SSH private key (PEM, base64): an existing <job>-ssh Secret wins, then mpi.ssh.privateKey, then a new key. */}}
{{- define "elastic-training.sshKey" -}}
{{- if not (hasKey .Values "__sshKey") -}}
{{- $job := include "elastic-training.fullname" . -}}
{{- $key := "" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-ssh" $job) -}}
{{- if and $existing $existing.data (index $existing.data "ssh-privatekey") -}}
{{- $key = index $existing.data "ssh-privatekey" -}}
{{- else if .Values.mpi.ssh.privateKey -}}
{{- $key = .Values.mpi.ssh.privateKey | b64enc -}}
{{- else -}}
{{- $key = genPrivateKey "ecdsa" | b64enc -}}
{{- end -}}
{{- $_ := set .Values "__sshKey" $key -}}
{{- end -}}
{{- index .Values "__sshKey" -}}
{{- end -}}

{{/*
The rendezvous backend: rendezvous.backend, and for auto the job's own (elastic-training: torchrun finds it through
torch >= 2.5's torchrun.handlers entry point, docs/elastic-training-backend.md), unless the trainer image's tag names an older
torch the way pytorch/pytorch's tags do ("2.4.1-cuda12.1-cudnn9-runtime"): c10d there.
*/}}
{{- define "elastic-training.backend" -}}
{{- $b := .Values.rendezvous.backend -}}
{{- if eq $b "auto" -}}
{{- $b = "elastic-training" -}}
{{- $m := regexFind "^[0-9]+[.][0-9]+[.][0-9]+(-|$)" (toString .Values.image.tag) -}}
{{- if $m -}}
{{- $major := splitList "." $m | first | atoi -}}
{{- $minor := index (splitList "." $m) 1 | atoi -}}
{{- if or (lt $major 2) (and (eq $major 2) (lt $minor 5)) -}}
{{- $b = "c10d" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $b -}}
{{- end -}}

{{/*
The job's plan: every group with its role, workload kind, whether its pods are rendezvous members, which group
hosts the rendezvous, and the job-wide counts. Returned as YAML; use with fromYaml.
*/}}
{{- define "elastic-training.plan" -}}
{{- $v := .Values -}}
{{- $groups := list -}}
{{- $member := list -}}
{{- $memberKind := "Job" -}}
{{- if eq $v.framework "mpi" -}}{{- $memberKind = "StatefulSet" -}}{{- end -}}
{{- if $v.workers.enabled -}}
{{- $member = append $member (dict "name" "worker" "values" $v.workers "path" "workers") -}}
{{- end -}}
{{- range $name, $g := $v.workerGroups -}}
{{- if (hasKey $g "enabled" | ternary $g.enabled true) -}}
{{- $member = append $member (dict "name" $name "values" $g "path" (printf "workerGroups.%s" $name)) -}}
{{- end -}}
{{- end -}}
{{- $min := 0 -}}{{- $max := 0 -}}{{- $replicas := 0 -}}{{- $preemptible := false -}}
{{- $resolved := list -}}
{{- range $member -}}
{{- $r := int .values.replicas -}}
{{- $lo := hasKey .values "minReplicas" | ternary .values.minReplicas $r | int -}}
{{- $hi := hasKey .values "maxReplicas" | ternary .values.maxReplicas $r | int -}}
{{- $min = add $min $lo -}}{{- $max = add $max $hi -}}{{- $replicas = add $replicas $r -}}
{{- if .values.preemptible -}}{{- $preemptible = true -}}{{- end -}}
{{- $resolved = append $resolved (dict "name" .name "path" .path "role" "worker" "kind" ($memberKind) "member" true "replicas" $r "minReplicas" $lo "maxReplicas" $hi "preemptible" (.values.preemptible | default false) "values" .values) -}}
{{- end -}}
{{- $dedicated := or (eq $v.rendezvous.placement "dedicated") $preemptible -}}
{{- $host := "" -}}
{{- if $dedicated -}}
{{- $host = "rdzv" -}}
{{- else if eq $v.framework "mpi" -}}
{{- $host = "launcher" -}}
{{- else if eq $v.framework "mxnet" -}}
{{- $host = "scheduler" -}}
{{- else if $resolved -}}
{{- $host = (first $resolved).name -}}
{{- end -}}
{{- if eq $v.framework "mpi" -}}
{{- $launcher := $v.mpi.launcher -}}
{{- $groups = append $groups (dict "name" "launcher" "path" "mpi.launcher" "role" "launcher" "kind" "Job" "member" false "replicas" 1 "minReplicas" 1 "maxReplicas" 1 "preemptible" false "values" $launcher) -}}
{{- end -}}
{{- /* The MXNet scheduler and servers run until the job is uninstalled, yet are Indexed Jobs, not StatefulSets:
Kubernetes replaces a Job's pod once it is evicted from a lost node, and never a StatefulSet's
(kubernetes/kubernetes#54368). Their hostnames are the same (<job>-scheduler-0: DMLC_PS_ROOT_URI). */ -}}
{{- if eq $v.framework "mxnet" -}}
{{- $groups = append $groups (dict "name" "scheduler" "path" "mxnet.scheduler" "role" "scheduler" "kind" "Job" "member" false "replicas" 1 "minReplicas" 1 "maxReplicas" 1 "preemptible" false "values" $v.mxnet.scheduler) -}}
{{- $s := int $v.mxnet.servers.replicas -}}
{{- $groups = append $groups (dict "name" "server" "path" "mxnet.servers" "role" "server" "kind" "Job" "member" false "replicas" $s "minReplicas" $s "maxReplicas" $s "preemptible" false "values" $v.mxnet.servers) -}}
{{- end -}}
{{- $groups = concat $groups $resolved -}}
{{- /* The Job whose Events tell the rendezvous (PyTorch): the first group that is not preemptible, else the first. */ -}}
{{- $eventsGroup := "" -}}
{{- range $resolved -}}
{{- if and (not $eventsGroup) (not .preemptible) -}}{{- $eventsGroup = .name -}}{{- end -}}
{{- end -}}
{{- if and (not $eventsGroup) $resolved -}}{{- $eventsGroup = (first $resolved).name -}}{{- end -}}
{{- $out := list -}}
{{- range $groups -}}
{{- $out = append $out (set . "rdzvHost" (eq .name $host)) -}}
{{- end -}}
{{- /* Standbys of the rendezvous: PyTorch's c10d store served by a worker group (docs/failures.md). */ -}}
{{- $standbys := 0 -}}
{{- if and (eq $v.framework "pytorch") (has (include "elastic-training.backend" $) (list "c10d" "elastic-training")) (not $dedicated) $resolved -}}
{{- $standbys = int $v.rendezvous.standbys -}}
{{- end -}}
{{- toYaml (dict "groups" $out "minNodes" $min "maxNodes" $max "replicas" $replicas "dedicated" $dedicated "host" $host "preemptible" $preemptible "eventsGroup" $eventsGroup "standbys" $standbys) -}}
{{- end -}}

{{/* Job-wide annotations of every pod template: the job's settings (docs/contract.md). */}}
{{- define "elastic-training.jobAnnotations" -}}
{{- $v := .root.Values -}}
{{- $plan := .plan -}}
{{- /* The webhook denies a contract newer than its own, naming both: upgrade the webhook chart first. */ -}}
elastic-training.io/contract: {{ (include "elastic-training.contract" .root | fromJson).contractVersion | int | quote }}
elastic-training.io/framework: {{ $v.framework | quote }}
elastic-training.io/run-id: {{ include "elastic-training.runId" .root | quote }}
elastic-training.io/min-nodes: {{ $plan.minNodes | quote }}
elastic-training.io/max-nodes: {{ $plan.maxNodes | quote }}
elastic-training.io/rdzv-backend: {{ include "elastic-training.backend" .root | quote }}
elastic-training.io/rdzv-join-timeout: {{ $v.rendezvous.joinTimeout | quote }}
elastic-training.io/rdzv-last-call-timeout: {{ $v.rendezvous.lastCallTimeout | quote }}
elastic-training.io/rdzv-close-timeout: {{ $v.rendezvous.closeTimeout | quote }}
elastic-training.io/max-restarts: {{ $v.rendezvous.maxRestarts | quote }}
{{- with $v.rendezvous.monitorInterval }}
elastic-training.io/monitor-interval: {{ . | quote }}
{{- end }}
{{- with $v.rendezvous.tls.secretName }}
elastic-training.io/rdzv-tls-secret: {{ . | quote }}
{{- end }}
{{- if and (eq $v.framework "pytorch") $v.checkpoint.memory (ne (int $v.checkpoint.replicas) 1) }}
elastic-training.io/checkpoint-replicas: {{ $v.checkpoint.replicas | int | toString | quote }}
{{- end }}
{{- if eq $v.framework "pytorch" }}
{{- if not $v.hang.enabled }}
elastic-training.io/hang-timeout: "off"
{{- else if $v.hang.timeout }}
elastic-training.io/hang-timeout: {{ $v.hang.timeout | int | toString | quote }}
{{- end }}
{{- if and $v.hang.enabled (ne (int $v.hang.replaceAfter) 2) }}
elastic-training.io/hang-replace-after: {{ $v.hang.replaceAfter | int | toString | quote }}
{{- end }}
{{- if eq $v.warmStart false }}
elastic-training.io/warm-start: "false"
{{- end }}
{{- end }}
{{- with $v.rendezvous.leaseTTL }}
elastic-training.io/rdzv-lease-ttl: {{ . | int | toString | quote }}
{{- end }}
{{- if and (eq $v.framework "pytorch") (eq $v.rendezvous.restartSurvivors false) }}
elastic-training.io/rdzv-restart-survivors: "false"
{{- end }}
{{- $sidecar := dict -}}
{{- range $mode, $r := ($v.rendezvous.sidecarResources | default dict) }}{{ if $r }}{{ $_ := set $sidecar $mode $r }}{{ end }}{{ end -}}
{{- with $sidecar }}
elastic-training.io/sidecar-resources: {{ toJson . | quote }}
{{- end }}
{{- with include "elastic-training.eventsJob" (dict "root" .root "plan" $plan) }}
elastic-training.io/rdzv-events: {{ . | quote }}
{{- end }}
{{- with include "elastic-training.lostPodSets" (dict "root" .root "plan" $plan) }}
elastic-training.io/force-delete-lost-pods: {{ . | quote }}
{{- end }}
{{- if eq $v.framework "mpi" }}
elastic-training.io/mpi-flavour: {{ $v.mpi.flavour | quote }}
{{- end }}
{{- if eq $v.framework "mxnet" }}
elastic-training.io/num-servers: {{ $v.mxnet.servers.replicas | quote }}
elastic-training.io/num-workers: {{ $plan.replicas | quote }}
elastic-training.io/ps-port: {{ $v.mxnet.psPort | quote }}
{{- end }}
{{- end -}}

{{/* The script ConfigMap's mount path. */}}
{{- define "elastic-training.scriptDir" -}}/etc/elastic-training-script{{- end -}}

{{- define "elastic-training.hasScript" -}}
{{- if or .Values.script .Values.scriptFiles -}}true{{- end -}}
{{- end -}}

{{/*
The restart policy of a group that runs as a Job: the group's value, else the job's; "auto" is OnFailure for
PyTorch worker groups that are not preemptible (torchrun agents restart in place and rejoin when the
rendezvous pod is replaced) and Never otherwise (preemptible groups keep the podFailurePolicy that ignores
disruptions, which needs Never).
*/}}
{{- define "elastic-training.restartPolicy" -}}
{{- $gv := .g.values | default dict -}}
{{- $p := $gv.restartPolicy | default .root.Values.restartPolicy -}}
{{- if eq $p "auto" -}}
{{- /* In place: a PyTorch worker (torchrun's agent rejoins in seconds) and the MXNet scheduler and servers (their
container restarts as a StatefulSet's would, keeping the pod's address). */ -}}
{{- $inPlace := or (and (eq .root.Values.framework "pytorch") (eq .g.role "worker") (not .g.preemptible)) (has .g.role (list "scheduler" "server")) -}}
{{- $p = $inPlace | ternary "OnFailure" "Never" -}}
{{- end -}}
{{- $p -}}
{{- end -}}

{{/*
Upgrade guard. A Job's pod template cannot change (Kubernetes answers "field is immutable" after Helm has already
applied the objects before it) and a StatefulSet's restarts every pod, so an upgrade that would change any pod
template is refused while rendering, before anything is applied. Every Job and StatefulSet carries its pod
template's digest (elastic-training.io/pod-template); the <job>-run ConfigMap carries a digest of each value
(values-digests) so that the refusal can name the values that changed.
*/}}
{{- define "elastic-training.valueDigests" -}}
{{- $out := dict -}}
{{- range $k, $v := .Values -}}
{{- if hasPrefix "__" $k -}}{{- continue -}}{{- end -}}
{{- if and (kindIs "map" $v) $v -}}
{{- range $k2, $v2 := $v -}}
{{- if eq $k2 "replicas" -}}{{- continue -}}{{- end -}}
{{- $x := $v2 -}}
{{- if kindIs "map" $v2 -}}{{- $x = omit $v2 "replicas" -}}{{- end -}}
{{- $_ := set $out (printf "%s.%s" $k $k2) (toJson $x | sha256sum | trunc 8) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $out $k (toJson $v | sha256sum | trunc 8) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* What to do instead of an upgrade the chart refuses: a new run that keeps the data and the run id. */}}
{{- define "elastic-training.newRunAdvice" -}}
{{- $job := include "elastic-training.fullname" . -}}
{{- $v := .Values -}}
{{- $data := "" -}}
{{- if and $v.persistence.enabled (not $v.persistence.existingClaim) $v.persistence.keep -}}
{{- $data = printf "helm uninstall %s keeps the PVC %s-data with its checkpoints (persistence.keep) and the next install takes it over" $job $job -}}
{{- else if $v.persistence.existingClaim -}}
{{- $data = printf "helm uninstall %s leaves your PVC %s as it is" $job $v.persistence.existingClaim -}}
{{- else -}}
{{- $data = printf "helm uninstall %s deletes the pods: keep your checkpoints on storage that outlives them (persistence.enabled, or a volume of yours)" $job -}}
{{- end -}}
to change it, start a new run that resumes from your checkpoints: {{ $data }}; then helm install {{ $job }} with the new values and --set runId={{ include "elastic-training.runId" . }} (the same run id)
{{- end -}}

{{/*
The pod template an upgrade renders for one workload. . = dict "root" "apiVersion" "kind" "name" "digest" "template".
Output: JSON {"digest", "template"}: the new ones, or, when no value changed but the chart did (a new chart version
whose templates render differently), the running object's own, so that a chart upgrade alone never blocks
`helm upgrade --set <group>.replicas=N` (a Job's pod template is immutable, and a StatefulSet's would restart every
pod); the new chart's template applies to the next run. Fails an upgrade whose values change the pod template.
*/}}
{{- define "elastic-training.podTemplateOnUpgrade" -}}
{{- $root := .root -}}
{{- $out := dict "digest" .digest "template" .template -}}
{{- if $root.Release.IsUpgrade -}}
{{- $live := lookup .apiVersion .kind $root.Release.Namespace .name | default dict -}}
{{- $was := dig "metadata" "annotations" "elastic-training.io/pod-template" "" $live -}}
{{- if and $was (ne $was .digest) -}}
{{- $job := include "elastic-training.fullname" $root -}}
{{- $run := lookup "v1" "ConfigMap" $root.Release.Namespace (printf "%s-run" $job) | default dict -}}
{{- $old := dig "data" "values-digests" "{}" $run | fromJson -}}
{{- $new := include "elastic-training.valueDigests" $root | fromJson -}}
{{- $changed := list -}}
{{- /* A value only one of the charts has (new in this chart, or gone from it) is no change of the user's. */ -}}
{{- range $k := keys $old | sortAlpha -}}
{{- if and (hasKey $new $k) (ne (toString (index $old $k)) (toString (index $new $k))) -}}{{- $changed = append $changed $k -}}{{- end -}}
{{- end -}}
{{- if and $old (not $changed) (dig "spec" "template" "" $live) -}}
{{- $out = dict "digest" $was "template" (toYaml $live.spec.template) -}}
{{- else -}}
{{- $why := printf "values changed since the running revision: %s" (join ", " $changed) -}}
{{- if not $old -}}
{{- $why = "the running revision was installed by a chart that does not record its values" -}}
{{- end -}}
{{- $scale := list -}}
{{- range $g := (include "elastic-training.plan" $root | fromYaml).groups -}}
{{- if $g.member -}}{{- $scale = append $scale (printf "%s.replicas=N" $g.path) -}}{{- end -}}
{{- end -}}
{{- $effect := ternary "Kubernetes does not let a Job's pod template change" "every pod of it would restart" (eq .kind "Job") -}}
{{- fail (printf "upgrade refused, nothing was changed: %s %s's pod template would change (%s), and %s. A running job changes only its size (helm upgrade --reuse-values --set %s); %s" .kind .name $why $effect (join "," $scale) (include "elastic-training.newRunAdvice" $root)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The rdzv-sidecar image of the dedicated rendezvous pod and the test pod, and its pull policy (YAML, "" for none).
By default the image the webhook injects, set in one place (the webhook chart): the chart renders the contract's
placeholder, which the webhook replaces with its own sidecar image and pull policy. With rendezvous.image.repository
set, that image: its tag defaulting to the chart's appVersion, as for every image of ours.
*/}}
{{- define "elastic-training.rendezvousImage" -}}
{{- $i := deepCopy .Values.rendezvous.image -}}
{{- if $i.repository -}}
{{- $_ := set $i "tag" (toString $i.tag | default .Chart.AppVersion) -}}
{{- include "elastic-training.imageRef" (dict "image" $i "root" .) -}}
{{- else -}}
{{- (include "elastic-training.contract" . | fromJson).sidecarPlaceholder -}}
{{- end -}}
{{- end }}

{{- define "elastic-training.rendezvousPullPolicy" -}}
{{- if and .Values.rendezvous.image.repository .Values.rendezvous.image.pullPolicy -}}
imagePullPolicy: {{ .Values.rendezvous.image.pullPolicy }}
{{- end -}}
{{- end }}

{{/*
The Job on which the serving sidecar records each torch rendezvous round as an Event (rendezvous.events,
PyTorch); empty: none. (dict "root" $ "plan" $plan)
*/}}
{{- define "elastic-training.eventsJob" -}}
{{- $v := .root.Values -}}
{{- if and (eq $v.framework "pytorch") $v.rendezvous.events .plan.eventsGroup -}}
{{- printf "%s-%s" (include "elastic-training.fullname" .root) .plan.eventsGroup -}}
{{- end -}}
{{- end }}

{{/*
The member StatefulSets whose pods the serving sidecar force-deletes once Kubernetes evicts them from a lost node
(forceDeleteLostPods; MPI workers), comma-separated; "" when none. Input: dict "root" $ "plan" <plan>.
*/}}
{{- define "elastic-training.lostPodSets" -}}
{{- $names := list -}}
{{- if .root.Values.forceDeleteLostPods -}}
{{- range .plan.groups -}}
{{- if and .member (eq .kind "StatefulSet") -}}
{{- $names = append $names (printf "%s-%s" (include "elastic-training.fullname" $.root) .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $names -}}
{{- end }}

{{/* The serving pod's service account: the rdzv-host group's, else the job's (the dedicated rendezvous pod runs as
the job's), else `default`. Input: dict "root" $ "plan" <plan>. */}}
{{- define "elastic-training.servingServiceAccount" -}}
{{- $job := include "elastic-training.jobServiceAccount" .root -}}
{{- $sa := $job | default "default" -}}
{{- if not .plan.dedicated -}}
{{- range .plan.groups -}}
{{- if .rdzvHost -}}{{- $sa = .values.serviceAccountName | default $job | default "default" -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $sa -}}
{{- end }}

{{/*
A pod's tolerations: the user's, then the node-loss ones (nodeLossTolerationSeconds) for the keys the user's do
not name. Input: dict "root" $ "user" <list>. Output: a YAML list.
*/}}
{{- define "elastic-training.tolerations" -}}
{{- $out := list -}}
{{- $keys := dict -}}
{{- range .user -}}
{{- $out = append $out . -}}
{{- with .key }}{{ $_ := set $keys . true }}{{ end -}}
{{- end -}}
{{- $s := .root.Values.nodeLossTolerationSeconds -}}
{{- if not (kindIs "invalid" $s) -}}
{{- range list "node.kubernetes.io/not-ready" "node.kubernetes.io/unreachable" -}}
{{- if not (hasKey $keys .) -}}
{{- $out = append $out (dict "key" . "operator" "Exists" "effect" "NoExecute" "tolerationSeconds" (int64 $s)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The rendezvous Service's ports (and its EndpointSlice's), as a YAML list: the Service's are fixed, its targets
are the serving pod's (elastic-training.sidecarPorts; the dedicated pod is never on host networking). */}}
{{- define "elastic-training.rdzvPorts" -}}
{{- $plan := include "elastic-training.plan" . | fromYaml -}}
{{- $p := (include "elastic-training.contract" . | fromJson).ports -}}
{{- if not $plan.dedicated }}{{ $p = include "elastic-training.sidecarPorts" . | fromYaml }}{{ end -}}
- name: client
  port: 2379
  targetPort: {{ $p.client }}
  protocol: TCP
{{- if eq .Values.framework "pytorch" }}
# The serving sidecar's health port: GET /rendezvous is the job's view of torch's rendezvous (helm test reads it).
- name: health
  port: {{ (include "elastic-training.contract" . | fromJson).healthPort }}
  targetPort: {{ $p.health }}
  protocol: TCP
{{- end }}
{{- if and (eq .Values.framework "pytorch") (has (include "elastic-training.backend" .) (list "c10d" "elastic-training")) }}
- name: c10d
  port: 29400
  targetPort: {{ $p.c10d }}
  protocol: TCP
{{- end }}
{{- end }}

{{/*
The sidecar's ports in the job's pods (YAML: base client peer health c10d checkpoint). On pod networking the defaults;
on host networking (hostNetwork) five of the job's own, from hostNetworkPortBase or from the job's namespace and name, so
that two jobs' pods on one node do not share them (the webhook reads the base from annotation rdzv-ports). A pod
declares its sidecar's ports: Kubernetes schedules at most one pod of a host-network job per node.
*/}}
{{- define "elastic-training.sidecarPorts" -}}
{{- if .Values.hostNetwork -}}
{{- $base := int (.Values.hostNetworkPortBase | default (include "elastic-training.derivedPortBase" .)) -}}
base: {{ $base }}
client: {{ $base }}
peer: {{ add $base 1 }}
health: {{ add $base 2 }}
c10d: {{ add $base 3 }}
checkpoint: {{ add $base 4 }}
{{- else -}}
base: 0
{{ (include "elastic-training.contract" . | fromJson).ports | toYaml }}
{{- end -}}
{{- end }}

{{/*
A host-network job's port base when hostNetworkPortBase is 0: one of 20000..29990 picked from the job's namespace
and name, below Kubernetes' NodePort range (30000-32767), whose ports kube-proxy claims on every node. Picked once:
the run ConfigMap keeps it (rdzv-port-base), and a job installed by a chart that did not record it keeps the base
that chart picked (20000..30990), so that an upgrade never moves a running job's ports.
*/}}
{{- define "elastic-training.derivedPortBase" -}}
{{- if not (hasKey .Values "__portBase") -}}
{{- $job := include "elastic-training.fullname" . -}}
{{- $sum := atoi (adler32sum (printf "%s/%s" .Release.Namespace $job)) -}}
{{- $base := add 20000 (mul 10 (mod $sum 1000)) -}}
{{- $run := lookup "v1" "ConfigMap" .Release.Namespace (printf "%s-run" $job) | default dict -}}
{{- if $run -}}
{{- $base = dig "data" "rdzv-port-base" (add 20000 (mul 10 (mod $sum 1100)) | toString) $run | atoi -}}
{{- end -}}
{{- $_ := set .Values "__portBase" $base -}}
{{- end -}}
{{- index .Values "__portBase" -}}
{{- end }}

{{/*
An image reference, [registry/]repository then @digest when a digest is set, else :tag. The registry is the image's
own `registry`, else global.imageRegistry, each replacing the registry host the repository names (its first part
when that has a '.' or ':' or is localhost; none: Docker Hub's), so that one value moves every image to a mirror.
Input: dict "image" <the image's dict> "root" $.
*/}}
{{- define "elastic-training.imageRef" -}}
{{- $i := .image -}}
{{- $registry := $i.registry | default ((.root.Values.global | default dict).imageRegistry) -}}
{{- $repo := $i.repository -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = rest $parts | join "/" -}}
{{- end -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo -}}
{{- end -}}
{{- if $i.digest -}}{{ printf "%s@%s" $repo $i.digest }}{{- else -}}{{ printf "%s:%s" $repo (toString $i.tag) }}{{- end -}}
{{- end }}

{{/* The account every pod of the job runs as unless its group names one: serviceAccountName, else the job's own
(serviceAccount: created or named), else "" (the namespace's default). */}}
{{- define "elastic-training.jobServiceAccount" -}}
{{- if .Values.serviceAccountName -}}
{{- .Values.serviceAccountName -}}
{{- else if or .Values.serviceAccount.create .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name | default (include "elastic-training.fullname" .) -}}
{{- end -}}
{{- end }}

{{/* "true" when the chart creates the job's own service account: serviceAccount.create and no serviceAccountName. */}}
{{- define "elastic-training.createServiceAccount" -}}
{{- if and .Values.serviceAccount.create (not .Values.serviceAccountName) }}true{{ end -}}
{{- end }}

{{/* A group's shared memory (shm): its own enabled and sizeLimit where it sets them (merge would take a group's
false for unset), else the job's. Input: dict "root" $ "g" <group>. Output: YAML. */}}
{{- define "elastic-training.shm" -}}
{{- $own := (.g.values | default dict).shm | default dict -}}
{{- $job := .root.Values.shm -}}
enabled: {{ hasKey $own "enabled" | ternary $own.enabled $job.enabled }}
sizeLimit: {{ $own.sizeLimit | default $job.sizeLimit | quote }}
{{- end }}

{{/* The port the pod that serves the rendezvous answers GET /rendezvous on (its health port). */}}
{{- define "elastic-training.rdzvHealthPort" -}}
{{- range (include "elastic-training.rdzvPorts" . | fromYamlArray) -}}
{{- if eq .name "health" }}{{ .targetPort }}{{ end -}}
{{- end -}}
{{- end }}

{{/* The pod settings a group takes from the top level unless it names them in notInherited (JSON list): every list
and map a pod has. */}}
{{- define "elastic-training.inheritable" -}}
{{- list "env" "envFrom" "volumes" "volumeMounts" "initContainers" "extraContainers" "imagePullSecrets" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "podLabels" "podAnnotations" "podSecurityContext" "securityContext" "ports" "dnsConfig" "hostAliases" "resourceClaims" | toJson -}}
{{- end -}}

{{/* deepMerge: map .over merged into a copy of map .base (either may be empty), .over winning key by key all the way
down; a key .over sets to null is dropped. JSON. */}}
{{- define "elastic-training.deepMerge" -}}
{{- $out := deepCopy (.base | default dict) -}}
{{- range $k, $v := (.over | default dict) -}}
{{- if kindIs "invalid" $v -}}
{{- $_ := unset $out $k -}}
{{- else if and (kindIs "map" $v) (kindIs "map" (index $out $k)) -}}
{{- $_ := set $out $k (include "elastic-training.deepMerge" (dict "base" (index $out $k) "over" $v) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* mergeList: the entries of list .base whose .key field no entry of list .over has, then .over's (a group's env
variable, volume or mount replaces the top level's of the same name or path); an entry equal to an earlier one is
kept once. JSON. */}}
{{- define "elastic-training.mergeList" -}}
{{- $key := .key -}}
{{- $taken := dict -}}
{{- range (.over | default list) -}}
{{- with (index . $key) }}{{ $_ := set $taken (toString .) true }}{{ end -}}
{{- end -}}
{{- $out := list -}}
{{- range (.base | default list) -}}
{{- if not (hasKey $taken (toString (index . $key))) -}}{{- $out = append $out . -}}{{- end -}}
{{- end -}}
{{- concat $out (.over | default list) | uniq | toJson -}}
{{- end -}}

{{/* guaranteedShaped: "true" when resources (a container's) give CPU and memory limits, each request missing or
equal to its limit: what Kubernetes needs of every container of a Guaranteed pod. */}}
{{- define "elastic-training.guaranteedShaped" -}}
{{- $l := .limits | default dict -}}
{{- $r := .requests | default dict -}}
{{- $ok := and (hasKey $l "cpu") (hasKey $l "memory") -}}
{{- range $k := list "cpu" "memory" -}}
{{- if and (hasKey $r $k) (ne (toString (index $r $k)) (toString (index $l $k))) -}}{{- $ok = false -}}{{- end -}}
{{- end -}}
{{- if $ok }}true{{ end -}}
{{- end -}}

{{/* The MPI workers' sshd when mpi.workerCommand is empty: in the foreground, logging to the container's stderr, with
the host key and the authorized key ssh-setup put into mpi.ssh.mountPath. /run/sshd is the privilege separation
directory Debian's and Ubuntu's sshd need, which images rarely hold. The ranks mpirun starts over ssh get the
container's environment (env, envFrom, the webhook's, the image's PATH), which an ssh session would not: sshd reads
it from ~/.ssh/environment (PermitUserEnvironment; one line per variable, so a value with a newline is left out). */}}
{{- define "elastic-training.sshd" -}}
set -eu
d={{ .Values.mpi.ssh.mountPath }}
[ -d /run/sshd ] || mkdir -p -m 0755 /run/sshd
env | grep -E '^[A-Za-z_][A-Za-z0-9_]*=' | grep -vE '^(HOME|HOSTNAME|PWD|SHLVL|_)=' > "$d/environment" || true
chmod 0600 "$d/environment"
sshd=$(command -v sshd || echo /usr/sbin/sshd)
exec "$sshd" -De -f /dev/null -h "$d/ssh_host_ed25519_key" -o PidFile=none -o UsePAM=no \
  -o AuthorizedKeysFile="$d/authorized_keys" -o PermitRootLogin=prohibit-password \
  -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o PermitUserEnvironment=yes
{{- end -}}

{{/* The serving pods' annotations that keep node autoscalers from draining their node to consolidate it
(rendezvous.doNotDisrupt): Karpenter's and the cluster autoscaler's. A lost store costs the job a round. */}}
{{- define "elastic-training.doNotDisrupt" -}}
{{- if .Values.rendezvous.doNotDisrupt -}}
karpenter.sh/do-not-disrupt: "true"
cluster-autoscaler.kubernetes.io/safe-to-evict: "false"
{{- end -}}
{{- end -}}

{{/* The job's alert rules (monitoring.prometheusRule), as the spec of a PrometheusRule: also a rules file of
Prometheus itself (test/integration checks them with promtool and a real Prometheus). . = dict "job" "namespace" "m" */}}
{{- define "elastic-training.alertRules" -}}
{{- $sel := printf "namespace=%q, training_job=%q" .namespace .job -}}
{{- $min := int .m.noProgressMinutes -}}
groups:
  - name: elastic-training.{{ .job }}
    rules:
      - alert: ElasticTrainingNoProgress
        expr: max by (namespace, training_job) (elastic_training_job_step{ {{- $sel -}} }) > 0 and max by (namespace, training_job) (changes(elastic_training_job_step{ {{- $sel -}} }[{{ $min }}m])) == 0
        for: 1m
        labels:
          severity: warning
        annotations:
          summary: Job {{ .job }} has trained no step for {{ $min }} minutes.
          description: The ranks of {{ .namespace }}/{{ .job }} said a step (elastic_training.progress) and then none for {{ $min }} minutes; a hang of the elastic-training backend is restarted sooner (TrainingHung Events), so look at kubectl describe job {{ .job }}-worker and the pods' logs.
      - alert: ElasticTrainingRoundChurn
        expr: sum by (namespace, training_job) (increase(elastic_training_sidecar_rendezvous_rounds_total{ {{- $sel -}} }[10m])) >= {{ int .m.roundChurn }}
        labels:
          severity: warning
        annotations:
          summary: Job {{ .job }} formed {{ int .m.roundChurn }} or more rounds in 10 minutes.
          description: Every round restarts every worker of {{ .namespace }}/{{ .job }}; this many in 10 minutes is a crash loop, a flapping node or a scale that keeps changing. The RendezvousRound Events name the members of each.
      - alert: ElasticTrainingHung
        expr: sum by (namespace, training_job) (increase(elastic_training_job_hangs_total{ {{- $sel -}} }[15m])) > 0
        labels:
          severity: warning
        annotations:
          summary: A round of job {{ .job }} hung and was restarted.
          description: No rank of {{ .namespace }}/{{ .job }} advanced for the hang timeout; the TrainingHung Event names the rank that stopped first. Repeated hangs of one pod point at its node.
{{- end -}}
