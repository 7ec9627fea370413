"""``kvpilot gpus`` and ``kvpilot models``: the built-in catalogues, as a table or ``--json``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TextIO

from kvpilot.cli.inputs import EXIT_OK
from kvpilot.tuner import gpus
from kvpilot.tuner import model as models
from kvpilot.tuner.types import GIB


def run_gpus(args: argparse.Namespace, out: TextIO) -> int:
    catalogue = gpus.list_gpus()
    if args.json:
        json.dump([dataclasses.asdict(g) for g in catalogue], out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"{'name':<16}{'CUDA GiB':>9}{'NVML MiB':>10}  {'cc':<5}{'fp8 KV':<8}{'link':<17}GFD product\n")
    for g in catalogue:
        nvml = f"{g.nvml_total_bytes // (1 << 20):,}" if g.nvml_total_bytes else "-"
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        products = ", ".join(g.gfd_products) or "-"
        out.write(
            f"{g.name:<16}{g.total_bytes / GIB:>9.2f}{nvml:>10}  {cc:<5}{'yes' if g.fp8_kv else 'no':<8}"
            f"{g.interconnect:<17}{products}\n"
        )
    return EXIT_OK


def run_models(args: argparse.Namespace, out: TextIO) -> int:
    listing = models.list_models()
    if args.json:
        json.dump([{"id": i, "description": d} for i, d in listing], out, indent=2)
        out.write("\n")
        return EXIT_OK
    width = max(len(i) for i, _ in listing) + 2
    for model_id, description in listing:
        out.write(f"{model_id:<{width}}{description}\n")
    return EXIT_OK


# -- estimate and render --------------------------------------------------------------------------
