{{/*
crust.labels: the labels every object of the chart carries in its metadata, beyond those of its source in
deploy/: which chart made it, and that Helm manages it. Pod templates and selectors do not get them (a
selector cannot change, and a new chart version must not restart pods by itself).
*/}}
{{- define "crust.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
crust.criDir: the host directory of criEndpoint's socket (the endpoint less its unix: scheme and the
socket's name). crustd gets it at the same path, so that --cri-endpoint names the socket inside the
container as on the host; a directory, so that a runtime restarted with a new socket is still reached.
Empty when criEndpoint is "": no CRI look-ups, nothing mounted.
*/}}
{{- define "crust.criDir" -}}
{{- with .Values.criEndpoint -}}{{ trimPrefix "unix:" . | trimPrefix "//" | dir }}{{- end -}}
{{- end -}}

{{/*
crust.httpHost: the address crustd's HTTP server binds: the node's loopback, or the node's IP from the
NODE_IP variable (metrics.listenOnNodeIP).
*/}}
{{- define "crust.httpHost" -}}
{{- if .Values.metrics.listenOnNodeIP -}}$(NODE_IP){{- else -}}127.0.0.1{{- end -}}
{{- end -}}

{{/*
crust.secureMetrics: "true" when crustd serves its authenticated /metrics (deploy/metrics-auth): asked
for by metrics.secure.enabled, or needed by the PodMonitor of monitoring.podMonitor, which scrapes it;
empty otherwise.
*/}}
{{- define "crust.secureMetrics" -}}
{{- if or .Values.metrics.secure.enabled (and .Values.monitoring.enabled .Values.monitoring.podMonitor) -}}true{{- end -}}
{{- end -}}

{{/*
crust.monitoringObject: one object of deploy/monitoring, read as it is from files/ (a verbatim copy that
render_test.go checks), placed in the release's namespace and given crust.labels and the labels of
monitoring.prometheusSelector. The argument is a list: the root context and the file's name.
*/}}
{{- define "crust.monitoringObject" -}}
{{- $root := index . 0 -}}
{{- $obj := $root.Files.Get (printf "files/%s" (index . 1)) | fromYaml -}}
{{- $_ := set $obj.metadata "namespace" $root.Release.Namespace -}}
{{- $_ := set $obj.metadata "labels" (merge (dict) (include "crust.labels" $root | fromYaml) ($root.Values.monitoring.prometheusSelector | default dict) ($obj.metadata.labels | default dict)) -}}
{{ toYaml $obj }}
{{- end -}}
