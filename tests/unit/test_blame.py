"""ApplyFailed names the CR's field behind the child's field the apiserver refused (#32 item 5)."""

from __future__ import annotations

from hpd_operator.blame import cr_field, hint

from .test_builders import build, by, container, seed_doc


def test_a_refused_env_name_is_traced_to_the_crs_env_entry() -> None:
    doc = seed_doc()
    doc["spec"]["env"] = [{"name": "GOOD", "value": "1"}, {"name": "1BAD", "value": "2"}]
    dep = by(build(doc), "Deployment", "nemotron-3-nano-decode")
    index = [e["name"] for e in container(dep)["env"]].index("1BAD")
    path = f"spec.template.spec.containers[0].env[{index}].name"
    assert index > 1  # the operator's own entries come first: the child's index is not the CR's
    assert cr_field(path, dep, doc["spec"]) == "spec.env[1].name"
    msg = f'Deployment.apps "x" is invalid: {path}: Invalid value: "1BAD": a valid environment variable name ...'
    assert hint(msg, dep, doc["spec"]).endswith("[the CR's field: spec.env[1].name]")


def test_a_refused_pod_template_volume_is_traced_and_operator_fields_are_left_as_they_are() -> None:
    doc = seed_doc()
    vol = {"name": "extra", "emptyDir": {"sizeLimit": "lots"}}
    doc["spec"]["prefill"]["podTemplate"] = {"spec": {"volumes": [vol]}}
    dep = by(build(doc), "Deployment", "nemotron-3-nano-prefill")
    index = [v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]].index("extra")
    path = f"spec.template.spec.volumes[{index}].emptyDir.sizeLimit"
    assert cr_field(path, dep, doc["spec"]) == "spec.prefill.podTemplate.spec.volumes[0].emptyDir.sizeLimit"
    own = "spec.template.spec.containers[0].ports[0].containerPort"  # the operator's field: no CR field behind it
    assert cr_field(own, dep, doc["spec"]) is None
    assert hint(f"{own}: Invalid value", dep, doc["spec"]) == f"{own}: Invalid value"
