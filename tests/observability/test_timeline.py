"""``kvpilot timeline``: one InferenceService's settings and decisions as a self-contained SVG.

The history is in the API contract's ``status.history`` format (a plan, a CUDA OOM retune, a
``max_num_seqs`` cut, its rollback); the Prometheus lanes come from a canned ``query_range`` server
that records the queries asked.
"""

from __future__ import annotations

import io
import json
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpilot import cli
from kvpilot.observability import fetch, timeline

SVG = "{http://www.w3.org/2000/svg}"
HISTORY = [
    {
        "time": "2026-12-05T10:00:00Z",
        "action": "Planned",
        "trigger": "Created",
        "reason": "memory model plan",
        "to": {"maxNumSeqs": 64, "maxModelLen": 8192, "gpuMemoryUtilization": 0.95},
    },
    {
        "time": "2026-12-05T10:20:00Z",
        "action": "Retuned",
        "trigger": "CudaOOM",
        "reason": "CUDA OOM: gpu_memory_utilization 0.95 -> 0.93 & headroom <1.2x>",
        "from": {"maxNumSeqs": 64, "maxModelLen": 8192, "gpuMemoryUtilization": 0.95},
        "to": {"maxNumSeqs": 64, "maxModelLen": 8192, "gpuMemoryUtilization": 0.93},
    },
    {
        "time": "2026-12-05T11:00:00Z",
        "action": "Retuned",
        "trigger": "Preemptions",
        "reason": "storm",
        "from": {"maxNumSeqs": 64},
        "to": {"maxNumSeqs": 48},
    },
    {
        "time": "2026-12-05T11:10:00Z",
        "action": "RolledBack",
        "trigger": "RolloutFailed",
        "reason": "crashed",
        "from": {"maxNumSeqs": 48},
        "to": {"maxNumSeqs": 64},
    },
]
SERVICE = {
    "metadata": {"name": "llm", "namespace": "ns1"},
    "status": {
        "applied": {"maxNumSeqs": 64, "maxModelLen": 8192, "gpuMemoryUtilization": 0.93},
        "history": HISTORY,
    },
}
T0 = timeline.parse_time("2026-12-05T10:00:00Z")


def _tree(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_decisions_are_marked_in_order_with_their_reasons() -> None:
    root = _tree(timeline.build_timeline_svg(SERVICE))
    marks = [g for g in root.iter(f"{SVG}g") if g.get("class") == "decision"]
    assert [g.get("data-action") for g in marks] == ["Planned", "Retuned", "Retuned", "RolledBack"]
    tips = [g.find(f"{SVG}title").text for g in marks]  # type: ignore[union-attr]
    assert tips[1] == "Retuned (CudaOOM): CUDA OOM: gpu_memory_utilization 0.95 -> 0.93 & headroom <1.2x>"
    legend = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert any(t.startswith("4. 2026-12-05T11:10:00Z RolledBack (RolloutFailed): crashed") for t in legend)
    xs = [float(g.find(f"{SVG}line").get("x1")) for g in marks]  # type: ignore[union-attr, arg-type]
    assert xs == sorted(xs) and xs[0] == timeline.LEFT and xs[-1] == timeline.WIDTH - timeline.RIGHT


def test_settings_are_steps() -> None:
    root = _tree(timeline.build_timeline_svg(SERVICE))
    lanes = {g.get("data-key"): g for g in root.iter(f"{SVG}g") if g.get("class") == "lane"}
    assert list(lanes) == ["maxNumSeqs", "maxModelLen", "gpuMemoryUtilization"]  # no batched-tokens history
    path = lanes["maxNumSeqs"].find(f"{SVG}path").get("d", "").split()  # type: ignore[union-attr]
    ys = [float(p.split(",")[1]) for p in path]
    # 64 until 11:00, 48 until 11:10, 64 again: each change is a vertical step at one x
    assert len(set(ys)) == 2 and ys[0] == ys[-1]
    xs = [float(p[1:].split(",")[0]) for p in path]
    assert xs == sorted(xs)


def test_prometheus_lanes() -> None:
    kv = [(T0 + 60 * i, min(1.0, 0.5 + 0.01 * i)) for i in range(80)]
    preemptions = [(T0, 0.0), (T0 + 4800, 2.5)]
    root = _tree(timeline.build_timeline_svg(SERVICE, {"kv_usage": kv, "preemptions": preemptions}))
    keys = [g.get("data-key") for g in root.iter(f"{SVG}g") if g.get("class") == "lane"]
    assert keys[-2:] == ["kv_usage", "preemptions"]


def test_no_history_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="ns1/llm has no status.history"):
        timeline.build_timeline_svg({"metadata": {"name": "llm", "namespace": "ns1"}, "status": {}})


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    """A canned Prometheus: every query_range gets one series; the queries asked are recorded."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            asked.append(query["query"][0])
            start = float(query["start"][0])
            values = [[start + 60 * i, str(0.9)] for i in range(10)]
            result = [{"metric": {}, "values": values}]
            data = {"resultType": "matrix", "result": result}
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()


def test_cli_writes_the_svg_with_prometheus_lanes(tmp_path: Path, prometheus: tuple[str, list[str]]) -> None:
    url, asked = prometheus
    (tmp_path / "llm.yaml").write_text(yaml.safe_dump(SERVICE))
    out = io.StringIO()
    svg = tmp_path / "llm.svg"
    args = ["timeline", "llm", "-f", str(tmp_path / "llm.yaml"), "--prometheus", url, "-o", str(svg)]
    assert cli.main(args, out=out) == 0
    assert out.getvalue() == f"wrote {svg} (4 decisions)\n"
    assert asked == list(fetch.build_queries("ns1", "llm").values())
    assert 'namespace="ns1", inferenceservice="llm"' in asked[0]  # the service's label, not a pod pattern
    keys = [g.get("data-key") for g in _tree(svg.read_text()).iter(f"{SVG}g") if g.get("class") == "lane"]
    assert "kv_usage" in keys


def test_cli_without_prometheus_still_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "llm.yaml").write_text(yaml.safe_dump(SERVICE))
    args = [
        "timeline",
        "llm",
        "-f",
        str(tmp_path / "llm.yaml"),
        "--prometheus",
        "http://127.0.0.1:9",
        "-o",
        str(tmp_path / "x.svg"),
    ]
    assert cli.main(args, out=io.StringIO()) == 0
    assert "no Prometheus ranges" in capsys.readouterr().err
    err = io.StringIO()
    assert cli.main(["timeline", "llm", "-f", str(tmp_path / "none.yaml")], out=io.StringIO(), err=err) == 2
    assert "cannot read" in err.getvalue()
