"""Run every modelled vLLM release's own CUDA-graph size function over a grid, into a data file.

"A fact keyed on a release is established from that release's own code": for each wheel of
:data:`vllm_release_facts.RELEASES` this script takes ``config/vllm.py::VllmConfig._set_cudagraph_sizes``
as that release wrote it and runs it on a stand-in config (no GPU, no torch): the model not eager,
``cudagraph_mode`` not ``NONE``, no explicit sizes, no speculative decoding (decode query length 1),
no sequence-parallel pass (0.19-0.2x re-cut the sizes for it at TP > 1 with ``enable_sp``),
and a platform stub that answers ``is_device_capability_family(100)`` for a data-centre Blackwell or
not. It writes ``tests/data/vllm_capture_sizes.json``: per distinct function source (sha256), the
releases that share it and the sizes it returns for each grid point;
``tests/tuner/test_vllm_capture_sizes.py`` checks :func:`kvpilot.tuner.vllm.cuda_graph_capture_sizes`
against every point (no network).

The speculative axis (``speculative``): the same grid at ``num_speculative_tokens`` in
:data:`SPECULATIVE_TOKENS` (decode query length ``1 + k``), through three functions of the release,
each taken from its own wheel: ``_set_cudagraph_sizes`` (the raw sizes: what Model Runner V2 captures
PIECEWISE from 0.25, the V2 runner no longer re-cutting them), then
``config/compilation.py::CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`` (the sizes rounded up
to multiples of ``1 + k`` under the cap: what the V1 runner captures with FULL decode graphs; its
``tensor_parallel_size`` argument, 0.19-0.31, is 1 here), then the FULL-decode filter of
``v1/cudagraph_dispatcher.py::CudagraphDispatcher.initialize_cudagraph_keys`` (its ``max_num_tokens``
assignment and ``cudagraph_capture_sizes_for_decode`` comprehension, run on the adjusted sizes). Per
distinct triple of sources: the releases and, per point, ``sizes``, ``adjusted`` (``null`` where the
release raises: no multiple of ``1 + k`` fits under the cap) and ``full_decode``.

Usage: ``python bench/vllm_capture_sizes.py [--wheels /tmp/wheels] [--src /tmp]`` (wheels are fetched
as ``bench/vllm_release_facts.py`` fetches them).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_release_facts import RELEASES, ROOT, _minor, fetch  # noqa: E402

OUT = ROOT / "tests" / "data" / "vllm_capture_sizes.json"

MAX_NUM_SEQS = (1, 3, 100, 128, 256, 300, 1024)
MAX_NUM_BATCHED_TOKENS = (2, 100, 200, 300, 2048, 8192)
BLACKWELL = (False, True)
PERFORMANCE_MODES = (None, "interactivity")
SPECULATIVE_TOKENS = (1, 3, 4)
"""``num_speculative_tokens`` of the speculative axis (0 is the plain grid of ``functions``)."""


def _function(path: Path, name: str) -> str:
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return textwrap.dedent(ast.get_source_segment(text, node) or "")
    raise SystemExit(f"{path}: no {name}")


def _source(pkg: Path) -> str:
    return _function(pkg / "config" / "vllm.py", "_set_cudagraph_sizes")


def _adjust_source(pkg: Path) -> str:
    return _function(pkg / "config" / "compilation.py", "adjust_cudagraph_sizes_for_spec_decode")


def _decode_rule_source(pkg: Path) -> str:
    """The FULL-decode size rule of ``initialize_cudagraph_keys``: its ``max_num_tokens = ...``
    assignment and the ``cudagraph_capture_sizes_for_decode = [...]`` comprehension, as written."""
    path = pkg / "v1" / "cudagraph_dispatcher.py"
    source = _function(path, "initialize_cudagraph_keys")
    function = ast.parse(source)
    wanted = {"max_num_tokens", "cudagraph_capture_sizes_for_decode"}
    found: dict[str, str] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in wanted:
                found.setdefault(target.id, ast.get_source_segment(source, node) or "")
    if set(found) != wanted:
        raise SystemExit(f"{path}: initialize_cudagraph_keys without {wanted - set(found)}")
    return "\n".join(
        textwrap.dedent(found[name]) for name in ("max_num_tokens", "cudagraph_capture_sizes_for_decode")
    )


class _Mode:
    NONE = "NONE"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


class _Platform:
    def __init__(self, blackwell: bool) -> None:
        self.blackwell = blackwell

    def is_device_capability_family(self, family: int) -> bool:
        return family == 100 and self.blackwell


def _compile(source: str) -> Any:
    namespace: dict[str, Any] = {
        "CUDAGraphMode": _Mode,
        "logger": types.SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None),
    }
    exec(compile(source, "_set_cudagraph_sizes", "exec"), namespace)  # noqa: S102 - a release's own code
    return namespace["_set_cudagraph_sizes"]


def _round_up(x: int, y: int) -> int:
    return ((x + y - 1) // y) * y


def _compile_adjust(source: str) -> Any:
    namespace: dict[str, Any] = {"round_up": _round_up}
    exec(compile(source, "adjust_cudagraph_sizes_for_spec_decode", "exec"), namespace)  # noqa: S102
    function = namespace["adjust_cudagraph_sizes_for_spec_decode"]
    takes_tp = function.__code__.co_argcount == 3

    def adjust(compilation: Any, query_len: int) -> None:
        if takes_tp:
            function(compilation, query_len, 1)
        else:
            function(compilation, query_len)

    return adjust


def _decode_sizes(rule: str, seqs: int, sizes: list[int], query_len: int) -> list[int]:
    namespace: dict[str, Any] = {
        "self": types.SimpleNamespace(
            vllm_config=types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=seqs)),
            compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=list(sizes)),
            uniform_decode_query_len=query_len,
        ),
        "uniform_decode_query_len": query_len,
    }
    exec(compile(rule, "initialize_cudagraph_keys", "exec"), namespace)  # noqa: S102
    return list(namespace["cudagraph_capture_sizes_for_decode"])


def _config(seqs: int, tokens: int, mode: str | None, speculative_tokens: int = 0) -> Any:
    compilation = types.SimpleNamespace(
        cudagraph_mode=_Mode.FULL_AND_PIECEWISE,
        max_cudagraph_capture_size=None,
        cudagraph_capture_sizes=None,
        post_init_cudagraph_sizes=lambda: None,
        pass_config=types.SimpleNamespace(enable_sp=False),
    )
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=False),
        compilation_config=compilation,
        scheduler_config=types.SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=tokens),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
        speculative_config=None
        if speculative_tokens == 0
        else types.SimpleNamespace(
            num_speculative_tokens=speculative_tokens,
            num_speculative_tokens_per_batch_size=None,
            uses_dynamic_speculative_decoding=lambda: False,
        ),
        uniform_decode_query_len=1 + speculative_tokens,
        num_speculative_tokens=speculative_tokens,
        performance_mode=mode,
    )


def run(source: str) -> list[dict[str, Any]]:
    """The sizes one release's function captures at every grid point."""
    function = _compile(source)
    points = []
    for seqs, tokens, blackwell, mode in itertools.product(
        MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, BLACKWELL, PERFORMANCE_MODES
    ):
        sys.modules["vllm.platforms"] = types.SimpleNamespace(current_platform=_Platform(blackwell))  # type: ignore[assignment]
        config = _config(seqs, tokens, mode)
        function(config)
        sizes = config.compilation_config.cudagraph_capture_sizes
        points.append(
            {
                "max_num_seqs": seqs,
                "max_num_batched_tokens": tokens,
                "blackwell": blackwell,
                "performance_mode": mode,
                "sizes": sizes,
            }
        )
    return points


