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

import json
from collections.abc import Iterable, Sequence
from typing import Any

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
    "--config",
)
"""Flags of vLLM 0.33 that load code or files chosen by the spec (``vllm serve --help``). ``--config`` names
a YAML file whose keys vLLM's parser reads as flags (``FlexibleArgumentParser._pull_args_from_config``), so
``trust-remote-code: true`` in a mounted ConfigMap would pass unseen (kvpilot also refuses it for everyone,
:data:`kvpilot.tuner.vllm.POD_FLAGS`)."""
CODE_LOADING_KEYS: dict[str, tuple[str, ...]] = {
    "--compilation-config": ("backend", "inductor_passes"),
}
"""Keys of JSON-valued flags that import a module the value names (``config/compilation.py``:
``CompilationConfig.backend`` is resolved by qualified name outside the ``eager``/``inductor`` backends,
``inductor_passes`` maps names to qualified names). The flags' other spellings: :data:`JSON_FLAG_ALIASES`."""
ANY_FLAG_CODE_KEYS = ("trust_remote_code",)
"""Keys refused in every JSON-valued flag (``--hf-overrides``, ``--model-loader-extra-config``,
``--speculative-config``, ...): vLLM reads trust only from ``--trust-remote-code`` (the draft model of
``--speculative-config`` inherits it), so such a key is either ignored or an attempt; refused either way."""
JSON_FLAG_ALIASES = {"-cc": "--compilation-config", "-O": "--compilation-config"}
"""Short spellings of JSON-valued flags in vLLM 0.33's parser (``engine/arg_utils.py``,
``utils/argparse_utils.py``: ``-O.backend=x`` is ``--compilation-config.backend=x``)."""
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
        f
        for f in flags
        if len(f) > 2 and f not in permitted and any(d.startswith(f) for d in CODE_LOADING_FLAGS)
    ]


def compute_code_loading_keys(args: Sequence[str], allowed: Iterable[str] = ()) -> list[str]:
    """``"--flag key"`` for each code-loading key (:data:`CODE_LOADING_KEYS`, :data:`ANY_FLAG_CODE_KEYS`)
    in a JSON-valued flag of ``args``: a JSON object after the flag (``--flag JSON`` or ``--flag=JSON``,
    nested keys too) or a dotted key (``--flag.key=value``, vLLM's spelling of one key). A flag in
    ``allowed`` may carry its :data:`CODE_LOADING_KEYS`."""
    permitted = set(allowed)
    found: list[str] = []
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        flag = _json_flag(arg)
        keys = _dotted_keys(arg) or _json_keys(arg.partition("=")[2] if "=" in arg else _next(args, i))
        refused = (() if flag in permitted else CODE_LOADING_KEYS.get(flag, ())) + ANY_FLAG_CODE_KEYS
        found += [f"{flag} {k}" for k in keys if k in refused]
    return found


def _json_flag(arg: str) -> str:
    head = arg.split("=")[0].split(".")[0]
    if head in JSON_FLAG_ALIASES or (head.startswith("-O") and not head.startswith("--")):
        return "--compilation-config"
    return head.replace("_", "-")


def _dotted_keys(arg: str) -> list[str]:
    head = arg.split("=")[0]
    return [k.replace("-", "_") for k in head.split(".")[1:]]


def _next(args: Sequence[str], i: int) -> str:
    return args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else ""


def _json_keys(text: str) -> list[str]:
    """Every key of the JSON object ``text`` (nested objects and lists too); none if it is not one."""
    if not text.lstrip().startswith("{"):
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []  # vLLM refuses it at start-up
    keys: list[str] = []
    todo: list[Any] = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            keys += [str(k).replace("-", "_") for k in node]
            todo += node.values()
        elif isinstance(node, list):
            todo += node
    return keys


def is_code_safe_env_prefix(prefix: str) -> bool:
    """Whether an ``envFrom`` with this ``prefix`` can only set names that load nothing, whatever keys the
    Secret or ConfigMap holds: the prefix starts no code-loading name (``LD_``, ``PYTHON``, a listed one) and
    none of them starts it."""
    names = (*CODE_LOADING_ENV, *CODE_LOADING_ENV_PREFIXES)
    if not prefix or any(n.startswith(prefix) for n in names):
        return False
    return not any(prefix.startswith(p) for p in CODE_LOADING_ENV_PREFIXES)


def is_code_loading_env(name: str) -> bool:
    """Whether setting ``name`` may load code (:data:`CODE_LOADING_ENV`, ``LD_*``, unsafe ``PYTHON*``)."""
    if name.startswith("LD_") or name in CODE_LOADING_ENV:
        return True
    return name.startswith("PYTHON") and name not in SAFE_PYTHON_ENV
