"""kvpilot's alert rules under ``promtool``: the rule file checks, and each alert fires on synthetic series
of the failure it names and stays silent on healthy ones (``promtool test rules``).

Each case below is one ``promtool`` test group: input series (``promtool``'s expanding notation), an
evaluation time, and the alerts expected then, by their labels; the expected annotations are the
rule's own templates with those labels filled in, so a case checks when a rule fires and for whom.
promtool comes with Debian's ``prometheus`` package (``make e2e-tools``); a missing one fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpilot.observability import alerts
from kvpilot.observability.__main__ import ROOT, RULE_FILES

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
RULES = {r["alert"]: r for g in alerts.build_rules()["groups"] for r in g["rules"]}
NS = {"namespace": "ns1"}


def _svc(name: str) -> str:
    return f'namespace="ns1", inferenceservice="{name}"'


def _decisions(name: str, kind: str, values: str) -> dict[str, str]:
    return {"series": f'kvpilot_service_decisions_total{{{_svc(name)}, kind="{kind}"}}', "values": values}


def _stamp(name: str, kind: str, seconds: int) -> dict[str, str]:
    return {
        "series": f'kvpilot_service_last_decision_timestamp_seconds{{{_svc(name)}, kind="{kind}"}}',
        "values": f"{seconds}x200",
    }


def _vllm(metric: str, pod: str, values: str) -> dict[str, str]:
    """A vLLM series of a Deployment's pod ``<service>-<hash>-<hash>``, relabelled as the chart's PodMonitor
    relabels it: its InferenceService from the pod's label."""
    service = pod.rsplit("-", 2)[0]
    labels = f'namespace="ns1", pod="{pod}", inferenceservice="{service}", model_name="m", engine="0"'
    return {"series": f"{metric}{{{labels}}}", "values": values}


def _operator_up() -> dict[str, str]:
    return {"series": 'kvpilot_reconciles_total{result="success"}', "values": "0+1x200"}


