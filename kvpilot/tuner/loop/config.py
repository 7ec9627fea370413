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
    cooldown_seconds: float = 600.0
    """Minimum time between a change and the next *metrics-driven* change (``spec.tuning.cooldownSeconds``).
    Ten minutes: a vLLM restart costs minutes of load/compile/graph capture, and a 5-minute
    window of post-change metrics is needed before judging the change."""
    min_change_interval_seconds: float = 60.0
    """Minimum time between any two changes, crash remedies included. Crash remedies skip the
    cooldown (a crash loop must not wait ten minutes) but only react to a crash of the
    *current* settings, so they cannot pile up on the same evidence."""
    max_changes_per_hour: int = 4
    """Retunes in any rolling hour (``spec.tuning.maxChangesPerHour``); rollbacks are exempt."""
    rollout_deadline_seconds: float = 900.0
    """A rollout not Ready after this long has failed (``spec.tuning.rolloutDeadlineSeconds``)."""
    probation_seconds: float = 300.0
    """After a rollout's pods are all Ready, how long the new settings must run without a crash before
    they become *good* (``lastGoodSettings``). Ready only says vLLM started: a raise of ``max_num_seqs``
    or ``gpu_memory_utilization`` typically OOMs later, at the first real batch (CUDA graphs, the
    sampler, a long prompt). A crash of the new settings on probation is a failed rollout: roll back
    to the previous good settings, as for a crash before Ready. Five minutes: one metrics window, and
    under the default cooldown, so probation never delays a metrics-driven change. 0 = good at Ready."""
    flap_guard_seconds: float = 3600.0
    """For this long after KV pressure lowered ``max_num_seqs`` from S, raises stay below S."""

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
    """KV usage at or below this with a queue means spare capacity. The 0.50..0.90 gap is the
    hysteresis band: nothing inside it changes anything."""
    preemption_rate_high: float = 0.05
    """Preemptions per second on the worst pod (3 a minute) that, with high KV usage, count as a storm."""
    queue_min: float = 1.0
    """Mean waiting requests on the worst pod for "a queue" (WVA uses 5 for scale-out; we only
    raise ``max_num_seqs``, which is cheap to undo)."""
    seqs_saturation: float = 0.9
    """Running at or above this share of ``max_num_seqs`` = the sequence limit is what queues requests."""
    target_kv_usage: float = 0.80
    """KV share that a sized ``max_num_seqs`` aims at (WVA's saturation point), leaving room for growth."""

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
    oom_headroom_ratio: float = 1.2
    """After a CUDA OOM the non-vLLM headroom ``1 - gpu_memory_utilization`` grows by this factor
    (VPA's ``DefaultOOMBumpUpRatio``, 20 %) ..."""
    oom_min_step: float = 0.02
    """... and by at least this much (VPA's +100 MiB floor, here 2 % of the GPU: 1.6 GiB on 80 GB)."""
    max_gmu_step: float = 0.05
    """Largest change of ``gpu_memory_utilization`` in one change."""
    batched_tokens_floor: int = 2048
    """``max_num_batched_tokens`` is never cut below this: smaller prefill chunks cost more steps per
    prompt than the activation memory they free is worth."""
    context_margin: float = 0.02
    """A fitted ``max_model_len`` stays this share under what vLLM says fits (its auto-fit can land
    exactly on pool capacity, without room for the null block)."""
    context_multiple: int = 256
    """A fitted ``max_model_len`` is rounded down to a multiple of this."""


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

    @classmethod
    def from_serving(cls, serving: ServingBounds, fp8_supported: bool = True) -> TuningBounds:
        """Bounds from the planner's :class:`ServingBounds` (no sequence bounds there)."""
        return cls(
            min_gpu_memory_utilization=serving.min_gpu_memory_utilization,
            max_gpu_memory_utilization=serving.max_gpu_memory_utilization,
            min_max_model_len=serving.min_context,
            max_max_model_len=serving.max_context,
            allow_fp8_kv=serving.allow_fp8_kv and fp8_supported,
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
        return settings.replace(**changes)

    def contains(self, settings: EngineSettings) -> bool:
        """Whether ``settings`` is already within the bounds."""
        return self.clamp(settings) == settings


@dataclass(frozen=True, slots=True)
class TuningContext:
    """What one service is tuned on and within: its GPU, the vLLM release, the model's own maximum
    context, the bounds and the policy. Fixed for a service between spec changes."""

    gpu: GpuSpec
    """The GPU the pods run on: vLLM's batch defaults depend on it (A100s and >= 160 GiB differ)."""
    default_max_model_len: int
    """The model's maximum context for this release: what an unset ``max_model_len`` means."""
    bounds: TuningBounds = TuningBounds()
    policy: PolicyConfig = PolicyConfig()
    vllm_version: str = vllm.PINNED_VLLM_VERSION
