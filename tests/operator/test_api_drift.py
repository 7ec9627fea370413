"""The CRD (the source of truth) and the pydantic models in kvpilot.operator.api must not drift.

Both are flattened to ``{path: facts}`` (path like ``spec.engine.pinned.maxModelLen`` or
``status.history[].from.maxNumSeqs``; facts: JSON type, enum, default, required) and compared.
Every CRD property must also carry a description for ``kubectl explain``.
"""

from __future__ import annotations

import types as pytypes
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from kvpilot.operator import api

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml"


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def _crd_type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "any"
    return node["type"]


def _crd_limits(node: dict[str, Any]) -> dict[str, Any]:
    """Numeric and size constraints, in pydantic's vocabulary (ge/gt/le, min_length/max_length)."""
    limits: dict[str, Any] = {}
    if "minimum" in node:
        limits["gt" if node.get("exclusiveMinimum") else "ge"] = node["minimum"]
    if "maximum" in node:
        limits["le"] = node["maximum"]
    for crd_key, key in (
        ("maxItems", "max_length"),
        ("maxProperties", "max_length"),
        ("maxLength", "max_length"),
        ("minLength", "min_length"),
    ):
        if crd_key in node:
            limits[key] = node[crd_key]
    return limits


def flatten_crd(node: dict[str, Any], path: str, out: dict[str, dict[str, Any]]) -> None:
    if path in api.KUBERNETES_SCHEMAS:  # the API server's schema (e2e/pod_template_schema.py); a dict here
        assert node["type"] == "object" and node.get("properties"), path
        out[path] = {"type": "any", "enum": None, "default": None, "limits": {}}
        return
    out[path] = {
        "type": _crd_type(node),
        "enum": node.get("enum"),
        "default": node.get("default"),
        "limits": _crd_limits(node),
    }
    if "properties" in node:
        required = set(node.get("required", []))
        for name, child in node["properties"].items():
            flatten_crd(child, f"{path}.{name}", out)
            out[f"{path}.{name}"]["required"] = name in required
    elif node.get("type") == "array":
        flatten_crd(node["items"], f"{path}[]", out)
        out[f"{path}[]"]["required"] = False
    elif isinstance(node.get("additionalProperties"), dict):
        flatten_crd(node["additionalProperties"], f"{path}{{}}", out)
        out[f"{path}{{}}"]["required"] = False


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (typing.Union, pytypes.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
    return tp


def _model_limits(metadata: list[Any]) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    for item in metadata:
        for key in ("ge", "gt", "le", "min_length", "max_length"):
            value = getattr(item, key, None)
            if value is not None:
                limits[key] = value
    return limits


def flatten_model(tp: Any, path: str, out: dict[str, dict[str, Any]], default: Any = None) -> None:
    tp = _strip_optional(tp)
    item_limits: dict[str, Any] | None = None
    if get_origin(tp) is typing.Annotated:  # list items and map values carry their own constraints
        base, *extras = get_args(tp)
        item_limits = _model_limits([m for e in extras for m in getattr(e, "metadata", [e])])
        tp = _strip_optional(base)
    origin = get_origin(tp)
    enum = None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        kind = "object"
    elif origin is list:
        kind = "array"
    elif origin is dict:
        kind = "any" if get_args(tp)[1] is Any else "object"
    elif origin is Literal:
        kind, enum = "string", list(get_args(tp))
    elif origin in (typing.Union, pytypes.UnionType):
        kind = "int-or-string"
    else:
        kind = {int: "integer", float: "number", str: "string", bool: "boolean"}[tp]
    out[path] = {"type": kind, "enum": enum, "default": default}
    if item_limits is not None:
        out[path]["limits"] = item_limits
    if kind == "object" and origin is None:
        for name, field in tp.model_fields.items():
            alias = field.alias or name
            d = field.default if field.default is not None and not callable(field.default) else None
            d = None if repr(d) == "PydanticUndefined" else d
            flatten_model(field.annotation, f"{path}.{alias}", out, d)
            out[f"{path}.{alias}"]["required"] = field.is_required()
            out[f"{path}.{alias}"]["limits"] = _model_limits(field.metadata)
    elif kind == "array":
        flatten_model(get_args(tp)[0], f"{path}[]", out)
        out[f"{path}[]"]["required"] = False
    elif kind == "object":
        flatten_model(get_args(tp)[1], f"{path}{{}}", out)
        out[f"{path}{{}}"]["required"] = False


def crd_paths() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    schema = crd_schema()
    for top in ("spec", "status"):
        flatten_crd(schema["properties"][top], top, out)
    return out


def model_paths() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    flatten_model(api.InferenceServiceSpec, "spec", out)
    flatten_model(api.InferenceServiceStatus, "status", out)
    return out


ONE_OF = {"spec.engine.env[].valueFrom"}
"""Objects whose CRD ``min/maxProperties: 1`` pydantic checks with a validator instead."""


def test_one_of_objects_refuse_none_and_two() -> None:
    api.EnvVar.model_validate({"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
    for bad in ({}, {"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "metadata.name"}}):
        with pytest.raises(ValueError, match="exactly one"):
            api.EnvVar.model_validate({"name": "A", "valueFrom": bad})


def test_same_property_paths() -> None:
    crd, models = set(crd_paths()), set(model_paths())
    assert crd - models == set(), "in the CRD, missing from kvpilot/operator/api.py"
    assert models - crd == set(), "in kvpilot/operator/api.py, missing from the CRD"


@pytest.mark.parametrize("fact", ["type", "enum", "required", "limits"])
def test_same_facts(fact: str) -> None:
    crd, models = crd_paths(), model_paths()
    empty = {} if fact == "limits" else None
    diffs = {
        p: (crd[p].get(fact), models[p].get(fact, empty))
        for p in crd
        if p in models
        if crd[p].get(fact) != models[p].get(fact, empty)
        and p not in ("spec", "status")
        and not (fact == "limits" and p.endswith(("[]", "{}")) and crd[p].get(fact) == {})
        and p not in ONE_OF
    }
    assert diffs == {}, f"{fact} differs (crd, model)"


def test_same_scalar_defaults() -> None:
    crd, models = crd_paths(), model_paths()
    diffs = {
        p: (crd[p]["default"], models[p]["default"])
        for p in crd
        if p in models
        if crd[p]["default"] not in (None, {}) and crd[p]["default"] != models[p]["default"]
    }
    assert diffs == {}


def _walk(node: dict[str, Any], path: str):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if node.get("type") == "array":
        yield from _walk(node["items"], f"{path}[]")


def test_every_property_is_described() -> None:
    schema = crd_schema()
    missing = [
        p
        for top in ("spec", "status")
        for p, n in _walk(schema["properties"][top], top)
        if not n.get("description")
    ]
    assert missing == []


def test_printer_columns_cover_the_issue() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    cols = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {
        "Model",
        "GPU",
        "Max-Model-Len",
        "Max-Num-Seqs",
        "GPU-Mem-Util",
        "KV-Dtype",
        "Ready",
        "Age",
    } <= cols
    subresources = crd["spec"]["versions"][0]["subresources"]
    assert subresources == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }


def test_no_unknown_fields_preserved_at_the_roots() -> None:
    schema = crd_schema()
    for top in ("spec", "status"):
        assert "x-kubernetes-preserve-unknown-fields" not in schema["properties"][top]


def test_the_api_accepts_exactly_the_kv_dtypes_the_memory_model_sizes() -> None:
    """One list (kvpilot.tuner.vllm.MODELLED_KV_CACHE_DTYPES): the pydantic API and, through the drift
    test above, the CRD's enum."""
    from typing import get_args

    from kvpilot.operator import api
    from kvpilot.tuner import vllm

    assert get_args(api.KvCacheDtype) == vllm.MODELLED_KV_CACHE_DTYPES
    assert tuple(crd_paths()["spec.engine.pinned.kvCacheDtype"]["enum"]) == vllm.MODELLED_KV_CACHE_DTYPES
