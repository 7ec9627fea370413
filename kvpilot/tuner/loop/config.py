"""The closed loop's knobs: how cautious the retuning policy is, and the user's bounds.

Two frozen dataclasses, every field with a default, a unit and the reason for the
default (the VPA recommender's ``config.go`` and kopf's ``configuration.py`` are the
models). :class:`PolicyConfig` is kvpilot's own behaviour; the four fields that
``spec.tuning`` exposes (cooldown, changes per hour, rollout deadline, fp8) are filled in
by the operator from the InferenceService. :class:`TuningBounds` is
``spec.tuning.bounds`` plus what the GPU allows. Read by :mod:`kvpilot.tuner.loop.remedies`
and :mod:`kvpilot.tuner.loop.policy`; imports nothing of ours but the value objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings, GpuSpec, ServingBounds, SettingsChanges


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Stability and step-size settings of the retuning policy. Times in seconds."""

    # --- stability ---------------------------------------------------------------------
    cooldown_seconds: float = 300.0
    """Minimum time between a retune and the next *metrics-driven* change (``spec.tuning.cooldownSeconds``),
    at least ``restart_seconds + window_seconds`` (see :attr:`cooldown_restart_windows`). Five minutes
    as a floor, eight with the default restart: each change costs a vLLM restart (load, compile, CUDA
    graphs: minutes, ``restart_seconds``), and the next change must be judged on a full window of
    metrics of the new settings, which exist only once they run. The initial plan starts no cooldown:
    the first metrics-driven change waits only for ``min_samples`` fresh samples of the planned pods
    (the metrics gate), since nothing earlier than the plan is being judged."""
    restart_seconds: float = 180.0
    """Start-to-Ready seconds of a vLLM pod, assumed when ``Evidence.restart_seconds`` (the measured
    figure, from the pods' start and Ready times) is not given. Three minutes: the bench's and e2e's 8B
    start-up is about 150 s (weights load, ``torch.compile``, CUDA-graph capture); larger models take
    longer, which the measured figure then says."""
    compile_seconds: float = 20.0
    """The part of a restart a warm compile cache spares: the pods keep vLLM's caches on a persistent
    volume (``Evidence.compile_cache_persistent``) and the change touches no setting in vLLM's compile hash
    (:data:`kvpilot.tuner.vllm.COMPILE_HASH_SETTINGS`), so the trade (:mod:`kvpilot.tuner.loop.trade`)
    prices it without this term. 20 s: "torch.compile takes" 25 s cold less 5 s to load the graphs warm,
    the medians of real GPU logs (the fleet's start-up calibration, ``e2e/fleet/truth.py``)."""
    cooldown_restart_windows: float = 1.0
    """The cooldown is at least ``restart_seconds + cooldown_restart_windows x window_seconds``: the new
    pod's start, then this many full metrics windows of it before the next metrics-driven change.
    One window: the metrics gate and the rules already judge one window; more only slows a ramp."""
    min_change_interval_seconds: float = 60.0
    """Minimum time between any two changes, crash remedies included. Crash remedies skip the
    cooldown (a crash loop must not wait minutes) but only react to a crash of the
    *current* settings, so they cannot pile up on the same evidence."""
    max_changes_per_hour: int = 4
    """Retunes in any rolling hour (``spec.tuning.maxChangesPerHour``); rollbacks are exempt."""
    rollout_deadline_seconds: float = 900.0
    """A rollout not Ready after this long has failed (``spec.tuning.rolloutDeadlineSeconds``), unless the
    service's starts take longer: see :attr:`rollout_deadline_start_factor`."""
    rollout_deadline_start_factor: float = 1.5
    """The deadline is at least this many times the start the new pods are expected to take (the longer of
    the measured start, ``Evidence.restart_seconds``, and a cold start predicted from the checkpoint's size:
    :func:`kvpilot.tuner.loop.rollout.compute_deadline_seconds`), so settings still loading their weights are
    never judged failed. 1.5: a start varies with the node's network and disk; a late verdict on a start
    that hangs costs half a start more, a false one costs a rollback and settings lost for good."""
    weights_download_gib_per_s: float = 0.5
    """The download rate a cold start is predicted with: ``huggingface_hub``'s ``snapshot_download`` (what
    kvpilot's init container runs) from the Hub's CDN in a cloud region, about 4 Gbit/s. A slower network
    shows in the measured start, which the deadline follows once one pod has started."""
    probation_seconds: float = 300.0
    """After a rollout's pods are all Ready, how long the new settings must run without a crash before
    they become *good* (``lastGoodSettings``). Ready only says vLLM started: a raise of ``max_num_seqs``
    or ``gpu_memory_utilization`` typically OOMs later, at the first real batch (CUDA graphs, the
    sampler, a long prompt). A crash of the new settings on probation is a failed rollout: roll back
    to the previous good settings, as for a crash before Ready. Five minutes: one metrics window, and
    under the default cooldown, so probation never delays a metrics-driven change. 0 = good at Ready."""
    flap_guard_seconds: float = 3600.0
    """For this long after KV pressure lowered ``max_num_seqs`` from S, raises stay below S -- unless the
    window at the lower setting shows room for S sequences at ``target_kv_usage`` (by the observed usage
    per running sequence, and by the observed lengths when known): the cut was then a transient (a burst of
    long requests), and the gap between ``target_kv_usage`` (0.88) and ``kv_usage_high`` (0.90) is the
    hysteresis that keeps the raise from re-triggering the cut under the same load. One hour: VPA's
    recommender likewise decays its peaks over hours, not minutes."""

    # --- metrics -------------------------------------------------------------------------
    window_seconds: float = 300.0
    """Length of the metrics window the operator fetches (Prometheus ``query_range``)."""
    staleness_seconds: float = 120.0
    """Newest sample older than this = metrics stale = hold (four scrape intervals of 30 s)."""
    min_samples: int = 5
    """Samples (since the last change) needed before metrics can drive a change."""
    sustain_fraction: float = 0.8
    """A condition is *sustained* when it holds in at least this share of the window's samples."""

    # --- hysteresis bands ------------------------------------------------------------------
    kv_usage_high: float = 0.90
    """KV usage at or above this is pressure; vLLM throughput "dramatically breaks" near 0.91
    (vllm#18115). Higher than WVA's 0.80 scale-out threshold because a retune costs a restart."""
    kv_usage_low: float = 0.50
    """KV usage at or below this with a queue at the sequence limit means spare capacity, however the
    lengths are known. Inside the 0.50..0.90 band a queue at the limit raises ``max_num_seqs`` only up
    to what the observed lengths and usage say fits at ``target_kv_usage``; without such room the band
    is hysteresis and nothing changes."""
    preemption_rate_high: float = 0.05
    """Preemptions per second on the worst pod (3 a minute) that, with high KV usage, count as a storm."""
    queue_min: float = 1.0
    """Mean waiting requests on the worst pod for "a queue" (WVA uses 5 for scale-out; we only
    raise ``max_num_seqs``, which is cheap to undo)."""
    seqs_saturation: float = 0.9
    """Running at or above this share of ``max_num_seqs`` = the sequence limit is what queues requests."""
    target_kv_usage: float = 0.88
    """KV share that a sized ``max_num_seqs`` aims at, leaving room for growth: just under
    ``kv_usage_high``, where pressure starts. vLLM's scheduler admits a request only when the cache has
    blocks for it, so a full cache queues, and it preempts only when running sequences outgrow it; with
    many sequences their lengths average out. The engine model (``bench/closed_loop.py``, band-queue:
    H100, 1,500 + 500 lognormal tokens) serves 224 sequences at a mean usage of 0.92 without a preemption
    and collapses into preemptions at 256; sized at 0.80 the loop stopped at 192-200 sequences, 3-8 %
    below the best static setting. 0.80 was WVA's saturation point, a scale-out threshold: a replica
    is cheap to add, a retune costs a restart."""
    output_occupancy: float = 0.5
    """Share of its output a sequence holds in KV on average over its life when sizing ``max_num_seqs``:
    a sequence holds its prompt plus the output generated so far, which grows linearly from 0 to the
    full output, so ``prompt + 0.5 x output`` on average (the bench's fluid model admits on the same
    figure; vLLM V1 allocates KV blocks as tokens are generated, not up front). ``target_kv_usage``
    keeps the margin for sequences near their end. 1.0 = the old, conservative full-length sizing."""

    # --- step sizes ------------------------------------------------------------------------
    seqs_step_down: float = 0.25
    """Largest relative cut of ``max_num_seqs`` in one change."""
    seqs_step_up: float = 0.25
    """Relative raise of ``max_num_seqs`` in one change when a queue builds up ..."""
    seqs_step_up_max: float = 1.0
    """... growing with the queue (``waiting / running``) up to this (doubling) when it is deep: a
    backlog as long as the running batch needs far more than +25 %. KV capacity still caps it."""
    min_seqs_raise: float = 0.05
    """Smallest relative raise worth a rollout (VPA likewise skips changes under 10 %): smaller
    raises are held, which also ends the bisection towards a value that failed."""
    peak_memory_seconds: float = 7200.0
    """KV pressure that comes back within ``flap_guard_seconds`` of an earlier pressure change is the
    service's peak load (bursts), not a transient: for this long after the last cut, raises stay at what it
    set, whatever room a calm window shows between peaks (bench ``long-output-bursts``: raised between
    bursts and cut again at each). Two hours: a load that peaks hourly keeps the memory between peaks."""
    flap_min_raise: float = 0.25
    """Smallest relative raise worth a rollout within ``flap_guard_seconds`` of a KV-pressure cut of
    ``max_num_seqs`` (``min_seqs_raise`` otherwise). The cut showed that this service's load at times
    needs fewer sequences than it had; a raise back towards them buys at most its own few per cent of
    throughput while the load that forced the cut lasts, and costs a restart now and, when that load
    returns, a second one to cut again (bench ``oom-and-context``: 15 -> 14 -> 15; ``long-output-bursts``:
    4 raises between bursts, each cut again). One ``seqs_step_up``: only a raise the size of a normal
    step earns the risk."""
    oom_headroom_ratio: float = 1.2
    """After a CUDA OOM the non-vLLM headroom ``1 - gpu_memory_utilization`` grows by this factor
    (VPA's ``DefaultOOMBumpUpRatio``, 20 %) ..."""
    oom_min_step: float = 0.02
    """... and by at least this much (VPA's +100 MiB floor, here 2 % of the GPU: 1.6 GiB on 80 GB)."""
    oom_large_allocation: float = 0.5
    """A CUDA OOM whose failed allocation ("Tried to allocate X") is at least this share of the
    headroom ``1 - gpu_memory_utilization`` is *batch-shaped*: one tensor sized by the batch (CUDA-graph
    capture and the sampler's logits grow with ``max_num_seqs``, the profile's activations with
    ``max_num_batched_tokens``). Cutting what sizes it frees the memory at once; walking utilisation
    down 2 % a crash would take several crashes. Smaller allocations mean the headroom filled up with
    many small ones (fragmentation, NCCL, the allocator's cache): more headroom is the cure. One half:
    an allocation of half the headroom cannot be fragmentation."""
    max_gmu_step: float = 0.05
    """Largest change of ``gpu_memory_utilization`` in one change -- except after a batch-shaped CUDA
    OOM whose printed shortfall (tried minus free) sizes the step exactly and the KV cache at the lower
    utilisation still holds every sequence at ``target_kv_usage``: a guessed step is bounded, a measured
    one is not (walking down 5 % a crash costs a crash per step)."""
    oom_growth_min_running: float = 16.0
    """A CUDA OOM, or free GPU memory below the early-warning floor, under a rising batch of at least this
    many requests bounds the memory per request from that one point (the memory used outside vLLM's
    budget over the running batch) and sizes the headroom for ``max_num_seqs``: the next pod, one step
    further, would run a few more and crash again (bench scenario ``oom-crash``: 20 MiB a request outside
    vLLM's budget, the backlog after a restart filling the batch in seconds) ..."""
    oom_growth_lookback_seconds: float = 60.0
    """... rising: no sample of these settings this long before the crash, or none within a
    ``seqs_step_down`` fewer running; a steady batch that OOMs (another process) is not the batch."""
    oom_trade_kv_floor: float = 0.80
    """After a batch-shaped CUDA OOM with no lengths observed yet (at start-up), less utilisation is
    traded for the sequences only while the KV cache keeps at least this share of today's capacity
    (bench scenario ``startup-oom``: 0.80 keeps 256 sequences at utilisation 0.80, where a cut to 128
    loses 1 % of goodput over three hours)."""
    kv_bound_min_gain: float = 0.03
    """A larger KV cache (:mod:`kvpilot.tuner.loop.kv_bound`) must be predicted to grow by at least this
    share. Small on purpose: the prediction scales vLLM's own reported capacity by the bytes a change
    frees, so it is close, and a few per cent is often the difference between two long requests
    preempting each other and both fitting (bench scenario ``startup-kv``: +5 % lifts goodput by a third);
    the restart's cost is weighed separately (:mod:`kvpilot.tuner.loop.trade`)."""
    trade_persistence_max_seconds: float = 3600.0
    """The restart-cost trade (:mod:`kvpilot.tuner.loop.trade`) counts a change's gain over the cooldown
    plus the time the loop has already held for the same trigger, up to this. A condition that has lasted
    ``t`` is taken to last about ``t`` more (nothing else is known about its future), so a small gain
    that persists is eventually worth a restart, and a transient never is. One hour: beyond that, load
    patterns (day and night) change what the gain is."""
    batched_tokens_floor: int = 2048
    """``max_num_batched_tokens`` is never cut below this: smaller prefill chunks cost more steps per
    prompt than the activation memory they free is worth."""
    activation_batched_share: float = 0.5
    """Share of the planned activation peak (``MemoryBudget.activation_gib``) taken to shrink in
    proportion when ``max_num_batched_tokens`` is cut, to predict the KV tokens the cut frees. The
    profile run's forward pass over the batch's tokens is linear in them, the sampler's
    ``max_num_seqs x vocabulary`` logits and fixed buffers are not (``kvpilot.tuner.memory.budget``);
    one half errs low for dense models, and a wrong prediction is corrected by vLLM's next start-up text."""
    context_margin: float = 0.02
    """A fitted ``max_model_len`` stays this share under what vLLM says fits (its auto-fit can land
    exactly on pool capacity, without room for the null block)."""
    context_multiple: int = 256
    """A fitted ``max_model_len`` is rounded down to a multiple of this."""

    # --- latency SLOs and GPU memory telemetry (kvpilot.tuner.loop.slo) --------------------------
    slo_raise_margin: float = 0.9
    """Raises of ``max_num_seqs`` stop while the inter-token latency p95 is above this share of its SLO."""
    slo_batched_tokens_max: int = 16384
    """A TTFT-driven raise of ``max_num_batched_tokens`` goes no higher."""
    gpu_memory_free_min_gib: float = 1.0
    """dcgm-exporter's free framebuffer below this (or below :attr:`gpu_memory_free_min_fraction` of the
    device) is the early warning of a CUDA OOM: lower the utilisation before it happens."""
    gpu_memory_free_min_fraction: float = 0.02
    gpu_memory_horizon_seconds: float = 600.0
    """A falling free framebuffer that would cross the minimum within this long warns too."""


