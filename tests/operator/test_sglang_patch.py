"""The SGLang loop's status (:mod:`kvpilot.operator.status.sglang_patch`): the recommendation in SGLang's
flags, the failed flags read back as the policy's ruled-out runs, writes and events only on a change."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from kvpilot.operator import api
from kvpilot.operator.inferenceservice import sglang_reading
from kvpilot.operator.status import sglang_patch, status_patch
from kvpilot.tuner import sglang
from kvpilot.tuner.loop import Action, FailedRun, HistoryAction, MetricsStatus, SglangDecision

FAILED = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.84, chunked_prefill_size=8192)
LOWER = sglang.SglangSettings(context_length=8192, mem_fraction_static=0.8, chunked_prefill_size=8192)
FRESH = MetricsStatus(True, "MetricsFresh", "10 samples from 1 pod(s)")


def oom(settings: sglang.SglangSettings = LOWER) -> SglangDecision:
    return SglangDecision(
        Action.RETUNE,
        settings,
        "RuntimeOOM",
        "CUDA out of memory while serving: --mem-fraction-static 0.84 -> 0.8",
        ("OOM step on the headroom 1 - 0.84: --mem-fraction-static 0.8",),
        failed=FailedRun(FAILED, "runtime_oom"),
        metrics=FRESH,
    )


def conditions(out: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in out.lists.apply_to({}).get("conditions", [])}


def landed(old: dict[str, Any], out: Any) -> dict[str, Any]:
    """The status after the patch: its fields merged, its conditions applied."""
    return {**out.lists.apply_to(old), **out.status}


def test_an_oom_records_the_failed_flags_and_recommends_in_sglangs_spelling() -> None:
    out = sglang_patch.build_sglang_patch({}, oom(), "Recommend", generation=1, now=1000.0)
    assert out.status["failedEngineArgs"] == [
        {"args": sglang.build_sglang_args(FAILED), "failure": "runtime_oom"}
    ]
    rec = out.status["recommendation"]
    assert sglang.parse_sglang_args(rec["engineArgs"]) == LOWER and rec["trigger"] == "RuntimeOOM"
    assert [e[:2] for e in out.events] == [("Warning", "RuntimeOOM"), ("Normal", "Recommended")]
    assert "OOM step" in out.events[-1][2]  # the memory model's steps go with the advice
    closed = conditions(out)["ClosedLoop"]
    assert (closed["status"], closed["reason"]) == ("True", "Recommending") and "mode Recommend" in closed[
        "message"
    ]
    assert sglang_patch.read_failed_runs(landed({}, out)) == (FailedRun(FAILED, "runtime_oom"),)


def test_the_same_advice_is_neither_rewritten_nor_announced_again() -> None:
    first = sglang_patch.build_sglang_patch({}, oom(), "Recommend", generation=1, now=1000.0)
    old = landed({}, first)
    again = sglang_patch.build_sglang_patch(old, oom(), "Recommend", generation=1, now=1030.0)
    assert again.status == {} and again.events == []
    assert again.build_conditional(old, "7") is None  # nothing to send
    other = dataclasses.replace(oom(sglang.SglangSettings(mem_fraction_static=0.76)), failed=None)
    changed = sglang_patch.build_sglang_patch(old, other, "Recommend", generation=1, now=1060.0)
    assert changed.status["recommendation"]["engineArgs"] == ["--mem-fraction-static", "0.76"]


def test_a_hold_of_the_gates_recommends_what_it_would_do_and_infeasible_warns_once() -> None:
    held = SglangDecision(
        Action.HOLD,
        FAILED,
        "KvPressure",
        "retractions; would retune but cooldown",
        recommended=LOWER,
        metrics=FRESH,
    )
    out = sglang_patch.build_sglang_patch({}, held, "Recommend", generation=1, now=1000.0)
    assert sglang.parse_sglang_args(out.status["recommendation"]["engineArgs"]) == LOWER
    stuck = SglangDecision(
        Action.INFEASIBLE, FAILED, "StartMemoryShort", "no larger fraction fits", metrics=FRESH
    )
    first = sglang_patch.build_sglang_patch({}, stuck, "Auto", generation=1, now=1000.0)
    assert ("Warning", "Infeasible") in [e[:2] for e in first.events] and "recommendation" not in first.status
    later = sglang_patch.build_sglang_patch(landed({}, first), stuck, "Auto", generation=1, now=1030.0)
    assert later.events == []


def test_the_running_requests_at_a_runtime_oom_are_recorded_and_read_back() -> None:
    seen = dataclasses.replace(oom(), failed=FailedRun(FAILED, "runtime_oom", running=97))
    out = sglang_patch.build_sglang_patch({}, seen, "Auto", generation=1, now=1000.0)
    assert out.status["failedEngineArgs"][0]["runningRequests"] == 97
    assert sglang_patch.read_failed_runs(landed({}, out)) == (FailedRun(FAILED, "runtime_oom", 97),)


def test_unreadable_failed_entries_are_skipped() -> None:
    status = {
        "failedEngineArgs": [
            {"args": ["--context-length", "long"], "failure": "runtime_oom"},
            {"args": ["--mem-fraction-static", "0.7"], "failure": "something_else"},
            {"args": ["--mem-fraction-static", "0.7"], "failure": "start_memory_short"},
        ]
    }
    assert sglang_patch.read_failed_runs(status) == (
        FailedRun(sglang.SglangSettings(mem_fraction_static=0.7), "start_memory_short"),
    )


def test_the_failed_cap_is_the_crds_and_the_status_models() -> None:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml").read_text()
    )
    (version,) = crd["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    field = api.InferenceServiceStatus.model_fields["failed_engine_args"]
    limits = [m.max_length for m in field.metadata if hasattr(m, "max_length")]
    assert sglang_patch.FAILED_LIMIT == status["failedEngineArgs"]["maxItems"] == limits[0]
    many = {
        "failedEngineArgs": [
            {"args": ["--context-length", str(1024 + i)], "failure": "runtime_oom"} for i in range(40)
        ]
    }
    out = sglang_patch.build_sglang_patch(many, oom(), "Auto", generation=1, now=1000.0)
    assert len(out.status["failedEngineArgs"]) == sglang_patch.FAILED_LIMIT
    assert out.status["failedEngineArgs"][-1]["args"] == sglang.build_sglang_args(FAILED)  # the newest kept


def test_auto_records_a_change_as_rolled_out_then_its_probation_and_success() -> None:
    out = sglang_patch.build_sglang_patch({}, oom(), "Auto", generation=1, now=1000.0, deadline_seconds=600)
    args = sglang.build_sglang_args(LOWER)
    assert out.status["appliedEngineArgs"] == args and out.status["lastChangeTime"]
    assert out.status["rollout"]["engineArgs"] == args and out.status["rollout"]["phase"] == "RollingOut"
    assert ("Normal", "Retuned") in [e[:2] for e in out.events] and "Recommended" not in str(out.events)
    assert conditions(out)["ClosedLoop"]["reason"] == "Tuning"
    assert conditions(out)["RolloutInProgress"]["status"] == "True"
    old = landed({}, out)
    rollout = sglang_patch.read_rollout(old, LOWER)
    assert rollout is not None and rollout.deadline - rollout.started_at == 600
    assert sglang_patch.read_rollout(old, FAILED) is None  # another rollout's flags: not this one's
    probation = SglangDecision(
        Action.HOLD, LOWER, "RolloutProbation", "on probation", probation_until=1400.0, metrics=FRESH
    )
    on = sglang_patch.build_sglang_patch(old, probation, "Auto", generation=1, now=1100.0)
    assert on.status["rollout"]["phase"] == "Probation" and on.status["rollout"]["probationUntil"]
    old = landed(old, on)
    good = SglangDecision(Action.HOLD, LOWER, "RolloutSucceeded", "ran 300s", good=LOWER, metrics=FRESH)
    done = sglang_patch.build_sglang_patch(old, good, "Auto", generation=1, now=1500.0)
    assert done.status["rollout"] is None and done.status["lastGoodEngineArgs"] == args
    assert ("Normal", "RolloutSucceeded") in [e[:2] for e in done.events]
    assert conditions(done)["RolloutInProgress"]["status"] == "False"


def test_a_rolled_out_change_and_a_persisting_infeasible_verdict_are_in_the_history() -> None:
    old = {"appliedEngineArgs": sglang.build_sglang_args(FAILED)}
    out = sglang_patch.build_sglang_patch(old, oom(), "Auto", generation=1, now=1000.0)
    (entry, dedupe), *rest = out.lists.history
    assert not rest and not dedupe and entry["action"] == "Retuned" and entry["trigger"] == "RuntimeOOM"
    assert entry["fromEngineArgs"] == sglang.build_sglang_args(FAILED)
    assert entry["toEngineArgs"] == sglang.build_sglang_args(LOWER)
    old = landed(old, out)
    assert [c.time for c in sglang_reading.read_changes(old)] == [1000.0]  # the gates count it
    (change,) = sglang_reading.read_changes(old)  # and the flap guard reads what it changed from and to
    assert (change.before, change.after) == (FAILED, LOWER)
    planned = {
        **old,
        "history": [{"time": "2026-01-01T00:00:00Z", "action": "Planned", "trigger": "Created"}],
    }
    read = {c.trigger: c.planned for c in sglang_reading.read_changes(planned)}
    assert read == {"Created": True, "lastChangeTime": False}  # the plan is no retune for the hourly limit
    stuck = SglangDecision(
        Action.INFEASIBLE, LOWER, "StartMemoryShort", "no larger fraction fits", metrics=FRESH
    )
    first = sglang_patch.build_sglang_patch(old, stuck, "Auto", generation=1, now=1030.0)
    assert [e["action"] for e, _ in first.lists.history] == ["Infeasible"]
    again = sglang_patch.build_sglang_patch(landed(old, first), stuck, "Auto", generation=1, now=1060.0)
    assert again.lists.history == []  # recorded once


def test_the_history_entries_are_the_crds() -> None:
    crd = yaml.safe_load(
        (Path(__file__).parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml").read_text()
    )
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    fields = set(status["history"]["items"]["properties"])
    entry = status_patch.build_history_entry(
        time="t",
        action=HistoryAction.RETUNED,
        trigger="x",
        reason="y",
        from_engine_args=[],
        to_engine_args=[],
    )
    assert set(entry) <= fields and {"fromEngineArgs", "toEngineArgs"} <= fields
    api.HistoryRecord.model_validate(entry)
