{{/* Names ------------------------------------------------------------------------------------ */}}

{{- define "nibble.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<role>", the name of a role's objects. Argument: (list $ "role"). */}}
{{- define "nibble.roleName" -}}
{{- printf "%s-%s" (include "nibble.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{- define "nibble.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "nibble.fullname" .)) -}}
{{- end -}}

{{- define "nibble.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "nibble.configPath" -}}/etc/nibble/config.yaml{{- end -}}

{{/* Labels. Argument: (list $ "role"). */}}
{{- define "nibble.selectorLabels" -}}
app.kubernetes.io/name: {{ (index . 0).Chart.Name }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "nibble.labels" -}}
{{- $root := index . 0 -}}
{{ include "nibble.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end -}}

{{/* metadata of a role's object. Argument: (list $ "role"). */}}
{{- define "nibble.metadata" -}}
name: {{ include "nibble.roleName" . }}
namespace: {{ (index . 0).Release.Namespace }}
labels:
  {{- include "nibble.labels" . | nindent 2 }}
{{- end -}}

{{/* Trainer GPUs and what follows from them ---------------------------------------------------- */}}

{{- define "nibble.trainerGpus" -}}{{ int .Values.trainer.gpusPerPod }}{{- end -}}

{{- define "nibble.trainerDevice" -}}
{{- if gt (int .Values.trainer.gpusPerPod) 0 }}cuda{{ else }}cpu{{ end -}}
{{- end -}}

{{- define "nibble.trainerProcesses" -}}{{ max 1 (int .Values.trainer.gpusPerPod) }}{{- end -}}

{{/* The trainer's command: plain python for one process, torchrun's module for more (as `nibble run`
starts it, nibble/launcher.py). */}}
{{- define "nibble.trainerCommand" -}}
{{- $n := int (include "nibble.trainerProcesses" .) -}}
{{- $cmd := list "python" -}}
{{- if gt $n 1 -}}
{{- $cmd = concat $cmd (list "-m" "torch.distributed.run" "--standalone" "--nproc-per-node" (toString $n)) -}}
{{- end -}}
{{- $cmd = concat $cmd (list "-m" "nibble.trainer" "--config" (include "nibble.configPath" .) "--out" "/data/out") -}}
{{- toJson $cmd -}}
{{- end -}}

{{/* The run configuration ---------------------------------------------------------------------- */}}

{{/* The keys the chart owns: ports, addresses, directories and the trainer's devices. Nothing here
depends on samplers.replicas: scaling samplers must leave the config (and so its checksum on the trainer's
and weight-sync's pods) alone; the trainer counts live samplers from their heartbeats in Redis. */}}
{{- define "nibble.ownedConfig" -}}
{{- $redisUrl := printf "redis://%s.%s.svc:%d/0" (include "nibble.roleName" (list . "redis")) .Release.Namespace (int .Values.redis.port) -}}
{{- $weightsyncHost := printf "%s.%s.svc" (include "nibble.roleName" (list . "weightsync")) .Release.Namespace -}}
{{- $owned := dict
  "redis" (dict "url" $redisUrl)
  "weightsync" (dict
    "host" $weightsyncHost
    "port" (int .Values.weightsync.port)
    "publish_port" (int .Values.weightsync.publishPort)
    "metrics_port" (int .Values.weightsync.metricsPort)
    "store_dir" "/data/weights")
  "trainer" (dict
    "device" (include "nibble.trainerDevice" .)
    "nproc_per_node" (int (include "nibble.trainerProcesses" .))
    "checkpoint_dir" "/data/checkpoints"
    "metrics_port" (int .Values.trainer.metricsPort)
    "metrics_host" "0.0.0.0"
    "health_port" (int .Values.trainer.healthPort))
  "sampler" (dict
    "metrics_port" (int .Values.samplers.metricsPort)
    "metrics_host" "0.0.0.0"
    "health_port" (int .Values.samplers.healthPort))
-}}
{{- toJson $owned -}}
{{- end -}}

{{/* The YAML every service reads: values.config with the chart's keys added. */}}
{{- define "nibble.runConfig" -}}
{{- $owned := include "nibble.ownedConfig" . | fromJson -}}
{{- toYaml (mustMergeOverwrite (deepCopy .Values.config) $owned) -}}
{{- end -}}

{{/* Validation (what values.schema.json cannot say, and its ranges again for
--skip-schema-validation) ------------------------------------------------------------------------ */}}

{{- define "nibble.requireInteger" -}}
{{- $name := index . 0 -}}{{- $value := index . 1 -}}{{- $min := index . 2 -}}
{{- if not (or (kindIs "float64" $value) (kindIs "int" $value) (kindIs "int64" $value)) -}}
{{- fail (printf "%s must be an integer ≥ %d, got %v" $name $min $value) -}}
{{- end -}}
{{- if or (ne (float64 $value) (float64 (int $value))) (lt (int $value) $min) -}}
{{- fail (printf "%s must be an integer ≥ %d, got %v" $name $min $value) -}}
{{- end -}}
{{- end -}}

{{- define "nibble.validate" -}}
{{- include "nibble.requireInteger" (list "trainer.gpusPerPod" .Values.trainer.gpusPerPod 0) -}}
{{- include "nibble.requireInteger" (list "samplers.replicas" .Values.samplers.replicas 1) -}}
{{- include "nibble.requireInteger" (list "samplers.gpusPerPod" .Values.samplers.gpusPerPod 0) -}}
{{- range $name, $port := dict "weightsync.port" .Values.weightsync.port "weightsync.publishPort" .Values.weightsync.publishPort "weightsync.metricsPort" .Values.weightsync.metricsPort "trainer.metricsPort" .Values.trainer.metricsPort "samplers.metricsPort" .Values.samplers.metricsPort "trainer.healthPort" .Values.trainer.healthPort "samplers.healthPort" .Values.samplers.healthPort "redis.port" .Values.redis.port -}}
{{- include "nibble.requireInteger" (list $name $port 1) -}}
{{- if gt (int $port) 65535 -}}{{- fail (printf "%s must be a port (1-65535), got %v" $name $port) -}}{{- end -}}
{{- end -}}
{{- $ws := .Values.weightsync -}}
{{- if or (eq (int $ws.port) (int $ws.publishPort)) (eq (int $ws.port) (int $ws.metricsPort)) (eq (int $ws.publishPort) (int $ws.metricsPort)) -}}
{{- fail (printf "weightsync.port (%v), weightsync.publishPort (%v) and weightsync.metricsPort (%v) share one pod and must differ" $ws.port $ws.publishPort $ws.metricsPort) -}}
{{- end -}}
{{- range $role := list "trainer" "samplers" -}}
{{- $v := index $.Values $role -}}
{{- if eq (int $v.metricsPort) (int $v.healthPort) -}}
{{- fail (printf "%s.metricsPort and %s.healthPort are both %v; they share one pod and must differ" $role $role $v.metricsPort) -}}
{{- end -}}
{{- end -}}
{{- $auto := .Values.samplers.autoscaling -}}
{{- if and $auto.enabled (gt (int $auto.minReplicas) (int $auto.maxReplicas)) -}}
{{- fail (printf "samplers.autoscaling.minReplicas (%v) must not exceed maxReplicas (%v)" $auto.minReplicas $auto.maxReplicas) -}}
{{- end -}}
{{- if not (kindIs "map" .Values.config) -}}
{{- fail "config must be a mapping (the run configuration, as in configs/*.yaml)" -}}
{{- end -}}
{{- $owned := include "nibble.ownedConfig" . | fromJson -}}
{{- range $key, $value := $owned -}}
{{- if kindIs "map" $value -}}
{{- $section := get $.Values.config $key | default dict -}}
{{- range $field, $_ := $value -}}
{{- if hasKey $section $field -}}
{{- fail (printf "config.%s.%s is set by the chart (see the comment above config in values.yaml); remove it" $key $field) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values.config "num_samplers" -}}
{{- fail "config.num_samplers does not apply on Kubernetes (samplers.replicas sets the sampler count; the trainer counts live samplers); remove it" -}}
{{- end -}}
{{- range $role := list "redis" "weightsync" "trainer" "samplers" -}}
{{- $limits := (index $.Values $role "resources" "limits") | default dict -}}
{{- $requests := (index $.Values $role "resources" "requests") | default dict -}}
{{- if or (hasKey $limits $.Values.gpuResourceName) (hasKey $requests $.Values.gpuResourceName) -}}
{{- fail (printf "%s.resources must not name %s; GPUs come from gpusPerPod" $role $.Values.gpuResourceName) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Pods ---------------------------------------------------------------------------------------- */}}

{{/* A container's resources: the role's, plus `gpus` GPUs as a limit (requests follow limits for
extended resources). Quantities are written as strings, the API's canonical form (`cpu: 2` → "2").
Argument: (list $ resources gpus). */}}
{{- define "nibble.resources" -}}
{{- $root := index . 0 -}}{{- $gpus := int (index . 2) -}}
{{- $resources := dict -}}
{{- range $kind, $quantities := index . 1 | default dict -}}
{{- $strings := dict -}}
{{- range $name, $quantity := $quantities -}}{{- $_ := set $strings $name (toString $quantity) -}}{{- end -}}
{{- $_ := set $resources $kind $strings -}}
{{- end -}}
{{- if gt $gpus 0 -}}
{{- $limits := get $resources "limits" | default dict -}}
{{- $_ := set $limits $root.Values.gpuResourceName (toString $gpus) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

{{/* Pod annotations: Prometheus scraping, the config's checksum (a new config restarts the pods),
and the role's own. Argument: (list $ role-values). */}}
{{- define "nibble.podAnnotations" -}}
{{- $root := index . 0 -}}{{- $values := index . 1 -}}
checksum/config: {{ include "nibble.runConfig" $root | sha256sum }}
{{- if and $root.Values.metrics.annotations $values.metricsPort }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ $values.metricsPort | int | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with $values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Scheduling and pull secrets, the same for every role. Argument: (list $ role-values). */}}
{{- define "nibble.podScheduling" -}}
{{- $root := index . 0 -}}{{- $values := index . 1 -}}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* One environment variable from the Secret. Argument: (list $ "NAME" "key"). */}}
{{- define "nibble.secretEnv" -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "nibble.secretName" (index . 0) }}
      key: {{ index . 2 }}
{{- end -}}

{{/* A Nibble service's environment: only the secrets its role needs (docs/design.md §5: separate publish
and fetch tokens), then the role's extraEnv. Argument: (list $ "role" role-values). */}}
{{- define "nibble.env" -}}
{{- $root := index . 0 -}}{{- $role := index . 1 -}}{{- $values := index . 2 -}}
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME   # caches (torch, triton, matplotlib) land on the /tmp emptyDir, not the read-only image
  value: /tmp
{{- if has $role (list "weightsync" "trainer") }}
{{ include "nibble.secretEnv" (list $root "NIBBLE_PUBLISH_TOKEN" "publish-token") }}
{{- end }}
{{- if has $role (list "weightsync" "samplers") }}
{{ include "nibble.secretEnv" (list $root "NIBBLE_FETCH_TOKEN" "fetch-token") }}
{{- end }}
{{- if and $root.Values.redis.auth (has $role (list "trainer" "samplers")) }}
{{ include "nibble.secretEnv" (list $root "NIBBLE_REDIS_PASSWORD" "redis-password") }}
{{- end }}
{{- with $values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The run config's volume and mount (every Nibble service). */}}
{{- define "nibble.configVolume" -}}
- name: config
  configMap:
    name: {{ include "nibble.roleName" (list . "config") }}
{{- end -}}

{{- define "nibble.configMount" -}}
- name: config
  mountPath: {{ dir (include "nibble.configPath" .) }}
  readOnly: true
{{- end -}}

{{/* The warm-start model's volume and mount (trainer and samplers), when a claim holds it. */}}
{{- define "nibble.modelVolume" -}}
{{- if .Values.model.existingClaim }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "nibble.modelMount" -}}
{{- if .Values.model.existingClaim }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* A PersistentVolumeClaim from a persistence block. Argument: (list $ "role" persistence keep). */}}
{{- define "nibble.pvc" -}}
{{- $root := index . 0 -}}{{- $p := index . 2 -}}
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  {{- include "nibble.metadata" (list $root (index . 1)) | nindent 2 }}
  {{- if index . 3 }}
  annotations:
    helm.sh/resource-policy: keep
  {{- end }}
spec:
  accessModes:
    {{- toYaml $p.accessModes | nindent 4 }}
  {{- with $p.storageClass }}
  storageClassName: {{ . }}
  {{- end }}
  resources:
    requests:
      storage: {{ $p.size }}
{{- end -}}


{{/* Pod security (restricted Pod Security Standard): a non-root user, the runtime's seccomp profile,
volumes group-owned by the pod's group. Argument: a securityContext values block (runAsUser, runAsGroup,
fsGroup). */}}
{{- define "nibble.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .runAsUser }}
runAsGroup: {{ .runAsGroup }}
fsGroup: {{ .fsGroup }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Every container: no privilege escalation, no capabilities, an unwritable root filesystem (what a
service writes goes to its volumes and to /tmp, an emptyDir). */}}
{{- define "nibble.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "nibble.tmpVolume" -}}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "nibble.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Startup, readiness and liveness through gRPC health checking on `port`. The startup probe allows
.Values.probes.startupSeconds for loading the model (or, for the trainer, resuming a checkpoint) before
liveness takes over. Argument: (list $ port). */}}
{{- define "nibble.grpcProbes" -}}
{{- $root := index . 0 -}}{{- $port := int (index . 1) -}}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 10
  failureThreshold: {{ max 1 (div (int $root.Values.probes.startupSeconds) 10) }}
readinessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 10
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}
