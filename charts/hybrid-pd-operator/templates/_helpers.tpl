{{/* Chart name (nameOverride). */}}
{{- define "hpd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "hpd.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "hpd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hpd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hybrid-pd-operator
{{- end }}

{{/* Selector labels of the operator pod (stable across upgrades). */}}
{{- define "hpd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hpd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "hpd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hpd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- define "hpd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Watched namespaces as a list: watchNamespaces, or [release namespace] in namespace scope, or [] (= all). */}}
{{- define "hpd.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson (uniq .Values.watchNamespaces) }}
{{- else if eq .Values.rbac.scope "namespace" }}
{{- toJson (list .Release.Namespace) }}
{{- else }}
{{- toJson (list) }}
{{- end }}
{{- end }}
