"""Read every modelled vLLM release's own code for the switches kvpilot's memory model keys on.

"A fact keyed on a release is established from that release's own code": this script downloads
each release's wheel from PyPI (no dependencies), unzips its ``.py`` files and reads them (AST and
text search), then writes

* ``tests/data/vllm_release_facts.json``: per release, the model runner default, Mamba align mode,
  the null block in the KV fit check and where its ValueError is raised, the CUDA-graph subtraction,
  the sampler warm-up, the batch default tiers and how the KV token count is logged (also for the
  patches in ``PATCHES``), each with the file and function it was read from;
  ``tests/tuner/test_vllm_release_facts.py`` checks :mod:`kvpilot.tuner.vllm` against it (no network);
* ``kvpilot/tuner/vllm/registry_data.py``: the architectures each release's model registry serves
  (``model_executor/models/registry.py::_VLLM_MODELS``), which the tuner refuses others by.

Usage: ``python bench/vllm_release_facts.py [--wheels /tmp/wheels] [--src /tmp]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

RELEASES = (
    "0.19.1",
    "0.20.2",
    "0.21.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.1",
    "0.26.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
)
"""The newest patch of every minor release from 0.19 to 0.33 on PyPI."""

PATCHES = ("0.20.0", "0.20.1")
"""Earlier patches read for the facts that changed inside a minor release: the KV token report moved to
concurrency x length in 0.20.1 (0.20.0 still logs blocks per group)."""

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "tests" / "data" / "vllm_release_facts.json"
REGISTRY = ROOT / "kvpilot" / "tuner" / "vllm" / "registry_data.py"


def fetch(version: str, wheels: Path, src: Path) -> Path:
    """The unzipped ``vllm/`` package of one release (downloaded once)."""
    root = src / f"vllm-{version}"
    if not (root / "vllm" / "envs.py").exists():
        found = list(wheels.glob(f"vllm-{version}-*.whl"))
        if not found:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    f"vllm=={version}",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "-d",
                    str(wheels),
                    "-q",
                ],
                check=True,
            )
            found = list(wheels.glob(f"vllm-{version}-*.whl"))
        subprocess.run(["unzip", "-o", "-q", str(found[0]), "vllm/*.py", "-d", str(root)], check=True)
    return root / "vllm"


def _functions(path: Path) -> dict[str, tuple[str, str]]:
    """Every function in a file: name -> (qualified name, source) of its first definition."""
    out: dict[str, tuple[str, str]] = {}
    for qual, source in _all_functions(path):
        out.setdefault(qual.rsplit(".", 1)[-1], (qual, source))
    return out


def _all_functions(path: Path) -> list[tuple[str, str]]:
    """Every function in a file (methods included): (qualified name, source)."""
    text = path.read_text()
    tree = ast.parse(text)
    out: list[tuple[str, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, ast.get_source_segment(text, child) or ""))

    walk(tree, "")
    return out


def _where(pkg: Path, path: Path, qualname: str) -> str:
    return f"{path.relative_to(pkg.parent).as_posix()}::{qualname}"


def _containing(pkg: Path, path: Path, needle: str) -> str | None:
    """``file::function`` of the first function whose source holds ``needle``, else None."""
    if not path.exists():
        return None
    for qual, source in _all_functions(path):
        if needle in source:
            return _where(pkg, path, qual)
    return None


def _env_default(pkg: Path, name: str) -> str | None:
    """The default string of an ``envs.py`` variable (``os.getenv(NAME, default)``)."""
    tree = ast.parse((pkg / "envs.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getenv":
            args = node.args
            if len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == name:
                value = args[1]
                return value.value if isinstance(value, ast.Constant) else ast.unparse(value)
    return None


def _frozenset_constant(path: Path, name: str) -> list[str]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            found = (n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant))
            return sorted(v for v in found if isinstance(v, str))
    return []


def model_runner(pkg: Path) -> dict[str, Any]:
    """Which runner a CUDA generate model gets without ``VLLM_USE_V2_MODEL_RUNNER``."""
    config = pkg / "config" / "vllm.py"
    env = _env_default(pkg, "VLLM_USE_V2_MODEL_RUNNER")
    funcs = _functions(config)
    where = _where(pkg, config, funcs["use_v2_model_runner"][0]) if "use_v2_model_runner" in funcs else None
    if env == "0":
        return {
            "env": "VLLM_USE_V2_MODEL_RUNNER",
            "env_default": "0",
            "rule": "v1",
            "architectures": [],
            "where": _where(pkg, pkg / "envs.py", "environment_variables"),
        }
    chooser = funcs.get("_is_default_v2_model_runner_model")
    if chooser is None:
        return {
            "env": "VLLM_USE_V2_MODEL_RUNNER",
            "env_default": env,
            "rule": "v2",
            "architectures": [],
            "where": where,
        }
    source = chooser[1]
    if "not model_config.is_moe and not model_config.is_quantized" in source:
        rule = "listed_dense_unquantized"
    elif "or not model_config.is_moe" in source:
        rule = "listed_or_dense"
    else:
        rule = "listed"
    if '"is_hybrid"' in source:
        hybrid = "unless_listed" if "not is_default_v2_architecture" in source else "never"
    else:
        hybrid = "allowed"
    return {
        "env": "VLLM_USE_V2_MODEL_RUNNER",
        "env_default": env,
        "rule": rule,
        "hybrid": hybrid,
        "attention_free": '"is_attention_free"' not in source,
        "architectures": _frozenset_constant(config, "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"),
        "where": _where(pkg, config, chooser[0]),
    }


def mamba_align(pkg: Path) -> dict[str, Any]:
    path = pkg / "model_executor" / "models" / "config.py"
    where = _containing(pkg, path, 'mamba_cache_mode = "align"')
    return {"align_with_prefix_caching": where is not None, "where": where}


def null_block(pkg: Path) -> dict[str, Any]:
    for name in ("kv_cache_planning.py", "kv_cache_utils.py"):
        path = pkg / "v1" / "core" / name
        if path.exists() and "check_enough_kv_cache_memory" in _functions(path):
            qual, source = _functions(path)["check_enough_kv_cache_memory"]
            return {"reserved_in_fit_check": "null block" in source.lower(), "where": _where(pkg, path, qual)}
    raise SystemExit(f"{pkg}: no check_enough_kv_cache_memory")


FIT_ERROR_TEXT = "To serve at least one request"


def fit_error(pkg: Path) -> dict[str, Any]:
    """Where the max-model-len ValueError is raised: a start-up traceback's last frame before the ValueError
    (``file::function`` and the line of its ``raise``, as Python prints it)."""
    for name in ("kv_cache_planning.py", "kv_cache_utils.py"):
        path = pkg / "v1" / "core" / name
        if not path.exists() or FIT_ERROR_TEXT not in path.read_text():
            continue
        text = path.read_text()
        tree = ast.parse(text)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            raises = [n for n in ast.walk(fn) if isinstance(n, ast.Raise)]
            hits = [n for n in raises if FIT_ERROR_TEXT in (ast.get_source_segment(text, n) or "")]
            if hits:
                where = _where(pkg, path, fn.name)
                return {"raised_in": where, "raise_line": hits[0].lineno}
    raise SystemExit(f"{pkg}: no {FIT_ERROR_TEXT!r}")


def cuda_graphs(pkg: Path) -> dict[str, Any]:
    worker = pkg / "v1" / "worker" / "gpu_worker.py"
    where = _containing(pkg, worker, "profile_cudagraph_memory()")
    env = _env_default(pkg, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
    estimators = sorted(
        _where(pkg, p, _functions(p)["profile_cudagraph_memory"][0])
        for p in (pkg / "v1" / "worker").rglob("*.py")
        if "def profile_cudagraph_memory" in p.read_text()
    )
    v2 = pkg / "v1" / "worker" / "gpu" / "model_runner.py"
    v2_source = _functions(v2).get("profile_cudagraph_memory", ("", ""))[1] if v2.exists() else ""
    return {
        "subtracted": where is not None and env == "1",
        "v2_estimates": bool(v2_source) and not re.search(r"^\s*return 0\s*$", v2_source, re.M),
        "env": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
        "env_default": env,
        "where": where,
        "estimators": estimators,
    }


def _line(path: Path, needle: str) -> int | None:
    """The 1-based number of the first line of ``path`` holding ``needle``, else None."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return number
    return None


