"""kvpilot's Prometheus alert rules, as data: ``build_rules()`` returns a rule file's ``groups``.

One group, ``kvpilot``; every rule says what happened and links its runbook line in
docs/observability.md (``runbook_url``; ``tests/observability`` checks each alert has one). The chart
ships them as a PrometheusRule (``alerts.enabled``) and examples/prometheus/ as a plain rule file.

What they watch, and from where:

* the engine itself: a vLLM container restarting again and again (kube-state-metrics), a CUDA OOM
  loop kvpilot's retunes do not end (three retunes or rollbacks within an hour);
* kvpilot's decisions: a rollback, a service held back at every tick of an hour (``kvpilot_service_held``),
  or Infeasible for long (its last Infeasible decision newer than its last change);
* what the closed loop reads: a service whose pods export no vLLM series (the loop holds blind), the
  KV cache above the policy's 'high' with preemptions while kvpilot has not retuned;
* the operator: not scraped (down), or failing its reconciliations.
"""

from __future__ import annotations

from typing import Any

from kvpilot.observability import series as s

__all__ = ["GROUP", "RUNBOOK", "build_rules", "expressions"]

GROUP = "kvpilot"
RUNBOOK = "https://github.com/kvpilot/kvpilot/blob/main/docs/observability.md#"
"""Each alert's ``runbook_url`` is this and the alert's name in lower case (a heading of the docs)."""

_CHANGES = "Planned|Retuned|RolledBack"
_PER_SERVICE = f"max by ({s.SERVICE})"


def _rule(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": RUNBOOK + name.lower(),
        },
    }


def _last(kinds: str) -> str:
    return f'{_PER_SERVICE} ({s.DECISION_TIME}{{kind=~"{kinds}"}})'


def _engine_rules() -> list[dict[str, Any]]:
    restarts = f'increase(kube_pod_container_status_restarts_total{{container="{s.CONTAINER}"}}[30m])'
    return [
        _rule(
            "KvpilotEngineRestartLoop",
            f"{restarts} >= 3",
            "5m",
            "warning",
            "vLLM in {{ $labels.namespace }}/{{ $labels.pod }} restarted 3 times or more in 30m",
            "The engine keeps failing to start or crashing. kubectl describe the InferenceService for "
            "kvpilot's reading of the crash; `kvpilot diagnose --pod {{ $labels.pod }}` reads its "
            "previous log.",
        ),
        _rule(
            "KvpilotOOMLoop",
            f'sum by ({s.SERVICE}) (increase({s.DECISIONS}{{kind=~"Retuned|RolledBack"}}[1h])) >= 3',
            "0m",
            "critical",
            "kvpilot changed {{ $labels.namespace }}/{{ $labels.inferenceservice }} 3 times or more "
            "in an hour",
            "Retunes and rollbacks follow each other: the engine keeps running out of memory (or failing) "
            "at every setting tried. Read status.history; pin a smaller max_model_len or max_num_seqs, or "
            "give the service a larger GPU.",
        ),
    ]


def _decision_rules() -> list[dict[str, Any]]:
    return [
        _rule(
            "KvpilotRolledBack",
            f'increase({s.DECISIONS}{{kind="RolledBack"}}[30m]) > 0',
            "0m",
            "warning",
            "kvpilot rolled {{ $labels.namespace }}/{{ $labels.inferenceservice }} back",
            "A retune failed (its pods crashed, or did not become Ready before spec.tuning."
            "rolloutDeadlineSeconds) and the last good settings were restored. status.history says why.",
        ),
        _rule(
            "KvpilotServiceHeld",
            f"min_over_time({s.HELD}[1h]) == 1",
            "0m",
            "warning",
            "kvpilot has held {{ $labels.namespace }}/{{ $labels.inferenceservice }} for over an hour",
            "The closed loop wanted a change it may not make (cooldown, change budget, bounds, metrics "
            "unavailable, mode). The Held event and status.history say what blocks it.",
        ),
        _rule(
            "KvpilotServiceInfeasible",
            f"{_last('Infeasible')} > ({_last(_CHANGES)} or {_PER_SERVICE} ({s.DECISION_TIME}) * 0)",
            "30m",
            "critical",
            "{{ $labels.namespace }}/{{ $labels.inferenceservice }} cannot be served as specified",
            "The model does not fit the GPUs asked for (the Infeasible condition quotes vLLM's own error). "
            "`kvpilot estimate` shows the plan; ask for more GPUs, FP8 KV cache or a shorter context.",
        ),
    ]


