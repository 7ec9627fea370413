"""What one closed-loop tick of an InferenceService reads first: the service, its model and GPU.

The first steps of :func:`kvpilot.operator.inferenceservice.closed_loop.run_once`: :func:`parse_service`
(the spec and status, pure) and :func:`fetch_resolved` (model, GPU, the budget of the current settings,
the policy); :func:`build_context` turns them into what the policy tunes within. The pods and metrics:
:mod:`.loop_observing`. A ``None`` says the tick has nothing to do (and why, in the log).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.loop import loop_settings, loop_state
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import engines, modes, release, resolve
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import gpus, plan
from kvpilot.tuner.loop import LoopState, PolicyConfig, TuningContext
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, MemoryBudget


@dataclass(frozen=True)
class Service:
    """The InferenceService as the tick read it: ``old`` its status at ``version``, ``spec`` parsed,
    ``pinned`` the user's values (never the loop's to change)."""

    body: Mapping[str, Any]
    meta: Mapping[str, Any]
    old: dict[str, Any]
    version: str | None
    spec: api.InferenceServiceSpec
    pinned: EngineSettings
    state: LoopState
    now: float

    @property
    def name(self) -> str:
        return str(self.meta["name"])

    @property
    def namespace(self) -> str:
        return str(self.meta.get("namespace") or "default")

    @property
    def mode(self) -> str:
        return self.spec.tuning.mode

    @property
    def engine_tuned(self) -> bool:
        """Whether the closed loop has rules for the service's engine (``spec.engine.kind``)."""
        return engines.is_tuned_by_closed_loop(self.spec)

    @property
    def engine_recommended(self) -> bool:
        """Whether the closed loop recommends for the service's engine without rolling out (SGLang)."""
        return engines.is_recommended_by_closed_loop(self.spec)

    @property
    def generation(self) -> int | None:
        generation = self.meta.get("generation")
        return int(generation) if generation is not None else None


@dataclass(frozen=True)
class Resolved:
    """The model and GPU (``inputs``: ``None`` when resolving failed, for ``failure``), the budget of the
    current settings, what the loop tunes for, and the policy (the spec's, at the operator's pace)."""

    policy: PolicyConfig
    inputs: resolve.Inputs | None
    failure: errors.Failure | None
    engine: release.EngineRelease
    budget: MemoryBudget
    gpu: GpuSpec
    default_len: int


def compute_checkpoint_gib(resolved: Resolved) -> float | None:
    """The whole checkpoint the pods load (``spec.model.checkpointBytes``, the catalogue's, or the weights
    the model's config implies); ``None`` when the model did not resolve."""
    if resolved.inputs is None:
        return None
    return resolve.compute_checkpoint_bytes(resolved.inputs.model) / GIB


def parse_service(
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    now: float,
) -> Service | None:
    """The service, or ``None`` when the loop has nothing to do: nothing applied yet, an invalid spec (the
    reconciler reports it), no replicas. A service of an engine the loop has no rules for
    (:attr:`Service.engine_tuned` False) is returned with no pinned settings: the tick only holds."""
    old = dict(status or {})
    version = meta.get("resourceVersion")  # what ``old`` was read at: kopf's body is live, read it now
    try:
        parsed = desired.parse_spec(spec)
        tuned = engines.is_tuned_by_closed_loop(parsed)  # another engine: the tick says it holds
        if tuned and not old.get("applied"):
            return None  # the reconciler has not applied anything yet
        pinned = modes.compute_user_args(parsed).pinned if tuned else EngineSettings()
    except (errors.OperatorError, tuner_errors.TunerError):
        return None
    if parsed.replicas == 0:
        return None
    return Service(body, meta, old, version, parsed, pinned, loop_state.build_loop_state(old), now)


async def fetch_resolved(deps: LoopDeps, svc: Service, logger: Any) -> Resolved | None:
    """Model, GPU and the budget of the current settings: resolved, else what the status recorded (a Hub
    outage does not stop crash remedies); ``None`` while neither says."""
    policy = loop_settings.build_policy(svc.spec, deps.pace)
    failure: errors.Failure | None = None
    try:
        inputs: resolve.Inputs | None = await resolve.fetch_inputs(
            svc.spec, svc.namespace, deps.kube, deps.hub
        )
    except Exception as exc:  # noqa: BLE001 -- the reconciler reports it; a vanished ref: loop_patch
        logger.warning(f"closed loop: cannot resolve model/GPU ({exc}); using status.budget")
        inputs, failure = None, errors.classify(exc)
    engine = release.resolve_release(svc.spec, inputs.model if inputs is not None else None)
    budget = loop_state.read_budget(svc.old, engine.version)
    if inputs is not None:
        try:
            budget = budget_for(inputs, svc.spec, svc.state.current)
        except tuner_errors.TunerError as exc:
            logger.warning(f"closed loop: memory model failed for the current settings ({exc})")
    if budget is None:
        logger.info("closed loop: no memory budget yet; waiting for the reconciler")
        return None
    gpu, default_len = gpu_and_default_len(inputs, svc.old, svc.state.current, engine)
    if gpu is None or not default_len:
        logger.info("closed loop: model or GPU not resolved and not in status; waiting for the reconciler")
        return None
    return Resolved(policy, inputs, failure, engine, budget, gpu, default_len)


def budget_for(
    inputs: resolve.Inputs, spec: api.InferenceServiceSpec, settings: EngineSettings
) -> MemoryBudget:
    """The budget of ``settings`` in the topology the workload renders
    (:func:`kvpilot.tuner.plan.compute_topology_budget`): over a group's nodes, its pipeline stages or one
    data-parallel engine (:func:`kvpilot.operator.planning.modes.compute_group_topology`)."""
    engine = release.resolve_release(spec, inputs.model)
    gpu_count, shards = modes.compute_group_topology(spec, inputs)
    return plan.compute_topology_budget(
        inputs.model.spec,
        inputs.gpu.gpu,
        gpu_count,
        settings,
        engine.version,
        inputs.model.checkpoint_bytes,
        engine.flags,
        expert_shards=shards,
    )


def gpu_and_default_len(
    inputs: resolve.Inputs | None,
    status: Mapping[str, Any],
    current: EngineSettings,
    engine: release.EngineRelease,
) -> tuple[GpuSpec | None, int]:
    """The GPU and the model's maximum context the loop tunes for: resolved, else what the reconciler
    recorded (``status.gpu.catalogueName``, the applied ``max_model_len``)."""
    if inputs is not None:
        return inputs.gpu.gpu, inputs.model.spec.default_max_model_len(engine.parsed)
    name = (status.get("gpu") or {}).get("catalogueName")
    try:
        gpu = gpus.lookup_gpu(str(name)) if name else None
    except tuner_errors.TunerError:
        gpu = None
    return gpu, current.max_model_len or 0


def build_context(svc: Service, resolved: Resolved) -> TuningContext:
    """What the policy tunes within: Auto never changes a pinned value; in Recommend pinned is what the
    user deploys, and the recommendation is advice on it."""
    inputs, gpu = resolved.inputs, resolved.gpu
    return TuningContext(
        gpu=gpu,
        default_max_model_len=resolved.default_len,
        mm_prefix_item_tokens=inputs.model.spec.mm_prefix_item_tokens if inputs is not None else 0,
        bounds=loop_settings.build_bounds(svc.spec, gpu.fp8_kv, svc.pinned if svc.mode == "Auto" else None),
        policy=resolved.policy,
        vllm_version=resolved.engine.version,
        slo=loop_settings.build_slo(svc.spec),
        max_num_active_seqs=resolved.engine.flags.max_num_active_seqs,
    )
