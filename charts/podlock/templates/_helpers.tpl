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

{{/* Pod-level settings every podlock pod shares: pull secrets and priority. */}}
{{- define "podlock.podSettings" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{- define "podlock.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $eps = append $eps (printf "http://podlock-etcd-%d.podlock-etcd.%s.svc:2379" $i $.Release.Namespace) -}}
{{- end -}}
{{ join "," $eps }}
{{- else -}}
{{ join "," .Values.etcd.endpoints }}
{{- end -}}
{{- end }}
