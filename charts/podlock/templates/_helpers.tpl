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

{{/* A pod template's metadata: the chart's labels, the component's, and the user's podLabels
     and podAnnotations. Called with (dict "root" $ "component" COMPONENT). */}}
{{- define "podlock.podMetadata" -}}
labels:
  {{- include "podlock.labels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.podAnnotations }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pod securityContext of podlock's pods (podSecurityContext); with `fsGroup`, the volume's
     group is the user's, so that a pod writing a volume (etcd) owns it. Called with (dict
     "root" $ "fsGroup" BOOL). */}}
{{- define "podlock.podSecurityContext" -}}
{{- $context := deepCopy .root.Values.podSecurityContext }}
{{- if and .fsGroup $context.runAsUser }}
{{- $_ := set $context "fsGroup" $context.runAsUser }}
{{- end -}}
securityContext: {{- toYaml $context | nindent 2 }}
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

{{/* Scheduling of a component's pods: its nodeSelector, tolerations and
     topologySpreadConstraints, and its affinity, or
     else a spread over nodes of the pods `selector` selects, preferred, or required when
     `required` is true (pods on the node's network, whose ports would clash). Called with (dict
     "values" COMPONENT'S-VALUES "selector" SELECTOR-LABELS ["required" BOOL]). */}}
{{- define "podlock.scheduling" -}}
{{- if .values.affinity }}
affinity: {{- toYaml .values.affinity | nindent 2 }}
{{- else if .required }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- .selector | nindent 12 }}
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
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The bundled etcd's Secrets: the ones named in etcd.bundled.tlsSecret and
     etcd.bundled.authSecret (made outside the chart: the same at every render, as GitOps
     tools need), else the ones the chart makes (etcd-security.yaml). */}}
{{- define "podlock.etcdTlsSecret" -}}
{{ .Values.etcd.bundled.tlsSecret | default (printf "%s-etcd-tls" (include "podlock.fullname" .)) }}
{{- end }}
{{- define "podlock.etcdRootSecret" -}}
{{ .Values.etcd.bundled.authSecret | default (printf "%s-etcd-root" (include "podlock.fullname" .)) }}
{{- end }}

{{- define "podlock.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "https://%s-etcd-%d.%s-etcd.%s.svc:2379" (include "podlock.fullname" $) $i (include "podlock.fullname" $) $.Release.Namespace) -}}
{{- end -}}
{{ join "," $eps }}
{{- else if .Values.etcd.endpoints -}}
{{ join "," .Values.etcd.endpoints }}
{{- else -}}
{{- /* Without an etcd every lock fails: refuse the install rather than report it a success. */}}
{{- fail "podlock needs an etcd: set etcd.endpoints (e.g. --set 'etcd.endpoints[0]=https://etcd.example:2379') or etcd.bundled.enabled=true" }}
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
# Pod liveness: watch pods with podlock sidecars and read one by name; and pods that asked for
# the sidecar and run without it (a metadata watch of the pods without the sidecar label). RBAC
# cannot narrow a watch by label, so this is every pod; it is read-only.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# A pod without its sidecar is warned about on its Deployment too: its ReplicaSet names it.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get]
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
served: admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, which every Kubernetes the
chart admits (1.35+) serves by default (tests/integration/kube-apis.txt), but a cluster may
turn off. On install and upgrade Helm reads the served kinds from the cluster's discovery (which
lists v1/Pod too); helm template's defaults list group/versions only, and then it is rendered.
*/}}
{{- define "podlock.secretPolicy" -}}
{{- $apis := .Capabilities.APIVersions -}}
{{- $served := or (not ($apis.Has "v1/Pod")) ($apis.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
{{- if and .Values.operator.secretPolicy $served -}}
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
