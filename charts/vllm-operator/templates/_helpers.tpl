{{/* The chart's name, or nameOverride: the app.kubernetes.io/name label and the suffix of the full name. */}}
{{- define "vllm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, else the release name when it already says the chart's name,
else <release>-<name>. */}}
{{- define "vllm-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "vllm-operator.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The operator's image: image.repository (its registry replaced by global.imageRegistry when a parent chart
sets one) and image.tag, the chart's appVersion when empty. */}}
{{- define "vllm-operator.image" -}}
{{- $repository := .Values.image.repository -}}
{{- $registry := (.Values.global | default dict).imageRegistry -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "vllm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vllm-operator.labels" -}}
{{ include "vllm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vllm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vllm-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Rules for the namespaced resources the operator touches: a ClusterRole's in cluster-wide
mode, each watched namespace's Role in namespaced mode. No Secrets: the vLLM pods read the
Hugging Face token through a secretKeyRef; the operator never does.
*/}}
{{- define "vllm-operator.rules" -}}
# VLLMServers: kopf lists and watches them and patches its finalizer and progress
# annotations; the reconciler reads one at a time.
- apiGroups: ["vllm-operator.io"]
  resources: ["vllmservers"]
  verbs: ["get", "list", "watch", "patch"]
# Status is written with server-side apply on the status subresource.
- apiGroups: ["vllm-operator.io"]
  resources: ["vllmservers/status"]
  verbs: ["patch"]
# Children: server-side applied (patch; the first apply of a missing object is authorised as
# create too), listed and watched by kopf (its event handlers and the in-memory index that
# reconciles read), pruned when no longer wanted (delete), read one at a time by the
# autoscaler (get).
- apiGroups: ["apps"]
  resources: ["statefulsets", "daemonsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The model cache claim every replica shares (cache.shared); per-replica claims are the StatefulSet
# controller's (volumeClaimTemplates).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# HorizontalPodAutoscalers and KEDA ScaledObjects of servers with autoscaling.mode HPA or KEDA,
# managed like the children above. Always granted: kopf watches every kind the reconciler
# manages before it runs any handler, so a missing grant would stop the whole operator
# (a kind the cluster does not serve, such as KEDA's without KEDA, is simply not watched).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.routing (docs/routing.md): the InferencePool, its endpoint picker (Deployment, Service, ServiceAccount,
# a Role and RoleBinding in the server's namespace; its config is an argument, no ConfigMap) and the HTTPRoute, managed like the children
# above (a kind the cluster does not serve is not watched). Creating the picker's Role needs the rights it grants
# (Kubernetes refuses an escalation): pods and inferencepools are granted here already, inferenceobjectives read.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["inference.networking.x-k8s.io"]
  resources: ["inferenceobjectives"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# LeaderWorkerSets of servers across nodes (spec.nodes > 1), managed like the children above; the
# autoscaler patches their replicas. Not watched where LWS is not installed.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pods: readiness and crash-loop reasons for status, and which ready pods the autoscaler scrapes
# (get, list, watch); create (rbac.podSecurityDryRun) only for a server-side dry run (dryRun=All) of a server's first pod, so that
# the API server's own Pod Security admission judges the final template before anything is applied
# (controller/pod_admission.py). The operator never stores a Pod; create on pods grants no more than
# create on statefulsets above already does (the StatefulSet controller creates whatever template it gets).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"{{ if .Values.rbac.podSecurityDryRun }}, "create"{{ end }}]
# Pods' status (patch): the adapters' readiness gate (condition vllm-operator.io/adapters-loaded) on the pods of a
# server with spec.adapters, set True once every adapter was tried on the pod's vLLM (docs/adapters.md). Nothing
# else of a pod's status is written.
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# Events: the reconciler's, the autoscaler's and kopf's own warnings (create; one per reason per server, counted
# on: get, patch); while a server is short of replicas, the events of its workload and pods (list, one object's at
# a time: FailedCreate, failed probes) name the cause.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "get", "patch", "list"]
{{- if and .Values.highAvailability.enabled .Values.operator.watchNamespaces }}
# highAvailability, namespaced mode: kopf watches the KopfPeering of each watched namespace
# and patches its keep-alive into it; the operator creates it at start when missing.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch", "create"]
{{- end }}
{{- end -}}

{{/* highAvailability, cluster-wide mode: the same on the one ClusterKopfPeering. */}}
{{- define "vllm-operator.clusterPeeringRules" -}}
{{- if and .Values.highAvailability.enabled (not .Values.operator.watchNamespaces) }}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch", "create"]
{{- end }}
{{- end -}}

{{/* What kopf reads at cluster scope: CRDs (to notice the VLLMServer CRD being reinstalled). */}}
{{- define "vllm-operator.namespaceRules" -}}
# Namespaces (get): a namespace's Pod Security level (pod-security.kubernetes.io/enforce), so a VLLMServer whose
# pods the namespace would refuse says so in its status instead of waiting for pods that never come.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
{{- end -}}

{{- define "vllm-operator.crdRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* An alert's labels: its severity and prometheusRule.alertLabels (dict: severity, alertLabels). */}}
{{- define "vllm-operator.alertLabels" }}
          labels:
            severity: {{ .severity }}
            {{- with .alertLabels }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
{{- end -}}

{{/* An alert's runbook_url annotation, when prometheusRule.runbookBaseURL is set (dict: alert, runbook). */}}
{{- define "vllm-operator.runbookURL" }}
{{- if .runbook }}
            runbook_url: {{ printf "%s#%s" .runbook (lower .alert) }}
{{- end }}
{{- end -}}
