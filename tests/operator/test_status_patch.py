"""The status document's own rules: caps from the status model, one history append, one message cap."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import Harness, fake_plan, isvc

from kvpilot.operator import api, conditions
from kvpilot.operator.status import events, loop_patch, status_patch
from kvpilot.tuner.loop import HistoryAction
from kvpilot.tuner.types import EngineSettings, Plan

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml"


def crd_status() -> dict:
    (version,) = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]


@pytest.mark.parametrize(
    ("limit", "crd_key"),
    [("HISTORY_LIMIT", "history"), ("FAILED_LIMIT", "failedSettings"), ("WARNINGS_LIMIT", "warnings")],
)
def test_caps_are_the_crds_max_items(limit: str, crd_key: str) -> None:
    assert getattr(status_patch, limit) == crd_status()[crd_key]["maxItems"]


def test_the_caps_come_from_the_status_model(monkeypatch: pytest.MonkeyPatch) -> None:
    field = api.InferenceServiceStatus.model_fields["history"]
    assert status_patch._max_items("history") == 20
    monkeypatch.setattr(field, "metadata", [])
    with pytest.raises(LookupError):
        status_patch._max_items("history")


def entry(action: HistoryAction, trigger: str, reason: str = "r", seqs: int = 64) -> dict:
    return status_patch.build_history_entry(
        time="2026-11-30T10:00:00Z",
        action=action,
        trigger=trigger,
        reason=reason,
        from_settings=EngineSettings(max_num_seqs=seqs),
        to_settings=EngineSettings(max_num_seqs=seqs),
    )


def test_one_dedupe_rule_same_action_trigger_and_settings() -> None:
    old = [entry(HistoryAction.HELD, "MetricsStale", "newest sample is 130s old")]
    same = entry(HistoryAction.HELD, "MetricsStale", "newest sample is 190s old")
    assert status_patch.append_history(old, same, dedupe=True) is None  # a persisting hold, once
    assert status_patch.append_history(old, same) == [*old, same]  # changes are never deduped
    for other in (
        entry(HistoryAction.HELD, "MetricsUnavailable"),
        entry(HistoryAction.INFEASIBLE, "MetricsStale"),
        entry(HistoryAction.HELD, "MetricsStale", seqs=32),
    ):
        assert status_patch.append_history(old, other, dedupe=True) == [*old, other]


def test_history_keeps_the_newest_entries() -> None:
    history: list[dict] = []
    for i in range(status_patch.HISTORY_LIMIT + 5):
        new = status_patch.append_history(history, entry(HistoryAction.RETUNED, f"T{i}"))
        assert new is not None
        history = new
    assert len(history) == status_patch.HISTORY_LIMIT
    assert history[-1]["trigger"] == f"T{status_patch.HISTORY_LIMIT + 4}" and history[0]["trigger"] == "T5"


def test_failed_settings_keep_the_newest() -> None:
    failed: list[dict] = []
    for seqs in range(1, status_patch.FAILED_LIMIT + 3):
        failed = status_patch.append_failed(failed, EngineSettings(max_num_seqs=seqs))
    assert len(failed) == status_patch.FAILED_LIMIT
    assert failed[0] == {"maxNumSeqs": 3} and failed[-1] == {"maxNumSeqs": status_patch.FAILED_LIMIT + 2}


def test_messages_share_the_event_cap() -> None:
    long = "x" * (events.MAX_MESSAGE + 500)
    assert status_patch.MAX_MESSAGE == events.MAX_MESSAGE
    e = entry(HistoryAction.HELD, "Other", long)
    assert len(e["reason"]) == events.MAX_MESSAGE
    conds = status_patch.set_conditions(
        {}, [(conditions.READY, conditions.FALSE, "Broken", long)], generation=1, now="2026-11-30T10:00:00Z"
    )
    assert len(conds[0]["message"]) == events.MAX_MESSAGE
    rec = status_patch.build_recommendation(EngineSettings(), long, "IdleCapacity", "2026-11-30T10:00:00Z")
    assert len(rec["reason"]) == events.MAX_MESSAGE


async def test_warnings_are_capped(harness: Harness) -> None:
    def chatty(*args: Any, **kwargs: Any) -> Plan:
        many = tuple(f"warning {i}" for i in range(40))
        return dataclasses.replace(fake_plan(*args, **kwargs), warnings=many)

    harness.deps.plan_fn = chatty
    body = isvc()
    await harness.run(body)
    assert body["status"]["warnings"] == [f"warning {i}" for i in range(status_patch.WARNINGS_LIMIT)]
    api.InferenceServiceStatus.model_validate(body["status"])  # the CRD would take it


def test_condition_types_have_one_home() -> None:
    assert conditions.TYPES == (
        "Ready",
        "Available",
        "Degraded",
        "Schedulable",
        "ConfigResolved",
        "Planned",
        "Infeasible",
        "MetricsAvailable",
        "RolloutInProgress",
    )
    sorted_ = conditions.set_conditions(
        [], [(t, conditions.TRUE, "Because", "m") for t in reversed(conditions.TYPES)], generation=1, now="t"
    )
    assert tuple(c["type"] for c in sorted_) == conditions.TYPES


def test_scale_out_is_recorded_once_with_an_event_and_withdrawn_when_the_pressure_goes() -> None:
    from kvpilot.tuner.loop import Action, Decision, Trigger

    held = Decision(
        Action.HOLD, EngineSettings(max_num_seqs=64), Trigger.KV_PRESSURE, "at the lower bound", scale_out=3
    )
    out: list[tuple[str, str, str]] = []
    patch = loop_patch.build_scale_out({}, held, "2026-12-02T08:00:00Z", out)
    assert patch["recommendation"]["replicas"] == 3
    assert [(e[0], e[1]) for e in out] == [(events.NORMAL, "ScaleOutRecommended")]
    assert "3 replicas recommended" in out[0][2]
    standing = {"recommendation": {"replicas": 3}}
    again: list[tuple[str, str, str]] = []
    assert loop_patch.build_scale_out(standing, held, "t", again) == {} and again == []
    steady = Decision(Action.HOLD, EngineSettings(max_num_seqs=64), Trigger.STEADY, "inside the band")
    assert loop_patch.build_scale_out(standing, steady, "t", again) == {"recommendation": {"replicas": None}}
    assert loop_patch.build_scale_out({}, steady, "t", again) == {}
