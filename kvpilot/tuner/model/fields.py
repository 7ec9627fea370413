"""Typed reads of a ``config.json``'s values, and the limits kvpilot holds them to.

Sits at the bottom of :mod:`kvpilot.tuner.model`: :mod:`.spec` and :mod:`.quantization` read
every value they use through a :class:`Fields`, so a malformed or hostile config (a string
where an integer belongs, a negative head count, NaN, an object for ``vocab_size``, a
3,000,000-layer model) is refused with :class:`~kvpilot.tuner.errors.InvalidModelConfig`
naming the field, what was found and what is expected -- before any arithmetic is done
with it. :func:`parse_config_json` is the edge's JSON reader (size and nesting bounded).

Integers must be JSON integers (transformers' strict config classes refuse ``4096.0`` and
``"4096"`` too); sizes are positive unless zero means "none" (``n_shared_experts``,
``first_k_dense_replace``...). Each size has a documented upper limit (the ``MAX_*``
:class:`Limit` s below): far above any published model -- the largest one is named -- and
low enough that the memory model's per-layer and per-token work stays bounded
(docs/memory-model.md, "What a config.json may hold").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors


@dataclass(frozen=True, slots=True)
class Limit:
    """The largest value kvpilot accepts for a kind of size, and the largest published one."""

    maximum: int
    published: str
    """The largest value of a published model, for the message (``"Llama-3.1-405B has 126"``)."""


MAX_LAYERS = Limit(1024, "the largest published model, Llama-3.1-405B, has 126")
"""Decoder (and vision-encoder) layers."""
MAX_HIDDEN_SIZE = Limit(131_072, "Llama-3.1-405B has 16384")
MAX_INTERMEDIATE_SIZE = Limit(1_048_576, "Llama-3.1-405B has 53248")
MAX_HEADS = Limit(1024, "DeepSeek-V3 and Llama-3.1-405B have 128")
"""Attention, KV and linear-attention heads."""
MAX_HEAD_DIM = Limit(8192, "Gemma 4's global layers and DeepSeek-V4 have 512")
"""Head sizes, MLA ranks' per-head parts."""
MAX_VOCAB_SIZE = Limit(16_777_216, "Gemma 3 and 4 have 262144")
MAX_EXPERTS = Limit(16_384, "Kimi-K3 has 896")
"""Routed experts, experts per token, shared experts."""
MAX_CONTEXT = Limit(268_435_456, "Llama-4-Scout has 10485760")
"""Any length in tokens: ``max_position_embeddings`` and its aliases, after rope scaling too;
sliding windows and attention chunks."""
MAX_ROPE_FACTOR = 1024.0
"""``rope_scaling.factor`` (Kimi-K2.5 and Devstral 2: 64)."""
MAX_SMALL = Limit(1024, "published models use at most 16")
"""Small counts: conv kernels, patch sizes, channels, layer-pattern periods, quantization bits."""
MAX_CONFIG_BYTES = 1 << 20
"""A ConfigMap holds at most 1 MiB; published config.json files are a few KB (the largest here: 58 KB)."""
MAX_JSON_DEPTH = 32
"""Nesting of objects and lists (published configs nest at most 7 deep)."""
MAX_JSON_VALUES = 20_000
"""Values (objects, lists, strings, numbers, ...) in a config.json, counted before it is parsed: a 1 MiB text
of ``[{},{},...]`` is about 26 MB of Python objects, so one tenant's hostile configs could exhaust the
operator. Published configs hold at most about 1,600."""


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def strip_json_strings(raw: bytes) -> bytes:
    """A JSON text with every string emptied (``"..."`` to ``""``): its punctuation left is the structure's.
    One pass of the regex over the text, the costly part of the checks below on a hostile megabyte: do it
    once and hand the result to both (``strings_stripped=True``)."""
    return _JSON_STRING.sub(b'""', raw)


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")


