{{/* The prefix of every name this release gives its objects: the release name when it already
     says podlock (`helm install podlock` keeps the plain names), else RELEASE-podlock. Two
     releases never share a name; at most 50 characters leave room for the longest suffix. */}}
{{- define "podlock.fullname" -}}
{{- if contains "podlock" .Release.Name -}}
{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}
{{ printf "%s-podlock" .Release.Name | trunc 50 | trimSuffix "-" }}
{{- end -}}
{{- end }}

{{- define "podlock.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: podlock
app.kubernetes.io/part-of: podlock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "podlock.selector" -}}
app.kubernetes.io/name: podlock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: podlock-operator
{{- end }}

{{- define "podlock.etcdSelector" -}}
app.kubernetes.io/name: podlock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end }}

{{/* The podlock image: by digest when one is given (what runs is then exactly what was
     tested), else by tag. */}}
{{- define "podlock.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Pod-level settings every podlock pod shares: pull secrets and priority. Called with
     (dict "root" $ "priorityClassName" COMPONENT'S): a component's own priority class wins
     over the top-level one. */}}
{{- define "podlock.podSettings" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName | default .root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/* Scheduling of a component's pods: its nodeSelector and tolerations, and its affinity, or
     else a preferred spread over nodes of the pods `selector` selects. Called with (dict
     "values" COMPONENT'S-VALUES "selector" SELECTOR-LABELS). */}}
{{- define "podlock.scheduling" -}}
{{- if .values.affinity }}
affinity: {{- toYaml .values.affinity | nindent 2 }}
{{- else }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- .selector | nindent 14 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "podlock.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "https://%s-etcd-%d.%s-etcd.%s.svc:2379" (include "podlock.fullname" $) $i (include "podlock.fullname" $) $.Release.Namespace) -}}
{{- end -}}
{{ join "," $eps }}
{{- else -}}
{{ join "," .Values.etcd.endpoints }}
{{- end -}}
{{- end }}

{{/* The operator's rules about locks and pods: in its ClusterRole, or with
     operator.watchNamespace in a Role of that namespace. */}}
{{- define "podlock.lockRules" -}}
# Reconcile DistributedLocks: watch them, manage the finalizer (a JSON patch), write status;
# read the status afresh before choosing a lock's token epoch (not from a lagging cache).
- apiGroups: [podlock.io]
  resources: [distributedlocks]
  verbs: [list, watch, patch]
- apiGroups: [podlock.io]
  resources: [distributedlocks/status]
  verbs: [get, patch]
# Pod liveness: watch pods with podlock sidecars and read one by name. RBAC cannot narrow a
# watch by label, so this is every pod; it is read-only.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# spec.holderService: a Service without a selector and its EndpointSlice per lock that asks
# for one, made by server-side apply (create and patch), watched by label, removed when no
# longer asked for. The operator never takes over one it did not make (owner reference).
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch, create, patch, delete]
# Kubernetes Events about locks (patch: the recorder counts repeats on its own Events, whose
# names are generated, so they cannot be listed here).
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/*
"true" when the operator's Secret policy is rendered: asked for (operator.secretPolicy) and
served: admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, which Kubernetes serves from
1.30 (tests/integration/kube-apis.txt). On install and upgrade Helm reads the served kinds from
the cluster's discovery (which lists v1/Pod too); helm template's defaults list group/versions
only, and then --kube-version decides alone.
*/}}
{{- define "podlock.secretPolicy" -}}
{{- $apis := .Capabilities.APIVersions -}}
{{- $served := or (not ($apis.Has "v1/Pod")) ($apis.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
{{- if and .Values.operator.secretPolicy (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) $served -}}
true
{{- end -}}
{{- end }}

{{/* The annotations of the pre-delete hook's objects (pre-delete.yaml), made in the order of
     their weight (the argument) and deleted once the hook succeeded. */}}
{{- define "podlock.preDeleteHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}
