"""Which vLLM flags and environment variables make the pods load code or files the spec chooses.

A spec that may pass ``--trust-remote-code`` runs any Hub repository's Python; ``--worker-extension-cls`` or
a ``*-plugin`` flag imports a module it names; ``LD_PRELOAD`` or ``PYTHONPATH`` loads a library before vLLM
does.
The tenant guards refuse them from a requester who may not create pods (the chart's ValidatingAdmissionPolicy,
``charts/kvpilot/templates/inferenceservice-admissionpolicy.yaml``, and, when it does not run, the operator's
:mod:`kvpilot.operator.pods.tenant_guard`). ``tests/chart/test_chart_tenant_guard.py`` checks that the
policy's lists are these.

vLLM's argument parser takes a unique prefix of a long flag (``--trust-remote`` is ``--trust-remote-code``),
spells ``_`` as ``-``, and reads ``--flag.key=value`` as a key of a JSON flag: :func:`normalise_flag` does the
same, and :func:`compute_code_loading_flags` refuses every prefix of a listed flag but those that are flags of
their own (:data:`EXACT_FLAGS`: an exact flag is never an abbreviation). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

CODE_LOADING_FLAGS = (
    "--trust-remote-code",
    "--worker-cls",
    "--worker-extension-cls",
    "--scheduler-cls",
    "--logits-processors",
    "--io-processor-plugin",
    "--reasoning-parser-plugin",
    "--tool-parser-plugin",
    "--middleware",
    "--model-class-overrides",
    "--kv-transfer-config",
    "--ec-transfer-config",
    "--allowed-local-media-path",
)
"""Flags of vLLM 0.33 that load code or files chosen by the spec (``vllm serve --help``)."""
EXACT_FLAGS = ("--model", "--reasoning-parser")
"""Flags that are themselves a prefix of a :data:`CODE_LOADING_FLAGS` entry: never read as an abbreviation."""
CODE_LOADING_ENV = (
    "VLLM_PLUGINS",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "CUDA_INJECTION64_PATH",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "GCONV_PATH",
    "BASH_ENV",
    "ENV",
    "NODE_OPTIONS",
    "PERL5OPT",
    "PERL5LIB",
    "RUBYOPT",
)
"""Environment variables that load code into vLLM's process or its children, besides every
:data:`CODE_LOADING_ENV_PREFIXES` name."""
CODE_LOADING_ENV_PREFIXES = ("LD_", "PYTHON")
"""The dynamic loader's and Python's variables (``LD_PRELOAD``, ``PYTHONPATH``, ``PYTHONSTARTUP``, ...)."""
SAFE_PYTHON_ENV = (
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONHASHSEED",
    "PYTHONIOENCODING",
    "PYTHONFAULTHANDLER",
    "PYTHONUTF8",
)
"""``PYTHON*`` variables that load nothing."""


def normalise_flag(arg: str) -> str:
    """The long flag an argument names, as vLLM's parser reads it: ``--trust_remote_code=true`` ->
    ``--trust-remote-code``, ``--kv-transfer-config.kv_connector=x`` -> ``--kv-transfer-config``."""
    return arg.split("=")[0].split(".")[0].replace("_", "-")


def compute_code_loading_flags(args: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """The flags among ``args`` (normalised) that name or abbreviate a :data:`CODE_LOADING_FLAGS` entry and
    are not in ``allowed``; in order, repeats kept."""
    permitted = set(allowed) | set(EXACT_FLAGS)
    flags = [normalise_flag(a) for a in args if a.startswith("--")]
    return [
        f for f in flags
        if len(f) > 2 and f not in permitted and any(d.startswith(f) for d in CODE_LOADING_FLAGS)
    ]  # fmt: skip


def is_code_loading_env(name: str) -> bool:
    """Whether setting ``name`` may load code (:data:`CODE_LOADING_ENV`, ``LD_*``, unsafe ``PYTHON*``)."""
    if name.startswith("LD_") or name in CODE_LOADING_ENV:
        return True
    return name.startswith("PYTHON") and name not in SAFE_PYTHON_ENV
