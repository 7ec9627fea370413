"""A hostile config.json in a ConfigMap is Ready=False with reason InvalidModelConfig, never InternalError.

On main each of these was an ``InternalError`` with a traceback, retried forever (and the
3,000,000-layer one held 1.28 GB of the operator's 512 Mi for 54 s).
"""

from __future__ import annotations

import json
import math

import kopf
import pytest
from operator_fakes import Harness, condition, isvc

from kvpilot.tuner.model import lookup_model_config

LLAMA = lookup_model_config("meta-llama/Llama-3.1-8B-Instruct")
BODY = {"model": {"id": "acme/custom", "source": "ConfigMap", "configMapRef": {"name": "cfg"}}}

HOSTILE = {
    "negative heads": json.dumps({**LLAMA, "num_attention_heads": -8}),
    "a string for an integer": json.dumps({**LLAMA, "num_hidden_layers": "32"}),
    "an object for vocab_size": json.dumps({**LLAMA, "vocab_size": {}}),
    "NaN": json.dumps({**LLAMA, "intermediate_size": math.nan}),
    "Infinity": json.dumps({**LLAMA, "max_position_embeddings": math.inf}),
    "huge context": json.dumps({**LLAMA, "max_position_embeddings": 2**62}),
    "three million layers": json.dumps({**LLAMA, "num_hidden_layers": 3_000_000}),
    "deep nesting": '{"text_config": ' + "[" * 50_000 + "]" * 50_000 + "}",
    "a 5001-digit integer": '{"vocab_size": 1' + "0" * 5000 + "}",
    "over 1 MiB": json.dumps({**LLAMA, "padding": "x" * (1 << 20)}),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_hostile_config_map_is_invalid_model_config(harness: Harness, text: str) -> None:
    harness.kube.config_maps[("ns1", "cfg")] = {"config.json": text}
    body = isvc(**BODY)
    with pytest.raises(kopf.PermanentError):  # not retried: the user has to fix the ConfigMap
        await harness.run(body)
    ready = condition(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidModelConfig")
    assert condition(body, "ConfigResolved")["reason"] == "InvalidModelConfig"
    assert "Traceback" not in ready["message"] and len(ready["message"]) < 400
    assert harness.emitter.events[-1][:2] == ("Warning", "InvalidModelConfig")
    assert harness.kube.applied == []
