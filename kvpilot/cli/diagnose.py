"""``kvpilot diagnose [LOG | --pod NAME]``: what a vLLM log says happened and what to change; with ``--gpu``,
kvpilot's plan for the log's model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from kvpilot.cli.inputs import EXIT_OK, CliError
from kvpilot.cli.plan_text import format_plan
from kvpilot.tuner import diagnose, errors, gpus, vllm
from kvpilot.tuner import model as models
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import ServingBounds
from kvpilot.tuner.vllm import serving


def _read_log(args: argparse.Namespace) -> str:
    if args.pod:  # the previous container's log, as the closed loop reads it
        from kvpilot.operator.pods.pod_reading import ClusterPods

        pods, container = ClusterPods(), serving.CONTAINER_NAME
        text = pods.read_previous_log(args.namespace, args.pod, container, 100_000)
        if text is None:
            raise CliError(f"pod {args.namespace}/{args.pod} has no previous {serving.CONTAINER_NAME} log")
        if not isinstance(text, str):  # why it could not be read, and what to do
            raise CliError(f"pod {args.namespace}/{args.pod}: {text.detail}")
        return text
    if args.log == "-":
        return sys.stdin.read()
    try:
        return Path(args.log).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CliError(f"cannot read {args.log}: {exc}") from None


def run_diagnose(args: argparse.Namespace, out: TextIO) -> int:
    reading = diagnose.read_log(_read_log(args))
    out.write(diagnose.format_diagnosis(diagnose.compute_diagnosis(reading)))
    if args.gpu and reading.model:
        try:
            config = models.lookup_model_config(reading.model)
        except errors.UnknownModel:
            out.write(f"\nno plan: {reading.model} is not in the catalogue (see `kvpilot plan --config`)\n")
            return EXIT_OK
        spec = models.build_model_spec(config)
        bounds = ServingBounds(max_context=reading.max_model_len)
        version = reading.version or vllm.PINNED_VLLM_VERSION
        gpu, count = gpus.lookup_gpu(args.gpu), reading.tensor_parallel_size or 1
        plan = compute_plan(spec, gpu, count, bounds, vllm_version=version)
        out.write("\nkvpilot's plan for this model and GPU:\n" + format_plan(plan, reading.model))
    return EXIT_OK


# -- timeline -------------------------------------------------------------------------------------
