{{/* Name of the chart, or nameOverride. */}}
{{- define "kok.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name. */}}
{{- define "kok.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "kok.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kok.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kube-on-kube
{{- end -}}

{{/*
Per-component helpers take a dict: {"root": $, "component": "kube-on-kube-operator"
or "node-operator", "values": the component's values}.
*/}}

{{/*
Object name of a component: <fullname>-operator for the kube-on-kube-operator,
<fullname>-node-operator for the node-operator.
*/}}
{{- define "kok.componentName" -}}
{{- $suffix := ternary "operator" .component (eq .component "kube-on-kube-operator") -}}
{{- printf "%s-%s" (include "kok.fullname" .root) $suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component's Pods. */}}
{{- define "kok.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kok.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of a component's objects. */}}
{{- define "kok.componentLabels" -}}
{{ include "kok.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* ServiceAccount name of a component. */}}
{{- define "kok.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (include "kok.componentName" .) .values.serviceAccount.name -}}
{{- else -}}
{{- required (printf "%s.serviceAccount.name is required when serviceAccount.create is false" .component) .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of a component. */}}
{{- define "kok.serviceAccount" -}}
{{- if .values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "kok.serviceAccountName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
  {{- with .values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
The Role and RoleBinding every leader-electing component needs in the release
namespace: its Lease.
*/}}
{{- define "kok.leaseRbac" -}}
{{- if .values.leaderElection.enabled }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ include "kok.componentName" . }}-leader-election
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
rules:
  # Leader election: read, take and renew the component's Lease.
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "create", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ include "kok.componentName" . }}-leader-election
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ include "kok.componentName" . }}-leader-election
subjects:
  - kind: ServiceAccount
    name: {{ include "kok.serviceAccountName" . }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}
{{- end -}}

{{/*
A component's Deployment. Extra keys in the dict: "args" (the component's own
command-line arguments), "volumes" and "volumeMounts" (lists).
*/}}
{{- define "kok.deployment" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "kok.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
spec:
  replicas: {{ .values.replicas }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "kok.selectorLabels" . | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: {{ if gt (int .values.replicas) 1 }}1{{ else }}0{{ end }}
      maxSurge: 1
  template:
    metadata:
      labels:
        {{- include "kok.selectorLabels" . | nindent 8 }}
        {{- with .values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "kok.serviceAccountName" . }}
      automountServiceAccountToken: true
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ .values.terminationGracePeriodSeconds }}
      {{- with .values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ .component }}
          image: {{ printf "%s:%s" .values.image.repository (default $root.Chart.AppVersion .values.image.tag) | quote }}
          imagePullPolicy: {{ .values.image.pullPolicy }}
          args:
            {{- range .args }}
            - {{ . | quote }}
            {{- end }}
            - {{ printf "--http-address=0.0.0.0:%v" $root.Values.httpPort | quote }}
            - {{ printf "--log-format=%s" $root.Values.logFormat | quote }}
            - {{ printf "--log-level=%s" $root.Values.logLevel | quote }}
            {{- /* Reconciles in flight get the Pod's grace period less 5 s, so the Lease is released before the kubelet kills the container. */}}
            - {{ printf "--shutdown-grace=%ds" (max 1 (sub (int .values.terminationGracePeriodSeconds) 5)) | quote }}
            {{- if .values.leaderElection.enabled }}
            - "--leader-elect"
            - {{ printf "--leader-election-namespace=%s" $root.Release.Namespace | quote }}
            {{- else }}
            - "--leader-elect=false"
            {{- end }}
            {{- range .values.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            {{- with .values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: http
              containerPort: {{ $root.Values.httpPort }}
              protocol: TCP
          startupProbe:
            httpGet:
              path: /healthz
              port: http
            periodSeconds: 5
            failureThreshold: 24
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
            periodSeconds: 5
            timeoutSeconds: 5
            failureThreshold: 3
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          {{- with .volumeMounts }}
          volumeMounts:
            {{- toYaml . | nindent 12 }}
          {{- end }}
      {{- with .volumes }}
      volumes:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if .values.affinity }}
        {{- toYaml .values.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "kok.selectorLabels" . | nindent 20 }}
        {{- end }}
{{- end -}}

{{/* A component's metrics Service, PodDisruptionBudget and ServiceMonitor. */}}
{{- define "kok.serving" -}}
{{- $root := .root -}}
{{- if .values.metrics.service.enabled }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "kok.componentName" . }}-metrics
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
  {{- with .values.metrics.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: ClusterIP
  selector:
    {{- include "kok.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ $root.Values.httpPort }}
      targetPort: http
      protocol: TCP
{{- end }}
{{- if and .values.podDisruptionBudget.enabled (gt (int .values.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "kok.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "kok.selectorLabels" . | nindent 6 }}
{{- end }}
{{- if and $root.Values.serviceMonitor.enabled .values.metrics.service.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "kok.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kok.componentLabels" . | nindent 4 }}
    {{- with $root.Values.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "kok.selectorLabels" . | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ $root.Release.Namespace }}
  endpoints:
    - port: http
      path: /metrics
      interval: {{ $root.Values.serviceMonitor.interval }}
      scrapeTimeout: {{ $root.Values.serviceMonitor.scrapeTimeout }}
{{- end }}
{{- end -}}
