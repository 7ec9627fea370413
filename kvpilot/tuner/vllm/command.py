"""A vLLM container's command line: find the engine in it, read its tuned settings, rewrite them.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there): how vLLM 0.33 is started in the shapes
other stacks render, which the target mode (an EngineTuner, :mod:`kvpilot.operator.enginetuner.target`) reads
and its
admission webhook rewrites. Strings in, strings out.

The forms (``command`` and ``args`` of a container, as Kubernetes concatenates them):

* ``vllm serve MODEL --flag value ...`` (vLLM production-stack's chart puts all of it in ``command``; the
  binary may be a path such as ``/opt/venv/bin/vllm``); ``MODEL`` may also be ``--model``;
* ``python -m vllm.entrypoints.openai.api_server --model MODEL ...``;
* a shell script that runs ``vllm serve ... $@`` with the engine flags as its positional parameters (KServe's
  vLLM runtime: ``bash -c 'vllm serve ${MODEL} --port 8000 $@' bash`` and the flags in ``args``).

``--config FILE`` (a YAML file of ``flag: value``) is read when the caller has its content
(:func:`build_config_file_args`); flags on the command line override it, as in vLLM's
``FlexibleArgumentParser``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kvpilot.tuner import errors
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm.args import (
    FLAGS,
    _canonical,
    _is_flag,
    build_vllm_args,
    find_flag_values,
    parse_vllm_args,
)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""The OpenAI-compatible server's module, run as ``python -m``."""
CONFIG_FLAG = "--config"
"""vLLM's flag for a YAML file of engine arguments (``FlexibleArgumentParser._load_config_file``)."""
MODEL_FLAG = "--model"
SHELLS = frozenset({"sh", "bash", "ash", "dash", "zsh"})

Form = Literal["vllm serve", "api_server", "shell"]


@dataclass(frozen=True, slots=True)
class VllmCommand:
    """The vLLM engine found in a container's command line."""

    form: Form
    model: str | None
    """The model argument as written (an id, a path, or a shell ``$VAR``); ``None`` when absent."""
    flags: tuple[str, ...]
    """The engine's flags (after the model), as vLLM parses them."""
    config_file: str | None
    """The ``--config`` file's path, when one is given."""
    in_args: bool
    """Whether the flags (or the ones a rewrite appends to) are in ``args`` rather than ``command``."""


def _base(token: str) -> str:
    return token.rsplit("/", 1)[-1]


def _after_model(tokens: Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    """``MODEL --flags...`` or ``--flags...`` (with ``--model``): the model and the flags."""
    if tokens and not _is_flag(tokens[0]):
        model: str | None = tokens[0]
        flags = tuple(tokens[1:])
    else:
        flags = tuple(tokens)
        model = None
    given = find_flag_values(flags, MODEL_FLAG)
    return (given[-1] if given else model), flags


def find_vllm_command(command: Sequence[str], args: Sequence[str]) -> VllmCommand | None:
    """The vLLM engine in ``command`` + ``args``, or ``None`` when the container does not run one."""
    tokens = [*command, *args]
    for index, token in enumerate(tokens[:-1]):
        if _base(token) == "vllm" and tokens[index + 1] == "serve":
            model, flags = _after_model(tokens[index + 2 :])
            return VllmCommand("vllm serve", model, flags, _config(flags), bool(args))
        if token == "-m" and tokens[index + 1] == API_SERVER_MODULE:
            flags = tuple(tokens[index + 2 :])
            given = find_flag_values(flags, MODEL_FLAG)
            return VllmCommand("api_server", given[-1] if given else None, flags, _config(flags), bool(args))
    return _find_in_shell(command, args)


def _find_in_shell(command: Sequence[str], args: Sequence[str]) -> VllmCommand | None:
    if len(command) < 3 or _base(command[0]) not in SHELLS or command[1] != "-c":
        return None
    script = command[2]
    try:
        words = shlex.split(script, comments=True)
    except ValueError:
        return None
    for index, word in enumerate(words[:-1]):
        if _base(word) == "vllm" and words[index + 1] == "serve":
            break
    else:
        return None
    rest = words[index + 2 :]
    positional = [*command[3:], *args][1:]  # $0 first, then "$@"
    passes = any(w in ("$@", "${@}") for w in rest) or '"$@"' in script
    script_flags = [w for w in rest if w not in ("$@", "${@}")]
    model, own = _after_model(script_flags)
    flags = (*own, *(positional if passes else ()))
    return VllmCommand("shell", model, flags, _config(flags), True)


def _config(flags: Sequence[str]) -> str | None:
    found = find_flag_values(flags, CONFIG_FLAG)
    return found[-1] if found else None


def build_config_file_args(config: Mapping[str, object]) -> tuple[str, ...]:
    """The flags a ``--config`` YAML file stands for: ``key: value`` is ``--key value``, ``key: true`` is
    ``--key``, a list is the flag with each item (vLLM's ``_load_config_file``)."""
    out: list[str] = []
    for key, value in config.items():
        flag = f"--{key}"
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return tuple(out)


def compute_command_settings(found: VllmCommand, config_args: Sequence[str] = ()) -> EngineSettings:
    """The tuned settings the command line runs: the ``--config`` file's, overridden by the flags.

    Raises :class:`~kvpilot.tuner.errors.InvalidEngineArgs` for a tuned flag vLLM would refuse."""
    settings, _ = parse_vllm_args([*config_args, *found.flags])
    return settings


def _strip_tuned(tokens: Sequence[str], fields: frozenset[str]) -> list[str]:
    """``tokens`` without the flags of ``fields`` (any spelling, with their values)."""
    flags = {FLAGS[f] for f in fields}
    out: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if _is_flag(token):
            flag, inline = _canonical(token)
            if flag in flags:
                skip = inline is None
                continue
        out.append(token)
    return out


def rewrite_tuned_flags(
    command: Sequence[str],
    args: Sequence[str],
    found: VllmCommand,
    settings: EngineSettings,
    *,
    keep: frozenset[str] = frozenset({"tensor_parallel_size"}),
) -> tuple[list[str], list[str]]:
    """``(command, args)`` with the tuned flags set to ``settings`` and nothing else changed.

    Every tuned flag but those in ``keep`` (the tensor-parallel size is the pod's shape, not tuning) is
    removed wherever it is, in any spelling, and ``settings``' set fields are appended (to ``args`` when the
    flags are there, else to ``command``); a field ``settings`` leaves unset runs vLLM's default. A shell
    script is not edited: only its positional flags in ``args`` are (later flags win in vLLM, so the
    appended ones override the script's own)."""
    fields = frozenset(FLAGS) - keep
    rendered = list(build_vllm_args(settings.replace(**{f: None for f in keep})))
    if found.form == "shell":
        new_command = list(command)
        new_args = [*_strip_tuned(args, fields), *rendered]
        return new_command, new_args
    new_command, new_args = _strip_tuned(command, fields), _strip_tuned(args, fields)
    if found.in_args:
        new_args += rendered
    else:
        new_command += rendered
    check = find_vllm_command(new_command, new_args)
    if check is None or check.model != found.model:  # a value was a model argument: refuse to guess
        raise errors.InvalidEngineArgs("the command line changed shape when rewritten", flag="serve")
    return new_command, new_args
