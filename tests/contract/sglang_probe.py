"""Run inside ``.venv-sglang`` (SGLang 0.5.23 without its GPU dependencies): SGLang's own answers, as JSON.

Reads ``{"parse": [argv, ...], "resolve": [{"argv": [...], "gpu_mib": N}, ...], "pool": [...]}`` on
stdin and prints ``{"version": ..., "parse": [...], "resolve": [...], "pool": [...]}``: ``parse`` is
``ServerArgs.add_cli_args``'s parser reading each argv (an error's text when it refuses one);
``resolve`` builds ``ServerArgs`` from the argv with ``prepare_server_args`` semantics, with
``get_device_memory_capacity`` answering ``gpu_mib`` (what ``nvidia-smi`` would say), runs
``resolve_once`` (which calls ``handle_gpu_memory_settings``) and reports the resolved memory settings
and SGLang's ``ModelConfig`` KV geometry; ``pool`` runs SGLang's own ``DefaultPoolConfigurator``
(cell size and ``calculate_pool_sizes``) for a given pool in bytes; ``max_running`` runs
``KVCacheConfigurator.resolve_max_num_reqs`` (the running-request limit SGLang serves with) for a pool of
``tokens``. Used by ``test_contract_sglang.py``;
not imported by kvpilot.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import types
from typing import Any

import sglang  # type: ignore[import-not-found]  # only in .venv-sglang
import sglang.srt.arg_groups.memory_hook as memory_hook  # type: ignore[import-not-found]
import sglang.srt.mem_cache.kv_cache_configurator as kv_cache_configurator  # type: ignore[import-not-found]
import sglang.srt.model_executor.pool_configurator as pool_configurator  # type: ignore[import-not-found]
import sglang.srt.runtime_context as runtime_context  # type: ignore[import-not-found]
import torch
from sglang.srt.arg_groups.overrides import (  # type: ignore[import-not-found]
    model_config_of,
    resolved_view,
    use_mla_backend,
)
from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

FIELDS = (
    "model_path",
    "context_length",
    "mem_fraction_static",
    "max_running_requests",
    "max_total_tokens",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "schedule_conservativeness",
    "kv_cache_dtype",
    "page_size",
    "tp_size",
    "pp_size",
    "enable_metrics",
    "host",
    "port",
    "nnodes",
    "node_rank",
    "dist_init_addr",
)


def _parser() -> argparse.ArgumentParser:
    # SGLang's own parser also takes unambiguous prefixes (argparse's allow_abbrev); the probe does not, so
    # a flag kvpilot renders proves its exact name, not a prefix of a renamed one.
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False, allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, object]:
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            namespace = parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError) as exc:
        lines = f"{exc}\n{err.getvalue()}".strip().splitlines()
        return {"error": lines[-1] if lines else type(exc).__name__}
    return {name: getattr(namespace, name) for name in FIELDS}


def _resolve(parser: argparse.ArgumentParser, argv: list[str], gpu_mib: float) -> dict[str, object]:
    memory_hook.get_device_memory_capacity = lambda device=None: gpu_mib
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    args.device = "cuda"
    args.resolve_once()
    view = resolved_view(args)
    config = model_config_of(args)
    return {
        "mem_fraction_static": view.mem_fraction_static,
        "chunked_prefill_size": view.chunked_prefill_size,
        "cuda_graph_max_bs": view.cuda_graph_config.decode.max_bs,
        "prefill_graph_backend": str(view.cuda_graph_config.prefill.backend),
        "context_length": config.context_len,
        "kv_heads_per_rank": config.get_num_kv_heads(view.tp_size),
        "head_dim": config.head_dim,
        "v_head_dim": config.v_head_dim,
        "num_layers": config.num_hidden_layers,
        "page_size": view.page_size,
        "use_mla_backend": use_mla_backend(args),
    }


KV_DTYPES = {
    "auto": None,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
"""``--kv-cache-dtype`` -> the torch dtype the pool stores (``auto``: the model's dtype)."""


def _pool(parser: argparse.ArgumentParser, case: dict[str, Any]) -> dict[str, object]:
    """SGLang's own ``DefaultPoolConfigurator``: its cell size and the tokens ``available_bytes`` holds.

    The configurator is built without its ``__init__`` (which wants a model runner): the fields its two
    methods read are set from the resolved ``ServerArgs``, its ``ModelConfig`` and the published parallel
    context, as ``KVCacheConfigurator`` would."""
    memory_hook.get_device_memory_capacity = lambda device=None: case["gpu_mib"]
    args = ServerArgs.from_cli_args(parser.parse_args(case["argv"]))
    args.device = "cuda"
    args.resolve_once()
    runtime_context.publish(args, role="scheduler")
    config = model_config_of(args)
    dtype = KV_DTYPES[case["kv_dtype"]] or config.dtype
    kvc = types.SimpleNamespace(
        model_config=config,
        kv_cache_dtype=dtype,
        kv_cache_dtype_str=case["kv_dtype"],
        server_args=args,
        use_mla_backend=use_mla_backend(args),
        page_size=case["page_size"],
        is_draft_worker=False,
    )
    configurator = object.__new__(pool_configurator.DefaultPoolConfigurator)
    configurator.kv_cache_dtype_str = case["kv_dtype"]
    configurator._cell_size = configurator._compute_cell_size(kvc, config.num_hidden_layers)
    configurator._fixed_overhead_bytes = 0
    configurator._zero_kv_max_tokens = 0
    sizes = configurator.calculate_pool_sizes(case["available_bytes"], case["page_size"])
    return {"cell_size": configurator._cell_size, "max_total_num_tokens": sizes.max_total_num_tokens}


def _max_running(parser: argparse.ArgumentParser, case: dict[str, Any]) -> int:
    """SGLang's own ``KVCacheConfigurator.resolve_max_num_reqs`` for a pool of ``tokens``, built without its
    ``__init__``: the fields it reads (the model's ``context_len``, one attention-DP rank, no Mamba state)
    set as ``KVCacheConfigurator`` would, the resolved ``ServerArgs`` published for ``get_schedule``."""
    memory_hook.get_device_memory_capacity = lambda device=None: case["gpu_mib"]
    args = ServerArgs.from_cli_args(parser.parse_args(case["argv"]))
    args.device = "cuda"
    args.resolve_once()
    runtime_context.publish(args, role="scheduler")
    configurator = types.SimpleNamespace(
        model_config=model_config_of(args), attn_dp_size=1, mambaish_config=None
    )
    return int(kv_cache_configurator.KVCacheConfigurator.resolve_max_num_reqs(configurator, case["tokens"]))


def main() -> None:
    request = json.load(sys.stdin)
    parser = _parser()
    answer = {
        "version": sglang.__version__,
        "parse": [_parse(parser, argv) for argv in request["parse"]],
        "resolve": [_resolve(parser, case["argv"], case["gpu_mib"]) for case in request["resolve"]],
        "pool": [_pool(parser, case) for case in request.get("pool", [])],
        "max_running": [_max_running(parser, case) for case in request.get("max_running", [])],
    }
    json.dump(answer, sys.stdout, default=str)


if __name__ == "__main__":
    main()
