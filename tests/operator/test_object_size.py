"""A spec at every limit of the CRD still fits the API server's object limits with kopf's bookkeeping.

The attacker's case: specs within the old schema's limits (128 extraArgs of 1024 characters, env values
of 32 KiB) pushed kopf's diff-base annotation past the 256 KiB an object's annotations may hold; every
patch then failed with 422 and the finalizer was never released. Now the diff base lives in
``status.kopf`` and the schema's limits are chosen so that the largest valid object, spec plus its copy
in status (JSON in a JSON string: escaped twice), stays under etcd's 1.5 MiB request limit with room for
the rest of the status. ``spec.template`` is bounded as a whole (the chart's size policy, 64 KiB): its
per-field bounds alone allow hundreds of MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from kvpilot.operator import api, main
from kvpilot.operator.pods import pod_template

CRD = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml").read_text()
)
SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
ETCD_LIMIT = 1536 * 1024
STATUS_ROOM = 256 * 1024
"""What the rest of the status may take (conditions, history of 20, settings, budget)."""


def _worst_string(length: int) -> str:
    return '"' * length  # a quote escapes to two bytes in JSON, four when the JSON is itself in a string


def largest_spec() -> dict[str, Any]:
    engine = SPEC["engine"]["properties"]
    args = engine["extraArgs"]
    env = engine["env"]
    env_item = env["items"]["properties"]
    tolerations = engine["tolerations"]
    tol = tolerations["items"]["properties"]
    selector = SPEC["nodeSelector"]
    return {
        "model": {"id": "a" * SPEC["model"]["properties"]["id"]["maxLength"], "revision": "r" * 128},
        "nodeSelector": {
            f"k{i}".ljust(63, "k"): _worst_string(selector["additionalProperties"]["maxLength"])
            for i in range(selector["maxProperties"])
        },
        "engine": {
            "image": "i" * engine["image"]["maxLength"],
            "extraArgs": [_worst_string(args["items"]["maxLength"])] * args["maxItems"],
            "env": [
                {
                    "name": f"N{i}".ljust(env_item["name"]["maxLength"], "N"),
                    "value": _worst_string(env_item["value"]["maxLength"]),
                }
                for i in range(env["maxItems"])
            ],
            "tolerations": [
                {
                    "key": "k" * tol["key"]["maxLength"],
                    "operator": "Equal",
                    "value": "v" * tol["value"]["maxLength"],
                    "effect": "NoSchedule",
                }
                for _ in range(tolerations["maxItems"])
            ],
        },
    }


def heaviest_template() -> dict[str, Any]:
    """Annotations of quotes (escaped twice in kopf's copy) weighing the size policy's limit."""
    annotations: dict[str, str] = {}
    template = {"metadata": {"annotations": annotations}}
    limit = pod_template.TEMPLATE_SIZE_LIMIT
    for i in range(32):
        room = limit - pod_template.compute_template_size(template) - len(f"a{i}") - 6
        if room <= 0:
            break
        annotations[f"a{i}"] = _worst_string(min(room, 4096))
    assert limit - 8 <= pod_template.compute_template_size(template) <= limit
    return template


def test_the_largest_valid_spec_is_valid() -> None:
    api.InferenceServiceSpec.model_validate(largest_spec())


def test_the_largest_object_with_kopfs_diff_base_fits_etcd() -> None:
    spec = largest_spec() | {"template": heaviest_template()}
    diff_base = json.dumps({"spec": spec}, separators=(",", ":"))  # what kopf stores (a string)
    obj = {"spec": spec, "status": {"kopf": {"lastHandledConfiguration": diff_base}}}
    size = len(json.dumps(obj, separators=(",", ":")).encode())
    assert size + STATUS_ROOM <= ETCD_LIMIT, f"{size / 1024:.0f} KiB"


def test_kopf_keeps_the_diff_base_in_status() -> None:
    assert main.DIFF_BASE_FIELD == "status.kopf.lastHandledConfiguration"
    status = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    kopf = status["properties"]["kopf"]
    assert kopf["properties"]["lastHandledConfiguration"]["type"] == "string"
