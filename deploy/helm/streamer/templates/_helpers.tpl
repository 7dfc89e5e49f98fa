{{/* Names and labels. */}}
{{- define "streamer.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "streamer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "streamer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "streamer.labels" -}}
{{ include "streamer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "streamer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "streamer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The longest a SIGTERM'd server takes to exit: its stream drain (grace + 1 s for the closing
handshakes), then uvicorn's shutdown of what is left (int(grace) + 5), as in streamer/server/app.py. */}}
{{- define "streamer.serverExitSeconds" -}}
{{- $grace := int .Values.drain.shutdownGraceSeconds -}}
{{- add $grace 1 $grace 5 -}}
{{- end -}}

{{/* preStop + the server's exit + margin: the pod is never killed mid-drain. */}}
{{- define "streamer.terminationGracePeriodSeconds" -}}
{{- add (int .Values.drain.preStopSleepSeconds) (int (include "streamer.serverExitSeconds" .)) (int .Values.drain.marginSeconds) -}}
{{- end -}}

{{- define "streamer.adapterRulesName" -}}
{{- default (printf "%s-adapter-rules" (include "streamer.fullname" .)) .Values.prometheusAdapter.configMapName -}}
{{- end -}}

{{/* Metric names the HPA reads from custom.metrics.k8s.io (the adapter rules name them). */}}
{{- define "streamer.streamsMetric" -}}streamer_live_streams{{- end -}}
{{- define "streamer.busyMetric" -}}streamer_engine_busy{{- end -}}
