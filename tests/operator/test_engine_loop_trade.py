"""The rollout's loss reaches SGLang's and TGI's decision, as vLLM's
(:mod:`kvpilot.tuner.loop.restart_trade`): in mode Auto a metrics-driven change is decided again with what
the strategy it would roll out with loses
(:func:`kvpilot.operator.inferenceservice.engine_actions.fetch_lost_fraction`: Surge 0, Replace ``k/N``,
Recreate 1), so a small gain on a recreate is held with the trade's words -- a ``Held`` history entry and
the recommendation -- while the same on a surge rolls out; the held condition wins its restart once it has
persisted long enough (the history's ``Held`` entries say since when)."""

from __future__ import annotations

from typing import Any

import pytest
from closed_loop_fakes import LoopHarness, window
from operator_fakes import Harness, isvc

from kvpilot.operator.loop import engine_reading
from kvpilot.tuner.loop import PolicyConfig
from kvpilot.tuner.loop.engine_state import EngineHold

SGLANG_IMAGE = "lmsysorg/sglang:v0.5.23"
TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
NOT_WORTH = "it is not worth a restart (expected gain"


def engine_isvc(kind: str, image: str, strategy: str, **spec: Any) -> dict[str, Any]:
    rollout = {"strategy": strategy, **({"allowDowntime": True} if strategy == "Recreate" else {})}
    return isvc(engine={"kind": kind, "image": image}, tuning={"mode": "Auto"}, rollout=rollout, **spec)


async def _proven(loop: LoopHarness, body: dict[str, Any], replicas: int = 1) -> list[str]:
    """The plan's flags, Ready through a tick: the last good ones (no gate but the trade holds a change)."""
    await loop.h.run(body)
    planned = list(body["status"]["appliedEngineArgs"])
    loop.healthy_pods(replicas)
    loop.window = window(loop.now + 30, kv=0.5, waiting=0)
    await loop.tick(body)
    assert body["status"]["lastGoodEngineArgs"] == planned
    return planned


FEW_RETRACTIONS = {"kv": 0.97, "preempt": 0.06, "running": 200.0, "waiting": 0.0}
"""Token usage high with a retraction every 17 s among 200 running requests: pressure by SGLang's rule, a
seventh of the running requests thrown away over the cooldown -- less than a recreate's restart."""


@pytest.mark.parametrize(
    ("strategy", "replicas", "held"),
    [("Recreate", 1, True), ("Surge", 1, False), ("Replace", 2, True), ("Replace", 4, False)],
)
async def test_sglang_the_rollouts_loss_reaches_the_decision(
    harness: Harness, strategy: str, replicas: int, held: bool
) -> None:
    """A recreate loses the whole restart, replacing one of two replicas half of it: more than the gain; one
    of four a quarter, and a surge nothing: less."""
    loop = LoopHarness(harness)
    body = engine_isvc(
        "SGLang", SGLANG_IMAGE, strategy, serving={"maxContextLength": 16384}, replicas=replicas
    )
    planned = await _proven(loop, body, replicas)
    loop.window = window(loop.now + 30, **FEW_RETRACTIONS)
    await loop.tick(body)
    st = body["status"]
    last = st["history"][-1]
    if held:
        assert st["appliedEngineArgs"] == planned and "Retuned" not in harness.emitter.reasons
        assert (last["action"], last["trigger"]) == ("Held", "KvPressure") and NOT_WORTH in last["reason"]
        assert last["toEngineArgs"] == st["recommendation"]["engineArgs"] != planned
        assert NOT_WORTH in st["recommendation"]["reason"]
    else:
        assert st["appliedEngineArgs"] != planned and "Retuned" in harness.emitter.reasons
        assert (last["action"], last["trigger"]) == ("Retuned", "KvPressure")


async def test_sglang_a_held_condition_wins_its_restart_once_it_has_persisted(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = engine_isvc("SGLang", SGLANG_IMAGE, "Recreate", serving={"maxContextLength": 16384})
    planned = await _proven(loop, body)
    loop.window = window(loop.now + 30, **FEW_RETRACTIONS)
    await loop.tick(body)
    held_at = body["status"]["history"][-1]["time"]
    assert engine_reading.read_holds(body["status"])[-1].trigger == "KvPressure"
    loop.window = window(loop.now + 60, **FEW_RETRACTIONS)
    await loop.tick(body, advance=60)
    assert body["status"]["appliedEngineArgs"] == planned  # the hold recorded once, its gain still short
    assert [e["time"] for e in body["status"]["history"] if e["action"] == "Held"] == [held_at]
    later = PolicyConfig().trade_persistence_max_seconds
    loop.window = window(loop.now + later, **FEW_RETRACTIONS)
    await loop.tick(body, advance=later)
    st = body["status"]
    assert st["appliedEngineArgs"] != planned and st["history"][-1]["action"] == "Retuned"


@pytest.mark.parametrize(("strategy", "held"), [("Recreate", True), ("Surge", False)])
async def test_tgi_the_rollouts_loss_reaches_the_decision(
    harness: Harness, strategy: str, held: bool
) -> None:
    """TGI's admission limit binding with two queued and KV to spare: a raise admits a few per running
    request, not worth a recreate's restart; on a surge it rolls out."""
    loop = LoopHarness(harness)
    body = engine_isvc(
        "TGI",
        TGI_IMAGE,
        strategy,
        gpu={"count": 1, "product": "H100-SXM"},
        serving={"maxContextLength": 8192},
    )
    planned = await _proven(loop, body)
    limit = int(planned[planned.index("--max-concurrent-requests") + 1])
    loop.window = window(loop.now + 30, kv=0.4, running=limit - 2.0, waiting=2.0)
    await loop.tick(body)
    st = body["status"]
    last = st["history"][-1]
    if held:
        assert st["appliedEngineArgs"] == planned
        assert (last["action"], last["trigger"]) == ("Held", "IdleCapacity") and NOT_WORTH in last["reason"]
    else:
        assert st["appliedEngineArgs"] != planned
        assert (last["action"], last["trigger"]) == ("Retuned", "IdleCapacity")


def test_the_holds_are_the_newest_held_entries_in_a_row() -> None:
    history = [
        {"time": "2026-01-01T00:00:00Z", "action": "Held", "trigger": "IdleCapacity"},
        {"time": "2026-01-01T00:01:00Z", "action": "Retuned", "trigger": "IdleCapacity"},
        {"time": "2026-01-01T00:02:00Z", "action": "Held", "trigger": "KvPressure"},
        {"time": "2026-01-01T00:03:00Z", "action": "Held", "trigger": "IdleCapacity"},
    ]
    holds = engine_reading.read_holds({"history": history})
    assert [h.trigger for h in holds] == ["KvPressure", "IdleCapacity"]
    assert all(isinstance(h, EngineHold) for h in holds) and holds[0].time < holds[1].time
    assert (
        engine_reading.read_holds({"history": [*history, {**history[1], "time": "2026-01-01T00:04:00Z"}]})
        == ()
    )
