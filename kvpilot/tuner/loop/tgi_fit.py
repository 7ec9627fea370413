"""TGI's memory model as the closed loop asks it: the settings TGI runs, the KV tokens a candidate holds, and
which candidates the history ruled out. Pure.

TGI's terms (:mod:`kvpilot.tuner.engines.tgi_budget`): ``--cuda-memory-fraction`` caps what torch may
allocate (default 1.0, of which the warm-up hands out ``TGI_WIGGLE_ROOM`` 0.9 --
``server/text_generation_server/models/globals.py`` line 32 at ``v3.3.7``); the warm-up runs a prefill of
``--max-batch-prefill-tokens`` and gives the KV cache what is free after it; the router refuses a
``--max-total-tokens`` above the KV tokens it inferred. So a smaller prefill leaves more KV, a larger fraction
more KV and less room for the run-time activations. A candidate passes :func:`pick`: clamped to the bounds
(:func:`clamp`: the fraction at least the memory-share bound and at most TGI's 1.0; ``--max-total-tokens``
within the context bounds; ``--max-concurrent-requests`` within the sequence bounds), left unset where it
matches TGI's default, dropped when it changes nothing, TGI would refuse it (``tgi.check_settings``) or the
history ruled it out (:func:`is_ruled_out`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner import errors, tgi
from kvpilot.tuner.engines import TgiBudget, compute_tgi_budget
from kvpilot.tuner.loop import engine_chain
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds
from kvpilot.tuner.loop.engine_flap import PressureChange
from kvpilot.tuner.loop.engine_state import EngineFailedRun, EngineProposal
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.types import GpuSpec

FailedRun = EngineFailedRun[tgi.TgiSettings]
"""Settings that failed, and how (``status.failedEngineArgs`` for TGI)."""
TgiProposal = EngineProposal[tgi.TgiSettings]


@dataclass(frozen=True, slots=True)
class TgiMemory:
    """The GPU and, when TGI's budget covers it, the model: what predicts the KV tokens and the defaults."""

    gpu: GpuSpec
    spec: ModelSpec | None = None
    """``None``, or a model TGI's budget does not cover: the defaults the launcher infers stay unknown."""
    weights_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class TgiSituation:
    """What a rule looks at: the settings (as written and with TGI's defaults filled in), the window since
    the last change, the memory, the ruled-out runs, the config."""

    current: tgi.TgiSettings
    effective: tgi.TgiSettings
    window: obs.ObservationWindow
    memory: TgiMemory
    failed: tuple[FailedRun, ...]
    bounds: TuningBounds
    policy: PolicyConfig
    now: float = 0.0
    itl_p95_objective: float | None = None
    """``spec.serving.slo.interTokenLatencyP95Seconds`` (``None``: none), read against TGI's time per output
    token (:data:`kvpilot.tuner.tgi.serving.TIME_PER_TOKEN`)."""
    pressure: tuple[PressureChange, ...] = ()
    """The loop's changes that found ``--max-concurrent-requests`` too many (KV pressure, the latency
    objective): the flap guard's memory (:mod:`.engine_flap`)."""


def compute_budget(settings: tgi.TgiSettings, memory: TgiMemory) -> TgiBudget | None:
    """TGI's warm-up budget for ``settings`` (``None``: the model is not modelled or TGI refuses them)."""
    if memory.spec is None:
        return None
    try:
        return compute_tgi_budget(
            memory.spec, memory.gpu, settings, weights_total_bytes=memory.weights_total_bytes
        )
    except errors.TunerError:
        return None


def compute_effective(settings: tgi.TgiSettings, memory: TgiMemory) -> tgi.TgiSettings:
    """``settings`` with TGI's defaults filled in: the fraction (1.0), the admission limit (128), one shard,
    and, where the model is modelled, the launcher's prefill and the warm-up's lengths
    (``max_batch_total_tokens`` stays as given: TGI infers it)."""
    filled = dataclasses.replace(
        settings,
        cuda_memory_fraction=settings.cuda_memory_fraction or tgi.CUDA_MEMORY_FRACTION_DEFAULT,
        max_concurrent_requests=settings.max_concurrent_requests or tgi.MAX_CONCURRENT_REQUESTS_DEFAULT,
        num_shard=settings.num_shard or 1,
    )
    budget = compute_budget(filled, memory)
    if budget is None:
        return filled
    return dataclasses.replace(
        filled,
        max_batch_prefill_tokens=budget.settings.max_batch_prefill_tokens,
        max_total_tokens=budget.settings.max_total_tokens,
        max_input_tokens=budget.settings.max_input_tokens,
    )


def predict_kv_tokens(settings: tgi.TgiSettings, memory: TgiMemory) -> int | None:
    """The KV tokens TGI infers at warm-up under ``settings`` (``tgi_batch_max_total_tokens``; ``None``: not
    modelled)."""
    budget = compute_budget(settings, memory)
    return None if budget is None else budget.max_batch_total_tokens