def _at(pkg: Path, path: Path, line: int | None) -> str | None:
    return None if line is None else f"{path.relative_to(pkg.parent).as_posix()}:{line}"


def profiler(pkg: Path) -> dict[str, Any]:
    """What the start-up profile charges and how it logs it (``Worker.init_device``,
    ``Worker.determine_available_memory``).

    * ``activation_includes_graph_estimate``: the logged "peak activation" is the transient headroom plus the
      applied CUDA-graph estimate (``peak_activation_memory = transient_peak_headroom +
      cudagraph_memory_estimate_applied``), not the torch peak alone;
    * ``snapshot_after_distributed_init``: the init snapshot (the free memory every later term is measured
      from) is taken after ``init_worker_distributed_environment``, so the communicators built there
      (pynccl, custom all-reduce, symmetric memory) are outside the budget;
    * ``graph_estimate_per_mode``: the estimate of each CUDA-graph mode is its first capture plus its second
      capture times the remaining graphs (``per_graph * (len(descs) - 1)``).
    """
    worker = pkg / "v1" / "worker" / "gpu_worker.py"
    runner = pkg / "v1" / "worker" / "gpu_model_runner.py"
    combined = _line(worker, "transient_peak_headroom + cudagraph_memory_estimate_applied")
    activation = combined or _line(worker, "self.peak_activation_memory = ")
    dist = _line(worker, "    init_worker_distributed_environment(")  # the call in init_device, not the def
    snapshot = _line(worker, "self.init_snapshot = ")
    estimate = _line(runner, "per_graph * (len(descs) - 1)")
    return {
        "activation_includes_graph_estimate": combined is not None,
        "activation_logged_at": _at(pkg, worker, activation),
        "snapshot_after_distributed_init": dist is not None and snapshot is not None and dist < snapshot,
        "distributed_init_at": _at(pkg, worker, dist),
        "snapshot_at": _at(pkg, worker, snapshot),
        "graph_estimate_per_mode": estimate is not None,
        "graph_estimate_at": _at(pkg, runner, estimate),
    }


