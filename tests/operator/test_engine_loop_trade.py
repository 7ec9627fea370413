"""The rollout's loss reaches SGLang's and TGI's decision, as vLLM's
(:mod:`kvpilot.tuner.loop.restart_trade`): in mode Auto a metrics-driven change is decided again with what
the strategy it would roll out with loses
(:func:`kvpilot.operator.inferenceservice.engine_actions.fetch_rollout_costs`: Surge 0, Replace ``k/N``,
Recreate 1), so a small gain on a recreate is held with the trade's words -- a ``Held`` history entry and
the recommendation -- while the same on a surge rolls out; the held condition wins its restart once it has
persisted long enough (the history's ``Held`` entries say since when). The restart is the one the pods were
measured to take (``status.startupSeconds``, as vLLM's), and a change the cluster cannot roll out (one
replica, no spare GPU, no ``allowDowntime``) is held with :data:`HELD_MESSAGE`, as vLLM's."""

from __future__ import annotations

from typing import Any

import pytest
from closed_loop_fakes import LoopHarness, rfc3339, window
from operator_fakes import Harness, condition, gpu_pod, isvc

from kvpilot.operator.loop import engine_reading
from kvpilot.operator.pods.rollout_strategy import HELD_MESSAGE
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


FEW_RETRACTIONS: dict[str, Any] = {"kv": 0.97, "preempt": 0.06, "running": 200.0, "waiting": 0.0}
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


def _started(loop: LoopHarness, startup: float) -> None:
    """The pods started ``startup`` seconds before they became Ready, 400 s ago: before the metrics window
    (300 s), so the replica count has settled (a pod that joined within it holds metrics-driven changes)."""
    for p in loop.pods.pods:
        p["status"]["startTime"] = rfc3339(loop.now - 400 - startup)
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(loop.now - 400)}
        p["status"]["conditions"] = [ready]


@pytest.mark.parametrize(("startup", "held"), [(30.0, False), (600.0, True)])
async def test_sglang_the_measured_start_is_recorded_and_prices_the_restart(
    harness: Harness, startup: float, held: bool
) -> None:
    """The same small gain on a recreate: worth a 30 s restart, not a 600 s one (the policy's 180 s
    assumption would hold both)."""
    loop = LoopHarness(harness)
    body = engine_isvc("SGLang", SGLANG_IMAGE, "Recreate", serving={"maxContextLength": 16384})
    planned = await _proven(loop, body)
    _started(loop, startup)
    loop.window = window(loop.now + 30, **FEW_RETRACTIONS)
    await loop.tick(body)
    st = body["status"]
    assert st["startupSeconds"] == startup
    last = st["history"][-1]
    if held:
        assert st["appliedEngineArgs"] == planned and "Retuned" not in harness.emitter.reasons
        assert (last["action"], last["trigger"]) == ("Held", "KvPressure")
        assert f"restart cost {startup:.0f}s" in last["reason"]
    else:
        assert st["appliedEngineArgs"] != planned
        assert (last["action"], last["trigger"]) == ("Retuned", "KvPressure")


async def test_sglang_a_measured_start_kept_in_status_prices_the_next_ticks(harness: Harness) -> None:
    """Once recorded, ``status.startupSeconds`` is the restart while no pod measures a new one (the pods
    replaced, a restart since): the small gain still goes at 30 s."""
    loop = LoopHarness(harness)
    body = engine_isvc("SGLang", SGLANG_IMAGE, "Recreate", serving={"maxContextLength": 16384})
    planned = await _proven(loop, body)
    _started(loop, 30.0)
    await loop.tick(body)
    assert body["status"]["startupSeconds"] == 30.0
    loop.healthy_pods()  # no start time to measure now
    loop.window = window(loop.now + 30, **FEW_RETRACTIONS)
    await loop.tick(body)
    st = body["status"]
    assert st["startupSeconds"] == 30.0 and st["appliedEngineArgs"] != planned


async def test_tgi_the_measured_start_is_recorded_and_prices_the_restart(harness: Harness) -> None:
    loop = LoopHarness(harness)
    body = engine_isvc(
        "TGI",
        TGI_IMAGE,
        "Recreate",
        gpu={"count": 1, "product": "H100-SXM"},
        serving={"maxContextLength": 8192},
    )
    planned = await _proven(loop, body)
    _started(loop, 600.0)
    limit = int(planned[planned.index("--max-concurrent-requests") + 1])
    loop.window = window(loop.now + 30, kv=0.4, running=limit - 2.0, waiting=2.0)
    await loop.tick(body)
    st = body["status"]
    last = st["history"][-1]
    assert st["startupSeconds"] == 600.0 and st["appliedEngineArgs"] == planned
    assert (last["action"], last["trigger"]) == ("Held", "IdleCapacity") and "restart cost 600s" in last[
        "reason"
    ]


@pytest.mark.parametrize(
    ("kind", "image", "spec"),
    [
        ("SGLang", SGLANG_IMAGE, {"serving": {"maxContextLength": 16384}}),
        ("TGI", TGI_IMAGE, {"serving": {"maxContextLength": 8192}}),
    ],
)
async def test_one_replica_on_a_full_pool_holds_with_the_reason_and_the_recommendation(
    harness: Harness, kind: str, image: str, spec: dict[str, Any]
) -> None:
    """One replica, no spare GPU, no ``allowDowntime``: a change that would roll out on a surge is held
    with :data:`HELD_MESSAGE`, as vLLM's -- recorded once as ``Held``, the recommendation kept,
    ``RolloutInProgress=False`` reason ``Held``, a ``Held`` event -- and nothing rolls."""
    harness.kube.pods = [gpu_pod("node-1", 8)]  # the fake cluster's one H100 node, full
    loop = LoopHarness(harness)
    body = engine_isvc(kind, image, "Auto", gpu={"count": 1, "product": "H100-SXM"}, **spec)
    planned = await _proven(loop, body)
    before = len(harness.kube.applied)
    if kind == "SGLang":
        loop.window = window(loop.now + 30, **FEW_RETRACTIONS)
    else:
        limit = int(planned[planned.index("--max-concurrent-requests") + 1])
        loop.window = window(loop.now + 30, kv=0.4, running=limit - 2.0, waiting=2.0)
    for _ in range(2):
        await loop.tick(body)
        st = body["status"]
        assert st["appliedEngineArgs"] == planned and len(harness.kube.applied) == before  # nothing rolled
        held = [e for e in st["history"] if e["action"] == "Held"]
        assert len(held) == 1 and HELD_MESSAGE in held[0]["reason"]  # recorded once
        assert held[0]["toEngineArgs"] == st["recommendation"]["engineArgs"] != planned
        assert HELD_MESSAGE in st["recommendation"]["reason"]
        cond = condition(body, "RolloutInProgress")
        assert (cond["status"], cond["reason"]) == ("False", "Held") and HELD_MESSAGE in cond["message"]
    assert "Retuned" not in harness.emitter.reasons
    assert len([m for _, r, m in harness.emitter.events if r == "Held" and HELD_MESSAGE in m]) == 1
