{{/*
The operator's rules: every verb is there because of a call the operator makes (operator/hpd_operator), and the
RBAC test (tests/chart/test_rbac_proof.py) runs the operator as this ServiceAccount with exactly these rules and
fails on any 403, and shows that dropping one verb breaks it. The same list is used for the ClusterRole
(rbac.scope=cluster) and for the Role in each watched namespace (rbac.scope=namespace). Nothing here is
cluster-scoped but one read: kopf's CRD/namespace scanning is off (settings.py); `hpd.nodeRules` (nodes: list+watch)
is the one cluster-scoped rule, in both scopes, behind rbac.readNodes (templates/rbac.yaml). The operator is
event-driven (handlers.py): it list+watches every kind it reads, and lists nothing per reconcile.
*/}}
{{- define "hpd.rules" -}}
# The custom resource. list+watch: kopf's watch stream (handlers: @kopf.index + @kopf.on.event, the cache and the
# work queue). No patch: event handlers write no annotation and no finalizer on the CR.
- apiGroups: ["hybridpd.io"]
  resources: ["hybridpddeployments"]
  verbs: ["list", "watch"]
# Its status subresource: computed status is written with a merge patch when it changed (report.write_status).
- apiGroups: ["hybridpd.io"]
  resources: ["hybridpddeployments/status"]
  verbs: ["patch"]
# Children carry an ownerReference to the CR with blockOwnerDeletion=true (kopf.append_owner_reference); the
# OwnerReferencesPermissionEnforcement admission plugin allows that only with `update` on the owner's finalizers.
- apiGroups: ["hybridpd.io"]
  resources: ["hybridpddeployments/finalizers"]
  verbs: ["update"]
# Events on the CR: Created/Updated/Pruned and condition transitions (report.event) and kopf's warnings. An Event
# has a deterministic name per CR/type/reason/message: create, and on a repeat get + patch its count (aggregation).
# list+watch: kopf's watch of the kubelet's probe-failure Events (field selector involvedObject.kind=Pod,
# reason=Unhealthy; handlers._index_event), whose message carries the runtime's reason (e.g. "P->D output differs
# from local") into DecodeReady.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "get", "patch", "list", "watch"]
# create on core events (above) also lets the operator give each CR's decode pods the `<cr>-kv-reporter` Role that may
# create Events (RBAC escalation prevention), as get+patch on leases (below) lets it grant get+patch on that CR's
# kv-reporter Lease, where the decode pods' KV path reports go (status.kvPath). A Lease, not a ConfigMap: watching
# the kind means reading every object of it in the cluster, and ConfigMaps hold other workloads' configuration.
# Children (apply.KINDS). list+watch: kopf's watch of each kind feeds the cache the reconcile reads (ownership,
# desired-hash, Deployment status; handlers._register_children); patch: server-side apply of a child that is
# missing, changed or drifted (apply.apply); create: the same apply PATCH creates a missing child, which the
# apiserver authorizes as `create` too; delete: prune of children no longer desired (apply.delete); get: a desired
# name the cache does not hold is read before it is applied, so an object owned by another CR or by nobody is never
# taken over (apply.foreign), and a child another manager touched is read back for the drift test
# (handlers.needs_apply). No update: no such call is made.
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's Role and RoleBinding (builders/router.py).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The per-CR NetworkPolicies (builders/networkpolicy.py, spec.networkPolicy).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The autoscaling roles' HorizontalPodAutoscalers (builders/autoscaling.py, spec.<role>.autoscaling): the operator
# applies them, narrows their min/max for spec.ratio and reads their status (the scaler's decision); it never writes a
# scale subresource (the HPA controller does, with its own rights).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# PodMonitors, only used (and watched) when the Prometheus Operator's CRD is served at startup
# (apply.api_available reads discovery, which every authenticated user may read).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# LeaderWorkerSets (sigs.k8s.io/lws): a role whose replica spans nodes (builders/lws.py). Used (and watched) only when
# LWS's CRD is served at startup, as for PodMonitors; LWS itself is a prerequisite for such roles only
# (docs/multi-node.md). The same verbs as every child kind, for the same calls.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# list+watch: kopf's watch of the pods feeds the cache (handlers._index_pod: the scheduler's Unschedulable verdict,
# pods on lost nodes, readiness, not-Ready pods whose probe Events explain why). get: Kubernetes lets it create the
# router's Role (get/list/watch pods, the router's discovery) only if it holds those permissions itself (RBAC
# escalation prevention), far narrower than the `escalate` and `bind` verbs on roles, which would let it grant
# anything.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{- define "hpd.nodeRules" -}}
# Nodes are cluster-scoped, so no Role can grant this. list+watch: the operator watches the nodes (names kept,
# handlers._index_node) so a Ready pod bound to a node that no longer exists stops counting as Ready at once
# (status NodeLost) instead of after the pod garbage collector (40-60 s). It asks at startup (a
# SelfSubjectAccessReview, which every user may create); without both verbs that check is skipped.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- end }}