def collectives(pkg: Path) -> dict[str, Any]:
    """The all-reduce machinery that needs NVLink-class hardware.

    * custom all-reduce refuses more than two PCIe-only GPUs
      (``distributed/device_communicators/custom_all_reduce.py``);
    * the FlashInfer all-reduce fusion (whose IPC workspace is built while compiling, after the snapshot)
      is enabled only on the compute capabilities ``config/vllm.py::enable_allreduce_rms_fusion`` names.
    """
    custom = pkg / "distributed" / "device_communicators" / "custom_all_reduce.py"
    config = pkg / "config" / "vllm.py"
    _, source = _functions(config).get("enable_allreduce_rms_fusion", ("", ""))
    exact = sorted(int(c) for c in re.findall(r"is_device_capability\((\d+)\)", source))
    family = sorted(int(c) for c in re.findall(r"is_device_capability_family\((\d+)\)", source))
    return {
        "custom_allreduce_pcie_limit_at": _at(pkg, custom, _line(custom, "more than two PCIe-only GPUs")),
        "allreduce_fusion_capabilities": exact,
        "allreduce_fusion_capability_families": family,
        "allreduce_fusion_at": _at(pkg, config, _line(config, "def enable_allreduce_rms_fusion")),
    }


def sampler_warmup(pkg: Path) -> dict[str, Any]:
    params = pkg / "sampling_params.py"
    defined = "def for_sampler_warmup" in params.read_text()
    users = sorted(
        _where(pkg, p, "_dummy_sampler_run")
        for p in (pkg / "v1" / "worker").rglob("*.py")
        if "for_sampler_warmup()" in p.read_text()
    )
    return {"for_sampler_warmup": defined, "used_by": users}


def kv_tokens_report(pkg: Path) -> dict[str, Any]:
    """How the start-up log's "GPU KV cache size: N tokens" is computed: ``num_blocks // num_groups *
    block_size`` (per group) or ``max_concurrency * max_model_len`` (concurrency)."""
    path = pkg / "v1" / "core" / "kv_cache_utils.py"
    text = path.read_text()
    by_concurrency = "int(max_concurrency * max_model_len)"
    concurrency = by_concurrency in text
    needle = by_concurrency if concurrency else "// len(kv_cache_config.kv_cache_groups)"
    return {
        "report": "concurrency" if concurrency else "per_group",
        "at": _at(pkg, path, _line(path, needle)),
    }


