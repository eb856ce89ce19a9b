{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "targetlease.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, prefixed by the chart name unless it already contains it. */}}
{{- define "targetlease.fullname" -}}
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

{{- define "targetlease.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "targetlease.selectorLabels" -}}
app.kubernetes.io/name: {{ include "targetlease.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "targetlease.labels" -}}
helm.sh/chart: {{ include "targetlease.chart" . }}
{{ include "targetlease.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "targetlease.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "targetlease.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The user name the API server gives the operator's ServiceAccount. */}}
{{- define "targetlease.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "targetlease.serviceAccountName" .) }}
{{- end }}

{{- define "targetlease.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "targetlease.leaseIdKeySecretName" -}}
{{- default (printf "%s-lease-id-key" (include "targetlease.fullname" .)) .Values.leaseIdKey.existingSecret }}
{{- end }}

{{/*
Name of a cluster-scoped object (ClusterRole, admission policy, their
bindings): `<release namespace>.<fullname>`. Releases of the same name in two
namespaces must not share one; a namespace has no dot, so the first dot
separates the two unambiguously.
*/}}
{{- define "targetlease.clusterScopedName" -}}
{{- printf "%s.%s" .Release.Namespace (include "targetlease.fullname" .) }}
{{- end }}

{{/*
A CEL expression: the bytes of the labels, annotations, finalizers and owner
references of the TargetLease named by the argument ("object" or
"oldObject"), as the lease-metadata policy counts them. Each finalizer counts
64 bytes more and each owner reference 256 more (what one costs the
operator's cache once decoded, so a mass of tiny entries is bounded too); one
copy of the operator's own finalizer is not counted, so that it can always be
added (a second copy is).
*/}}
{{- define "targetlease.leaseMetadataBytes" -}}
{{- $m := printf "%s.metadata" . -}}
(has({{ $m }}.labels) ? {{ $m }}.labels.map(k, size(bytes(k)) + size(bytes({{ $m }}.labels[k]))).sum() : 0) + (has({{ $m }}.annotations) ? {{ $m }}.annotations.map(k, size(bytes(k)) + size(bytes({{ $m }}.annotations[k]))).sum() : 0) + (has({{ $m }}.finalizers) ? {{ $m }}.finalizers.map(f, size(bytes(f)) + 64).sum() - ({{ $m }}.finalizers.exists(f, f == 'targetlease.dev/release') ? size(bytes('targetlease.dev/release')) + 64 : 0) : 0) + (has({{ $m }}.ownerReferences) ? {{ $m }}.ownerReferences.map(o, size(bytes(o.apiVersion)) + size(bytes(o.kind)) + size(bytes(o.name)) + size(bytes(o.uid)) + 256).sum() : 0)
{{- end }}
