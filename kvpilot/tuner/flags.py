"""Engine flags read back from a container's arguments: the inverse of each engine's ``build_*_args``.

Shared by the engines whose flags kvpilot reads back (:func:`kvpilot.tuner.sglang.parse_sglang_args`,
:func:`kvpilot.tuner.tgi.parse_tgi_args`): each engine's package keeps its own flag names and value types
and asks this for the parse. Pure; no engine facts here.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kvpilot.tuner import errors

SHELLS = frozenset({"sh", "bash", "ash", "dash", "zsh"})


def parse_flag_values(
    args: Sequence[str],
    flags: Mapping[str, str],
    *,
    floats: Collection[str] = (),
    strings: Collection[str] = (),
) -> dict[str, object]:
    """``{field: value}`` for every flag of ``flags`` (field -> flag) in ``args`` (``--flag value`` or
    ``--flag=value``; other flags are ignored), as ``int`` unless the field is in ``floats`` or ``strings``.
    A value that does not parse is an error naming the flag."""
    field_of = {flag: name for name, flag in flags.items()}
    values: dict[str, object] = {}
    items = list(args)
    for i, arg in enumerate(items):
        flag, eq, inline = arg.partition("=")
        name = field_of.get(flag)
        if name is None:
            continue
        text = inline if eq else (items[i + 1] if i + 1 < len(items) else "")
        try:
            values[name] = text if name in strings else float(text) if name in floats else int(text)
        except ValueError as exc:
            raise errors.InvalidEngineArgs(f"{flag} {text!r} is not a valid value") from exc
    return values


def canonical_args(args: Sequence[str], aliases: Mapping[str, str]) -> list[str]:
    """``args`` with each alias flag (``aliases``: alias -> the flag's own spelling) spelled as its flag,
    ``--alias value`` and ``--alias=value`` alike; everything else as it was."""
    out: list[str] = []
    for arg in args:
        flag, eq, inline = arg.partition("=")
        out.append(f"{aliases[flag]}{eq}{inline}" if flag in aliases else arg)
    return out


def find_flag_value(args: Sequence[str], names: Collection[str]) -> str | None:
    """The value of the last of ``names`` in ``args`` (``--flag value`` or ``--flag=value``), or ``None``."""
    found: str | None = None
    items = list(args)
    for i, arg in enumerate(items):
        flag, eq, inline = arg.partition("=")
        if flag in names:
            found = inline if eq else (items[i + 1] if i + 1 < len(items) else None)
    return found


def strip_flags(args: Sequence[str], names: Collection[str]) -> list[str]:
    """``args`` without the flags ``names`` and their values (``--flag value`` or ``--flag=value``)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in names:
            skip = not eq
            continue
        out.append(arg)
    return out


@dataclass(frozen=True, slots=True)
class ShellScript:
    """A container whose command is ``SHELL -c SCRIPT [$0 [ARGS...]]``: the script's words and its
    positional parameters (what ``$@`` stands for)."""

    words: tuple[str, ...]
    """The script split as the shell would (``shlex``; comments dropped, ``$VAR`` left as written)."""
    positional: tuple[str, ...]
    """``$1...``: the command's words after ``$0``, then ``args``."""
    passes: bool
    """Whether the script passes its positional parameters on (``$@``)."""


def read_shell_script(command: Sequence[str], args: Sequence[str]) -> ShellScript | None:
    """The shell script ``command`` runs, or ``None`` when it is no ``sh -c`` (or does not split)."""
    if len(command) < 3 or str(command[0]).rsplit("/", 1)[-1] not in SHELLS or command[1] != "-c":
        return None
    script = str(command[2])
    try:
        words = shlex.split(script, comments=True)
    except ValueError:
        return None
    positional = tuple(str(a) for a in [*command[3:], *args][1:])  # $0 first, then "$@"
    passes = any(w in ("$@", "${@}") for w in words) or '"$@"' in script
    return ShellScript(tuple(w for w in words if w not in ("$@", "${@}")), positional, passes)