def batch_defaults(pkg: Path) -> dict[str, Any]:
    path = pkg / "engine" / "arg_utils.py"
    funcs = _functions(path)
    qual, source = funcs.get("get_batch_defaults", ("", ""))
    text = path.read_text()
    return {
        "tier_160gib": "160 * GiB" in source,
        "gb10_excluded": "(12, 1)" in source,
        "performance_mode_throughput": 'self.performance_mode == "throughput"' in text,
        "where": _where(pkg, path, qual) if qual else None,
    }


def registry(pkg: Path) -> list[str]:
    """``_VLLM_MODELS``'s keys: what ``ModelRegistry.get_supported_archs()`` returns."""
    tree = ast.parse((pkg / "model_executor" / "models" / "registry.py").read_text())
    dicts: dict[str, ast.Dict] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
            dicts[target.id] = value

    def keys(d: ast.Dict) -> set[str]:
        out: set[str] = set()
        for k, v in zip(d.keys, d.values, strict=True):
            if k is None and isinstance(v, ast.Name):
                out |= keys(dicts[v.id])
            elif isinstance(k, ast.Constant):
                out.add(k.value)
        return out

    return sorted(keys(dicts["_VLLM_MODELS"]))


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def write_registry(served: dict[str, list[str]]) -> None:
    releases = list(served)
    names = sorted(set().union(*map(set, served.values())))
    lines = []
    for name in names:
        present = [r for r in releases if name in served[r]]
        runs: list[list[str]] = []
        for r in present:
            if runs and releases.index(r) == releases.index(runs[-1][1]) + 1:
                runs[-1][1] = r
            else:
                runs.append([r, r])
        spans = ", ".join(f'("{_minor(a)}", "{_minor(b)}")' for a, b in runs)
        lines.append(f'    "{name}": ({spans},),')
    header = (
        '"""The architectures each modelled vLLM release serves.\n\n'
        "GENERATED by ``bench/vllm_release_facts.py`` from each wheel's\n"
        "``vllm/model_executor/models/registry.py::_VLLM_MODELS``; do not edit. Wheels:\n"
        f"{', '.join(releases[:8])},\n{', '.join(releases[8:])}.\n\n"
        "Architecture -> the spans of minor releases (first, last; both included) that serve it.\n"
        '"""\n\nfrom __future__ import annotations\n\n'
        "REGISTRY_RELEASES: tuple[str, ...] = (\n"
        + "".join(f'    "{_minor(r)}",\n' for r in releases)
        + ")\n\n"
        "SERVED: dict[str, tuple[tuple[str, str], ...]] = {\n"
    )
    REGISTRY.write_text(header + "\n".join(lines) + "\n}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/wheels"))
    parser.add_argument("--src", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    facts: dict[str, Any] = {}
    served: dict[str, list[str]] = {}
    for version in RELEASES:
        pkg = fetch(version, args.wheels, args.src)
        facts[_minor(version)] = {
            "wheel": version,
            "model_runner": model_runner(pkg),
            "mamba_align": mamba_align(pkg),
            "null_block": null_block(pkg),
            "fit_error": fit_error(pkg),
            "cuda_graphs": cuda_graphs(pkg),
            "profiler": profiler(pkg),
            "collectives": collectives(pkg),
            "sampler_warmup": sampler_warmup(pkg),
            "batch_defaults": batch_defaults(pkg),
            "kv_tokens_report": kv_tokens_report(pkg),
        }
        served[version] = registry(pkg)
    patches = {
        version: {"kv_tokens_report": kv_tokens_report(fetch(version, args.wheels, args.src))}
        for version in PATCHES
    }
    out = {
        "generator": "bench/vllm_release_facts.py",
        "wheels": list(RELEASES),
        "releases": facts,
        "patches": patches,
    }
    FACTS.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    write_registry(served)
    print(f"wrote {FACTS.relative_to(ROOT)} and {REGISTRY.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
