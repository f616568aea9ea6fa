{{- /* The dedicated rendezvous pod's template (its digest guards upgrades: elastic-training.podTemplateOnUpgrade). */ -}}
{{- define "elastic-training.rdzvPodTemplate" -}}
{{- $plan := .plan -}}
{{- with .root -}}
{{- $job := include "elastic-training.fullname" . -}}
{{- $r := .Values.rendezvous -}}
{{- $tls := $r.tls.secretName -}}
{{- $scheme := ternary "https" "http" (not (empty $tls)) -}}
{{- $svc := printf "%s-rdzv.%s.svc.%s" $job .Release.Namespace .Values.clusterDomain -}}
{{- $events := include "elastic-training.eventsJob" (dict "root" . "plan" $plan) -}}
{{- $lostPodSets := include "elastic-training.lostPodSets" (dict "root" . "plan" $plan) -}}
metadata:
  labels:
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    app.kubernetes.io/name: {{ include "elastic-training.name" . }}
    app.kubernetes.io/instance: {{ .Release.Name }}
    app.kubernetes.io/component: rdzv
    elastic-training.io/job: {{ $job }}
    elastic-training.io/role: rdzv
    elastic-training.io/group: rdzv
  annotations:
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    kubectl.kubernetes.io/default-container: rdzv-sidecar
    {{- include "elastic-training.jobAnnotations" (dict "root" . "plan" $plan) | nindent 4 }}
    elastic-training.io/rdzv-host: "true"
    {{- include "elastic-training.doNotDisrupt" . | nindent 4 }}
spec:
  # Only the webhook removes this gate, as it gives the pod its sidecar image (rendezvous.image).
  schedulingGates:
    - name: {{ (include "elastic-training.contract" . | fromJson).schedulingGate }}
  {{- /* The name a StatefulSet would give it: resolvable through the headless Service, the sidecar's identity. */}}
  hostname: {{ $job }}-rdzv-0
  subdomain: {{ $job }}
  enableServiceLinks: false
  {{- with include "elastic-training.jobServiceAccount" . }}
  serviceAccountName: {{ . }}
  {{- end }}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 10
  {{- with ($r.priorityClassName | default .Values.priorityClassName) }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $r.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "elastic-training.tolerations" (dict "root" . "user" $r.tolerations) | fromYamlArray) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $r.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: rdzv-sidecar
      image: {{ include "elastic-training.rendezvousImage" . }}
      {{- with include "elastic-training.rendezvousPullPolicy" . }}
      {{ . }}
      {{- end }}
      {{- with $r.command }}
      command:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      args:
        - serve
        - --data-dir=/var/lib/elastic-training
        - --listen-client-urls={{ $scheme }}://0.0.0.0:2379
        - --advertise-client-urls={{ $scheme }}://{{ $svc }}:2379
        - --health-addr=:2381
        - --files-dir=/etc/elastic-training
        - --hostfile-flavour={{ eq .Values.framework "mpi" | ternary .Values.mpi.flavour "openmpi" }}
        - --register=false
        - --member-host={{ $job }}-rdzv-0.{{ $job }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
        - --member-group=rdzv
        - --member-index=0
        {{- with $r.leaseTTL }}
        - --lease-ttl={{ . | int }}s
        {{- end }}
        {{- if eq .Values.framework "pytorch" }}
        - --backend={{ include "elastic-training.backend" . }}
        {{- if eq $r.restartSurvivors false }}
        - --restart-survivors=false
        {{- end }}
        {{- if eq (include "elastic-training.backend" .) "elastic-training" }}
        {{- if not .Values.hang.enabled }}
        - --hang=false
        {{- else if .Values.hang.timeout }}
        - --hang-timeout={{ .Values.hang.timeout | int }}s
        {{- end }}
        {{- end }}
        {{- end }}
        {{- with $events }}
        - --events-job={{ . }}
        {{- end }}
        {{- with $lostPodSets }}
        - --force-delete-lost-pods-of={{ . }}
        {{- end }}
        # It serves while it holds the Lease {{ $job }}-rdzv, which points the Service at it (rbac.yaml).
        - --lease={{ $job }}-rdzv
        {{- if $tls }}
        - --cert-file=/etc/elastic-training-tls/tls.crt
        - --key-file=/etc/elastic-training-tls/tls.key
        - --trusted-ca-file=/etc/elastic-training-tls/ca.crt
        # As in a webhook-served rendezvous: every client presents the Secret's certificate.
        - --client-cert-auth
        {{- end }}
      # Args above but the member flags, and all below but resources: the sidecar the webhook injects into a
      # serving pod (internal/mutate, func sidecar); test/helm/sidecar_contract_test.go fails on any difference.
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              apiVersion: v1
              fieldPath: metadata.name
        - name: POD_IP
          valueFrom:
            fieldRef:
              apiVersion: v1
              fieldPath: status.podIP
      ports:
        - name: rdzv
          containerPort: 2379
          protocol: TCP
        - name: c10d
          containerPort: 29400
          protocol: TCP
        - name: rdzv-health
          containerPort: 2381
          protocol: TCP
      {{- /* As the webhook's serving sidecars (internal/mutate startHook, startProbe): a postStart hook on /startz where
      the agents wait for the store themselves, a startup probe on /readyz elsewhere. */}}
      {{- if and (eq .Values.framework "pytorch") (eq (include "elastic-training.backend" .) "elastic-training") }}
      lifecycle:
        postStart:
          exec:
            command:
              - /usr/local/bin/rdzv-sidecar
              - started
              - --url=http://127.0.0.1:2381/startz
              - --timeout=1m0s
      {{- else }}
      startupProbe:
        httpGet:
          path: /readyz
          port: 2381
        periodSeconds: 1
        failureThreshold: 600
      {{- end }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: 2381
        periodSeconds: 5
        failureThreshold: 3
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        allowPrivilegeEscalation: false
        privileged: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: [ALL]
        seccompProfile:
          type: RuntimeDefault
      terminationMessagePolicy: FallbackToLogsOnError
      {{- with $r.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: elastic-training-data
          mountPath: /var/lib/elastic-training
        - name: elastic-training
          mountPath: /etc/elastic-training
        {{- if $tls }}
        - name: elastic-training-tls
          mountPath: /etc/elastic-training-tls
          readOnly: true
        {{- end }}
        # The sidecar's API token for its Lease, Events and lost pods (rbac.yaml); the pod's own token stays unmounted.
        - name: elastic-training-token
          mountPath: /var/run/secrets/kubernetes.io/serviceaccount
          readOnly: true
  volumes:
    - name: elastic-training-data
      emptyDir: {}
    - name: elastic-training
      emptyDir: {}
    - name: elastic-training-token
      projected:
        defaultMode: 0644
        sources:
          - serviceAccountToken:
              path: token
              expirationSeconds: 3607
          - configMap:
              name: kube-root-ca.crt
              items:
                - key: ca.crt
                  path: ca.crt
          - downwardAPI:
              items:
                - path: namespace
                  fieldRef:
                    apiVersion: v1
                    fieldPath: metadata.namespace
    {{- if $tls }}
    - name: elastic-training-tls
      secret:
        secretName: {{ $tls }}
    {{- end }}
{{- end -}}
{{- end -}}
