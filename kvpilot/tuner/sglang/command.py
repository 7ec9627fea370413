"""An SGLang container's command line: find the server in it, read its flags, rewrite the tuned ones.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there): how SGLang 0.5.23 is started in the
shapes other stacks render, which the target mode (an EngineTuner,
:mod:`kvpilot.operator.enginetuner.target_engines`) reads and its admission webhook rewrites. Strings in,
strings out. The forms (``command`` and ``args`` of a container, as Kubernetes concatenates them):

* ``python -m sglang.launch_server --model-path M --flag value ...`` (any ``python``; or the module's file,
  ``.../sglang/launch_server.py``);
* ``sglang serve [M] --flag value ...`` (``cli/main.py``: the ``serve`` subcommand; ``cli/serve.py``
  ``_normalize_positional_model_path``: a first argument that is no flag is ``--model-path``);
* a shell script (``sh -c '...'``) running either, with its positional parameters when it passes ``"$@"``.

``--model-path`` may be spelled ``--model`` (:data:`~.args.MODEL_ALIASES`), the tuned flags by their aliases
(:data:`~.args.ALIASES`); a later flag wins over an earlier one (``argparse``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from kvpilot.tuner import errors, flags
from kvpilot.tuner.sglang.args import (
    ALIASES,
    FLAGS,
    MODEL_ALIASES,
    MODEL_FLAG,
    SglangSettings,
    build_sglang_args,
    parse_sglang_args,
)
from kvpilot.tuner.sglang.serving import SERVER_MODULE

Form = Literal["launch_server", "sglang serve", "shell"]
SHAPE_FIELDS = frozenset({"tp_size", "pp_size"})
"""The fields that are the pod's shape (its GPUs), not tuning: a rewrite keeps the owner's."""


@dataclass(frozen=True, slots=True)
class SglangCommand:
    """The SGLang server found in a container's command line."""

    form: Form
    model: str | None
    """The model argument as written (an id, a path, or a shell ``$VAR``); ``None`` when absent."""
    flags: tuple[str, ...]
    """The server's flags, as SGLang parses them (a shell script's own, then its positional ones)."""
    in_args: bool
    """Whether the flags a rewrite appends go to ``args`` rather than ``command``."""
    rewritable: bool = True
    """``False`` for a shell script that does not pass ``"$@"``: appended flags would not reach SGLang."""


def _model_of(flags_: Sequence[str]) -> str | None:
    return flags.find_flag_value(flags_, (MODEL_FLAG, *MODEL_ALIASES))


def _find_server(tokens: Sequence[str]) -> tuple[Form, str | None, tuple[str, ...]] | None:
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if (token == "-m" and following == SERVER_MODULE) or token.endswith("sglang/launch_server.py"):
            rest = tuple(tokens[i + (2 if token == "-m" else 1) :])
            return "launch_server", _model_of(rest), rest
        if token.rsplit("/", 1)[-1] == "sglang" and following == "serve":
            rest = tuple(tokens[i + 2 :])
            if rest and not rest[0].startswith("-"):  # sglang serve MODEL ...
                return "sglang serve", _model_of(rest[1:]) or rest[0], rest[1:]
            return "sglang serve", _model_of(rest), rest
    return None


def find_sglang_command(command: Sequence[str], args: Sequence[str]) -> SglangCommand | None:
    """The SGLang server in ``command`` + ``args``, or ``None`` when the container does not run one."""
    command, args = [str(c) for c in command], [str(a) for a in args]
    found = _find_server([*command, *args])
    if found is not None:
        form, model, own = found
        return SglangCommand(form, model, own, in_args=bool(args))
    script = flags.read_shell_script(command, args)
    found = _find_server(script.words) if script is not None else None
    if script is None or found is None:
        return None
    _, model, own = found
    passed = script.positional if script.passes else ()
    return SglangCommand("shell", model, (*own, *passed), in_args=True, rewritable=script.passes)


def compute_command_settings(found: SglangCommand) -> SglangSettings:
    """The tuned settings the command line runs (:func:`~.args.parse_sglang_args`); InvalidEngineArgs when a
    value does not parse."""
    return parse_sglang_args(found.flags)


def _tuned_spellings(keep: Collection[str]) -> set[str]:
    names = {FLAGS[f] for f in FLAGS if f not in keep}
    return names | {alias for alias, flag in ALIASES.items() if flag in names}


def rewrite_tuned_flags(
    command: Sequence[str],
    args: Sequence[str],
    found: SglangCommand,
    settings: SglangSettings,
    *,
    keep: Collection[str] = SHAPE_FIELDS,
) -> tuple[list[str], list[str]]:
    """``(command, args)`` with the tuned flags set to ``settings`` and nothing else changed.

    Every flag of :data:`~.args.FLAGS` but those of ``keep`` (the pod's shape) is removed wherever it is, in
    any spelling, and ``settings``' set fields are appended (to ``args`` when the flags are there, else to
    ``command``); a field ``settings`` leaves unset runs SGLang's default. A shell script is not edited:
    only its positional flags in ``args`` are (InvalidEngineArgs when it does not pass ``"$@"``)."""
    command, args = [str(c) for c in command], [str(a) for a in args]
    names = _tuned_spellings(keep)
    rendered = build_sglang_args(replace(settings, **{f: None for f in keep}))
    if found.form == "shell":
        if not found.rewritable:
            raise errors.InvalidEngineArgs(
                'the shell script does not pass "$@" to SGLang, so flags in args would not reach it'
            )
        return command, [*flags.strip_flags(args, names), *rendered]
    new_command, new_args = flags.strip_flags(command, names), flags.strip_flags(args, names)
    if found.in_args:
        new_args += rendered
    else:
        new_command += rendered
    check = find_sglang_command(new_command, new_args)
    if check is None or check.model != found.model:  # a value was a model argument: refuse to guess
        raise errors.InvalidEngineArgs("the command line changed shape when rewritten")
    return new_command, new_args
