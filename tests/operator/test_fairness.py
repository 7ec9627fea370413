"""Per-namespace fairness (kvpilot.operator.fairness): a burst in one namespace does not delay another's."""

from __future__ import annotations

import asyncio

import kopf
import pytest

from kvpilot.operator import fairness
from kvpilot.operator.clients import metrics
from kvpilot.operator.fairness import FairGate, FairnessConfigError, FairnessSettings
from kvpilot.operator.loop import loop_deps, startup


async def _run(gate: FairGate, work: list[tuple[str, int]], order: list[str], hold: float = 0.01) -> None:
    async def unit(namespace: str, i: int) -> None:
        async with gate.slot(namespace):
            order.append(f"{namespace}{i}")
            assert gate.active <= gate.total and gate.running[namespace] <= gate.per_namespace
            await asyncio.sleep(hold)

    tasks = [asyncio.create_task(unit(ns, i)) for ns, i in work]
    await asyncio.gather(*tasks)


async def test_one_namespaces_burst_does_not_delay_anothers_unit() -> None:
    """500 units from tenant a arrive first, then one from tenant b: b's runs among the first, not last."""
    gate = FairGate(total=4, per_namespace=2)
    order: list[str] = []
    work = [("a", i) for i in range(500)] + [("b", 0)]
    await _run(gate, work, order, hold=0.001)
    assert len(order) == 501
    assert order.index("b0") <= gate.per_namespace + 1  # behind at most the burst's own share
    assert order[: gate.per_namespace] == ["a0", "a1"]  # inside a namespace: first come, first served


async def test_namespaces_take_turns_when_slots_free() -> None:
    gate = FairGate(total=1, per_namespace=1)
    order: list[str] = []
    work = [("a", i) for i in range(3)] + [("b", i) for i in range(3)] + [("c", 0)]
    await _run(gate, work, order)
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "b2"]


async def test_a_burst_alone_uses_only_its_share() -> None:
    gate = FairGate(total=8, per_namespace=3)
    peak = 0

    async def unit() -> None:
        nonlocal peak
        async with gate.slot("a"):
            peak = max(peak, gate.running["a"])
            await asyncio.sleep(0.005)

    await asyncio.gather(*(unit() for _ in range(20)))
    assert peak == 3 and gate.active == 0 and gate.waiting("a") == 0


async def test_a_cancelled_waiter_leaves_no_slot_taken() -> None:
    gate = FairGate(total=1, per_namespace=1)
    release = asyncio.Event()

    async def holder() -> None:
        async with gate.slot("a"):
            await release.wait()

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(holder())
    await asyncio.sleep(0)
    assert gate.waiting("a") == 1
    waiter.cancel()
    release.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.active == 0 and gate.waiting("a") == 0
    async with gate.slot("b"):  # the slot is free again
        assert gate.running["b"] == 1


async def test_a_unit_cancelled_between_grant_and_run_gives_its_slot_on() -> None:
    gate = FairGate(total=1, per_namespace=1)
    await gate._acquire("a")
    waiter = asyncio.create_task(gate._acquire("b"))
    await asyncio.sleep(0)
    gate._release("a")  # grants b's slot ...
    waiter.cancel()  # ... and b is cancelled before it ran
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.active == 0
    async with gate.slot("c"):
        assert gate.running["c"] == 1


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, FairnessSettings(16, 4)),
        ({fairness.TOTAL_ENV: "2"}, FairnessSettings(2, 2)),
        ({fairness.TOTAL_ENV: "40", fairness.PER_NAMESPACE_ENV: "10"}, FairnessSettings(40, 10)),
    ],
)
def test_settings_from_env(env: dict[str, str], expected: FairnessSettings) -> None:
    assert fairness.settings_from_env(env) == expected


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({fairness.TOTAL_ENV: "0"}, "a positive integer"),
        ({fairness.PER_NAMESPACE_ENV: "many"}, "a positive integer"),
        ({fairness.TOTAL_ENV: "4", fairness.PER_NAMESPACE_ENV: "5"}, "is above"),
    ],
)
def test_bad_settings_are_refused_by_name(env: dict[str, str], complaint: str) -> None:
    with pytest.raises(FairnessConfigError, match=complaint):
        fairness.settings_from_env(env)


def test_the_operators_start_up_installs_the_configured_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's `operator.fairness` values arrive as these variables; start-up builds the gate of them."""
    monkeypatch.setenv(fairness.TOTAL_ENV, "24")
    monkeypatch.setenv(fairness.PER_NAMESPACE_ENV, "3")
    monkeypatch.setattr(fairness, "_GATE", fairness.gate())  # restored after the test
    monkeypatch.setattr(metrics, "start_metrics_server", lambda: None)
    monkeypatch.setattr(loop_deps, "configure", lambda *_args: None)  # no cluster here
    startup.apply_config(startup.read_config())
    assert (fairness.gate().total, fairness.gate().per_namespace) == (24, 3)


def test_a_bad_setting_stops_the_operator_at_start_up_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fairness.TOTAL_ENV, "2")
    monkeypatch.setenv(fairness.PER_NAMESPACE_ENV, "3")
    with pytest.raises(kopf.PermanentError, match=f"{fairness.PER_NAMESPACE_ENV}=3 is above"):
        startup.read_config()
