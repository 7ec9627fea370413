"""Engine flags read back from a container's arguments: the inverse of each engine's ``build_*_args``.

Shared by the engines whose flags kvpilot reads back (:func:`kvpilot.tuner.sglang.parse_sglang_args`,
:func:`kvpilot.tuner.tgi.parse_tgi_args`): each engine's package keeps its own flag names and value types
and asks this for the parse. Pure; no engine facts here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from kvpilot.tuner import errors


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
