{{/*
The operator's rules: every verb is there because of a call the operator makes (operator/hpd_operator), and the
RBAC test (tests/chart/test_rbac_proof.py) runs the operator as this ServiceAccount with exactly these rules and
fails on any 403, and shows that dropping one verb breaks it. The same list is used for the ClusterRole
(rbac.scope=cluster) and for the Role in each watched namespace (rbac.scope=namespace). Nothing here is
cluster-scoped but one read: kopf's CRD/namespace scanning is off (settings.py); `hpd.nodeRules` (nodes: list, metadata
only) is the one cluster-scoped rule, in both scopes, behind rbac.readNodes (templates/rbac.yaml).
*/}}
{{- define "hpd.rules" -}}
# The custom resource. list+watch: kopf's watch stream (create/update/resume handlers) and the resync loop's
# list (handlers._list_crs). patch: kopf writes its progress and last-handled-spec annotations
# (settings.persistence.*_storage, prefix hybridpd.io).
- apiGroups: ["hybridpd.io"]
  resources: ["hybridpddeployments"]
  verbs: ["list", "watch", "patch"]
# Its status subresource: computed status is written with a merge patch (handlers._write_status).
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
# list: the kubelet's probe-failure Events of the engine pods (report.observe_probe_events, only while a pod is not
# Ready), whose message carries the runtime's reason (e.g. "P->D output differs from local") into DecodeReady.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "get", "patch", "list"]
# Children (apply.KINDS). patch: server-side apply updates them (apply.apply); create: the same apply PATCH creates
# a missing child, which the apiserver authorizes as `create` too; list: the existing set by label selector, to
# prune and to observe Deployment status (apply.list_children); delete: prune of children no longer desired
# (apply.delete); get: the ownership check reads each desired child by name before applying it, so an object owned
# by another CR or by nobody is never taken over (apply.foreign). No watch/update: no such call is made.
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "create", "patch", "delete"]
# The router's Role and RoleBinding (builders/router.py).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "create", "patch", "delete"]
# The per-CR NetworkPolicies (builders/networkpolicy.py, spec.networkPolicy).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "create", "patch", "delete"]
# PodMonitors, only used when the Prometheus Operator's CRD is served (apply.api_available reads discovery,
# which every authenticated user may read).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "create", "patch", "delete"]
# list: the operator reads each role's pods (report.observe_pods: the scheduler's Unschedulable verdict, pods on
# lost nodes, not-Ready pods whose probe Events explain why). get/watch: Kubernetes lets it create the router's Role
# (get/list/watch pods, the router's discovery) only if it holds those permissions itself (RBAC escalation
# prevention), far narrower than the `escalate` and `bind` verbs on roles, which would let it grant anything.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{- define "hpd.nodeRules" -}}
# Nodes are cluster-scoped, so no Role can grant this. The operator lists node names (metadata only,
# report.observe_nodes) so a Ready pod bound to a node that no longer exists stops counting as Ready at once
# (status NodeLost) instead of after the pod garbage collector (40-60 s). Without it that check is skipped.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
{{- end }}