def nests_deeper_than(raw: bytes, limit: int, *, strings_stripped: bool = False) -> bool:
    """Whether a JSON text nests objects and lists deeper than ``limit``, without parsing it (strings
    skipped; ``strings_stripped``: ``raw`` is already :func:`strip_json_strings`' output). Each round removes
    the innermost pairs, one level, in one pass of C code: at most ``limit`` rounds over the brackets, so a
    hostile megabyte costs milliseconds, not seconds of the operator's thread."""
    brackets = (raw if strings_stripped else strip_json_strings(raw)).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _EMPTY_PAIR.sub(b"", brackets)
    return bool(brackets)


def _count_values(raw: bytes) -> int:
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def _bare_for_counting(raw: bytes) -> bytes:
    """``raw`` when its cheap bound (punctuation inside strings counted too) is within
    :data:`MAX_JSON_VALUES`, as for every real config; else :func:`strip_json_strings`' output."""
    return raw if _count_values(raw) <= MAX_JSON_VALUES else strip_json_strings(raw)


def count_json_values(raw: bytes) -> int:
    """An upper bound of the values in a JSON text, without parsing it: its commas and opening brackets
    outside strings, plus one (a value is the first of its container, or follows a comma)."""
    return _count_values(_bare_for_counting(raw))  # punctuation inside strings is no value


def describe(value: Any) -> str:
    """A short, safe description of a JSON value for a message (no recursion, bounded length)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value.bit_length() > 128:
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {shown!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def refuse(field: str, expected: str, value: Any) -> errors.InvalidModelConfig:
    """The error for ``field`` holding ``value`` where ``expected`` belongs."""
    message = f"config.json: {field} must be {expected}, got {describe(value)}"
    return errors.InvalidModelConfig(message, field=field)


def _expected_int(minimum: int) -> str:
    if minimum == 1:
        return "a positive integer"
    if minimum == 0:
        return "a non-negative integer"
    return f"an integer of at least {minimum}"


class Fields:
    """One JSON object of a config.json, read with types and ranges checked.

    ``prefix`` is the object's path (``"text_config"``, ``"vision_config"``, ``""`` at the top);
    errors name ``prefix.key``. Keys in ``inherited`` were copied from the top level and are
    named without the prefix.
    """

    __slots__ = ("data", "inherited", "prefix")

    def __init__(self, data: Mapping[str, Any], prefix: str = "", inherited: frozenset[str] = frozenset()):
        self.data, self.prefix, self.inherited = data, prefix, inherited

    def path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix and name not in self.inherited else name

    def raw(self, name: str) -> Any:
        return self.data.get(name)

    def present(self, name: str) -> bool:
        return self.data.get(name) is not None

    def _first(self, names: tuple[str, ...]) -> tuple[str, Any]:
        for name in names:
            value = self.data.get(name)
            if value is not None:
                return name, value
        return names[0], None

    def missing(self, *names: str) -> errors.InvalidModelConfig:
        where = f".{self.prefix}" if self.prefix else ""
        also = f" (also looked for {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
        return errors.InvalidModelConfig(
            f"config.json{where} has no {names[0]!r}: "
            f"the memory model cannot size this model without it{also}",
            field=self.path(names[0]),
        )

    def optional_int(self, *names: str, limit: Limit, minimum: int = 1) -> int | None:
        """The first of ``names`` that is not null, as an integer in [minimum, limit]; None if none is set."""
        name, value = self._first(names)
        if value is None:
            return None
        return self.check_int(name, value, limit=limit, minimum=minimum)

    def need_int(self, *names: str, limit: Limit, minimum: int = 1) -> int:
        """:meth:`optional_int`, required: a config without any of ``names`` is refused."""
        value = self.optional_int(*names, limit=limit, minimum=minimum)
        if value is None:
            raise self.missing(*names)
        return value

    def check_int(self, name: str, value: Any, *, limit: Limit, minimum: int = 1) -> int:
        field = self.path(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise refuse(field, _expected_int(minimum), value)
        if value < minimum:
            raise refuse(field, _expected_int(minimum), value)
        if value > limit.maximum:
            raise refuse(field, f"at most {limit.maximum} (kvpilot's limit; {limit.published})", value)
        return value

    def optional_float(self, name: str, *, maximum: float, inclusive_zero: bool = False) -> float | None:
        """A finite number above zero (or at least zero) and at most ``maximum``; None if null or absent."""
        value = self.data.get(name)
        if value is None:
            return None
        low = "at least 0" if inclusive_zero else "above 0"
        expected = f"a number {low} and at most {maximum:g}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(self.path(name), expected, value)
        if isinstance(value, int) and not 0 <= value <= maximum:  # before float(): 10**400 overflows
            raise refuse(self.path(name), expected, value)
        number = float(value)
        if not math.isfinite(number) or not 0 <= number <= maximum or (number == 0 and not inclusive_zero):
            raise refuse(self.path(name), expected, value)
        return number

    def optional_bool(self, name: str) -> bool | None:
        value = self.data.get(name)
        if value is None or isinstance(value, bool):
            return value
        raise refuse(self.path(name), "true or false", value)

    def flag(self, name: str) -> bool:
        """A boolean; absent or null is false."""
        return bool(self.optional_bool(name))

    def string(self, *names: str) -> str | None:
        """The first of ``names`` holding a non-empty string; every one set must be a string."""
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise refuse(self.path(name), "a string", value)
            if value:
                return value
        return None

    def child(self, name: str) -> Fields | None:
        """The nested object ``name`` (None if absent or null); anything else is refused."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise refuse(self.path(name), "an object", value)
        return Fields(value, self.path(name))

    def strings(self, name: str) -> list[str] | None:
        """A list of strings (None if absent or null)."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise refuse(self.path(name), "a list of strings", value)
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise refuse(f"{self.path(name)}[{index}]", "a string", item)
        return value

    def ints(self, name: str, *, limit: Limit, minimum: int = 0) -> list[int] | None:
        """A list of integers in [minimum, limit] (None if absent or null)."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise refuse(self.path(name), "a list of integers", value)
        return [
            self.check_int(f"{name}[{i}]", item, limit=limit, minimum=minimum) for i, item in enumerate(value)
        ]


