{{/* Names and labels shared by every object of the chart. */}}
{{- define "lazarus-worker.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lazarus-worker.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lazarus-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lazarus-worker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lazarus-worker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "lazarus-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller-worker
{{- end -}}

{{- define "lazarus-worker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lazarus-worker.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The worker image, also run by the init container (and munged, unless told otherwise). */}}
{{- define "lazarus-worker.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* True when SSH keys are given (existing Secret or inline). */}}
{{- define "lazarus-worker.sshKeys" -}}
{{- if or .Values.ssh.keys.existingSecret .Values.ssh.keys.privateKeys -}}true{{- end -}}
{{- end -}}

{{/* True when known_hosts has a persistent home (claim, ConfigMap or inline lines). */}}
{{- define "lazarus-worker.knownHosts" -}}
{{- with .Values.ssh.knownHosts -}}
{{- if or .existingClaim .existingConfigMap .entries -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* True when the init container has a key to copy. */}}
{{- define "lazarus-worker.privateKeys" -}}
{{- if or .Values.replicaKey.existingSecret .Values.slurm.enabled -}}true{{- end -}}
{{- end -}}
