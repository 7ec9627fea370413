"""The scale-out recommendation of an engine with rules of its own (SGLang, TGI) in the operator
(:func:`kvpilot.operator.status.engine_patch.build_engine_patch`, through vLLM's
:func:`kvpilot.operator.status.loop_patch.add_scale_out`): ``status.recommendation.replicas`` and one
``ScaleOutRecommended`` event once the engine's tuning has nothing left under pressure, nothing while the
replica count changes, withdrawn once the pressure is gone -- as vLLM's
(``tests/operator/test_status_patch.py``)."""

from __future__ import annotations

from typing import Any

from closed_loop_fakes import LoopHarness, window
from operator_fakes import Harness, isvc

from kvpilot.operator.pods import engine_pods
from kvpilot.operator.status import engine_patch, events
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import Action
from kvpilot.tuner.loop.engine_state import EngineDecision

TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
SCALE_OUT = "ScaleOutRecommended"


def tgi_isvc(**spec: Any) -> dict[str, Any]:
    return isvc(engine={"kind": "TGI", "image": TGI_IMAGE}, **spec)


async def test_tgi_at_a_full_kv_recommends_replicas_once_and_withdraws_them_when_steady(
    harness: Harness,
) -> None:
    """Two replicas, TGI's defaults (the whole GPU for the KV), the KV full with a queue: TGI never evicts and
    has no more KV to give, so only more replicas serve the queue -- 2 x (20 running + 12 waiting) / 20."""
    loop = LoopHarness(harness)
    body = tgi_isvc(serving={"maxContextLength": 8192}, tuning={"mode": "Recommend"}, replicas=2)
    await harness.run(body)
    loop.healthy_pods(n=2)
    loop.window = window(loop.now + 30, kv=0.97, running=20, waiting=12)
    await loop.tick(body)
    rec = body["status"]["recommendation"]
    assert rec["replicas"] == 4 and rec["trigger"] == "KvPressure"
    assert "no eviction" in rec["reason"]
    (event,) = [e for e in harness.emitter.events if e[1] == SCALE_OUT]
    assert event[0] == events.NORMAL and "4 replicas recommended" in event[2]

    loop.window = window(loop.now + 30, kv=0.97, running=20, waiting=12)
    await loop.tick(body)  # the same recommendation: no second event
    assert harness.emitter.reasons.count(SCALE_OUT) == 1
    assert body["status"]["recommendation"]["replicas"] == 4

    loop.window = window(loop.now + 30, kv=0.5, running=8, waiting=0)
    await loop.tick(body)  # the pressure is gone
    assert body["status"].get("recommendation", {}).get("replicas") is None


async def test_no_replicas_are_recommended_while_the_count_changes(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = tgi_isvc(serving={"maxContextLength": 8192}, tuning={"mode": "Recommend"}, replicas=2)
    await harness.run(body)
    loop.healthy_pods(n=1)  # one pod of two
    loop.window = window(loop.now + 30, kv=0.97, running=20, waiting=12)
    await loop.tick(body)
    assert (body["status"].get("recommendation") or {}).get("replicas") is None
    assert SCALE_OUT not in harness.emitter.reasons


def test_an_sglang_decision_at_its_floor_writes_the_replicas_into_its_recommendation() -> None:
    """In SGLang's flags too: the replicas merge into the standing recommendation of ``engineArgs``."""
    current = sglang.SglangSettings(max_running_requests=1)
    held = EngineDecision(Action.HOLD, current, "LatencySlo", "nothing left", scale_out=3)
    standing = {"recommendation": {"engineArgs": ["--max-running-requests", "1"], "trigger": "LatencySlo"}}
    out = engine_pods.SGLANG
    patch = engine_patch.build_engine_patch(out, standing, held, "Recommend", generation=1, now=0.0)
    assert patch.status["recommendation"]["replicas"] == 3
    assert [e[1] for e in patch.events] == [SCALE_OUT]
    steady = EngineDecision(Action.HOLD, current, "Steady", "inside the band")
    raised = {"recommendation": {**standing["recommendation"], "replicas": 3}}
    cleared = engine_patch.build_engine_patch(out, raised, steady, "Recommend", generation=1, now=0.0)
    assert cleared.status["recommendation"] == {"replicas": None} and not cleared.events
