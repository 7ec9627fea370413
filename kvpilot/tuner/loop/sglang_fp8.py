"""An fp8 KV cache in SGLang's crash rules (:mod:`.sglang_rules`): where a smaller cell per token keeps the
user's context and running requests, in the order vLLM's crash rules give it. Pure.

The gates are the pressure rule's (:func:`allows_fp8`): the bounds allow one (``allow_fp8_kv``: the user's
``allowFp8KvCache`` *and* the GPU's fp8 support, ANDed by the operator, no pinned dtype) and the cache is not
fp8 yet. The dtype is SGLang's (:data:`~kvpilot.tuner.sglang.FP8_KV_CACHE_DTYPE`, ``fp8_e4m3``), whose cell
is half the 16-bit one: the pool holds twice the tokens in the same bytes.

- A start-up short of memory (:func:`propose_for_memory_short`): as vLLM's ``KvCacheTooSmall`` (a context cut
  to what fits within ``minContextLength``, *then* fp8, then fp8 with a context fitted to its pool), after
  SGLang's own raise of the fraction and the context its 16-bit pool holds at the highest ceiling: fp8 at
  the fraction that holds one full-context request in fp8, else fp8 with the context its pool holds at the
  highest ceiling. ``--mem-fraction-static`` only goes up here (SGLang's start-up meaning).
- An out-of-memory at graph capture or while serving (:func:`propose_for_oom`): fp8 at a *smaller* fraction
  that keeps the pool's tokens (half the pool's bytes handed to the memory outside the share, at least the
  OOM step), before any cut of ``--max-running-requests`` -- as vLLM's pressure rule puts fp8 before the
  sequences' cut -- and so first where a run-time OOM that came back after a smaller fraction would cut them.

Where the user's permission alone keeps an fp8 cache out (the GPU supports one), an exhausted rule says so
(:func:`describe_permission`, the shared wording of :mod:`kvpilot.tuner.fp8_advice`).
"""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import sglang
from kvpilot.tuner.fp8_advice import describe_fp8_fits
from kvpilot.tuner.loop.sglang_fit import (
    SglangSituation,
    ceil_grid,
    clamp,
    compute_budget,
    compute_effective,
    compute_fraction_for_context,
    compute_shorter_context,
    compute_wanted_fraction,
    fraction_of,
    holds_full_request,
    predict_pool_tokens,
    would_start,
)

FP8_FLAGS = f"--kv-cache-dtype {sglang.FP8_KV_CACHE_DTYPE}"


def allows_fp8(s: SglangSituation) -> bool:
    """The bounds allow an fp8 KV cache (the user and the GPU) and the cache is not fp8 yet."""
    return s.bounds.allow_fp8_kv and not sglang.is_fp8_kv_cache_dtype(s.effective.kv_cache_dtype)


def _permission_only(s: SglangSituation) -> bool:
    """Only the user's ``allowFp8KvCache`` keeps an fp8 cache out: the GPU supports one, no dtype is
    pinned, the cache is not fp8 yet."""
    return (
        not s.bounds.allow_fp8_kv
        and s.memory.gpu.fp8_kv
        and s.bounds.pinned.kv_cache_dtype is None
        and not sglang.is_fp8_kv_cache_dtype(s.effective.kv_cache_dtype)
    )


def to_fp8(settings: sglang.SglangSettings) -> sglang.SglangSettings:
    return dataclasses.replace(settings, kv_cache_dtype=sglang.FP8_KV_CACHE_DTYPE)


def propose_for_memory_short(
    s: SglangSituation,
    trials: list[sglang.SglangSettings],
    ceilings: list[float],
    minimum: float | None,
) -> tuple[list[sglang.SglangSettings], list[str]]:
    """fp8 candidates after a start-up short of memory, and the lines that explain them: the smallest
    fraction (the fewest prefill tokens given up for it, as the 16-bit raise) whose fp8 pool holds one
    full-context request, or, where the memory model does not explain the failure, the highest ceiling;
    then the context the fp8 pool holds at the highest ceiling. Computed whether or not fp8 is allowed
    (:func:`describe_permission` asks them); the rule offers them only where :func:`allows_fp8`."""
    eff8 = to_fp8(s.effective)
    trials8 = [to_fp8(t) for t in trials]
    best = ceilings.index(max(ceilings))
    wanted = compute_wanted_fraction(eff8, s.memory, minimum)
    candidates: list[sglang.SglangSettings] = []
    if wanted is not None:
        reaching = [t for t, c in zip(trials8, ceilings, strict=True) if c >= wanted]
        candidates += [dataclasses.replace(reaching[0], mem_fraction_static=wanted)] if reaching else []
    else:
        candidates.append(dataclasses.replace(trials8[best], mem_fraction_static=ceilings[best]))
    shorter = compute_shorter_context(s, trials8[best], minimum)
    if shorter is not None:
        candidates.append(shorter)
    lines = [
        f"{FP8_FLAGS} at --mem-fraction-static {c.mem_fraction_static}: the pool holds "
        f"{predict_pool_tokens(c, s.memory)} tokens, --context-length {c.context_length}"
        for c in candidates
        if predict_pool_tokens(c, s.memory) is not None
    ]
    return candidates, lines


def propose_for_oom(s: SglangSituation, lower: float) -> tuple[sglang.SglangSettings | None, str]:
    """fp8 at a smaller fraction after an out-of-memory outside the share, and why: the fraction less half
    the pool's bytes (the fp8 pool then holds the tokens the 16-bit one held), at least ``lower`` (the OOM
    step), and no lower than what holds one full-context request in fp8 (or a page, where the current pool
    never held one: :func:`~.sglang_fit.holds_full_request`). ``None`` where the model is not modelled or no
    smaller fraction is left."""
    eff = s.effective
    budget = compute_budget(eff, s.memory)
    if budget is None or budget.pre_load_bytes <= 0:
        return None, ""
    fraction = fraction_of(eff)
    freed = budget.pool_bytes / 2 / budget.pre_load_bytes
    target = min(lower, ceil_grid(fraction - freed))
    floor = compute_fraction_for_context(to_fp8(eff), s.memory) if holds_full_request(s) else None
    if floor is not None:
        target = max(target, floor)
    if target >= fraction - 1e-9:
        return None, ""
    candidate = dataclasses.replace(to_fp8(eff), mem_fraction_static=target)
    tokens = predict_pool_tokens(candidate, s.memory)
    return candidate, (
        f"{FP8_FLAGS} at --mem-fraction-static {target}: the pool keeps {tokens} tokens "
        f"({budget.max_total_tokens} in 16 bits at {fraction}) and leaves "
        f"{(fraction - target) * budget.pre_load_bytes / (1 << 30):.1f} GiB more outside the share"
    )


def describe_permission(s: SglangSituation, candidates: list[sglang.SglangSettings]) -> str:
    """``"; <an fp8 KV cache fits: set allowFp8KvCache>"`` where only the user's permission keeps out an fp8
    candidate the memory model says starts within the bounds; else ``""``."""
    if not _permission_only(s):
        return ""
    for candidate in candidates:
        clamped = clamp(candidate, s)
        if would_start(clamped, s):
            eff = compute_effective(clamped, s.memory)
            where = f" at --mem-fraction-static {fraction_of(eff)} --context-length {eff.context_length}"
            return "; " + describe_fp8_fits(FP8_FLAGS, allowed=False, where=where).rstrip(".")
    return ""
