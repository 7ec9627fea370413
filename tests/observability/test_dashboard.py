"""The dashboard and the rule files as shipped: what the code builds, naming only series that exist.

vLLM's series must be :mod:`kvpilot.tuner.vllm.serving`'s (one home for a release's metric names), the
operator's must be in its registry (:mod:`kvpilot.operator.clients.metrics`), and the committed files
(chart and examples) must be what ``python -m kvpilot.observability`` writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

from kvpilot.observability import alerts, dashboard
from kvpilot.observability.__main__ import DASHBOARD_FILES, ROOT, main, render_files
from kvpilot.tuner.vllm import serving

SUFFIXES = ("_bucket", "_sum", "_count")
EXPRESSIONS = dashboard.expressions(dashboard.build_dashboard()) + alerts.expressions(alerts.build_rules())


def _names(prefix: str) -> set[str]:
    return {m for e in EXPRESSIONS for m in re.findall(rf"\b{prefix}[a-zA-Z0-9_:]+", e)}


def test_every_vllm_series_is_one_serving_names() -> None:
    known = {v for k, v in vars(serving).items() if isinstance(v, str) and v.startswith("vllm:")}
    named = {re.sub("|".join(SUFFIXES) + "$", "", n) for n in _names("vllm:")}
    assert named and named <= known, named - known


def test_every_operator_series_is_exported() -> None:
    families = list(REGISTRY.collect())  # a labelled metric without children has no samples yet
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    named = _names("kvpilot_")
    assert {"kvpilot_applied_setting", "kvpilot_service_decisions_total", "kvpilot_slo_seconds"} <= named
    assert named <= exported, named - exported


def test_the_committed_files_are_what_the_code_builds(tmp_path: Path) -> None:
    assert main(["--check"]) == 0, "run: python -m kvpilot.observability"
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / DASHBOARD_FILES[0]).write_text("{}")
    assert main(["--root", str(tmp_path), "--check"]) == 1  # a hand edit is caught


def test_the_dashboard_has_the_panels_and_variables() -> None:
    model = json.loads(render_files()[DASHBOARD_FILES[0]])
    titles = [p["title"] for p in model["panels"]]
    words = ("KV cache", "Preemptions", "Queue", "max_num_seqs", "TTFT", "ITL", "GPU memory", "Decisions")
    for word in words:
        assert any(word in t for t in titles), word
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource", "namespace", "service"]
    assert len({p["id"] for p in model["panels"]}) == len(titles)
    assert model["annotations"]["list"][0]["expr"].startswith("increase(kvpilot_service_decisions_total")
    (ROOT / "docs" / "observability.md").read_text().index(dashboard.TITLE)
