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
MAX_NUM_BATCHED_TOKENS = (2, 200, 2048, 8192)
BLACKWELL = (False, True)
PERFORMANCE_MODES = (None, "interactivity")


def _source(pkg: Path) -> str:
    path = pkg / "config" / "vllm.py"
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == "_set_cudagraph_sizes":
            return textwrap.dedent(ast.get_source_segment(text, node) or "")
    raise SystemExit(f"{path}: no _set_cudagraph_sizes")


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


def _config(seqs: int, tokens: int, mode: str | None) -> Any:
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
        speculative_config=None,
        uniform_decode_query_len=1,
        num_speculative_tokens=0,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/wheels"))
    parser.add_argument("--src", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    functions: dict[str, dict[str, Any]] = {}
    for version in RELEASES:
        source = _source(fetch(version, args.wheels, args.src))
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        entry = functions.setdefault(digest, {"releases": [], "points": None})
        entry["releases"].append(_minor(version))
        if entry["points"] is None:
            entry["points"] = run(source)
    out = {
        "generator": "bench/vllm_capture_sizes.py",
        "function": "vllm/config/vllm.py::VllmConfig._set_cudagraph_sizes",
        "wheels": list(RELEASES),
        "functions": functions,
    }
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    for digest, entry in functions.items():
        print(digest, " ".join(entry["releases"]))
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
