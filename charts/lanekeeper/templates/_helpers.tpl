{{/* The chart name. */}}
{{- define "lanekeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every resource name. */}}
{{- define "lanekeeper.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "lanekeeper.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "lanekeeper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: lanekeeper
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels that select the controller pods. (The controller itself
     marks its ConfigMaps app.kubernetes.io/managed-by=lanekeeper.) */}}
{{- define "lanekeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lanekeeper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ServiceAccount name. */}}
{{- define "lanekeeper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lanekeeper.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference. */}}
{{- define "lanekeeper.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Lease name. */}}
{{- define "lanekeeper.leaseName" -}}
{{- default (include "lanekeeper.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
The rules of the controller's namespaced work: exactly the calls in
src/controller (tests/e2e/e2e_rbac.rs compares them with a real API server's
audit log).
*/}}
{{- define "lanekeeper.rules" -}}
- apiGroups: ["lanekeeper.dev"]
  resources: ["capacityprofiles", "lanecontracts", "degradationpolicies"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["lanekeeper.dev"]
  resources: ["capacityprofiles/status", "lanecontracts/status", "degradationpolicies/status"]
  verbs: ["patch"]
# Consuming an approval removes the lanekeeper.dev/approve-level annotation
# from the DegradationPolicy (metadata, not status).
- apiGroups: ["lanekeeper.dev"]
  resources: ["degradationpolicies"]
  verbs: ["patch"]
# The freeze parameters, one LaneFreeze per profile: watched, and written
# by server-side apply (patch, and create for a new one). Nobody else may
# write them (the freeze-params admission policy).
- apiGroups: ["lanekeeper.dev"]
  resources: ["lanefreezes"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  # list, watch: the gateway ConfigMaps are read from a watch (label
  # app.kubernetes.io/managed-by=lanekeeper). get: a Prometheus CA bundle
  # from a ConfigMap, and a gateway ConfigMap as the server has it before
  # writing again a config this leader wrote before. create: a server-side apply of a ConfigMap that does
  # not exist yet is authorized as patch and create.
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: [{{ if .Values.rbac.drain }}"list", "watch", "patch"{{ else }}"list", "watch"{{ end }}]
{{- if .Values.rbac.drain }}
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
{{- end }}
{{- if .Values.rbac.secrets }}
# A Prometheus credential a profile names; the controller uses only a Secret
# labeled lanekeeper.dev/prometheus-credential: "true".
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# The scale target is watched by name (its replicas are spec.replicas for
# these kinds, so their scale subresource is only written).
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments/scale", "statefulsets/scale"]
  verbs: ["patch"]
# A Deployment pool's current revision is its newest ReplicaSet's
# pod-template-hash (drains wait for a rollout; see docs/operations.md);
# watched, metadata only.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list", "watch"]
{{- range .Values.rbac.extraScaleTargets }}
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{ .resource | quote }}]
  verbs: ["list", "watch"]
# Other kinds: the scale subresource is read when the object changes.
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{ printf "%s/scale" .resource | quote }}]
  verbs: ["get", "patch"]
{{- end }}
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: [{{ if .Values.rbac.hpaMinReplicas }}"list", "watch", "patch"{{ else }}"list", "watch"{{ end }}]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* The shared store's name when the chart deploys it. */}}
{{- define "lanekeeper.sharedStateName" -}}
{{- printf "%s-valkey" (include "lanekeeper.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The address the gateways use for --shared-state: the store the chart
     deploys (gateway.sharedState.deploy), else gateway.sharedState.address
     (empty: none). */}}
{{- define "lanekeeper.sharedStateAddress" -}}
{{- $shared := .Values.gateway.sharedState | default dict -}}
{{- if $shared.deploy -}}
{{- printf "redis://%s.%s.svc:%d" (include "lanekeeper.sharedStateName" .) .Release.Namespace (int64 $shared.store.port) -}}
{{- else -}}
{{- $shared.address -}}
{{- end -}}
{{- end -}}
