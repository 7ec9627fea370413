"""The retuning rules: given what went wrong (or right), which settings to try next.

Each rule is a small pure function from a :class:`Situation` to a :class:`Proposal`: the
trigger, the evidence in words, and *candidate* settings in order of preference. Rules
do not check bounds, failed settings, cooldowns or whether vLLM would start; the chain
in :mod:`kvpilot.tuner.loop.policy` filters candidates through those steps and picks the
first survivor. That keeps each rule a few lines of arithmetic with its own table test.

The metrics rules live here (the crash rules in :mod:`kvpilot.tuner.loop.crash_remedies`, the larger
KV cache in :mod:`kvpilot.tuner.loop.kv_bound`, the latency and GPU-memory rules in
:mod:`kvpilot.tuner.loop.slo`), with what they all share: the :class:`Situation`, the
:class:`Proposal`, the capacity predictions and the single moves.

- ``KvPressure``: fp8 KV if allowed, else fewer sequences (sized to capacity when lengths are known).
- ``IdleCapacity``: a queue at the sequence limit with room in the KV cache (usage <= 0.50, or the
  window's lengths and usage say more fit at 0.88): more sequences (+25 %, up to x2 with a deep
  queue), within that room, under the anti-flap ceiling (lifted when the window shows room for it)
  and bisecting towards any count that failed.

The sequence limit is the admission limit (:attr:`Situation.admission_limit`): the engine's
``--max-num-active-seqs`` when its arguments carry one. kvpilot does not tune that cap (it is the user's);
under it a raise of ``--max-num-seqs`` admits nothing more and a cut below it does not start, so the rules
that move the sequences hold and name the flag (:mod:`kvpilot.tuner.vllm.active_seqs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.loop import history as history_mod
from kvpilot.tuner.loop import observations as obs
from kvpilot.tuner.loop.config import PolicyConfig, TuningBounds, TuningContext
from kvpilot.tuner.loop.history import HistoryEntry
from kvpilot.tuner.loop.observations import ObservationWindow
from kvpilot.tuner.types import GIB, EngineSettings, MemoryBudget

KV_PRESSURE = "KvPressure"
IDLE_CAPACITY = "IdleCapacity"


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything a rule may look at, already reduced to the current settings' evidence."""

    current: EngineSettings
    """Settings on the Deployment now, as written (``None`` = vLLM's default)."""
    effective: EngineSettings
    """``current`` as vLLM runs it: every field set (:func:`compute_effective`)."""
    budget: MemoryBudget
    window: ObservationWindow
    """Samples since the last change only."""
    context: TuningContext
    history: tuple[HistoryEntry, ...]
    now: float
    capacity_tokens: int | None
    """KV tokens the current settings hold: vLLM's report when there is one, else the plan's."""
    failed: tuple[EngineSettings, ...] = ()
    """Settings that crashed or failed to roll out (``status.failedSettings``)."""

    @property
    def bounds(self) -> TuningBounds:
        return self.context.bounds

    @property
    def policy(self) -> PolicyConfig:
        return self.context.policy

    @property
    def active_cap(self) -> int | None:
        """The engine's ``--max-num-active-seqs``, kvpilot's to read, not to tune."""
        return self.context.max_num_active_seqs

    @property
    def admission_limit(self) -> int:
        """The requests vLLM admits into RUNNING: the running requests are "at the sequence limit" against
        this, not ``max_num_seqs`` (:func:`kvpilot.tuner.vllm.compute_admission_limit`)."""
        return vllm.compute_admission_limit(self.effective.max_num_seqs or 1, self.active_cap)

    def describe_cap(self, *, more: bool) -> str:
        """Why a sequence rule holds under the cap (:func:`.vllm.describe_active_cap_binds`)."""
        return vllm.describe_active_cap_binds(
            self.admission_limit, self.effective.max_num_seqs or 1, more=more
        )

    def effective_of(self, settings: EngineSettings) -> EngineSettings:
        """``settings`` as vLLM would run them on this service's GPU."""
        return compute_effective(settings, self.context)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A rule's answer: try these settings, in this order, because of this."""

    trigger: str
    evidence: str
    candidates: tuple[EngineSettings, ...]
    crash: bool = False
    """A crash remedy: skips the metrics cooldown, and the current settings are marked failed."""
    exhausted: str = ""
    """What to say when no candidate survives the filters."""
    infeasible_when_exhausted: bool = False
    """No survivor means the service cannot run within the bounds (else: hold)."""
    urgent: bool = False
    """Ahead of a crash (e.g. GPU memory running out): skips the metrics cooldown like a crash remedy,
    but the current settings are not marked failed."""


