"""Run the fleet simulator as a process until SIGTERM/Ctrl-C.

    python -m e2e.fleet --kubeconfig KUBECONFIG --targets TARGETS.json [--scenarios SCENARIOS.json]

``SCENARIOS.json``: ``{"default": {...}, "<namespace>/<instance>": {...}}`` where each value is
``Scenario.to_dict()`` (``truth``, ``workload``, ``naming``, ``seed``, ``name``); it is re-read
when it changes.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from e2e.fleet.fleet import Fleet
from e2e.fleet.truth import Scenario


def _load(path: Path) -> dict[str, Scenario]:
    raw = json.loads(path.read_text())
    return {k: Scenario.from_dict(v) for k, v in raw.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.fleet", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--targets", required=True, help="Prometheus file_sd JSON to write")
    ap.add_argument("--scenarios", help="JSON file of scenarios (re-read when it changes)")
    ap.add_argument("--namespace", action="append", help="only these namespaces (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if a.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    scen_path = Path(a.scenarios) if a.scenarios else None
    scenarios = _load(scen_path) if scen_path and scen_path.exists() else {}
    fleet = Fleet(a.kubeconfig, a.targets, default_scenario=scenarios.get("default"), namespaces=a.namespace)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    mtime = 0.0
    with fleet:
        print(f"fleet running; targets in {a.targets}", flush=True)
        while not done.wait(1.0):
            if scen_path and scen_path.exists() and scen_path.stat().st_mtime != mtime:
                mtime = scen_path.stat().st_mtime
                for key, sc in _load(scen_path).items():
                    if key == "default":
                        fleet.default_scenario = sc
                    else:
                        ns, _, inst = key.partition("/")
                        fleet.set_scenario(ns, inst or "*", sc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