@dataclass(frozen=True, slots=True)
class TuningBounds:
    """What the policy may set (``spec.tuning.bounds`` and friends). ``None`` = unbounded."""

    min_max_num_seqs: int = 1
    max_max_num_seqs: int | None = None
    min_gpu_memory_utilization: float = 0.5
    max_gpu_memory_utilization: float = 0.95
    min_max_model_len: int | None = None
    """The shortest context the user accepts (``serving.minContextLength`` / ``bounds.maxModelLen.min``)."""
    max_max_model_len: int | None = None
    allow_fp8_kv: bool = False
    """The user allows an fp8 KV cache *and* the GPU supports one (the operator ANDs the two)."""
    pinned: EngineSettings = EngineSettings()
    """The user's fixed values (``spec.engine.pinned`` and tuned flags in ``extraArgs``): :meth:`clamp` puts
    each back, so no candidate of the loop changes one (a pinned KV dtype also keeps fp8 out)."""

    @classmethod
    def from_serving(
        cls, serving: ServingBounds, fp8_supported: bool = True, pinned: EngineSettings | None = None
    ) -> TuningBounds:
        """The loop's bounds from the planner's :class:`ServingBounds`: the same bounds bind both; ``pinned``
        the values the loop never changes."""
        pinned = pinned or EngineSettings()
        return cls(
            pinned=pinned,
            min_max_num_seqs=serving.min_max_num_seqs,
            max_max_num_seqs=serving.max_max_num_seqs,
            min_gpu_memory_utilization=serving.min_gpu_memory_utilization,
            max_gpu_memory_utilization=serving.max_gpu_memory_utilization,
            min_max_model_len=serving.min_context,
            max_max_model_len=serving.max_context,
            allow_fp8_kv=serving.allow_fp8_kv and fp8_supported and pinned.kv_cache_dtype is None,
        )

    def clamp(self, settings: EngineSettings) -> EngineSettings:
        """``settings`` with every set numeric field moved into the bounds (the KV dtype is left
        alone: the policy only ever *introduces* fp8 when ``allow_fp8_kv``)."""
        changes: SettingsChanges = {}
        gmu = settings.gpu_memory_utilization
        if gmu is not None:
            changes["gpu_memory_utilization"] = min(
                max(gmu, self.min_gpu_memory_utilization), self.max_gpu_memory_utilization
            )
        seqs = settings.max_num_seqs
        if seqs is not None:
            seqs = max(seqs, self.min_max_num_seqs)
            if self.max_max_num_seqs is not None:
                seqs = min(seqs, self.max_max_num_seqs)
            changes["max_num_seqs"] = seqs
        mml = settings.max_model_len
        if mml is not None:
            if self.min_max_model_len is not None:
                mml = max(mml, self.min_max_model_len)
            if self.max_max_model_len is not None:
                mml = min(mml, self.max_max_model_len)
            changes["max_model_len"] = mml
        changes.update(self.pinned.as_dict())  # type: ignore[typeddict-item]
        return settings.replace(**changes)

    def contains(self, settings: EngineSettings) -> bool:
        """Whether ``settings`` is already within the bounds."""
        return self.clamp(settings) == settings