# --- effective settings and capacity ------------------------------------------------------


def compute_effective(settings: EngineSettings, context: TuningContext) -> EngineSettings:
    """``settings`` with the release's defaults for the unset fields, on the service's GPU: what vLLM
    runs, and what the policy steps from (:func:`kvpilot.tuner.vllm.compute_effective_settings`)."""
    return vllm.compute_effective_settings(
        settings,
        context.gpu,
        vllm.parse_version(context.vllm_version),
        context.default_max_model_len,
        mm_prefix_item_tokens=context.mm_prefix_item_tokens,
    )


def compute_capacity_tokens(
    effective: EngineSettings, budget: MemoryBudget, window: ObservationWindow, observed_kv_tokens: int | None
) -> int | None:
    """KV tokens of the running settings: vLLM's own report beats the plan (calibration).

    The window's report counts only if ``vllm:cache_config_info`` was for these settings
    (same utilisation and dtype); ``observed_kv_tokens`` is the figure kept in
    ``status.calibration`` from an earlier window of the same settings.
    """
    reported = window.kv_capacity_tokens
    if reported and report_matches(effective, window):
        return reported
    if observed_kv_tokens:
        return observed_kv_tokens
    return budget.kv_cache_tokens or None


def report_matches(effective: EngineSettings, window: ObservationWindow) -> bool:
    gmu = window.reported_gpu_memory_utilization
    cur = effective.gpu_memory_utilization
    if gmu is not None and cur is not None and abs(gmu - cur) > 1e-6:
        return False
    dtype = window.reported_kv_cache_dtype
    return dtype is None or dtype == (effective.kv_cache_dtype or "auto")


def predict_kv_tokens(situation: Situation, candidate: EngineSettings) -> float | None:
    """KV tokens ``candidate`` would hold, scaled from the current capacity. ``None``: unknown.

    Linear in the memory handed to vLLM (``gpu_memory_utilization x total``) and inversely
    so in the KV element size (fp8 halves it). A cut of ``max_num_batched_tokens`` frees
    ``activation_batched_share`` of the planned activation peak in proportion; weights,
    graphs and the sampler are taken as unchanged, so this errs low.
    """
    base = situation.capacity_tokens
    cur = situation.effective
    budget = situation.budget
    if base is None:
        return None
    tokens = float(base)
    calibration = base / budget.kv_cache_tokens if budget.kv_cache_tokens else 1.0
    cur_gmu = cur.gpu_memory_utilization or 0.0
    new_gmu = candidate.gpu_memory_utilization or cur_gmu
    freed_bytes = 0.0
    if new_gmu != cur_gmu:
        if budget.kv_bytes_per_token <= 0 or budget.gpu_total_gib <= 0:
            return None
        freed_bytes += (new_gmu - cur_gmu) * budget.gpu_total_gib * GIB
    cur_batched, new_batched = cur.max_num_batched_tokens, candidate.max_num_batched_tokens
    if cur_batched and new_batched and new_batched < cur_batched and budget.kv_bytes_per_token > 0:
        share = situation.policy.activation_batched_share * (1.0 - new_batched / cur_batched)
        freed_bytes += share * budget.activation_gib * GIB
    if freed_bytes:
        tokens += calibration * freed_bytes / budget.kv_bytes_per_token
    if vllm.is_fp8(candidate.kv_cache_dtype) and not vllm.is_fp8(cur.kv_cache_dtype):
        tokens *= 2.0
    elif vllm.is_fp8(cur.kv_cache_dtype) and not vllm.is_fp8(candidate.kv_cache_dtype):
        tokens /= 2.0
    return max(tokens, 0.0)


# --- single moves ----------------------------------------------------------------------------


def effective_value(value: float | None) -> float:
    """A field of effective settings (always set; ``None`` only from a caller's bug)."""
    if value is None:
        raise AssertionError("effective settings have every field set")
    return value


def floor2(value: float) -> float:
    """Round down to two decimals (``gpu_memory_utilization`` granularity)."""
    return math.floor(value * 100 + 1e-9) / 100


def ceil2(value: float) -> float:
    return math.ceil(value * 100 - 1e-9) / 100


def compute_oom_step(gmu: float, policy: PolicyConfig) -> float:
    """How far one CUDA OOM lowers ``gpu_memory_utilization``: VPA's OOM bump on the headroom."""
    headroom = 1.0 - gmu
    grown = max(headroom * policy.oom_headroom_ratio, headroom + policy.oom_min_step)
    return min(grown - headroom, policy.max_gmu_step)