def _reading_rules() -> list[dict[str, Any]]:
    served = f'{_PER_SERVICE} ({s.APPLIED_SETTING}{{setting="max_num_seqs"}})'
    seen = f"{_PER_SERVICE} ({s.RUNNING})"
    kv = f"{_PER_SERVICE} ({s.KV_USAGE})"
    high = f'{_PER_SERVICE} ({s.KV_THRESHOLD}{{threshold="high"}})'
    preempting = f"sum by ({s.SERVICE}) (rate({s.PREEMPTIONS}[10m])) > 0"
    changed = f'sum by ({s.SERVICE}) (increase({s.DECISIONS}{{kind=~"{_CHANGES}"}}[30m])) > 0'
    return [
        _rule(
            "KvpilotMetricsUnavailable",
            f"{served} unless on ({s.SERVICE}) {seen}",
            "10m",
            "warning",
            "No vLLM metrics for {{ $labels.namespace }}/{{ $labels.inferenceservice }}",
            "kvpilot manages the service but Prometheus has none of its pods' vLLM series: the closed loop "
            "holds blind, or its series lack the inferenceservice label. Check the PodMonitor "
            "(vllmPodMonitor.enabled; a scrape config of your own needs its relabeling: "
            "docs/observability.md) and the MetricsAvailable condition.",
        ),
        _rule(
            "KvpilotKvSaturatedWhileHeld",
            f"({kv} > on ({s.SERVICE}) {high}) and on ({s.SERVICE}) ({preempting}) "
            f"unless on ({s.SERVICE}) ({changed})",
            "15m",
            "warning",
            "{{ $labels.namespace }}/{{ $labels.inferenceservice }}: KV cache full and preempting, no retune",
            "KV usage is above the policy's high mark and vLLM preempts requests, yet kvpilot has not "
            "changed the settings in 30 minutes (mode, bounds, cooldown or change budget). See the Held "
            "events; raise the bounds or the replicas.",
        ),
    ]


def _operator_rules() -> list[dict[str, Any]]:
    failing = f'sum(rate({s.OPERATOR_RECONCILES}{{result!="success"}}[15m]))'
    return [
        _rule(
            "KvpilotOperatorDown",
            f"absent({s.OPERATOR_RECONCILES})",
            "10m",
            "critical",
            "kvpilot's operator is not scraped",
            "No kvpilot_reconciles_total series: the operator is down or its metrics are not scraped "
            "(metrics.serviceMonitor.enabled). Nothing is tuned or repaired meanwhile.",
        ),
        _rule(
            "KvpilotReconcileErrors",
            f'{failing} > 0 unless sum(rate({s.OPERATOR_RECONCILES}{{result="success"}}[15m])) > 0',
            "15m",
            "warning",
            "kvpilot's reconciliations fail",
            "Every reconciliation of the last 15 minutes failed. kvpilot_errors_total says why by reason; "
            "the operator's log has the rest.",
        ),
    ]


def build_rules() -> dict[str, Any]:
    """A Prometheus rule file: ``{"groups": [...]}``."""
    rules = _engine_rules() + _decision_rules() + _reading_rules() + _operator_rules()
    return {"groups": [{"name": GROUP, "rules": rules}]}


def expressions(rules: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]
