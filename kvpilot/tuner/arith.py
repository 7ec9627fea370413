"""The two integer roundings vLLM's sizing code uses everywhere (``vllm/utils/math_utils.py``: ``cdiv`` and
``round_up``), kept once for every layer of the tuner."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up (vLLM's ``cdiv``)."""
    return -(-a // b)


def round_up(value: int, multiple: int) -> int:
    """``value`` up to the next multiple of ``multiple`` (vLLM's ``round_up``)."""
    return cdiv(value, multiple) * multiple