# (alert, input series, evaluation time, labels of each alert expected then)
CASES: list[tuple[str, list[dict[str, str]], str, list[dict[str, str]]]] = [
    (
        "KvpilotEngineRestartLoop",
        [
            {
                "series": 'kube_pod_container_status_restarts_total{namespace="ns1", pod="llm-5d8f7c-aaaaa", '
                'container="vllm"}',
                "values": "0+1x60",
            },
            {
                "series": 'kube_pod_container_status_restarts_total{namespace="ns1", pod="ok-5d8f7c-aaaaa", '
                'container="vllm"}',
                "values": "0x60",
            },
            {
                "series": 'kube_pod_container_status_restarts_total{namespace="ns1", '
                'pod="side-5d8f7c-aaaaa", container="sidecar"}',
                "values": "0+1x60",
            },
        ],
        "40m",
        [{**NS, "pod": "llm-5d8f7c-aaaaa", "container": "vllm"}],
    ),
    (
        "KvpilotOOMLoop",
        [
            _decisions("loop", "Retuned", "0 1 2 2 2 2 2"),
            _decisions("loop", "RolledBack", "0 0 0 1 1 1 1"),
            _decisions("once", "Retuned", "0 1 1 1 1 1 1"),
        ],
        "5m",
        [{**NS, "inferenceservice": "loop"}],
    ),
    (
        "KvpilotRolledBack",
        [
            _decisions("back", "RolledBack", "0 0 1 1 1 1"),
            _decisions("fine", "RolledBack", "0 0 0 0 0 0"),
        ],
        "5m",
        [{**NS, "inferenceservice": "back", "kind": "RolledBack"}],
    ),
    (
        "KvpilotServiceHeld",
        [
            {"series": f"kvpilot_service_held{{{_svc('stuck')}}}", "values": "0x30 1x90"},
            {
                "series": f"kvpilot_service_held{{{_svc('moved')}}}",
                "values": "0x30 1x50 0 1x39",
            },  # let go once
            {"series": f"kvpilot_service_held{{{_svc('fresh')}}}", "values": "0x90 1x30"},
        ],
        "2h",
        [{**NS, "inferenceservice": "stuck"}],
    ),
    (
        "KvpilotServiceInfeasible",
        [
            _stamp("never", "Infeasible", 60),
            _stamp("fixed", "Infeasible", 60),
            _stamp("fixed", "Planned", 120),
        ],
        "40m",
        [{**NS, "inferenceservice": "never"}],
    ),
    (
        "KvpilotMetricsUnavailable",
        [
            {
                "series": f'kvpilot_applied_setting{{{_svc("blind")}, setting="max_num_seqs"}}',
                "values": "64x30",
            },
            {
                "series": f'kvpilot_applied_setting{{{_svc("seen")}, setting="max_num_seqs"}}',
                "values": "64x30",
            },
            _vllm("vllm:num_requests_running", "seen-5d8f7c-aaaaa", "3x30"),
            _vllm("vllm:num_requests_running", "blind-extra-5d8f7c-aaaaa", "3x30"),  # another service's pod
        ],
        "20m",
        [{**NS, "inferenceservice": "blind"}],
    ),
    (
        "KvpilotKvSaturatedWhileHeld",
        [
            *[
                {"series": f'kvpilot_kv_usage_threshold{{{_svc(n)}, threshold="high"}}', "values": "0.9x60"}
                for n in ("hot", "tuning", "cool")
            ],
            _vllm("vllm:kv_cache_usage_perc", "hot-5d8f7c-aaaaa", "0.97x60"),
            _vllm("vllm:num_preemptions_total", "hot-5d8f7c-aaaaa", "0+30x60"),
            _vllm("vllm:kv_cache_usage_perc", "tuning-5d8f7c-aaaaa", "0.97x60"),
            _vllm("vllm:num_preemptions_total", "tuning-5d8f7c-aaaaa", "0+30x60"),
            _decisions("tuning", "Retuned", "0x20 1x40"),
            _vllm("vllm:kv_cache_usage_perc", "cool-5d8f7c-aaaaa", "0.6x60"),
            _vllm("vllm:num_preemptions_total", "cool-5d8f7c-aaaaa", "0+30x60"),
        ],
        "30m",
        [{**NS, "inferenceservice": "hot"}],
    ),
    ("KvpilotOperatorDown", [{"series": 'up{job="other"}', "values": "1x30"}], "15m", [{}]),
    ("KvpilotOperatorDown", [_operator_up()], "15m", []),
    (
        "KvpilotReconcileErrors",
        [
            {"series": 'kvpilot_reconciles_total{result="temporary_error"}', "values": "0+1x60"},
            {"series": 'kvpilot_reconciles_total{result="success"}', "values": "5x60"},
        ],
        "40m",
        [{}],
    ),
    (
        "KvpilotReconcileErrors",
        [
            {"series": 'kvpilot_reconciles_total{result="temporary_error"}', "values": "0+1x60"},
            _operator_up(),
        ],
        "40m",
        [],
    ),
]


def _expected(alert: str, labels: dict[str, str]) -> dict[str, Any]:
    rule = RULES[alert]

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)

    return {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": {k: fill(v) for k, v in rule["annotations"].items()},
    }


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail(f"{PROMTOOL} is missing: `make e2e-tools` installs Debian's prometheus package")
    cmd = [PROMTOOL, *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("path", RULE_FILES, ids=str)
def test_promtool_checks_the_shipped_rule_files(path: Path) -> None:
    done = _promtool("check", "rules", str(ROOT / path), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in done.stdout


def test_every_alert_has_a_case_that_fires() -> None:
    assert {alert for alert, _, _, expected in CASES if expected} == set(RULES)


def test_promtool_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(alerts.build_rules(), sort_keys=False))
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": alert,
                    "exp_alerts": [_expected(alert, labels) for labels in expected],
                }
            ],
        }
        for alert, series, at, expected in CASES
    ]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": tests}))
    done = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_case_fails(tmp_path: Path) -> None:
    """The harness is not vacuous: a healthy series expected to fire makes promtool fail."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(alerts.build_rules(), sort_keys=False))
    (alert, series, at, _), *_ = [c for c in CASES if c[0] == "KvpilotOperatorDown" and not c[3]]  # it is up
    fires = [{"eval_time": at, "alertname": alert, "exp_alerts": [_expected(alert, {})]}]
    wrong = {"interval": "1m", "input_series": series, "alert_rule_test": fires}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [wrong]}))
    assert _promtool("test", "rules", "tests.yaml", cwd=tmp_path).returncode != 0


def test_every_alert_links_its_runbook() -> None:
    docs = (ROOT / "docs" / "observability.md").read_text()
    for alert, rule in RULES.items():
        assert rule["annotations"]["runbook_url"].endswith("#" + alert.lower())
        assert f"### {alert}" in docs, f"docs/observability.md has no runbook for {alert}"