def lower_gmu(eff: EngineSettings, steps: int, policy: PolicyConfig) -> EngineSettings:
    gmu = effective_value(eff.gpu_memory_utilization)
    for _ in range(steps):
        gmu = floor2(gmu - compute_oom_step(gmu, policy))
    return eff.replace(gpu_memory_utilization=gmu)


def cut_seqs(eff: EngineSettings, policy: PolicyConfig) -> EngineSettings:
    seqs = eff.max_num_seqs or 1
    return eff.replace(max_num_seqs=max(1, math.floor(seqs * (1.0 - policy.seqs_step_down))))


def halve_batched(eff: EngineSettings, policy: PolicyConfig) -> EngineSettings:
    tokens = eff.max_num_batched_tokens or policy.batched_tokens_floor
    return eff.replace(max_num_batched_tokens=max(policy.batched_tokens_floor, tokens // 2))


def fit_context(tokens: float, policy: PolicyConfig) -> int:
    """The longest ``max_model_len`` to ask for when ``tokens`` fit, with margin and rounding."""
    usable = tokens * (1.0 - policy.context_margin)
    multiple = policy.context_multiple if usable >= 4 * policy.context_multiple else 16
    return int(usable // multiple) * multiple


# --- metrics rules ----------------------------------------------------------------------------


def propose_for_pressure(s: Situation) -> Proposal | None:
    """Sustained high KV usage *with* preemptions: fp8 KV if allowed, else fewer sequences."""
    p, w, eff = s.policy, s.window, s.effective
    high = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v >= p.kv_usage_high)
    rate = obs.compute_mean(w.samples, obs.preemption_rate) or 0.0
    if high < p.sustain_fraction or rate < p.preemption_rate_high:
        return None
    candidates: list[EngineSettings] = []
    if s.bounds.allow_fp8_kv and not vllm.is_fp8(eff.kv_cache_dtype):
        candidates.append(eff.replace(kv_cache_dtype="fp8"))
    seqs = eff.max_num_seqs or 1
    peak_running = obs.compute_max(w.samples, obs.running)
    base = min(seqs, math.ceil(peak_running)) if peak_running else seqs
    floor_step = math.floor(base * (1.0 - p.seqs_step_down))
    target = floor_step
    fit = _fit_seqs(s)
    if fit is not None and fit < base:
        target = max(fit, floor_step)
    exhausted = "already at the lower bound of maxNumSeqs"
    if s.active_cap is None:
        candidates.append(eff.replace(max_num_seqs=max(1, min(target, base - 1))))
    else:  # the running batch is the cap's: a cut below it does not start, one above it cuts nothing
        exhausted = s.describe_cap(more=False)
    return Proposal(
        trigger=KV_PRESSURE,
        evidence=(
            f"KV usage >= {p.kv_usage_high:.2f} in {high:.0%} of samples with "
            f"{rate:.2f} preemptions/s (peak running {peak_running or 0:.0f})"
        ),
        candidates=tuple(candidates),
        exhausted=exhausted,
    )


def propose_for_idle(s: Situation) -> Proposal | None:
    """Requests queue at the sequence limit and the KV cache has room: more sequences.

    Room is either sustained KV usage <= ``kv_usage_low`` (raise by the step, capped by what fits when
    that is known) or, inside the hysteresis band, what the window shows fits at ``target_kv_usage``
    (:func:`compute_room_seqs`): without such evidence the band holds.
    """
    p, w, eff = s.policy, s.window, s.effective
    low = obs.compute_fraction(w.samples, obs.kv_usage, lambda v: v <= p.kv_usage_low)
    queue = obs.compute_mean(w.samples, obs.waiting) or 0.0
    peak_running = obs.compute_max(w.samples, obs.running) or 0.0
    seqs = eff.max_num_seqs or 1
    limit = s.admission_limit
    if queue < p.queue_min or peak_running < p.seqs_saturation * limit:
        return None
    room = compute_room_seqs(s)
    idle = low >= p.sustain_fraction
    if not idle and (room is None or room < limit * (1.0 + p.min_seqs_raise)):
        return None  # inside the band and no evidence that more sequences fit: hysteresis
    if s.active_cap is not None:  # the queue is at the cap: more --max-num-seqs admits nobody
        return Proposal(
            trigger=IDLE_CAPACITY,
            evidence=f"{queue:.1f} requests wait while {peak_running:.0f} of {limit} admitted sequences run "
            f"with room in the KV cache" + (f" for {room} at {p.target_kv_usage:.2f}" if room else ""),
            candidates=(),
            exhausted=s.describe_cap(more=True),
        )
    step = min(p.seqs_step_up_max, max(p.seqs_step_up, queue / max(peak_running, 1.0)))
    target = math.ceil(seqs * (1.0 + step))
    caps = [f"step +{step:.0%}"]
    demand = math.ceil(peak_running + queue)
    if room is not None and not idle and target < room:
        # inside the band the raise stands on the measured room alone: take it whole, in one rollout (a
        # queue measured at the limit understates what more sequences would admit)
        target, caps = room, [f"KV room at {p.target_kv_usage:.2f} usage ({s.capacity_tokens} tokens)"]
    elif room is not None and target < min(room, demand):
        # the window measured the room: the step's cap only guards a raise taken without that evidence
        target, caps = demand, [f"the queue: {demand} sequences asked for"]
    if room is not None and room < target:
        target, caps = room, [f"KV room at {p.target_kv_usage:.2f} usage ({s.capacity_tokens} tokens)"]
    ceiling = history_mod.compute_pressure_ceiling(s.history, KV_PRESSURE, s.now - p.flap_guard_seconds)
    lifted = (
        ceiling is not None
        and room is not None
        and _usage_room(s) is not None
        and room >= ceiling
        and queue_persists(s)
    )
    if ceiling is not None and not lifted and ceiling - 1 < target:
        target, caps = ceiling - 1, [f"below {ceiling}, where KV pressure found the cache full"]
    peak = compute_peak_seqs(s)
    if peak is not None and peak < target:
        target, caps = peak, [f"{peak}, where KV pressure that came back within the hour settled"]
    failed_at = _failed_seqs_ceiling(s, eff)
    trade = None
    if failed_at is not None and (seqs + failed_at) // 2 < target:
        trade = _trade_headroom_for(s, target)
        # bisect between what runs and what failed, rather than creeping up one by one
        target, caps = (seqs + failed_at) // 2, [f"halfway to {failed_at}, which failed with these settings"]
    least, cut = compute_min_raise(s)
    if target < seqs * (1.0 + least):
        if cut is not None and target > seqs:
            caps = [f"a raise under {least:.0%} after KV pressure cut from {cut}"]
        target = seqs
    raised = _with_seqs(eff, target)
    candidates: tuple[EngineSettings, ...] = (raised,) if target > seqs else ()
    if trade is not None:
        candidates = (trade, *candidates)
        gmu = trade.gpu_memory_utilization
        caps.append(f"or {trade.max_num_seqs} at utilisation {gmu} (headroom traded)")
    mean_kv = obs.compute_mean(w.samples, obs.kv_usage) or 0.0
    where = (
        f"KV usage <= {p.kv_usage_low:.2f} in {low:.0%} of samples"
        if idle
        else f"mean KV usage {mean_kv:.2f} with room for {room} sequences at {p.target_kv_usage:.2f}"
    )
    lift = f"; the cut below {ceiling} is lifted: the window shows room for it" if lifted else ""
    return Proposal(
        trigger=IDLE_CAPACITY,
        evidence=(
            f"{where} while {queue:.1f} requests wait and {peak_running:.0f} of {seqs} sequences run "
            f"(capped by {'; '.join(caps)}){lift}"
        ),
        candidates=candidates,
        exhausted="no more sequences fit (" + caps[0] + ")",
    )


def queue_persists(s: Situation) -> bool:
    """Requests still wait at the window's newest sample (at least ``queue_min``): the window measured the
    load that is there now.

    The flap guard's lift trusts the room a window shows at a limit KV pressure found full. A window whose
    queue drained by its end spans a change of load (a burst that ended, its backlog served): its mean
    queue and its usage per running sequence mix the two, and the room they show is not the present load's
    (bench long-output-bursts: the first burst's backlog of 432 on the mean, none at the newest sample,
    showed room for 191 at the 139 the burst had found full; the next burst cut 191 -> 146 -> 109)."""
    return (obs.compute_latest(s.window.samples, obs.waiting) or 0.0) >= s.policy.queue_min


def compute_min_raise(s: Situation) -> tuple[float, int | None]:
    """The smallest relative raise of ``max_num_seqs`` worth a rollout, and the value KV pressure cut from
    that sets it: ``flap_min_raise`` within ``flap_guard_seconds`` of such a cut, or later while no raise
    has followed it (the cut is still what the service knows of its peak load); else ``min_seqs_raise``."""
    p = s.policy
    cut = history_mod.compute_pressure_ceiling(s.history, KV_PRESSURE, s.now - p.flap_guard_seconds)
    if cut is None:
        cut = history_mod.compute_unanswered_cut(s.history, KV_PRESSURE)
    return (p.min_seqs_raise, None) if cut is None else (p.flap_min_raise, cut)


def compute_peak_seqs(s: Situation) -> int | None:
    """At most this many sequences, or ``None``: what the last KV-pressure cut set, for
    ``peak_memory_seconds`` after it, when that pressure came back within ``flap_guard_seconds`` of an
    earlier pressure change (:func:`history_mod.compute_recurring_cut`). The flap guard's lift trusts a
    calm window's room; a peak that recurs says the calm will end."""
    p = s.policy
    return history_mod.compute_recurring_cut(
        s.history, KV_PRESSURE, since=s.now - p.peak_memory_seconds, gap=p.flap_guard_seconds
    )


def compute_room_seqs(s: Situation, scale: float = 1.0) -> int | None:
    """Sequences the KV cache holds at ``target_kv_usage``: the fewer of what the observed lengths say
    (:func:`_fit_seqs`) and what the observed usage per running sequence says; ``None`` if neither.
    ``scale``: for a cache that many times the current one (a candidate's predicted tokens over today's)."""
    known = [x for x in (_fit_seqs(s, scale), _usage_room(s, scale)) if x is not None]
    return min(known) if known else None


def _usage_room(s: Situation, scale: float = 1.0) -> int | None:
    """Sequences at ``target_kv_usage`` by the window's KV usage per running sequence, over the samples
    where the sequence limit binds (running at ``seqs_saturation`` of it) when there are any: a raise of the
    limit changes only those; a sample held below it by the KV cache (a burst of long prompts still
    draining) says nothing of what the next sequences cost."""
    samples = s.window.samples
    limit = s.admission_limit
    if limit:
        bound = tuple(
            x for x in samples if x.running is not None and x.running >= s.policy.seqs_saturation * limit
        )
        samples = bound or samples
    mean_kv = obs.compute_mean(samples, obs.kv_usage)
    mean_running = obs.compute_mean(samples, obs.running)
    if not mean_kv or not mean_running or mean_kv <= 0 or mean_running < 1:
        return None
    room = s.policy.target_kv_usage * mean_running / mean_kv * scale
    if not math.isfinite(room):  # a usage too small to divide by (a denormal sample) says nothing of room
        return None
    return max(1, math.floor(room))


def _failed_seqs_ceiling(s: Situation, settings: EngineSettings) -> int | None:
    """The fewest sequences above ``settings``' that failed with everything else as in ``settings``
    (effective): raising to it or past it fails again."""
    mine = settings.replace(max_num_seqs=None, max_num_batched_tokens=None)
    seqs = [
        f.max_num_seqs
        for f in (s.effective_of(x) for x in s.failed)
        if f.max_num_seqs is not None
        and f.max_num_seqs > (settings.max_num_seqs or 0)
        and f.replace(max_num_seqs=None, max_num_batched_tokens=None) == mine
    ]
    return min(seqs) if seqs else None


def _with_seqs(settings: EngineSettings, seqs: int) -> EngineSettings:
    raised = settings.replace(max_num_seqs=seqs)
    if raised.max_num_batched_tokens is not None and raised.max_num_batched_tokens < seqs:
        raised = raised.replace(max_num_batched_tokens=seqs)
    return raised


def _trade_headroom_for(s: Situation, target: int) -> EngineSettings | None:
    """``target`` sequences at one OOM step less utilisation, when a raise to ``target`` failed at the
    current one: the failure of more sequences is most often memory outside vLLM's budget (CUDA graphs
    and the sampler grow with them), which the step gives back. Only while the KV cache at the lower
    utilisation still holds ``target`` sequences of the observed length at ``target_kv_usage``, and
    below any count that failed at that utilisation. ``None`` when not worth trying."""
    p, eff = s.policy, s.effective
    lower = lower_gmu(eff, 1, p)
    failed_there = _failed_seqs_ceiling(s, lower)
    if failed_there is not None and failed_there <= target:
        return None
    length = s.window.compute_occupied_tokens(p.output_occupancy)
    tokens = predict_kv_tokens(s, lower)
    if length is None or tokens is None or tokens * p.target_kv_usage < target * length:
        return None
    return _with_seqs(lower, target)


def _fit_seqs(s: Situation, scale: float = 1.0) -> int | None:
    """Sequences of the observed mean occupancy (prompt + ``output_occupancy`` x output) that fill the
    KV cache to ``target_kv_usage``."""
    length = s.window.compute_occupied_tokens(s.policy.output_occupancy)
    if s.capacity_tokens is None or length is None:
        return None
    return max(1, math.floor(s.capacity_tokens * scale * s.policy.target_kv_usage / length))