def _depth_within(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and lists at most ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return False
                stack.append((child, depth + 1))
    return True


def parse_config_json(text: str | bytes, where: str) -> dict[str, Any]:
    """A config.json's text as an object; too large, too deep or not JSON: InvalidModelConfig."""
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_CONFIG_BYTES:
        raise errors.InvalidModelConfig(
            f"{where} is {size} bytes; a config.json may hold at most {MAX_CONFIG_BYTES} "
            "(published ones are a few KB)",
            field=None,
        )
    raw = text.encode() if isinstance(text, str) else text
    bare = _bare_for_counting(
        raw
    )  # stripped of its strings (once, for both checks) when over the cheap bound
    values = _count_values(bare)  # count_json_values(raw); over the bound, bare is stripped
    if values > MAX_JSON_VALUES and nests_deeper_than(bare, MAX_JSON_DEPTH, strings_stripped=True):
        raise errors.InvalidModelConfig(
            f"{where} nests objects or lists deeper than {MAX_JSON_DEPTH} levels", field=None
        )
    if values > MAX_JSON_VALUES:
        raise errors.InvalidModelConfig(
            f"{where} holds about {values} JSON values; a config.json may hold at most {MAX_JSON_VALUES} "
            "(published ones hold under 2,000)",
            field=None,
        )
    try:
        config = json.loads(text)
    except RecursionError:
        raise errors.InvalidModelConfig(
            f"{where} nests objects or lists deeper than {MAX_JSON_DEPTH} levels", field=None
        ) from None
    except ValueError as exc:  # JSONDecodeError, and integers longer than Python converts
        raise errors.InvalidModelConfig(f"{where} is not valid JSON: {exc}", field=None) from None
    if not isinstance(config, dict):
        raise errors.InvalidModelConfig(f"{where} must hold a JSON object (a config.json)", field=None)
    if not _depth_within(config, MAX_JSON_DEPTH):
        raise errors.InvalidModelConfig(
            f"{where} nests objects or lists deeper than {MAX_JSON_DEPTH} levels", field=None
        )
    return config
