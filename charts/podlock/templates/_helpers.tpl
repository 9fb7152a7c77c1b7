{{- define "podlock.labels" -}}
app.kubernetes.io/name: podlock
app.kubernetes.io/part-of: podlock
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "podlock.selector" -}}
app.kubernetes.io/name: podlock
app.kubernetes.io/component: podlock-operator
{{- end }}

{{- define "podlock.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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
