{{/*
The pod template of one group. Input: dict "root" $ "g" <group from the plan> "plan" <plan>.
Nothing here may depend on a group's replicas (except MXNet's num-workers): the template must stay
byte-identical when `helm upgrade --set workers.replicas=N` scales the job. No chart version, no revision.
*/}}
{{- define "elastic-training.podTemplate" -}}
{{- include "elastic-training.checkGroup" . -}}
{{- $root := .root -}}
{{- $rv := $root.Values -}}
{{- $g := .g -}}
{{- $gv := $g.values | default dict -}}
{{- $job := include "elastic-training.fullname" $root -}}
{{- $isMPI := eq $rv.framework "mpi" -}}
{{- $hasScript := include "elastic-training.hasScript" $root -}}
{{- $scriptPath := printf "%s/%s" (include "elastic-training.scriptDir" $root) $rv.scriptName -}}
{{- $image := merge (deepCopy ($gv.image | default dict)) $rv.image -}}
{{/* What the group takes from the top level (README "Pod settings"): every list and map, unless the group names it
in notInherited. Lists are appended (an entry equal to one above is kept once), maps merged with the group winning
key by key, all the way down (a key the group sets to null is dropped). */}}
{{- $in := dict -}}
{{- range $k := include "elastic-training.inheritable" . | fromJsonArray -}}
{{- if not (has $k ($gv.notInherited | default list)) -}}
{{- $_ := set $in $k (index $rv $k) -}}
{{- end -}}
{{- end -}}
{{/* command and args */}}
{{- $command := $gv.command | default list -}}
{{- $args := $gv.args | default list -}}
{{- $ownSshd := false -}}
{{- if and $isMPI (eq $g.role "worker") -}}
{{- $command = $command | default $rv.mpi.workerCommand -}}
{{- if and (not $command) $rv.mpi.ssh.enabled -}}
{{- /* The chart's sshd: its host key made by ssh-setup (no image layer holds one; Debian's packages make them at
install time, and images delete them), no config file, PAM or password; the job's key from ssh-setup logs in. */ -}}
{{- $ownSshd = true -}}
{{- $command = list "/bin/sh" "-c" (include "elastic-training.sshd" $root) -}}
{{- end -}}
{{- else -}}
{{- $command = $command | default $rv.command -}}
{{- $args = $args | default $rv.args -}}
{{- if and (not $command) $hasScript -}}
{{- $launcher := $rv.scriptLauncher | default (eq $rv.framework "pytorch" | ternary (list "torchrun") (list "python3")) -}}
{{- $command = $launcher -}}
{{- $args = prepend $args $scriptPath -}}
{{- end -}}
{{- if and $isMPI (eq $g.role "launcher") $rv.mpi.launcher.waitForWorkers $command -}}
{{- /* rdzv-sidecar launch (the webhook copies the binary into every pod): mpirun starts once the job's minimum of
workers is registered, settled, in the hostfile and answering ssh, and runs again when one is lost. */ -}}
{{- $launch := list (include "elastic-training.contract" $root | fromJson).sidecarBinary "launch" (printf "--members=%d" (int .plan.minNodes)) -}}
{{- if contains "--host-discovery-script" (join " " (concat $command $args)) -}}
{{- /* horovodrun follows the membership itself through the discovery script: wait, then leave it be. */ -}}
{{- $launch = append $launch "--once" -}}
{{- else if $rv.mpi.launcher.rerunOnScaleUp -}}
{{- $launch = append $launch "--rerun-on-join" -}}
{{- end -}}
{{- if $rv.rendezvous.tls.secretName -}}
{{- $launch = concat $launch (list "--cacert=/etc/elastic-training-tls/ca.crt" "--cert=/etc/elastic-training-tls/tls.crt" "--key=/etc/elastic-training-tls/tls.key") -}}
{{- end -}}
{{- /* A run whose ranks said their progress and then stopped is stopped and run again (docs/hangs.md, "MPI"). */ -}}
{{- if not $rv.hang.enabled -}}
{{- $launch = append $launch "--hang=false" -}}
{{- else if $rv.hang.timeout -}}
{{- $launch = append $launch (printf "--hang-timeout=%ds" (int $rv.hang.timeout)) -}}
{{- end -}}
{{- $command = concat $launch (list "--") $command -}}
{{- end -}}
{{- end -}}
{{/* resources: the group's requests and limits win, resource by resource, over the shared ones; gpus add the
accelerator limit */}}
{{- $resources := dict -}}
{{- range $k := list "requests" "limits" "claims" -}}
{{- $group := index ($gv.resources | default dict) $k -}}
{{- $shared := index ($rv.resources | default dict) $k -}}
{{- if eq $k "claims" -}}
{{- with ($group | default $shared) -}}{{- $_ := set $resources $k . -}}{{- end -}}
{{- else if or $group $shared -}}
{{- $_ := set $resources $k (merge (deepCopy ($group | default dict)) ($shared | default dict)) -}}
{{- end -}}
{{- end -}}
{{- $gpus := int ($gv.gpus | default 0) -}}
{{- if gt $gpus 0 -}}
{{- $limits := $resources.limits | default dict -}}
{{- $_ := set $limits $rv.gpuResource $gpus -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{/* volumes */}}
{{- $volumes := include "elastic-training.mergeList" (dict "base" $in.volumes "over" $gv.volumes "key" "name") | fromJsonArray -}}
{{- $userMounts := include "elastic-training.mergeList" (dict "base" $in.volumeMounts "over" $gv.volumeMounts "key" "mountPath") | fromJsonArray -}}
{{- $mounts := $userMounts -}}
{{- if $hasScript -}}
{{- $volumes = append $volumes (dict "name" "script" "configMap" (dict "name" (printf "%s-script" $job) "defaultMode" 365)) -}}
{{- $mounts = append $mounts (dict "name" "script" "mountPath" (include "elastic-training.scriptDir" $root) "readOnly" true) -}}
{{- end -}}
{{- if $rv.persistence.enabled -}}
{{- $volumes = append $volumes (dict "name" "data" "persistentVolumeClaim" (dict "claimName" ($rv.persistence.existingClaim | default (printf "%s-data" $job)))) -}}
{{- $mounts = append $mounts (dict "name" "data" "mountPath" $rv.persistence.mountPath) -}}
{{- end -}}
{{- if and (eq $rv.framework "pytorch") (eq $g.role "worker") $rv.checkpoint.memory -}}
{{/* in-memory checkpoints: the webhook mounts it in the trainer and the sidecar (docs/contract.md) */}}
{{- $volumes = append $volumes (dict "name" "elastic-training-checkpoints" "emptyDir" (dict "medium" "Memory" "sizeLimit" $rv.checkpoint.memory)) -}}
{{- end -}}
{{- $shm := include "elastic-training.shm" (dict "root" $root "g" $g) | fromYaml -}}
{{- if $shm.enabled -}}
{{- $shmDir := dict "medium" "Memory" -}}
{{- with $shm.sizeLimit }}{{- $_ := set $shmDir "sizeLimit" . -}}{{- end -}}
{{- $volumes = append $volumes (dict "name" "dshm" "emptyDir" $shmDir) -}}
{{- $mounts = append $mounts (dict "name" "dshm" "mountPath" "/dev/shm") -}}
{{- end -}}
{{- $ssh := and $isMPI $rv.mpi.ssh.enabled -}}
{{- if $ssh -}}
{{- $volumes = append $volumes (dict "name" "ssh-key" "secret" (dict "secretName" (printf "%s-ssh" $job) "defaultMode" 256)) -}}
{{- $volumes = append $volumes (dict "name" "ssh" "emptyDir" (dict "medium" "Memory")) -}}
{{- $mounts = append $mounts (dict "name" "ssh" "mountPath" $rv.mpi.ssh.mountPath) -}}
{{- end -}}
{{/* scheduling */}}
{{- $schedulerName := $gv.schedulerName | default $rv.schedulerName | default (ternary "volcano" "" (not (empty $rv.queue.volcano))) -}}
{{- $spread := list -}}
{{- range (concat ($in.topologySpreadConstraints | default list) ($gv.topologySpreadConstraints | default list) | uniq) -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "elastic-training.groupSelector" (dict "root" $root "group" $g.name) | fromYaml)) -}}
{{- end -}}
{{- $spread = append $spread $c -}}
{{- end -}}
{{- $podLabels := include "elastic-training.deepMerge" (dict "base" $in.podLabels "over" $gv.podLabels) | fromJson -}}
{{- $podAnnotations := include "elastic-training.deepMerge" (dict "base" $in.podAnnotations "over" $gv.podAnnotations) | fromJson -}}
{{- $containerName := $rv.containerName -}}
{{- $inits := concat ($in.initContainers | default list) ($gv.initContainers | default list) -}}
{{- $extra := concat ($in.extraContainers | default list) ($gv.extraContainers | default list) -}}
{{- $sa := $gv.serviceAccountName | default $rv.serviceAccountName | default (include "elastic-training.jobServiceAccount" $root) -}}
metadata:
  labels:
    {{- with $podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    app.kubernetes.io/name: {{ include "elastic-training.name" $root }}
    app.kubernetes.io/instance: {{ $root.Release.Name }}
    app.kubernetes.io/component: {{ $g.role }}
    elastic-training.io/job: {{ $job }}
    elastic-training.io/role: {{ $g.role }}
    elastic-training.io/group: {{ $g.name }}
  annotations:
    {{- with $podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    kubectl.kubernetes.io/default-container: {{ $containerName }}
    elastic-training.io/container: {{ $containerName }}
    {{- include "elastic-training.jobAnnotations" (dict "root" $root "plan" .plan) | nindent 4 }}
    {{- if and (eq $rv.framework "pytorch") (eq $g.role "worker") $rv.checkpoint.memory (or $rv.checkpoint.persistDir $rv.persistence.enabled) (gt (int $rv.checkpoint.persistEvery) 0) }}
    {{- /* in-memory checkpoints copied to the job's volume as well (docs/checkpoints.md) */}}
    elastic-training.io/checkpoint-persist: {{ $rv.checkpoint.persistDir | default (printf "%s/elastic-training/%s" (trimSuffix "/" $rv.persistence.mountPath) $job) | quote }}
    elastic-training.io/checkpoint-persist-every: {{ $rv.checkpoint.persistEvery | int | toString | quote }}
    {{- end }}
    {{- with (include "elastic-training.sidecarPorts" $root | fromYaml).base }}
    elastic-training.io/rdzv-ports: {{ . | quote }}
    {{- end }}
    {{- if $g.rdzvHost }}
    elastic-training.io/rdzv-host: "true"
    {{- include "elastic-training.doNotDisrupt" $root | nindent 4 }}
    {{- if .plan.standbys }}
    elastic-training.io/rdzv-standbys: {{ .plan.standbys | quote }}
    {{- end }}
    {{- end }}
    {{- if not (kindIs "invalid" $gv.slots) }}
    elastic-training.io/slots: {{ int $gv.slots | quote }}
    {{- end }}
    {{- with $rv.queue.volcano }}
    scheduling.volcano.sh/queue-name: {{ . }}
    {{- /* The job's PodGroup (podgroup.yaml): Volcano gangs every pod of the job, not each Job on its own. */}}
    scheduling.k8s.io/group-name: {{ $job }}
    {{- end }}
spec:
  # Only the admission webhook removes this gate (internal/constants.SchedulingGate): without the webhook the pod
  # stays SchedulingGated instead of training alone, with no rendezvous.
  schedulingGates:
    - name: {{ (include "elastic-training.contract" $root | fromJson).schedulingGate }}
  {{- if eq $g.kind "Job" }}
  restartPolicy: {{ include "elastic-training.restartPolicy" (dict "root" $root "g" $g) }}
  {{- else }}
  restartPolicy: Always
  {{- end }}
  subdomain: {{ $job }}
  enableServiceLinks: false
  {{- if $rv.hostNetwork }}
  hostNetwork: true
  {{- end }}
  {{- with ($rv.dnsPolicy | default (ternary "ClusterFirstWithHostNet" "" $rv.hostNetwork)) }}
  dnsPolicy: {{ . }}
  {{- end }}
  {{- with (include "elastic-training.deepMerge" (dict "base" $in.dnsConfig "over" $gv.dnsConfig) | fromJson) }}
  dnsConfig:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (concat ($in.hostAliases | default list) ($gv.hostAliases | default list) | uniq) }}
  hostAliases:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "elastic-training.mergeList" (dict "base" $in.resourceClaims "over" $gv.resourceClaims "key" "name") | fromJsonArray) }}
  resourceClaims:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $rv.hostIPC }}
  hostIPC: true
  {{- end }}
  {{- with $rv.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with $sa }}
  serviceAccountName: {{ . }}
  {{- end }}
  automountServiceAccountToken: {{ hasKey $gv "automountServiceAccountToken" | ternary $gv.automountServiceAccountToken $rv.automountServiceAccountToken }}
  {{- with $schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- with ($gv.priorityClassName | default $rv.priorityClassName) }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ hasKey $gv "terminationGracePeriodSeconds" | ternary $gv.terminationGracePeriodSeconds $rv.terminationGracePeriodSeconds | int }}
  {{- with (concat ($in.imagePullSecrets | default list) ($gv.imagePullSecrets | default list) | uniq) }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "elastic-training.deepMerge" (dict "base" $in.nodeSelector "over" $gv.nodeSelector) | fromJson) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "elastic-training.tolerations" (dict "root" $root "user" (concat ($in.tolerations | default list) ($gv.tolerations | default list) | uniq)) | fromYamlArray) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "elastic-training.deepMerge" (dict "base" $in.affinity "over" $gv.affinity) | fromJson) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $spread }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "elastic-training.deepMerge" (dict "base" $in.podSecurityContext "over" $gv.podSecurityContext) | fromJson) }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if or $ssh $inits }}
  initContainers:
  {{- end }}
  {{- if $ssh }}
  {{- /* ssh-setup runs in the trainer image, so it gets the trainer's own volumeMounts too (an image may bring
  its tools through them). chmod: an emptyDir is created 0777, and sshd's StrictModes rejects authorized_keys in a
  group- or world-writable directory. An image without OpenSSH fails here, saying so, instead of with "not found". */}}
  {{- $need := ternary (first ($rv.mpi.workerCommand | default (list "/usr/sbin/sshd"))) "ssh" (eq $g.role "worker") }}
    - name: ssh-setup
      image: {{ include "elastic-training.imageRef" (dict "image" $image "root" $root) }}
      imagePullPolicy: {{ $image.pullPolicy }}
      command: ["/bin/sh", "-c"]
      args:
        - |
          set -eu
          for b in ssh-keygen {{ $need }}; do
            command -v "$b" >/dev/null 2>&1 || {
              echo "elastic-training: image {{ include "elastic-training.imageRef" (dict "image" $image "root" $root) }} has no $b: MPI pods need OpenSSH in the trainer image (ssh-keygen, and sshd on workers, ssh on the launcher; Debian: openssh-server, openssh-client)" >&2
              exit 1
            }
          done
          d={{ $rv.mpi.ssh.mountPath }}
          chmod 0700 "$d"
          cp /etc/elastic-training-ssh/ssh-privatekey "$d/id_ecdsa"
          chmod 0600 "$d/id_ecdsa"
          ssh-keygen -y -f "$d/id_ecdsa" > "$d/id_ecdsa.pub"
          cp "$d/id_ecdsa.pub" "$d/authorized_keys"
          printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  IdentityFile %s/id_ecdsa\n' "$d" > "$d/config"
          chmod 0600 "$d/authorized_keys" "$d/config"
          {{- if $ownSshd }}
          ssh-keygen -q -t ed25519 -N '' -C '' -f "$d/ssh_host_ed25519_key"
          {{- end }}
      {{- if include "elastic-training.guaranteedShaped" $resources }}
      {{- /* The pod is Guaranteed only when every container is, init containers too (the webhook shapes the
      sidecar likewise, internal/mutate resources.go). */}}
      resources:
        requests: {cpu: 100m, memory: 64Mi}
        limits: {cpu: 100m, memory: 64Mi}
      {{- end }}
      volumeMounts:
        {{- with $userMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        - name: ssh-key
          mountPath: /etc/elastic-training-ssh
          readOnly: true
        - name: ssh
          mountPath: {{ $rv.mpi.ssh.mountPath }}
      terminationMessagePolicy: FallbackToLogsOnError
  {{- end }}
  {{- with $inits }}
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ $containerName }}
      image: {{ include "elastic-training.imageRef" (dict "image" $image "root" $root) }}
      imagePullPolicy: {{ $image.pullPolicy }}
      {{- with $command }}
      command:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $args }}
      args:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with ($gv.workingDir | default $rv.workingDir) }}
      workingDir: {{ . }}
      {{- end }}
      {{- with (include "elastic-training.mergeList" (dict "base" $in.ports "over" $gv.ports "key" "containerPort") | fromJsonArray) }}
      ports:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with (include "elastic-training.mergeList" (dict "base" $in.env "over" $gv.env "key" "name") | fromJsonArray) }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with (concat ($in.envFrom | default list) ($gv.envFrom | default list) | uniq) }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with (include "elastic-training.deepMerge" (dict "base" $in.securityContext "over" $gv.securityContext) | fromJson) }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $mounts }}
      volumeMounts:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- /* A probe or hook is one handler: a group's replaces the top level's whole. For PyTorch, a preStop of
      your own replaces the webhook's, which leaves the rendezvous at once on a scale-down (run
      /etc/elastic-training/leave-rendezvous.py from yours). */}}
      {{- range $k := list "livenessProbe" "readinessProbe" "startupProbe" "lifecycle" }}
      {{- with (index $gv $k | default (index $rv $k)) }}
      {{ $k }}:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
  {{- with $extra }}
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $volumes }}
  volumes:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
