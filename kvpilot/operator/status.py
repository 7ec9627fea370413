"""Status patches: what a reconciliation writes to ``status`` (never via handler return values).

kopf applies these as JSON merge patches, where an absent key keeps its old value;
so objects that must be *replaced* (the settings objects, the budget, the GPU) carry
every key, with ``None`` for the unset ones, which deletes them. Pure functions of the
old status and the decision; the clock comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api, conditions
from kvpilot.operator.errors import Failure
from kvpilot.operator.planning import Decision
from kvpilot.operator.resolve import Inputs
from kvpilot.tuner import vllm
from kvpilot.tuner.types import GIB, EngineSettings

HISTORY_LIMIT = 20
_SETTINGS_KEYS = tuple(f.alias or n for n, f in api.Settings.model_fields.items())
_BUDGET_KEYS = tuple(f.alias or n for n, f in api.Budget.model_fields.items())


def build_settings(settings: EngineSettings | None) -> dict[str, Any] | None:
    """A settings object in wire form with every key present (merge-patch replaces it whole)."""
    if settings is None:
        return None
    wire = api.Settings.from_engine(settings).wire()
    return {key: wire.get(key) for key in _SETTINGS_KEYS}


def _compact(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (obj or {}).items() if v is not None}


def _history(
    old: Sequence[Mapping[str, Any]], entry: Mapping[str, Any], *, dedupe: bool = False
) -> list[dict[str, Any]] | None:
    """The history with ``entry`` appended (at most :data:`HISTORY_LIMIT`); None when nothing to add."""
    if dedupe and old:
        last = old[-1]
        if all(last.get(k) == entry.get(k) for k in ("action", "reason", "to")):
            return None
    return [*(dict(e) for e in old), dict(entry)][-HISTORY_LIMIT:]


def build_success_status(
    old: Mapping[str, Any], *, generation: int | None, now: str, inputs: Inputs, decision: Decision,
    trigger: str,
) -> dict[str, Any]:  # fmt: skip
    """Status after the Deployment and Service were applied with ``decision.deploy``."""
    plan, gpu = decision.plan, inputs.gpu
    applied = build_settings(decision.deploy)
    planned_text = vllm.describe_settings(plan.settings)
    b = plan.budget
    updates = [
        (conditions.CONFIG_RESOLVED, conditions.TRUE, "Resolved",
         f"model config from {inputs.model.origin}; GPU {gpu.gpu.name} from {gpu.origin}"),
        (conditions.PLANNED, conditions.TRUE, "Planned",
         f"{planned_text}; KV cache {b.available_kv_cache_gib:.2f} GiB = {b.kv_cache_tokens} tokens, "
         f"{plan.concurrency_at_max_len:.1f} requests at max-model-len"),
        (conditions.INFEASIBLE, conditions.FALSE, "Feasible", "the plan fits the GPUs"),
        (conditions.READY, conditions.TRUE, "Applied",
         _ready_message(decision)),
    ]  # fmt: skip
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions.set_conditions(
            old.get("conditions") or [], updates, generation=generation, now=now
        ),  # fmt: skip
        "gpu": {
            "product": ", ".join(gpu.products) or None,
            "catalogueName": gpu.gpu.name,
            "count": decision.plan.gpu_count,
            "memoryGiB": round(gpu.gpu.total_bytes / GIB, 2),
        },
        "applied": applied,
        "budget": {**dict.fromkeys(_BUDGET_KEYS), **api.Budget.from_budget(b).wire()},
        "warnings": [*gpu.warnings, *plan.warnings],
        "recommendation": None,
    }
    if decision.recommendation is not None:
        patch["recommendation"] = {
            "settings": build_settings(decision.recommendation),
            "reason": f"planned for {plan.gpu_count}x {plan.gpu}: {planned_text}",
            "trigger": trigger,
            "time": now,
        }
    old_applied = old.get("applied")
    if _compact(old_applied) != _compact(applied):
        patch["lastChangeTime"] = now
        patch["history"] = _history(old.get("history") or [], {
            "time": now, "action": "Planned", "trigger": trigger,
            "reason": f"{decision.mode}: {vllm.describe_settings(decision.deploy)}",
            **({"from": _compact(old_applied)} if old_applied else {}), "to": _compact(applied),
        })  # fmt: skip
    return {k: v for k, v in patch.items() if k != "history" or v is not None}


def _ready_message(decision: Decision) -> str:
    if decision.mode == "Auto":
        return f"Deployment applied with the plan: {vllm.describe_settings(decision.deploy)}"
    what = (
        "the recommendation is in status.recommendation"
        if decision.mode == "Recommend"
        else "plan reported only"
    )
    return f"Deployment applied with the user's settings ({vllm.describe_settings(decision.deploy)}); {what}"


def build_failure_status(
    old: Mapping[str, Any], *, generation: int | None, now: str, failure: Failure, trigger: str
) -> dict[str, Any]:
    """Status after a failed reconciliation: Ready=False with the reason; the Deployment is untouched."""
    updates = []
    if failure.condition != conditions.READY:
        updates.append((failure.condition, conditions.FALSE, failure.reason, failure.message))
    if failure.infeasible:
        updates.append((conditions.INFEASIBLE, conditions.TRUE, failure.reason, failure.message))
    elif failure.condition == conditions.PLANNED:
        updates.append((conditions.INFEASIBLE, conditions.FALSE, "NotPlanned", "no plan was made"))
    updates.append((conditions.READY, conditions.FALSE, failure.reason, failure.message))
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions.set_conditions(
            old.get("conditions") or [], updates, generation=generation, now=now
        ),  # fmt: skip
    }
    if failure.infeasible:
        history = _history(old.get("history") or [], {
            "time": now, "action": "Infeasible", "trigger": trigger, "reason": failure.message[:1000],
        }, dedupe=True)  # fmt: skip
        if history is not None:
            patch["history"] = history
    return patch
