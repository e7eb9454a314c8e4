{{/*
Names. Objects are named after their component, not the release: Lace is a
cluster-wide singleton (its CRDs, ClusterRoles and default objects exist
once per cluster), so a second release would fight the first anyway.
*/}}
{{- define "lace.agent.name" -}}lace-agent{{- end }}
{{- define "lace.controller.name" -}}lace-controller{{- end }}
{{- define "lace.agent.nodeRestriction" -}}lace-agent-node-restriction{{- end }}

{{/* The label networks carry and routing policies select on. */}}
{{- define "lace.networkLabel" -}}lace-cni.io/network{{- end }}

{{- define "lace.chart" -}}
{{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels on every object but the selector labels. */}}
{{- define "lace.commonLabels" -}}
helm.sh/chart: {{ include "lace.chart" . }}
app.kubernetes.io/part-of: lace
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of objects that belong to no component (the defaults). */}}
{{- define "lace.labels" -}}
{{ include "lace.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of a component: (dict "ctx" $ "component" "agent"). */}}
{{- define "lace.selectorLabels" -}}
app.kubernetes.io/name: lace-{{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end }}

{{/* All labels of a component's objects. */}}
{{- define "lace.componentLabels" -}}
{{ include "lace.commonLabels" .ctx }}
{{ include "lace.selectorLabels" . }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "lace.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/*
KUBERNETES_SERVICE_HOST/PORT for in-cluster config when apiServer is set:
Lace serves the `kubernetes` Service itself, so it cannot reach the API
server through it.
*/}}
{{- define "lace.apiServerEnv" -}}
{{- $host := toString .Values.apiServer.host -}}
{{- $port := toString .Values.apiServer.port -}}
{{- if and $host (not $port) -}}
{{- fail "apiServer.host is set but apiServer.port is not: set both or neither" -}}
{{- end -}}
{{- if and $port (not $host) -}}
{{- fail "apiServer.port is set but apiServer.host is not: set both or neither" -}}
{{- end -}}
{{- if $host -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ $host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $port | quote }}
{{- end }}
{{- end }}

{{/* Whether a default object is rendered: (include "lace.default" (list $ "world")). */}}
{{- define "lace.default" -}}
{{- $ctx := index . 0 -}}
{{- $d := $ctx.Values.defaults -}}
{{- if and $d.enabled (index $d (index . 1)).enabled -}}true{{- end -}}
{{- end }}

{{/*
The external IP allow-list, comma-separated, for the agent's and the
controller's --allowed-external-ips. An IPv4 CIDR with host bits set
(192.0.2.5/16) fails the install: it would otherwise be read as its whole
network (the binaries refuse it too, IPv6 ones included, with the same
advice).
*/}}
{{- define "lace.allowedExternalIPs" -}}
{{- $cidrs := dig "externalIPs" "allowedCIDRs" (list) (.Values.services | default dict) -}}
{{- range $c := $cidrs -}}
{{- if not (contains ":" $c) -}}
{{- $parts := splitList "/" $c -}}
{{- $o := splitList "." (first $parts) -}}
{{- $v := add (mul (atoi (index $o 0)) 16777216) (mul (atoi (index $o 1)) 65536) (mul (atoi (index $o 2)) 256) (atoi (index $o 3)) -}}
{{- $m := 1 -}}
{{- range until (int (sub 32 (atoi (last $parts)))) }}{{ $m = mul $m 2 }}{{ end -}}
{{- if ne (mod $v $m) 0 -}}
{{- fail (printf "services.externalIPs.allowedCIDRs: %s has host bits set: write the network address of the range, or the address with /32" $c) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $cidrs -}}
{{- end }}

{{/*
"true" when the controller must run on control-plane nodes: placement
controlPlane, or auto and the cluster has a Node labelled
node-role.kubernetes.io/control-plane (lookup sees nothing under `helm
template` or --dry-run=client). Empty otherwise.
*/}}
{{- define "lace.controller.controlPlaneOnly" -}}
{{- $placement := .Values.controller.placement | default "auto" -}}
{{- if eq $placement "controlPlane" -}}
true
{{- else if eq $placement "auto" -}}
{{- $found := false -}}
{{- range (lookup "v1" "Node" "" "").items | default list -}}
{{- if hasKey ((.metadata).labels | default dict) "node-role.kubernetes.io/control-plane" -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}
{{- end }}
