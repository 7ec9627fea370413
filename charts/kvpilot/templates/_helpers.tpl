{{/* Names ------------------------------------------------------------------------------------------- */}}

{{- define "kvpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-kvpilot, or the release name when it already contains the chart name. */}}
{{- define "kvpilot.fullname" -}}
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

{{- define "kvpilot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvpilot.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvpilot.peeringName" -}}
{{- default (include "kvpilot.fullname" .) .Values.peering.name }}
{{- end }}

{{- define "kvpilot.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Labels ------------------------------------------------------------------------------------------ */}}

{{- define "kvpilot.labels" -}}
helm.sh/chart: {{ include "kvpilot.chart" . }}
{{ include "kvpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvpilot
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kvpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Watch scope ------------------------------------------------------------------------------------- */}}

{{/* "true" when the operator serves only .Values.watchNamespaces (Roles), "" when cluster-wide. */}}
{{- define "kvpilot.namespaced" -}}
{{- if .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/* JSON list of the namespaces where the operator reads model-config ConfigMaps and Hub-token Secrets (Roles):
     watchNamespaces in namespace-scoped mode, rbac.modelConfigNamespaces when cluster-wide; "[]" means a
     ClusterRole (cluster-wide mode, no list): every namespace. */}}
{{- define "kvpilot.modelConfigNamespaces" -}}
{{- if include "kvpilot.namespaced" . }}
{{- if .Values.rbac.modelConfigNamespaces }}
{{- fail "rbac.modelConfigNamespaces is for cluster-wide mode; with watchNamespaces set, ConfigMaps and Secrets are read in exactly those namespaces" }}
{{- end }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson (default (list) .Values.rbac.modelConfigNamespaces) }}
{{- end }}
{{- end }}

{{/* Arguments of the `kopf` command (the container's command is kopf, or a shell that execs it). */}}
{{- define "kvpilot.kopfArgs" -}}
- run
- --module=kvpilot.operator.main
{{- if include "kvpilot.namespaced" . }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.livenessPort }}/healthz
{{- if .Values.peering.enabled }}
- --peering={{ include "kvpilot.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
- --log-format={{ .Values.operator.logFormat }}
{{- if .Values.operator.debug }}
- --debug
{{- end }}
{{- range .Values.operator.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* RBAC rules, one block per purpose. Rendered into ClusterRoles (cluster-wide mode) or into Roles in every
     watched namespace (namespace-scoped mode); see templates/operator-rbac.yaml. Explicit verbs only. */}}

{{/* kopf itself: events about handler progress, and the peering object the replicas coordinate through. */}}
{{- define "kvpilot.rules.framework" -}}
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.peering.enabled }}
{{- if include "kvpilot.namespaced" . }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  resourceNames: [{{ include "kvpilot.peeringName" . | quote }}]
  verbs: [get, patch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [list, watch]
{{- else }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  resourceNames: [{{ include "kvpilot.peeringName" . | quote }}]
  verbs: [get, patch]
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [list, watch]
{{- end }}
{{- end }}
{{- end }}

{{/* kopf's cluster-wide discovery: CRDs (to start serving InferenceServices once the CRD appears) and, in
     namespace-scoped mode, namespaces (to notice the watched ones appear). Read-only. */}}
{{- define "kvpilot.rules.discovery" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if include "kvpilot.namespaced" . }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end }}

{{/* The custom resource: watch it, keep kopf's annotations and finalizer, write its status. No create/delete:
     users own InferenceServices. */}}
{{- define "kvpilot.rules.inferenceservices" -}}
- apiGroups: [kvpilot.io]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch, update]
- apiGroups: [kvpilot.io]
  resources: [inferenceservices/status]
  verbs: [get, patch, update]
- apiGroups: [kvpilot.io]
  resources: [inferenceservices/finalizers]
  verbs: [update]
{{- end }}

{{/* Fleet learning (cluster-scoped TuningProfiles, docs/fleet-learning.md): list them for the planner (one cached
     list, no watch), read one fresh before adding a sample, create one on a key's first sample, and merge-patch
     its status (with the resourceVersion read). No update (a patch is enough), no watch, no delete: people
     delete profiles. */}}
{{- define "kvpilot.rules.tuningprofiles" -}}
- apiGroups: [kvpilot.io]
  resources: [tuningprofiles]
  verbs: [get, list, create]
- apiGroups: [kvpilot.io]
  resources: [tuningprofiles/status]
  verbs: [patch]
{{- end }}

{{/* EngineTuner (target mode, docs/enginetuner.md): the kind itself and its status; the target's pods are
     evicted one at a time in mode Auto (pods/eviction create, in kvpilot.rules.disruption). The target is
     only read (a Deployment through the workloads rules, a StatefulSet here): new pods get the settings from
     the admission webhook. */}}
{{- define "kvpilot.rules.enginetuners" -}}
- apiGroups: [kvpilot.io]
  resources: [enginetuners]
  verbs: [get, list, watch, patch, update]
- apiGroups: [kvpilot.io]
  resources: [enginetuners/status]
  verbs: [get, patch, update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get]
{{- end }}

{{/* What the operator owns: the vLLM Deployment and Service per InferenceService, and the weight-cache claim of a
     model.storage.claimTemplate, server-side applied (patch;
     create when the apply creates) and read (get: an object of the wanted name that another controls is a
     NameConflict, never adopted). No update (an apply is a PATCH) and no delete: garbage collection
     removes them through their owner references when the InferenceService goes. A user's existing claim
     (model.storage.persistentVolumeClaim) is only read, to report a missing one. Pods are only read (crash
     loops and restarts drive rollbacks). pods/log: the kubelet keeps only the last 80 lines / 2 KiB of a crash as
     its termination message, which after a vLLM start-up failure is usually the API server's traceback, not
     vLLM's error; the closed loop reads the previous container's log tail to classify the crash. */}}
{{- define "kvpilot.rules.workloads" -}}
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# which HorizontalPodAutoscalers scale an InferenceService (an autoscaler on a Recreate single replica is
# warned about: kvpilot.operator.inferenceservice.autoscalers); read only, and only for Recreate services
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list]
{{- if .Values.multiNode.enabled }}
# a replica over several nodes (spec.gpu.nodesPerReplica > 1) runs as a LeaderWorkerSet (sigs.k8s.io/lws,
# installed separately); server-side apply, as for the Deployment: no update, no delete; list and watch for
# drift repair
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch]
{{- end }}
{{- end }}

{{/* Model configuration the user points at: a ConfigMap holding config.json (`source: ConfigMap`) and the
     Hugging Face token Secret (`source: Hub`). get only: nothing is listed, watched or written. Roles in the
     namespaces of kvpilot.modelConfigNamespaces; a ClusterRole (every namespace) only when cluster-wide
     without rbac.modelConfigNamespaces. */}}
{{- define "kvpilot.rules.modelConfig" -}}
- apiGroups: [""]
  resources: [configmaps]
  {{- with .Values.rbac.configMaps.resourceNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
  verbs: [get]
{{- if .Values.rbac.secrets.enabled }}
- apiGroups: [""]
  resources: [secrets]
  {{- with .Values.rbac.secrets.resourceNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
  verbs: [get]
{{- end }}
{{- end }}

{{/* Disruption: the PodDisruptionBudget of a service with 2 or more replicas, and an EngineTuner's
     one-pod-at-a-time eviction (updateMode Auto). Confined like the model config (kvpilot.modelConfigNamespaces):
     a ClusterRole only in cluster-wide mode with rbac.modelConfigNamespaces empty (then kube-system too). */}}
{{- define "kvpilot.rules.disruption" -}}
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
{{- end }}

{{/* Capacity: pods of every namespace (list only), to count the nvidia.com/gpu other pods hold on each
     node (spec.rollout.strategy Auto's surge test). Always cluster-wide: GPUs are shared across namespaces. */}}
{{- define "kvpilot.rules.capacity" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- end }}

{{/* GPU discovery: GPU Feature Discovery labels and nvidia.com/gpu capacity on nodes. Read-only. */}}
{{- define "kvpilot.rules.gpuDiscovery" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- end }}

{{/*
"true" when the cluster serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy: Kubernetes 1.30 or
later (the server's version; `helm template --kube-version`). The admission policies render only then (an
older API server would refuse the install), and NOTES.txt warns when they do not.
*/}}
{{- define "kvpilot.admissionPolicyServed" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- end }}

{{- /*
Who enforces the tenant policy in the operator (admissionPolicy.operatorEnforcement): the value when set, else
Strict when the chart renders no admission policy (disabled, or Kubernetes before 1.30) and Off when it does.
*/ -}}
{{- define "kvpilot.operatorEnforcement" -}}
{{- if .Values.admissionPolicy.operatorEnforcement }}{{ .Values.admissionPolicy.operatorEnforcement }}
{{- else if and .Values.admissionPolicy.enabled (include "kvpilot.admissionPolicyServed" .) }}Off
{{- else }}Strict
{{- end }}
{{- end }}

{{/* spec.template's weight limit in bytes: kvpilot.operator.pods.pod_template.TEMPLATE_SIZE_LIMIT
     (tests/chart/test_chart_admission.py ties the two). */}}
{{- define "kvpilot.templateSizeLimit" -}}
65536
{{- end }}

{{/*
The access modes a requester's spec.model.storage.claimTemplate may ask for (the admission policy and the
operator's own guard read this one list): admissionPolicy.claimTemplate.allowedAccessModes, and
ReadWriteMany when multiNode.enabled, since every node of a group mounts the weights and the CRD refuses any
other mode for gpu.nodesPerReplica > 1 (docs/multinode.md). JSON.
*/}}
{{- define "kvpilot.claimAccessModes" -}}
{{- $modes := .Values.admissionPolicy.claimTemplate.allowedAccessModes }}
{{- if .Values.multiNode.enabled }}{{ $modes = append $modes "ReadWriteMany" | uniq }}{{ end }}
{{- toJson $modes }}
{{- end }}
