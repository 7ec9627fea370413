"""The CRD's spec.template schema is the API server's own, as e2e/pod_template_schema.py renders it."""

from __future__ import annotations

import json

import yaml

from e2e import pod_template_schema as gen
from kvpilot.operator.pods import pod_template


def test_the_crd_holds_what_the_generator_renders_from_the_snapshot() -> None:
    """Edit e2e/pod_template_schema.py (or refresh the snapshot), then ``python -m e2e.pod_template_schema
    write``: the block between the markers is never edited by hand."""
    text = gen.CRD.read_text()
    assert gen.BEGIN + gen.render_block(gen.load_snapshot()) + gen.END in text


def test_the_size_policy_reads_what_the_generator_renders() -> None:
    assert gen.SIZE_CEL.read_text() == gen.render_size_expression(gen.load_snapshot())
    expr = gen.SIZE_CEL.read_text()
    for field in ("projected", "nodeSelectorTerms", "matchExpressions", "envFrom", "annotations"):
        assert f".{field})?" in expr, field  # the weight walks every field of the schema


def test_the_snapshot_says_where_it_came_from() -> None:
    snap = json.loads(gen.SNAPSHOT.read_text())
    assert snap["serverVersion"].startswith("v1.") and "openapi/v3" in snap["source"]
    assert "io.k8s.api.core.v1.Affinity" in snap["schemas"]


def _spec_schema() -> dict:
    crd = yaml.safe_load(gen.CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_template_schema_is_structural_and_typed_all_the_way_down() -> None:
    """No free-form subtree: every object node below spec.template has properties (or is a map of typed
    values), every array typed items."""
    untyped: list[str] = []

    def walk(node: dict, path: str) -> None:
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            return
        if node.get("type") == "object":
            if "properties" in node:
                for k, v in node["properties"].items():
                    walk(v, f"{path}.{k}")
            elif "additionalProperties" in node:
                walk(node["additionalProperties"], f"{path}{{}}")
            else:
                untyped.append(path)
        elif node.get("type") == "array":
            walk(node["items"], f"{path}[]")

    walk(_spec_schema()["properties"]["template"], "spec.template")
    # emptyDir-like markers (an empty object is a meaningful value) are Kubernetes' own
    assert all(p.endswith(("seLinuxChangePolicy", "emptyDir")) for p in untyped) or untyped == [], untyped


def test_the_cel_rules_name_what_pod_template_reserves() -> None:
    t = _spec_schema()["properties"]["template"]["properties"]
    rules = json.dumps(
        [
            t["metadata"]["properties"]["labels"]["x-kubernetes-validations"],
            *(
                t["spec"]["properties"][k]["x-kubernetes-validations"]
                for k in ("volumes", "initContainers", "containers")
            ),
        ]
    )
    for name in (*pod_template.RESERVED_VOLUMES, *pod_template.RESERVED_INIT_CONTAINERS):
        assert f"x.name != '{name}'" in rules
    for label in gen.OWNED_LABELS:
        assert f"!('{label}' in self)" in rules
