"""A timeline picture of one InferenceService: ``build_timeline_svg()`` returns a self-contained SVG.

From ``status.history`` (and ``status.applied``): the settings as steps over time, one lane each
(``maxNumSeqs``, ``maxModelLen``, ``gpuMemoryUtilization``, ``maxNumBatchedTokens``), and every decision
marked by a numbered line in its action's colour, its reason listed beneath. With Prometheus ranges
(``series``: KV usage 0-1 and preemptions per second, as ``(unix time, value)`` points) two lanes more
below. Pure: data in, text out (``kvpilot timeline`` fetches; :mod:`kvpilot.cli`).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["ACTION_COLOURS", "SETTINGS", "build_timeline_svg", "parse_time"]

SETTINGS = ("maxNumSeqs", "maxModelLen", "gpuMemoryUtilization", "maxNumBatchedTokens")
ACTION_COLOURS = {
    "Planned": "#1f77b4",
    "Retuned": "#2ca02c",
    "RolledBack": "#d62728",
    "Held": "#ff7f0e",
    "Infeasible": "#9467bd",
}
SERIES = (("kv_usage", "KV cache usage", 1.0), ("preemptions", "preemptions /s", None))
WIDTH, LEFT, RIGHT, LANE, GAP = 1000, 190, 30, 54, 14

Points = Sequence[tuple[float, float]]


def parse_time(text: str) -> float:
    """An RFC 3339 time (``2026-12-05T18:00:00Z``) as unix seconds."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _steps(history: Sequence[Mapping[str, Any]], applied: Mapping[str, Any], key: str, end: float) -> Points:
    """``key``'s value over time: each entry's ``to`` from its time on (``from`` before the first)."""
    points: list[tuple[float, float]] = []
    for h in history:
        t = parse_time(h["time"])
        before, after = (h.get("from") or {}).get(key), (h.get("to") or {}).get(key)
        if not points and before is not None:
            points.append((t, float(before)))
        if after is not None:
            points.append((t, float(after)))
    if key in applied:
        points.append((end, float(applied[key])))
    elif points:
        points.append((end, points[-1][1]))
    return points


def build_timeline_svg(
    service: Mapping[str, Any], series: Mapping[str, Points] | None = None, now: float | None = None
) -> str:
    """The SVG of ``service`` (an InferenceService object with ``metadata`` and ``status``)."""
    meta, status = service.get("metadata") or {}, service.get("status") or {}
    history = [h for h in status.get("history") or [] if h.get("time")]
    if not history:
        raise ValueError(f"{meta.get('namespace')}/{meta.get('name')} has no status.history to draw")
    series = {k: v for k, v in (series or {}).items() if v}
    times = [parse_time(h["time"]) for h in history] + [t for pts in series.values() for t, _ in pts]
    start, end = min(times), max([*times, now or 0.0])
    end = end if end > start else start + 60
    lanes: list[tuple[str, str, Points, float | None]] = [
        (k, k, _steps(history, status.get("applied") or {}, k, end), None) for k in SETTINGS
    ]
    lanes = [lane for lane in lanes if lane[2]]
    lanes += [(k, label, series[k], top) for k, label, top in SERIES if k in series]
    plot_h = len(lanes) * (LANE + GAP)
    x = _scale(start, end, LEFT, WIDTH - RIGHT)
    out = [_lane(i, key, label, points, top, x) for i, (key, label, points, top) in enumerate(lanes)]
    out += [_marker(n, h, x, plot_h) for n, h in enumerate(history, 1)]
    out += _axis(start, end, x, plot_h)
    out += _legend(history, plot_h + 40)
    height = plot_h + 60 + 18 * len(history)
    title = f"kvpilot timeline: {meta.get('namespace', '')}/{meta.get('name', '')}"
    return (
        "\n".join(
            [
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height + 30}" '
                f'font-family="sans-serif" font-size="12">',
                f"<title>{escape(title)}</title>",
                f'<rect width="{WIDTH}" height="{height + 30}" fill="white"/>',
                f'<text x="10" y="18" font-size="15" font-weight="bold">{escape(title)}</text>',
                '<g transform="translate(0,30)">',
                *out,
                "</g>",
                "</svg>",
            ]
        )
        + "\n"
    )


def _scale(lo: float, hi: float, a: float, b: float) -> Any:
    return lambda v: a + (b - a) * (v - lo) / (hi - lo) if hi > lo else (a + b) / 2


def _lane(i: int, key: str, label: str, points: Points, top: float | None, x: Any) -> str:
    y0 = i * (LANE + GAP)
    values = [v for _, v in points]
    hi = top if top is not None else max(values)
    lo = 0.0 if top is not None or min(values) == hi else min(values)
    hi = hi if hi > lo else lo + 1
    y = _scale(lo, hi, y0 + LANE, y0 + 4)
    path, last = [], None
    for t, v in points:
        if last is not None and key in SETTINGS:
            path.append(f"L{x(t):.1f},{y(last):.1f}")  # a step: hold the old value until the change
        path.append(f"{'M' if not path else 'L'}{x(t):.1f},{y(v):.1f}")
        last = v
    colour = "#444" if key in SETTINGS else "#8c564b"
    return (
        f'<g class="lane" data-key="{key}"><rect x="{LEFT}" y="{y0}" width="{WIDTH - LEFT - RIGHT}" '
        f'height="{LANE}" fill="#f6f6f6"/><text x="10" y="{y0 + LANE / 2 + 4}">{escape(label)}</text>'
        f'<text x="{LEFT - 6}" y="{y0 + 12}" text-anchor="end" fill="#888">{_fmt(hi)}</text>'
        f'<text x="{LEFT - 6}" y="{y0 + LANE}" text-anchor="end" fill="#888">{_fmt(lo)}</text>'
        f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="2"/></g>'
    )


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.3g}"


def _marker(n: int, h: Mapping[str, Any], x: Any, plot_h: float) -> str:
    px, colour = x(parse_time(h["time"])), ACTION_COLOURS.get(str(h.get("action")), "#333")
    tip = escape(f"{h.get('action')} ({h.get('trigger')}): {h.get('reason', '')}")
    return (
        f'<g class="decision" data-action="{escape(str(h.get("action")))}"><title>{tip}</title>'
        f'<line x1="{px:.1f}" y1="0" x2="{px:.1f}" y2="{plot_h}" stroke="{colour}" stroke-width="2" '
        f'stroke-dasharray="4 3"/><circle cx="{px:.1f}" cy="{plot_h + 2}" r="8" fill="{colour}"/>'
        f'<text x="{px:.1f}" y="{plot_h + 6}" text-anchor="middle" fill="white" font-size="10">{n}</text>'
        "</g>"
    )


def _axis(start: float, end: float, x: Any, plot_h: float) -> list[str]:
    out = []
    for i in range(5):
        t = start + (end - start) * i / 4
        label = datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%m-%d %H:%M")
        anchor = ("start", "middle", "middle", "middle", "end")[i]
        y = plot_h + 26
        out.append(f'<text x="{x(t):.1f}" y="{y}" text-anchor="{anchor}" fill="#666">{label}</text>')
    return out


def _legend(history: Sequence[Mapping[str, Any]], y0: float) -> list[str]:
    out = []
    for n, h in enumerate(history, 1):
        colour = ACTION_COLOURS.get(str(h.get("action")), "#333")
        text = f"{n}. {h['time']} {h.get('action')} ({h.get('trigger')}): {h.get('reason', '')}"
        text = text if len(text) <= 150 else text[:147] + "..."
        out.append(f'<text x="10" y="{y0 + 18 * n}" fill="{colour}">{escape(text)}</text>')
    return out
