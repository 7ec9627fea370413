"""What lets an fp8 KV cache in, said one way wherever a plan or a remedy finds that one would fit: vLLM's
infeasible plan (:mod:`kvpilot.tuner.plan.planner`), SGLang's (:mod:`kvpilot.tuner.engines.sglang_budget`)
and SGLang's crash rules when nothing else is left (:mod:`kvpilot.tuner.loop.sglang_fp8`). Pure.

The engine's own flag and dtype spelling come from the caller (each engine's package holds its own); the
permission is the API's: ``spec.tuning.allowFp8KvCache`` on an InferenceService, ``--allow-fp8-kv`` on
``kvpilot plan``.
"""

from __future__ import annotations

ALLOW_FP8_KV = "spec.tuning.allowFp8KvCache: true (kvpilot plan --allow-fp8-kv)"
"""Where a user allows an fp8 KV cache."""


def describe_fp8_fits(flags: str, *, allowed: bool, where: str = "") -> str:
    """``An fp8 KV cache (<flags>) fits<where>``, and, when the user has not allowed one, how to.

    ``flags`` is the engine's own rendering (``--kv-cache-dtype fp8`` for vLLM, ``--kv-cache-dtype
    fp8_e4m3`` for SGLang); ``where`` qualifies the fit (``" at the minimum context 8192"``)."""
    how = "" if allowed else f": set {ALLOW_FP8_KV}"
    return f"An fp8 KV cache ({flags}) fits{where}{how}."
