"""From a spec and its resolved inputs to the settings the Deployment gets: the tuning modes.

* The user's fixed values are ``spec.engine.pinned`` plus any tuned flag written in
  ``spec.engine.extraArgs`` (split off by :func:`kvpilot.tuner.vllm.args.parse_vllm_args`;
  a conflict between the two is an :class:`~kvpilot.operator.errors.InvalidSpec`).
  The tensor-parallel size is always fixed by the user's GPU request.
* The planner (:func:`kvpilot.tuner.plan.compute_plan`, through :func:`compute_feasible_plan`) runs
  in every mode; its results are cached by their inputs, so many identical services cost one plan.
* :func:`compute_mode_decision` says what each mode deploys (a :class:`ModeDecision`).
* ``Auto`` deploys the plan; ``Recommend`` deploys the user's own settings and
  publishes the plan as ``status.recommendation``; ``Off`` deploys the user's own
  settings and only reports the plan (budget and the ``Planned`` condition).
* An infeasible plan raises :class:`~kvpilot.tuner.errors.InfeasiblePlan` in every
  mode: nothing is deployed that the memory model says cannot start.

Pure apart from the cache; no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.planning import host_memory, layouts, release, resolve
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import memory, vllm
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.plan import Layout, compute_plan, compute_tensor_parallel
from kvpilot.tuner.plan.profiles import Learned
from kvpilot.tuner.types import EngineSettings, GpuSpec, Plan, ServingBounds

PlanFn = Callable[..., Plan]


@dataclass(frozen=True, slots=True)
class UserArgs:
    pinned: EngineSettings
    """Pinned settings: spec.engine.pinned, tuned flags from extraArgs, gpu.tensorParallelSize.

    Without an explicit tensor-parallel size the planner picks one (gpu.count, or a divisor of the
    attention heads); the remaining GPUs become pipeline-parallel stages."""
    extra: tuple[str, ...]
    """extraArgs without tuned flags, validated against vLLM 0.33."""


@dataclass(frozen=True, slots=True)
class ModeDecision:
    """What the spec's tuning mode deploys and recommends (the closed loop's is ``tuner.loop.Decision``)."""

    plan: Plan
    deploy: EngineSettings
    """Settings rendered onto the Deployment."""
    recommendation: EngineSettings | None
    """What status.recommendation says (None in mode Off)."""
    mode: str


def compute_user_args(spec: api.InferenceServiceSpec) -> UserArgs:
    """Split and check the user's own engine arguments (InvalidEngineArgs / InvalidSpec on error).

    Refused with InvalidSpec: the flags of the pod kvpilot renders (``--host``, ``--port``, ``--model``, ...:
    :data:`kvpilot.tuner.vllm.POD_FLAGS`), a tuned flag contradicting ``pinned`` or ``gpu``, pipeline
    stages that do not fill ``gpu.count``; with InvalidEngineArgs: an abbreviated or misvalued flag of
    :mod:`kvpilot.tuner.vllm.engine_flags`. Planned for: ``--pipeline-parallel-size`` that does (it fixes
    the tensor-parallel size), tuned flags (they become pinned settings), ``--enforce-eager``,
    ``--performance-mode`` and prefix caching (:func:`kvpilot.operator.planning.release.resolve_release`).
    ``--dtype``
    needs the model:
    :func:`check_model_args`."""
    pod = vllm.find_pod_flags(spec.engine.extra_args)
    if pod:
        what = "in spec.engine.extraArgs contradicts the pod kvpilot renders"
        raise errors.InvalidSpec("; ".join(f"{flag} {what}: {why}" for flag, why in pod))
    vllm.validate_extra_args(spec.engine.extra_args)
    vllm.check_engine_flags(spec.engine.extra_args)
    host_memory.check_host_memory(spec)
    from_extra, rest = vllm.parse_vllm_args(spec.engine.extra_args)
    pinned = spec.engine.pinned.to_engine()
    merged = pinned.as_dict()
    for name, value in from_extra.as_dict().items():
        if name in merged and merged[name] != value:
            flag = vllm.FLAGS[name]
            raise errors.InvalidSpec(
                f"{flag} {value} in spec.engine.extraArgs contradicts spec.engine.pinned ({merged[name]}); "
                "keep it in pinned only"
            )
        merged[name] = value
    tp = spec.engine.pinned.tensor_parallel_size or spec.gpu.tensor_parallel_size
    if tp is not None and merged.get("tensor_parallel_size", tp) != tp:
        raise errors.InvalidSpec(
            f"--tensor-parallel-size {merged['tensor_parallel_size']} in spec.engine.extraArgs contradicts "
            f"spec.gpu (tensor-parallel size {tp}); set spec.gpu.tensorParallelSize instead"
        )
    extra_tp = from_extra.tensor_parallel_size  # the merged size when tp is None (pinned has none then)
    if tp is not None:
        merged["tensor_parallel_size"] = tp
    elif spec.gpu.count % (1 if extra_tp is None else extra_tp):  # also catches a size above the count
        raise errors.InvalidSpec(
            f"--tensor-parallel-size {merged['tensor_parallel_size']} in spec.engine.extraArgs does not "
            f"divide spec.gpu.count {spec.gpu.count}; set spec.gpu.tensorParallelSize instead"
        )
    pp = _pipeline_stages(spec, rest, merged.get("tensor_parallel_size"))
    if pp is not None:  # planned for: the stages fix the tensor-parallel size (gpu.count / stages)
        merged["tensor_parallel_size"] = spec.gpu.count // pp
    settings = EngineSettings(**merged)  # type: ignore[arg-type]
    vllm.check_settings(settings)
    try:
        vllm.check_modelled(settings.kv_cache_dtype)
    except tuner_errors.InvalidEngineArgs as exc:
        raise errors.InvalidSpec(f"spec.engine.extraArgs: {exc.message}") from None
    return UserArgs(settings, rest)


def _pipeline_stages(spec: api.InferenceServiceSpec, extra: tuple[str, ...], tp: object) -> int | None:
    """``--pipeline-parallel-size`` (or ``-pp``) in the extra args: the stages, when they and the
    tensor-parallel size use exactly spec.gpu.count GPUs per pod; InvalidSpec naming the flag otherwise."""
    values = vllm.find_flag_values(extra, vllm.PIPELINE_PARALLEL_FLAG)
    if not values:
        return None
    flag, text = vllm.PIPELINE_PARALLEL_FLAG, values[-1]
    if not text.isdigit() or int(text) < 1:
        raise errors.InvalidSpec(f"{flag} {text!r} in spec.engine.extraArgs is not a positive integer")
    pp, count = int(text), spec.gpu.count
    if isinstance(tp, int) and tp * pp != count:
        raise errors.InvalidSpec(
            f"{flag} {pp} in spec.engine.extraArgs with tensor-parallel size {tp} needs {tp * pp} GPUs per "
            f"pod, but spec.gpu.count is {count}; drop it (kvpilot renders the stages that fill the GPUs)"
        )
    if count % pp:
        raise errors.InvalidSpec(
            f"{flag} {pp} in spec.engine.extraArgs does not divide spec.gpu.count {count}: every pod's GPUs "
            "are split into equal stages; drop it or change spec.gpu.count"
        )
    return pp


def check_model_args(user: UserArgs, model_dtype: str) -> None:
    """The extra args that need the model to judge: ``--dtype`` must size the weights as planned."""
    try:
        vllm.check_dtype(user.extra, model_dtype)
    except tuner_errors.InvalidEngineArgs as exc:
        raise errors.InvalidSpec(f"spec.engine.extraArgs: {exc.message}") from None


@functools.lru_cache(maxsize=2048)
def _cached_plan(
    plan_fn: PlanFn,
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_count: int,
    bounds: ServingBounds,
    pinned: EngineSettings,
    vllm_version: str,
    engine: vllm.EngineFlags,
    weights_total_bytes: int | None,
    learned: Learned | None,
) -> Plan | tuner_errors.TunerError:
    """One planner call, its verdict cached by every input, so many identical services cost one plan."""
    try:
        return plan_fn(
            model,
            gpu,
            gpu_count,
            bounds,
            pinned=pinned,
            vllm_version=vllm_version,
            engine=engine,
            weights_total_bytes=weights_total_bytes,
            learned=learned,
        )
    except tuner_errors.TunerError as exc:  # cache verdicts too: an infeasible spec stays infeasible
        return exc


def compute_feasible_plan(
    spec: api.InferenceServiceSpec,
    model: ModelSpec,
    gpu: GpuSpec,
    user: UserArgs,
    *,
    image: vllm.ImageVersion | None = None,
    engine: vllm.EngineFlags = vllm.DEFAULT_ENGINE,
    weights_total_bytes: int | None = None,
    learned: Learned | None = None,
    plan_fn: PlanFn | None = None,
    owner_layout: bool = False,
) -> Plan:
    """The planner's answer for this spec (cached); raises InfeasiblePlan when nothing fits.

    ``image``: the release the image runs (its tag, or ``spec.engine.vllmVersion``: :mod:`.release`;
    ``None``, the pinned one), whose ``VersionAssumed`` warning, when the release was assumed, comes first
    among the plan's warnings (``status.warnings`` and a Warning event carry it, as every plan warning).
    ``engine``: what the image's environment and the extra args choose (the model runner,
    ``--enforce-eager``, ``--performance-mode``, prefix caching). ``learned``: the matching TuningProfile's
    lesson (:mod:`kvpilot.operator.planning.profiles`). ``plan_fn``: the planner,
    :func:`kvpilot.tuner.plan.compute_plan` (tests pass their own). ``owner_layout``: the replica's layout
    is someone else's (an EngineTuner's target): its tensor x pipeline parallel is planned as it is, never
    split DP x EP."""
    check_model_args(user, str(getattr(model, "dtype", "")))
    version = image.version if image is not None else api.VLLM_VERSION
    count, pinned = spec.gpu.count, user.pinned
    if spec.gpu.nodes_per_replica > 1:  # tensor parallel within a node, the nodes' GPUs pipeline stages
        count *= spec.gpu.nodes_per_replica
        pinned = pinned.replace(
            tensor_parallel_size=pinned.tensor_parallel_size or compute_tensor_parallel(model, spec.gpu.count)
        )
    data_parallel = None
    if not owner_layout:  # a MoE group the node planner splits DP x EP
        data_parallel = layouts.compute_data_parallel(
            spec,
            model,
            gpu,
            user.pinned,
            vllm_version=version,
            engine=engine,
            weights_total_bytes=weights_total_bytes,
        )
    rank_plan = None if data_parallel is None else data_parallel.plan
    result = rank_plan or _cached_plan(
        plan_fn or compute_plan,
        model,
        gpu,
        count,
        spec.to_bounds(),
        pinned,
        version,
        engine,
        weights_total_bytes,
        learned,
    )
    if isinstance(result, tuner_errors.TunerError):
        raise copy.copy(result)
    if image is not None and image.warning is not None:
        result = dataclasses.replace(result, warnings=(image.warning, *result.warnings))
    if not result.feasible:
        reasons = list(result.reasons) or ["the model does not fit the GPUs within the spec's bounds"]
        raise tuner_errors.InfeasiblePlan(
            f"{spec.model.id} on {spec.gpu.count}x {gpu.name}: {reasons[0]}",
            suggestions=tuple(reasons[1:]),
        )
    return result


def compute_group_layout(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, user: UserArgs
) -> Layout | None:
    """The DP x EP split of a replica over nodes (:func:`.layouts.compute_data_parallel`, for the service's
    resolved inputs and release); ``None``: TP x PP or one node. The reconciler's render and every
    closed-loop render of other settings ask it, so they agree."""
    engine = release.resolve_release(spec, inputs.model)
    found = layouts.compute_data_parallel(
        spec,
        inputs.model.spec,
        inputs.gpu.gpu,
        user.pinned,
        vllm_version=engine.version,
        engine=engine.flags,
        weights_total_bytes=inputs.model.checkpoint_bytes,
    )
    return None if found is None else found.layout


def compute_group_topology(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs
) -> tuple[int, memory.ExpertShards]:
    """What one engine's budget is computed over, in the layout the workload renders: the spec's own
    :func:`compute_group_layout`, then :func:`.layouts.compute_engine_topology`."""
    return layouts.compute_engine_topology(spec, compute_group_layout(spec, inputs, compute_user_args(spec)))


def compute_mode_decision(spec: api.InferenceServiceSpec, plan: Plan, user: UserArgs) -> ModeDecision:
    """What each tuning mode deploys and recommends."""
    planned = plan.settings
    own = user.pinned.replace(tensor_parallel_size=planned.tensor_parallel_size)  # structure, not tuning
    mode = spec.tuning.mode
    if mode == "Auto":
        return ModeDecision(plan, planned, planned, mode)
    if mode == "Recommend":
        return ModeDecision(plan, own, planned, mode)
    return ModeDecision(plan, own, None, mode)


PLAN_NEUTRAL_FIELDS: tuple[tuple[str, ...], ...] = (
    ("replicas",),
    ("engine", "image"),
    ("engine", "env"),
    ("engine", "resources"),
    ("engine", "tolerations"),
    ("tuning", "cooldownSeconds"),
    ("tuning", "maxChangesPerHour"),
    ("tuning", "rolloutDeadlineSeconds"),
    ("rollout",),
    ("serving", "slo"),
)
"""Spec fields (relative to ``spec``) the planner does not read: changing only these keeps the engine
settings on the Deployment (which the closed loop may have retuned) instead of re-planning."""


def compute_replan_needed(diff: Any) -> bool:
    """Whether a spec diff (kopf's, paths relative to ``spec``) touches anything the planner reads.

    Conservative: a change of a whole parent object (``engine``) counts as a plan input change.
    """
    for item in diff or ():
        path = tuple(item[1])
        if not any(path[: len(neutral)] == neutral for neutral in PLAN_NEUTRAL_FIELDS):
            return True
    return False


def clear_cache() -> None:
    _cached_plan.cache_clear()
