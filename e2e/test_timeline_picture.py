"""The timeline picture as people see it: ``kvpilot timeline``'s SVG rendered by headless Chromium (Debian's
``chromium``, installed by ``make e2e-apt``), and its screenshot checked for every decision marker.

Each decision is a dashed vertical line in its action's colour at the x the SVG gives it; the test
looks for that colour in the screenshot's pixel columns around that x, inside the plot, and for no
marker of a colour where no decision was taken. A missing chromium fails the test, never skips it.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from kvpilot.observability import timeline

pytestmark = pytest.mark.e2e

SVG_NS = "{http://www.w3.org/2000/svg}"
TOP = 30  # the plot's offset in the SVG (the title above it)
SERVICE = {
    "metadata": {"name": "llm", "namespace": "ns1"},
    "status": {
        "applied": {"maxNumSeqs": 64, "gpuMemoryUtilization": 0.93},
        "history": [
            {
                "time": "2026-12-05T10:00:00Z",
                "action": "Planned",
                "trigger": "Created",
                "reason": "plan",
                "to": {"maxNumSeqs": 64, "gpuMemoryUtilization": 0.95},
            },
            {
                "time": "2026-12-05T10:30:00Z",
                "action": "Retuned",
                "trigger": "CudaOOM",
                "reason": "oom",
                "from": {"gpuMemoryUtilization": 0.95},
                "to": {"gpuMemoryUtilization": 0.93},
            },
            {"time": "2026-12-05T11:00:00Z", "action": "Held", "trigger": "Cooldown", "reason": "cooldown"},
            {
                "time": "2026-12-05T11:40:00Z",
                "action": "RolledBack",
                "trigger": "RolloutFailed",
                "reason": "crashed",
                "from": {"maxNumSeqs": 48},
                "to": {"maxNumSeqs": 64},
            },
        ],
    },
}


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("chromium is missing: `make e2e-apt` installs Debian's chromium")
    return found


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def _has_colour(img: Image.Image, x: float, y0: int, y1: int, colour: tuple[int, int, int]) -> bool:
    rgb = img.convert("RGB")
    for px in range(int(x) - 2, int(x) + 3):
        for py in range(y0, y1):
            pixel = rgb.getpixel((px, py))
            assert isinstance(pixel, tuple)
            if all(abs(a - b) <= 40 for a, b in zip(pixel[:3], colour, strict=True)):
                return True
    return False


def test_chromium_screenshot_shows_every_decision(tmp_path: Path) -> None:
    svg = timeline.build_timeline_svg(SERVICE)
    (tmp_path / "timeline.svg").write_text(svg)
    root = ET.fromstring(svg)
    width, height = int(root.get("width", "0")), int(root.get("height", "0"))
    shot = tmp_path / "timeline.png"
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            f"--window-size={width},{height}",
            (tmp_path / "timeline.svg").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shot.exists(), done.stderr[-2000:]
    img = Image.open(shot)
    assert img.size == (width, height)
    marks = [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "decision"]
    assert [g.get("data-action") for g in marks] == ["Planned", "Retuned", "Held", "RolledBack"]
    plot_h = int(float(marks[0].find(f"{SVG_NS}line").get("y2", "0")))  # type: ignore[union-attr]
    for g in marks:
        x = float(g.find(f"{SVG_NS}line").get("x1", "0"))  # type: ignore[union-attr]
        colour = _rgb(timeline.ACTION_COLOURS[g.get("data-action", "")])
        assert _has_colour(img, x, TOP, TOP + plot_h, colour), f"no {g.get('data-action')} marker at x={x}"
    # between the decisions (10:45, where nothing happened) no marker colour is drawn
    quiet = (
        float(marks[1].find(f"{SVG_NS}line").get("x1", "0"))
        + float(  # type: ignore[union-attr]
            marks[2].find(f"{SVG_NS}line").get("x1", "0")
        )
    ) / 2  # type: ignore[union-attr]
    colours = [_rgb(c) for c in timeline.ACTION_COLOURS.values()]
    assert not any(_has_colour(img, quiet, TOP, TOP + plot_h, c) for c in colours)
