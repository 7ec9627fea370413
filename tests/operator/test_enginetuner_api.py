"""The EngineTuner CRD (crds/enginetuners.kvpilot.io.yaml) against kvpilot.operator.api, and its shared
subtrees against the InferenceService CRD: one schema of model, serving, tuning, settings and conditions."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from test_api_drift import _walk, flatten_crd, flatten_model

from kvpilot.operator import api
from kvpilot.operator.clients import kube

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "enginetuners.kvpilot.io.yaml"
ISVC_CRD = ROOT / "crds" / "inferenceservices.kvpilot.io.yaml"


def schema(path: Path) -> dict[str, Any]:
    (version,) = yaml.safe_load(path.read_text())["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def paths(kind: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if kind == "crd":
        for top in ("spec", "status"):
            flatten_crd(schema(CRD)["properties"][top], top, out)
    else:
        flatten_model(api.EngineTunerSpec, "spec", out)
        flatten_model(api.EngineTunerStatus, "status", out)
    return out


def test_same_property_paths() -> None:
    assert set(paths("crd")) == set(paths("model"))


@pytest.mark.parametrize("fact", ["type", "enum", "required", "limits"])
def test_same_facts(fact: str) -> None:
    crd, models = paths("crd"), paths("model")
    empty = {} if fact == "limits" else None
    diffs = {
        p: (crd[p].get(fact), models[p].get(fact, empty))
        for p in crd
        if crd[p].get(fact) != models[p].get(fact, empty)
        and p not in ("spec", "status")
        and not (fact == "limits" and p.endswith(("[]", "{}")) and crd[p].get(fact) == {})
    }
    assert diffs == {}


def test_same_scalar_defaults() -> None:
    crd, models = paths("crd"), paths("model")
    diffs = {
        p: (crd[p]["default"], models[p]["default"])
        for p in crd
        if crd[p]["default"] not in (None, {}) and crd[p]["default"] != models[p]["default"]
    }
    assert diffs == {}


def _body(node: dict[str, Any]) -> dict[str, Any]:
    """A subtree less its own description (which says what it is for in this kind)."""
    return {k: v for k, v in node.items() if k != "description"}


def _shape(node: Any) -> Any:
    """A subtree less every description."""
    if isinstance(node, dict):
        return {k: _shape(v) for k, v in node.items() if k != "description"}
    return [_shape(v) for v in node] if isinstance(node, list) else node


def test_the_shared_subtrees_are_the_inference_services() -> None:
    et, isvc = schema(CRD)["properties"], schema(ISVC_CRD)["properties"]
    for name in ("model", "serving"):
        assert _body(et["spec"]["properties"][name]) == _body(isvc["spec"]["properties"][name]), name
    tuning = copy.deepcopy(isvc["spec"]["properties"]["tuning"])
    del tuning["properties"]["mode"]  # an EngineTuner's is spec.updateMode
    assert et["spec"]["properties"]["tuning"] == tuning
    for name in ("conditions", "recommendation", "budget", "gpu", "warnings", "kopf", "observedGeneration"):
        assert et["status"]["properties"][name] == isvc["status"]["properties"][name], name
    # the closed loop's memory, vLLM's settings and another engine's flags (what each is for: its
    # description; the EngineTuner's fields say the target's pods, the rollout is the owner's or Auto's)
    for name in ("failedSettings", "lastGoodSettings"):
        assert _body(et["status"]["properties"][name]) == _body(isvc["status"]["properties"][name]), name
    for name in ("history", "rollout", "failedEngineArgs", "lastGoodEngineArgs"):
        assert _shape(et["status"]["properties"][name]) == _shape(isvc["status"]["properties"][name]), name
    assert (
        et["status"]["properties"]["discovered"]["properties"]["settings"]["properties"]
        == (isvc["status"]["properties"]["applied"]["properties"])
    )


def test_update_modes_are_one_enum() -> None:
    assert schema(CRD)["properties"]["spec"]["properties"]["updateMode"]["enum"] == list(
        get_args(api.UpdateMode)
    )


def test_target_kinds_and_api_versions_are_one_table() -> None:
    """``TARGET_API_VERSIONS`` is the one table; the model's ``Literal``s, the CRD's enums and the client's
    custom kinds (a ``Literal`` cannot be computed) must say the same."""
    ref = schema(CRD)["properties"]["spec"]["properties"]["targetRef"]["properties"]
    versions = sorted(set(api.TARGET_API_VERSIONS.values()))
    assert list(get_args(api.TargetKind)) == list(api.TARGET_API_VERSIONS) == ref["kind"]["enum"]
    assert sorted(get_args(get_args(api.TargetRef.model_fields["api_version"].annotation)[0])) == versions
    assert sorted(ref["apiVersion"]["enum"]) == versions
    for kind, (group, version, _plural) in kube.CUSTOM_KINDS.items():
        assert f"{group}/{version}" == api.TARGET_API_VERSIONS[kind]


def test_every_property_is_described() -> None:
    s = schema(CRD)
    missing = [
        p
        for top in ("spec", "status")
        for p, n in _walk(s["properties"][top], top)
        if not n.get("description")
    ]
    assert missing == []


def test_status_subresource_and_columns() -> None:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    assert {"Target", "Mode", "Model", "Max-Model-Len", "Ready"} <= {
        c["name"] for c in version["additionalPrinterColumns"]
    }


def test_chart_copy_is_byte_identical() -> None:
    copy_ = ROOT / "charts" / "kvpilot" / "files" / "crds" / CRD.name
    assert copy_.read_bytes() == CRD.read_bytes(), (
        f"run: cp {CRD.relative_to(ROOT)} charts/kvpilot/files/crds/"
    )