def fraction_of(settings: tgi.TgiSettings) -> float:
    return settings.cuda_memory_fraction or tgi.CUDA_MEMORY_FRACTION_DEFAULT


def prefill_of(settings: tgi.TgiSettings) -> int | None:
    return settings.max_batch_prefill_tokens


def concurrency_of(settings: tgi.TgiSettings) -> int:
    return settings.max_concurrent_requests or tgi.MAX_CONCURRENT_REQUESTS_DEFAULT


# --- what the history ruled out -------------------------------------------------------------------


def is_ruled_out(candidate: tgi.TgiSettings, s: TgiSituation) -> bool:
    """Whether a failed run of the history rules ``candidate`` out (on the same shards): the same settings;
    a warm-up prefill that did not fit, by as many prefill tokens or more and no larger fraction; a
    ``--max-total-tokens`` the KV cache could not hold, by as long a one or longer with no larger fraction
    and no smaller prefill; a run-time OOM, by as much memory or more for the KV (a fraction as large or
    larger) with no smaller prefill and no fewer concurrent requests."""
    eff = compute_effective(candidate, s.memory)
    for run in s.failed:
        failed = compute_effective(run.settings, s.memory)
        if failed == eff:
            return True
        if failed.num_shard != eff.num_shard:
            continue
        more_fraction = fraction_of(eff) > fraction_of(failed) + 1e-9
        prefill_ge = (prefill_of(eff) or 0) >= (prefill_of(failed) or 0)
        if run.kind == "start_oom" and prefill_ge and not more_fraction:
            return True
        total_ge = (eff.max_total_tokens or 0) >= (failed.max_total_tokens or 0)
        if run.kind == "start_memory_short" and total_ge and prefill_ge and not more_fraction:
            return True
        if (
            run.kind == "runtime_oom"
            and fraction_of(eff) >= fraction_of(failed) - 1e-9
            and prefill_ge
            and concurrency_of(eff) >= concurrency_of(failed)
        ):
            return True
    return False


def pick(s: TgiSituation, proposal: TgiProposal) -> tgi.TgiSettings | None:
    """The first candidate that, clamped to the bounds, changes something, TGI takes and the history did
    not rule out."""
    for candidate in proposal.candidates:
        settings = normalize(clamp(candidate, s), s)
        if compute_effective(settings, s.memory) == s.effective:
            continue
        try:
            tgi.check_settings(settings)
        except errors.InvalidEngineArgs:
            continue
        if not is_ruled_out(settings, s):
            return settings
    return None


def clamp(settings: tgi.TgiSettings, s: TgiSituation) -> tgi.TgiSettings:
    """``settings`` within the bounds: ``--max-concurrent-requests`` by the sequence bounds,
    ``--max-total-tokens`` by the context bounds (``--max-input-tokens`` kept below it), the fraction at
    least ``min_gpu_memory_utilization`` and at most TGI's own 1.0 (its warm-up keeps a tenth back)."""
    b = s.bounds
    running = engine_chain.clamp_sequences(settings.max_concurrent_requests, b)
    total = engine_chain.clamp_context(settings.max_total_tokens, b)
    given_input = settings.max_input_tokens
    max_input = min(given_input, total - 1) if given_input is not None and total is not None else given_input
    fraction = settings.cuda_memory_fraction
    if fraction is not None:
        fraction = round(min(max(fraction, b.min_gpu_memory_utilization), 1.0), 3)
        fraction = None if fraction >= tgi.CUDA_MEMORY_FRACTION_DEFAULT else fraction  # TGI's default
    return dataclasses.replace(
        settings,
        max_concurrent_requests=running,
        max_total_tokens=total,
        max_input_tokens=max_input,
        cuda_memory_fraction=fraction,
    )


def normalize(settings: tgi.TgiSettings, s: TgiSituation) -> tgi.TgiSettings:
    """Leave unset what the current settings leave unset, where TGI's default is the candidate's value."""
    return engine_chain.leave_defaults(settings, s.current, lambda x: compute_effective(x, s.memory))


def describe_change(before: tgi.TgiSettings, after: tgi.TgiSettings) -> str:
    """``--flag a -> b`` for every rendered field that differs (unset: TGI's default)."""
    return engine_chain.describe_flag_change(before, after, tgi.FLAGS)


def describe_settings(settings: tgi.TgiSettings) -> str:
    """The flags as rendered, on one line (TGI's defaults: the flags left out)."""
    return " ".join(tgi.build_tgi_args(settings)) or "TGI's defaults"


def explain_kv(settings: tgi.TgiSettings, memory: TgiMemory) -> tuple[str, ...]:
    """One line: the KV tokens the warm-up infers for ``settings`` (none when not modelled)."""
    budget = compute_budget(settings, memory)
    if budget is None:
        return ()
    return (
        f"--cuda-memory-fraction {budget.memory_fraction}, --max-batch-prefill-tokens "
        f"{budget.max_batch_prefill_tokens}: the warm-up infers {budget.max_batch_total_tokens} KV tokens",
    )
