"""``status.budget``: the plan's per-rank terms as the status carries them and the loop reads them back
(:meth:`kvpilot.operator.api.Budget.from_budget`, :func:`kvpilot.operator.loop.loop_state.read_budget`),
with the terms only some plans have (LoRA, an MTP drafter, a KV connector) present only where they are."""

from __future__ import annotations

from kvpilot.operator import api
from kvpilot.operator.loop.loop_state import read_budget
from kvpilot.tuner import compute_plan, lookup_gpu, vllm
from kvpilot.tuner.model import build_model_spec, lookup_model_config
from kvpilot.tuner.types import ServingBounds

LMCACHE = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'


def _budget(*extra: str) -> api.Budget:
    spec = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
    engine = vllm.build_engine_flags(list(extra))
    plan = compute_plan(spec, lookup_gpu("H100-SXM"), 1, ServingBounds(), engine=engine)
    assert plan.budget is not None
    return api.Budget.from_budget(plan.budget)


def test_a_plain_plan_has_no_optional_terms() -> None:
    wire = _budget().model_dump(by_alias=True, exclude_none=True)
    assert not {"loraGiB", "speculativeGiB", "kvConnectorGiB"} & set(wire)
    assert wire["kvCacheGiB"] > 0


def test_lora_and_a_kv_connector_are_carried_and_read_back() -> None:
    lora = ("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64")
    budget = _budget(*lora, "--kv-transfer-config", LMCACHE)
    wire = budget.model_dump(by_alias=True, exclude_none=True)
    assert wire["loraGiB"] > 1.0 and 0 < wire["kvConnectorGiB"] < 0.1 and "speculativeGiB" not in wire
    back = read_budget({"budget": wire})
    assert back is not None
    assert (back.lora_gib, back.kv_connector_gib) == (wire["loraGiB"], wire["kvConnectorGiB"])
