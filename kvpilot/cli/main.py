"""The ``kvpilot`` command's argv: one parser, each subcommand's ``run``, and errors as one line on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from kvpilot.cli.cases import run_estimate
from kvpilot.cli.catalogues import run_gpus, run_models
from kvpilot.cli.diagnose import run_diagnose
from kvpilot.cli.inputs import EXIT_OK, EXIT_USAGE, CliError, positive_int
from kvpilot.cli.plan import nodes_arg, run_plan
from kvpilot.cli.render import run_render
from kvpilot.cli.timeline import run_timeline
from kvpilot.tuner import errors, sglang, tgi, vllm


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvpilot", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser(
        "plan",
        help="plan engine arguments (vLLM; SGLang or TGI with --engine) for a model on a GPU type",
    )
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="ID", help="a catalogue model (see `kvpilot models`)")
    source.add_argument(
        "--config",
        metavar="PATH",
        help="a Hugging Face config.json, or its folder (its preprocessor configs size the vision profile)",
    )
    plan.add_argument("--gpu", required=True, metavar="NAME", help="a catalogue GPU (see `kvpilot gpus`)")
    plan.add_argument("--gpus", type=positive_int, metavar="N", help="GPUs per replica (1)")
    plan.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=8,
        metavar="N",
        help="GPUs in one node (%(default)s): more --gpus than this span nodes",
    )
    plan.add_argument(
        "--nodes",
        type=nodes_arg,
        metavar="N|auto",
        help="nodes per replica, of --gpus-per-node GPUs each; auto: the fewest that fit",
    )
    plan.add_argument("--max-context", type=positive_int, metavar="N", help="longest max_model_len wanted")
    plan.add_argument("--min-context", type=positive_int, metavar="N", help="shortest max_model_len allowed")
    plan.add_argument("--concurrency", type=positive_int, metavar="N", help="expected concurrent sequences")
    plan.add_argument("--allow-fp8-kv", action="store_true", help="let the planner choose an fp8 KV cache")
    plan.add_argument("--checkpoint-bytes", type=positive_int, metavar="N", help="checkpoint size, if known")
    pinned = vllm.PINNED_VLLM_VERSION
    plan.add_argument("--vllm-version", default=pinned, metavar="V", help="vLLM release (%(default)s)")
    plan.add_argument(
        "--pin-kv-cache-memory",
        action="store_true",
        help="render --kv-cache-memory-bytes (the planned KV pool) instead of --gpu-memory-utilization",
    )
    plan.add_argument(
        "--engine-args",
        metavar="ARGS",
        help="the pods' untuned vllm serve flags that change memory, quoted: '--enforce-eager', "
        "'--performance-mode interactivity', '--no-enable-prefix-caching'",
    )
    plan.add_argument(
        "--draft-config",
        metavar="PATH",
        help="the draft checkpoint's config.json, or its folder, for --engine-args "
        '\'--speculative-config {"method": "eagle3", ...}\' (an EAGLE3 drafter) or '
        '\'{"model": "Qwen/Qwen3-0.6B", ...}\' (a draft model): budgets its weights and KV layers',
    )
    plan.add_argument(
        "--engine",
        choices=("vllm", "sglang", "tgi"),
        default="vllm",
        help="the engine to plan: vllm (%(default)s), sglang (its own memory model, release "
        f"{sglang.PINNED_SGLANG_VERSION}) or tgi (legacy, release {tgi.PINNED_TGI_VERSION}: --gpus is "
        "--num-shard, --max-context caps --max-total-tokens, --concurrency is --max-concurrent-requests)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(run=run_plan)

    for name, run, what in (
        ("gpus", run_gpus, "the GPU catalogue"),
        ("models", run_models, "the model catalogue"),
    ):
        sub = commands.add_parser(name, help=f"list {what}")
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")
        sub.set_defaults(run=run)

    est = commands.add_parser("estimate", help="estimate vLLM's start-up memory for a JSON list of cases")
    est.add_argument("--cases", required=True, metavar="FILE", help="cases as in vllm_memory_cases.json")
    est.set_defaults(run=run_estimate)

    ren = commands.add_parser("render", help="print the Deployment and Service the operator would apply")
    ren.add_argument("-f", "--file", required=True, metavar="FILE", help="InferenceService manifest (YAML)")
    ren.add_argument("--gpu", metavar="NAME", help="GPU to assume when the spec leaves it to node labels")
    ren.set_defaults(run=run_render)

    diag = commands.add_parser("diagnose", help="say what a vLLM log shows happened, and what to change")
    diag.add_argument("log", nargs="?", default="-", help="a vLLM log file; - or nothing: stdin")
    diag.add_argument("--pod", metavar="NAME", help="read this pod's previous vllm container log instead")
    diag.add_argument("-n", "--namespace", default="default", help="the pod's namespace (default)")
    diag.add_argument("--gpu", metavar="NAME", help="a catalogue GPU: add kvpilot's plan for the log's model")
    diag.set_defaults(run=run_diagnose)

    line = commands.add_parser("timeline", help="draw one InferenceService's settings and decisions (SVG)")
    line.add_argument("name", help="the InferenceService")
    line.add_argument("-n", "--namespace", default="default", help="its namespace (default)")
    line.add_argument("-f", "--file", metavar="FILE", help="read it from kubectl get -o yaml output instead")
    line.add_argument("--prometheus", metavar="URL", help="add KV usage and preemptions from this Prometheus")
    line.add_argument("-o", "--output", metavar="FILE", help="the SVG to write (NAME-timeline.svg)")
    line.set_defaults(run=run_timeline)
    return parser


def _fail(message: str, err: TextIO) -> int:
    err.write(f"kvpilot: error: {message}\n")
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the command in ``argv`` (``sys.argv[1:]`` by default) and return the exit status.

    Usage errors exit through argparse (status 2); every other failure is a message on
    ``err`` and status 2.
    """
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args, out))
    except (errors.TunerError, CliError) as exc:
        return _fail(str(exc), err)
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # last resort: a message, not a traceback
        return _fail(f"unexpected {type(exc).__name__}: {exc} (please report this)", err)