@dataclass(frozen=True, slots=True)
class LatencySlo:
    """``spec.serving.slo``: 95th-percentile objectives, in seconds (``None``: no objective)."""

    ttft_p95_seconds: float | None = None
    itl_p95_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class TuningContext:
    """What one service is tuned on and within: its GPU, the vLLM release, the model's own maximum
    context, the bounds and the policy. Fixed for a service between spec changes."""

    gpu: GpuSpec
    """The GPU the pods run on: vLLM's batch defaults depend on it (A100s and >= 160 GiB differ)."""
    default_max_model_len: int
    """The model's maximum context for this release: what an unset ``max_model_len`` means."""
    mm_prefix_item_tokens: int = 0
    """A multimodal prefix-LM's largest item (``ModelSpec.mm_prefix_item_tokens``): vLLM's batch floor."""
    bounds: TuningBounds = TuningBounds()
    policy: PolicyConfig = PolicyConfig()
    vllm_version: str = vllm.PINNED_VLLM_VERSION
    slo: LatencySlo | None = None
    """The service's latency objectives (``spec.serving.slo``), if any."""
    max_num_active_seqs: int | None = None
    """The engine's ``--max-num-active-seqs`` (the user's arguments; kvpilot does not tune it): the admission
    limit the sequence rules compare the running requests with (:mod:`kvpilot.tuner.vllm.active_seqs`)."""
