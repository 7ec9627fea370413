"""``kvpilot timeline NAME``: an SVG of one InferenceService's settings and decisions over time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from kvpilot.cli.inputs import EXIT_OK, CliError


def run_timeline(args: argparse.Namespace, out: TextIO) -> int:
    from kvpilot.observability import fetch, timeline

    try:
        if args.file:
            service = fetch.read_service(args.file)
        else:
            service = fetch.fetch_service(args.namespace, args.name)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    meta = service["metadata"]
    history = (service.get("status") or {}).get("history") or []
    ranges = {}
    if args.prometheus and history:
        times = [timeline.parse_time(h["time"]) for h in history]
        try:
            ranges = fetch.fetch_ranges(
                args.prometheus,
                meta.get("namespace") or args.namespace,
                meta["name"],
                min(times) - 600,
                max(times) + 600,
            )
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"kvpilot: warning: no Prometheus ranges ({exc})\n")
    try:
        svg = timeline.build_timeline_svg(service, ranges)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    target = Path(args.output or f"{meta['name']}-timeline.svg")
    target.write_text(svg, encoding="utf-8")
    out.write(f"wrote {target} ({len(history)} decisions)\n")
    return EXIT_OK


# -- argv -----------------------------------------------------------------------------------------