def run_speculative(source: str, adjust_source: str, rule: str) -> list[dict[str, Any]]:
    """Per grid point and ``num_speculative_tokens``: the release's sizes, the V1 runner's adjusted sizes
    and its FULL-decode sizes."""
    function = _compile(source)
    adjust = _compile_adjust(adjust_source)
    points = []
    for seqs, tokens, blackwell, mode, k in itertools.product(
        MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, BLACKWELL, PERFORMANCE_MODES, SPECULATIVE_TOKENS
    ):
        sys.modules["vllm.platforms"] = types.SimpleNamespace(current_platform=_Platform(blackwell))  # type: ignore[assignment]
        config = _config(seqs, tokens, mode, k)
        function(config)
        compilation = config.compilation_config
        sizes = list(compilation.cudagraph_capture_sizes)
        adjusted: list[int] | None
        try:
            adjust(compilation, 1 + k)
            adjusted = list(compilation.cudagraph_capture_sizes)
        except ValueError:
            adjusted = None
        points.append(
            {
                "max_num_seqs": seqs,
                "max_num_batched_tokens": tokens,
                "blackwell": blackwell,
                "performance_mode": mode,
                "num_speculative_tokens": k,
                "sizes": sizes,
                "adjusted": adjusted,
                "full_decode": None if adjusted is None else _decode_sizes(rule, seqs, adjusted, 1 + k),
            }
        )
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/wheels"))
    parser.add_argument("--src", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    functions: dict[str, dict[str, Any]] = {}
    speculative: dict[str, dict[str, Any]] = {}
    for version in RELEASES:
        pkg = fetch(version, args.wheels, args.src)
        source = _source(pkg)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        entry = functions.setdefault(digest, {"releases": [], "points": None})
        entry["releases"].append(_minor(version))
        if entry["points"] is None:
            entry["points"] = run(source)
        adjust_source, rule = _adjust_source(pkg), _decode_rule_source(pkg)
        triple = hashlib.sha256("\0".join((source, adjust_source, rule)).encode()).hexdigest()[:16]
        spec = speculative.setdefault(
            triple,
            {
                "releases": [],
                "set_cudagraph_sizes": digest,
                "adjust": hashlib.sha256(adjust_source.encode()).hexdigest()[:16],
                "decode_rule": rule,
                "points": None,
            },
        )
        spec["releases"].append(_minor(version))
        if spec["points"] is None:
            spec["points"] = run_speculative(source, adjust_source, rule)
    out = {
        "generator": "bench/vllm_capture_sizes.py",
        "function": "vllm/config/vllm.py::VllmConfig._set_cudagraph_sizes",
        "wheels": list(RELEASES),
        "functions": functions,
        "speculative_functions": [
            "vllm/config/vllm.py::VllmConfig._set_cudagraph_sizes",
            "vllm/config/compilation.py::CompilationConfig.adjust_cudagraph_sizes_for_spec_decode",
            "vllm/v1/cudagraph_dispatcher.py::CudagraphDispatcher.initialize_cudagraph_keys",
        ],
        "speculative": speculative,
    }
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    for digest, entry in functions.items():
        print(digest, " ".join(entry["releases"]))
    for digest, entry in speculative.items():
        print("speculative", digest, entry["adjust"], " ".join(entry["releases"]))
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
