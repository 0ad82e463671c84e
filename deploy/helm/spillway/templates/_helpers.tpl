{{/* The release's resources are named after it, or "spillway" when the release is. */}}
{{- define "spillway.fullname" -}}
{{- if contains "spillway" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-spillway" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "spillway.selectorLabels" -}}
app.kubernetes.io/name: spillway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "spillway.labels" -}}
{{ include "spillway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The image: repository with the digest when given, else the tag (the appVersion by default). */}}
{{- define "spillway.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "spillway.keysSecret" -}}
{{- default (printf "%s-keys" (include "spillway.fullname" .)) .Values.keys.existingSecret -}}
{{- end -}}

{{- define "spillway.domainsConfigMap" -}}
{{- default (printf "%s-domains" (include "spillway.fullname" .)) .Values.domains.existingConfigMap -}}
{{- end -}}

{{- define "spillway.hasDomains" -}}
{{- if or .Values.domains.files .Values.domains.existingConfigMap -}}true{{- end -}}
{{- end -}}
