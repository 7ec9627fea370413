"""A TGI container's command line and environment: find the launcher, read its flags, rewrite the tuned ones.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there): how TGI 3.3.7's launcher is started in the
shapes other stacks render, which the target mode (an EngineTuner,
:mod:`kvpilot.operator.enginetuner.target_engines`) reads and its admission webhook rewrites. Strings in,
strings out. The forms (``command`` and ``args`` of a container, as Kubernetes concatenates them):

* ``text-generation-launcher --model-id M --flag value ...`` (any path to the binary);
* TGI's image with no ``command``: its entry point runs the launcher (``Dockerfile`` lines 240-249), so
  ``args`` are the launcher's flags (:data:`~.serving.IMAGE_REPOSITORY`);
* a shell script (``sh -c '...'``) running the launcher, with its positional parameters when it passes
  ``"$@"``.

In every form the launcher also reads each flag from its environment variable (:func:`~.args.env_name`:
``MODEL_ID``, ``MAX_TOTAL_TOKENS``, ...), which a flag on the command line overrides (clap): the flags read
are the environment's first, then the command line's, and a later one wins.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from kvpilot.tuner import errors, flags
from kvpilot.tuner.tgi.args import (
    FLAGS,
    MODEL_FLAG,
    MODEL_ID_DEFAULT,
    TgiSettings,
    build_env_args,
    build_tgi_args,
    env_name,
    parse_tgi_args,
)
from kvpilot.tuner.tgi.serving import IMAGE_REPOSITORY, SERVE_COMMAND

Form = Literal["launcher", "image", "shell"]
SHAPE_FIELDS = frozenset({"num_shard"})
"""The fields that are the pod's shape (its GPUs), not tuning: a rewrite keeps the owner's."""
LAUNCHER = SERVE_COMMAND[0]


@dataclass(frozen=True, slots=True)
class TgiCommand:
    """The TGI launcher found in a container."""

    form: Form
    model: str
    """The model, as written (an id, a path, or a shell ``$VAR``): the last ``--model-id``, else
    ``MODEL_ID``, else the launcher's default."""
    model_from_env: bool
    flags: tuple[str, ...]
    """The launcher's flags: the environment's (:func:`~.args.build_env_args`), then the command line's."""
    in_args: bool
    """Whether the flags a rewrite appends go to ``args`` rather than ``command``."""
    rewritable: bool = True
    """``False`` for a shell script that does not pass ``"$@"``: appended flags would not reach TGI."""


def _is_image(image: str) -> bool:
    return image.split("@")[0].split(":")[0].endswith(IMAGE_REPOSITORY)


def _launcher_flags(tokens: Sequence[str]) -> tuple[str, ...] | None:
    for i, token in enumerate(tokens):
        if token.rsplit("/", 1)[-1] == LAUNCHER:
            return tuple(tokens[i + 1 :])
    return None


def find_tgi_command(
    command: Sequence[str], args: Sequence[str], image: str, env: Mapping[str, str]
) -> TgiCommand | None:
    """The TGI launcher in a container (its ``command``, ``args``, ``image`` and literal ``env``), or ``None``
    when the container does not run one."""
    command, args = [str(c) for c in command], [str(a) for a in args]
    form: Form = "launcher"
    rewritable = True
    cli = _launcher_flags([*command, *args])
    in_args = bool(args)
    if cli is None and not command and _is_image(image):
        form, cli, in_args = "image", tuple(args), True
    if cli is None:
        script = flags.read_shell_script(command, args)
        own = _launcher_flags(script.words) if script is not None else None
        if script is None or own is None:
            return None
        form, in_args, rewritable = "shell", True, script.passes
        cli = (*own, *(script.positional if script.passes else ()))
    env_args = build_env_args(env)
    given = flags.find_flag_value(cli, (MODEL_FLAG,))
    from_env = given is None and env.get(env_name(MODEL_FLAG)) is not None
    model = given or env.get(env_name(MODEL_FLAG)) or MODEL_ID_DEFAULT
    return TgiCommand(form, model, from_env, (*env_args, *cli), in_args, rewritable)


def compute_command_settings(found: TgiCommand) -> TgiSettings:
    """The tuned settings the launcher runs (:func:`~.args.parse_tgi_args`); InvalidEngineArgs when a value
    does not parse."""
    return parse_tgi_args(found.flags)


def rewrite_tuned_flags(
    command: Sequence[str],
    args: Sequence[str],
    found: TgiCommand,
    settings: TgiSettings,
    *,
    keep: Collection[str] = SHAPE_FIELDS,
) -> tuple[list[str], list[str], frozenset[str]]:
    """``(command, args, env names to drop)`` with the tuned flags set to ``settings``, nothing else changed.

    Every flag of :data:`~.args.FLAGS` but those of ``keep`` (the pod's shape) is removed from the command
    line, and its environment variable is to be dropped, and ``settings``' set fields are appended (to
    ``args`` when the flags are there or the image runs the launcher, else to ``command``); a field
    ``settings`` leaves unset runs TGI's default. A shell script is not edited: only its positional flags in
    ``args`` are (InvalidEngineArgs when it does not pass ``"$@"``)."""
    command, args = [str(c) for c in command], [str(a) for a in args]
    names = {FLAGS[f] for f in FLAGS if f not in keep}
    drop = frozenset(env_name(n) for n in names)
    rendered = build_tgi_args(replace(settings, **{f: None for f in keep}))
    if found.form == "shell":
        if not found.rewritable:
            raise errors.InvalidEngineArgs(
                'the shell script does not pass "$@" to the launcher, so flags in args would not reach it'
            )
        return command, [*flags.strip_flags(args, names), *rendered], drop
    new_command, new_args = flags.strip_flags(command, names), flags.strip_flags(args, names)
    if found.in_args:
        new_args += rendered
    else:
        new_command += rendered
    return new_command, new_args, drop
