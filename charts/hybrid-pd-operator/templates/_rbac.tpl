{{/*
The operator's rules: every verb is there because of a call the operator makes (operator/hpd_operator), and the
RBAC test (tests/chart/test_rbac_proof.py) runs the operator as this ServiceAccount with exactly these rules and
fails on any 403, and shows that dropping one verb breaks it. The same list is used for the ClusterRole
(rbac.scope=cluster) and for the Role in each watched namespace (rbac.scope=namespace). Nothing here is
cluster-scoped: kopf's CRD/namespace scanning is off (settings.py), so namespace mode needs no ClusterRole.
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
# Events on the CR: Created/Updated/Pruned/InvalidSpec/ApplyFailed (handlers._event) and kopf's warnings.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Children (apply.KINDS). patch: server-side apply updates them (apply.apply); create: the same apply PATCH creates
# a missing child, which the apiserver authorizes as `create` too; list: the existing set by label selector, to
# prune and to observe Deployment status (apply.list_children); delete: prune of children no longer desired
# (apply.delete). No get/watch/update: no such call is made.
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "create", "patch", "delete"]
# The router's Role and RoleBinding (builders/router.py).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "create", "patch", "delete"]
# PodMonitors, only used when the Prometheus Operator's CRD is served (apply.api_available reads discovery,
# which every authenticated user may read).
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["list", "create", "patch", "delete"]
# Not read by the operator itself: Kubernetes lets it create the router's Role (get/list/watch pods, the
# router's discovery) only if it holds those permissions itself (RBAC escalation prevention). Holding them is far
# narrower than the alternative, the `escalate` and `bind` verbs on roles, which would let it grant anything.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- end }}
