{{/* The labels every object of the release carries. */}}
{{- define "oka.labels" -}}
app.kubernetes.io/name: oka
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The selector of one component's Pods: (dict "root" $ "component" "controller"). */}}
{{- define "oka.selector" -}}
app.kubernetes.io/name: oka
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A component's image reference: (dict "root" $ "image" .Values.controller.image). */}}
{{- define "oka.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{/* The admin key's Secret. */}}
{{- define "oka.adminKeySecret" -}}
{{ .Values.adminKey.existingSecret | default "oka-admin-key" }}
{{- end -}}

{{/* The relay token's Secret. */}}
{{- define "oka.relayTokenSecret" -}}
{{ .Values.relayToken.existingSecret | default "oka-relay-token" }}
{{- end -}}

{{/* The container securityContext of the controller, the manager and the gateway. */}}
{{- define "oka.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The Pod securityContext of the controller, the manager and the gateway. */}}
{{- define "oka.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Probes on the component's api.listen port (named `http`). */}}
{{- define "oka.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}

{{/* The volumes of the config file and the relay token, mounted by every component. */}}
{{- define "oka.commonVolumes" -}}
- name: config
  configMap:
    name: oka-config
- name: relay-token
  secret:
    secretName: {{ include "oka.relayTokenSecret" . }}
    items: [{key: token, path: token}]
{{- end -}}

{{/* Scratch space for the components whose root filesystem is read-only. */}}
{{- define "oka.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "oka.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "oka.commonMounts" -}}
- name: config
  mountPath: /etc/oka/config
  readOnly: true
- name: relay-token
  mountPath: /etc/oka/relay-token
  readOnly: true
{{- end -}}

{{/* The Redis credentials of the API-key quotas (the manager and the controller's claim engine). */}}
{{- define "oka.redisEnv" -}}
{{- if and .Values.redis.addr .Values.redis.existingSecret }}
- name: QUOTA_REDIS_USERNAME
  valueFrom:
    secretKeyRef: {name: {{ .Values.redis.existingSecret }}, key: username, optional: true}
- name: QUOTA_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .Values.redis.existingSecret }}, key: password, optional: true}
{{- end }}
{{- end -}}
