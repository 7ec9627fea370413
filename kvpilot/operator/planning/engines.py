"""The engine a service runs (``spec.engine.kind``), as the operator asks it: how its pod serves, its planner.

Every engine fact comes from the tuner's seam (:mod:`kvpilot.tuner.engines`: command, port, health and
metrics paths, the flag that turns metrics on) and from that engine's own package (its flags, its planner);
this module only chooses, per kind, in one table (:data:`PLANNERS`):

* **vLLM**: planned and rendered by :mod:`.modes` and :mod:`kvpilot.operator.pods.workloads` (its own path,
  with the tuning modes, profiles and the closed loop).
* **SGLang**: planned with SGLang's own memory model (:func:`kvpilot.tuner.engines.plan_sglang_budget`:
  ``--mem-fraction-static`` covers weights + KV pool), rendered as ``python3 -m sglang.launch_server
  --model-path M --host 0.0.0.0 --port 30000`` + the planned flags + ``--enable-metrics`` + extra args.
  The closed loop tunes SGLang flags with SGLang's own rules (:data:`RECOMMENDING_KINDS`); in mode Auto
  the flags it rolled out (``status.appliedEngineArgs``) are rendered instead of the plan's.
* **TGI** (3.3.7, legacy): planned with TGI's own warm-up memory model
  (:func:`kvpilot.tuner.engines.plan_tgi_budget`: the KV blocks it infers from the memory free after a
  warm-up prefill), rendered as ``text-generation-launcher --model-id M --hostname 0.0.0.0 --port 80`` + the
  planned flags (``--max-input-tokens``, ``--max-total-tokens``, ``--max-batch-prefill-tokens``,
  ``--max-concurrent-requests``, ``--num-shard``) in mode Auto + extra args; Recommend and Off leave them to
  TGI. One node per replica, sharded over every GPU of the pod. The closed loop tunes TGI flags with TGI's
  own rules (:data:`RECOMMENDING_KINDS`, :func:`kvpilot.tuner.loop.compute_tgi_decision`); in mode Auto the
  flags it rolled out (``status.appliedEngineArgs``) are rendered instead of the plan's, as for SGLang.

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvpilot.operator import api, errors
from kvpilot.operator.planning import resolve
from kvpilot.tuner import engines, sglang, tgi
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.engines import Serving
from kvpilot.tuner.sglang import serving as sglang_serving
from kvpilot.tuner.types import GIB

CLOSED_LOOP_KINDS: frozenset[api.EngineKind] = frozenset({"vLLM"})
"""The engines vLLM's closed loop retunes (:mod:`kvpilot.operator.inferenceservice.closed_loop`)."""
RECOMMENDING_KINDS: frozenset[api.EngineKind] = frozenset({"SGLang", "TGI"})
"""The engines with a closed loop of their own rules (:mod:`kvpilot.operator.inferenceservice.engine_loop`):
mode Recommend records what it would change, mode Auto also rolls it out (probation, rollback); for any
other kind the loop holds and says why."""

EngineFlags = sglang.SglangSettings | tgi.TgiSettings
"""Flags in an engine's own type, as its closed loop rolls them out (``status.appliedEngineArgs``)."""


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """A non-vLLM engine's plan and the container that runs it, in the engine's own terms."""

    kind: api.EngineKind
    serving: Serving
    args: tuple[str, ...]
    """The container's arguments, after :attr:`Serving.command`."""
    planned: tuple[str, ...]
    """The flags the planner chose (deployed in mode Auto; Recommend and Off leave them to the engine)."""
    summary: str
    """One line for the ``Planned`` condition: the flags and what they hold."""
    explanation: tuple[str, ...]
    """The budget, step by step (as ``kvpilot plan --engine`` prints it)."""
    mode: str
    """``spec.tuning.mode``: Auto deploys :attr:`planned`, Recommend and Off leave them to the engine."""
    gpu_count: int


def is_tuned_by_closed_loop(spec: api.InferenceServiceSpec) -> bool:
    return spec.engine.kind in CLOSED_LOOP_KINDS


def is_recommended_by_closed_loop(spec: api.InferenceServiceSpec) -> bool:
    return spec.engine.kind in RECOMMENDING_KINDS


def compute_engine_plan(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, kept: EngineFlags | None = None
) -> EnginePlan:
    """The plan and container of a non-vLLM engine; EngineNotSupported, InvalidSpec or InfeasiblePlan.
    ``kept``: the flags the closed loop rolled out (``status.appliedEngineArgs``), deployed in mode Auto
    instead of the plan's."""
    planner = PLANNERS.get(spec.engine.kind)
    if planner is None:
        raise ValueError(f"{spec.engine.kind} is planned by kvpilot.operator.planning.modes")
    return planner(spec, inputs, kept)


# --- SGLang -------------------------------------------------------------------------------------------


def _check_sglang_spec(spec: api.InferenceServiceSpec) -> None:
    """What the SGLang path does not take yet, said plainly."""
    if spec.engine.pinned.wire():
        raise errors.InvalidSpec(
            "spec.engine.pinned holds vLLM flags, which SGLang does not take; leave it empty for SGLang "
            "(the context comes from serving.maxContextLength)"
        )
    node_flags = (
        sglang_serving.NNODES_FLAG,
        sglang_serving.NODE_RANK_FLAG,
        sglang_serving.DIST_INIT_ADDR_FLAG,
    )
    rendered = {sglang.MODEL_FLAG, sglang.HOST_FLAG, sglang.PORT_FLAG, *sglang.FLAGS.values(), *node_flags}
    for arg in spec.engine.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in rendered:
            raise errors.InvalidSpec(
                f"{flag} in spec.engine.extraArgs is a flag kvpilot renders for SGLang; drop it (the "
                "context: serving.maxContextLength; the GPUs: gpu.count, gpu.tensorParallelSize and "
                "gpu.nodesPerReplica)"
            )


_SGLANG_FLAGS = (sglang.MODEL_FLAG, sglang.REVISION_FLAG, sglang.HOST_FLAG, sglang.PORT_FLAG)
_TGI_FLAGS = (tgi.MODEL_FLAG, tgi.REVISION_FLAG, tgi.HOSTNAME_FLAG, tgi.PORT_FLAG)
"""Each engine's model, revision, host and port flags (its own package's names)."""

CONTEXT_STEP = 1024
"""A context shortened to fit the pool is rounded down to a multiple of this."""


def _sglang_settings(spec: api.InferenceServiceSpec, context: int | None) -> sglang.SglangSettings:
    """As ``kvpilot plan --engine sglang`` asks: ``serving.concurrency`` for ``--max-running-requests``; TP
    ``gpu.tensorParallelSize`` (every GPU of the replica when unset: SGLang's tensor parallelism spans a
    group's nodes, ``--nnodes``), the replica's other GPUs pipeline stages."""
    gpus = spec.gpu.count * spec.gpu.nodes_per_replica
    tp = spec.gpu.tensor_parallel_size or gpus
    pp = gpus // tp
    return sglang.SglangSettings(
        context_length=context,
        max_running_requests=spec.serving.concurrency,
        tp_size=tp,
        pp_size=pp if pp > 1 else None,
    )


def compute_sglang_budget(spec: api.InferenceServiceSpec, inputs: resolve.Inputs) -> engines.SglangBudget:
    """The longest context up to ``serving.maxContextLength`` (at most the model's own, which is the
    default) whose one
    request fits SGLang's pool: the pool does not depend on the context, so a context that does not fit is
    shortened to the pool (rounded down to :data:`CONTEXT_STEP`), unless that falls below
    ``serving.minContextLength``; the budget returned is then infeasible. The KV dtype is chosen first, at
    the wanted context, as vLLM's planner chooses it (:func:`kvpilot.tuner.engines.plan_sglang_kv`:
    ``tuning.allowFp8KvCache`` and the GPU's fp8 support), and kept when the context is shortened."""
    model, gpu, weights = inputs.model.spec, inputs.gpu.gpu, inputs.model.checkpoint_bytes
    wanted = spec.serving.max_context_length
    settings = _sglang_settings(spec, min(wanted, model.max_model_len) if wanted else None)
    budget = engines.plan_sglang_kv(
        model,
        gpu,
        settings,
        allow_fp8_kv=spec.tuning.allow_fp8_kv_cache,
        weights_total_bytes=weights,
        min_context=spec.serving.min_context_length,
    )
    shorter = budget.max_total_tokens // CONTEXT_STEP * CONTEXT_STEP or budget.max_total_tokens
    if budget.feasible or shorter < max(1, spec.serving.min_context_length or 1):
        return budget
    kv = budget.settings.kv_cache_dtype
    settings = replace(_sglang_settings(spec, shorter), kv_cache_dtype=kv if kv != "auto" else None)
    shortened = engines.plan_sglang_budget(model, gpu, settings, weights_total_bytes=weights)
    return replace(shortened, notes=budget.notes)


def plan_sglang(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, kept: EngineFlags | None = None
) -> EnginePlan:
    """SGLang's budget for the spec (the planner of ``kvpilot plan --engine sglang``), its flags in mode
    Auto (``kept``'s instead, where the closed loop retuned them); InfeasiblePlan when one full-context
    request does not fit the pool."""
    _check_sglang_spec(spec)
    kept = kept if isinstance(kept, sglang.SglangSettings) else None
    gpu = inputs.gpu.gpu
    budget = compute_sglang_budget(spec, inputs)
    explanation = tuple(engines.explain_sglang_budget(budget))
    if not budget.feasible:
        raise tuner_errors.InfeasiblePlan(
            f"{spec.model.id} on {spec.gpu.count}x {gpu.name} (SGLang {sglang.PINNED_SGLANG_VERSION}): "
            + ". ".join(engines.explain_sglang_infeasible(budget))
        )
    mode = spec.tuning.mode
    kept = kept if mode == "Auto" else None
    planned = tuple(sglang.build_sglang_args(budget.rendered if kept is None else kept))
    serving = engines.lookup_engine("SGLang").serving
    args = tuple(_launch_args(spec, planned if mode == "Auto" else (), serving, _SGLANG_FLAGS))
    summary = (
        f"SGLang {sglang.PINNED_SGLANG_VERSION}: {' '.join(planned)}; KV pool "
        f"{budget.pool_bytes / GIB:.2f} GiB = {budget.max_total_tokens} tokens, "
        f"{budget.full_context_requests} request(s) at --context-length"
    )
    if kept is not None:
        summary = (
            f"SGLang {sglang.PINNED_SGLANG_VERSION}: {' '.join(planned)} (the closed loop's flags, kept: "
            f"status.appliedEngineArgs; the plan: {' '.join(sglang.build_sglang_args(budget.rendered))})"
        )
    return EnginePlan("SGLang", serving, args, planned, summary, explanation, mode, spec.gpu.count)


# --- TGI ----------------------------------------------------------------------------------------------


def _check_tgi_spec(spec: api.InferenceServiceSpec) -> None:
    """What the TGI path does not take, said plainly."""
    if spec.gpu.nodes_per_replica > 1:
        raise errors.EngineNotSupported(
            "TGI over several nodes (gpu.nodesPerReplica > 1) is not rendered: TGI shards within one node; "
            "use one node per replica"
        )
    tp = spec.gpu.tensor_parallel_size
    if tp is not None and tp != spec.gpu.count:
        raise errors.InvalidSpec(
            f"gpu.tensorParallelSize {tp} with gpu.count {spec.gpu.count}: TGI shards the model over every "
            "GPU of the pod (--num-shard), with no pipeline stages; leave tensorParallelSize unset or equal"
        )
    if spec.engine.pinned.wire():
        raise errors.InvalidSpec(
            "spec.engine.pinned holds vLLM flags, which TGI does not take; leave it empty for TGI "
            "(the context comes from serving.maxContextLength)"
        )
    rendered = {tgi.MODEL_FLAG, tgi.REVISION_FLAG, tgi.HOSTNAME_FLAG, tgi.PORT_FLAG, *tgi.FLAGS.values()}
    for arg in spec.engine.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in rendered:
            raise errors.InvalidSpec(
                f"{flag} in spec.engine.extraArgs is a flag kvpilot renders for TGI; drop it (the context: "
                "serving.maxContextLength; the admission limit: serving.concurrency; the GPUs: gpu.count)"
            )


def compute_tgi_budget(spec: api.InferenceServiceSpec, inputs: resolve.Inputs) -> engines.TgiBudget:
    """As ``kvpilot plan --engine tgi --gpus N`` asks: ``serving.maxContextLength`` caps
    ``--max-total-tokens`` (at most the model's ``max_position_embeddings``; unset, TGI's default, the
    inferred total), ``serving.concurrency`` is ``--max-concurrent-requests``, ``gpu.count`` the shards."""
    model, gpu, weights = inputs.model.spec, inputs.gpu.gpu, inputs.model.checkpoint_bytes
    wanted, limit = spec.serving.max_context_length, model.max_len_base or model.max_model_len
    settings = tgi.TgiSettings(
        max_total_tokens=min(wanted, limit) if wanted else None,
        max_concurrent_requests=spec.serving.concurrency,
        num_shard=spec.gpu.count,
    )
    return engines.plan_tgi_budget(model, gpu, settings, weights_total_bytes=weights)


def _launch_args(
    spec: api.InferenceServiceSpec,
    planned: Sequence[str],
    serving: Serving,
    flags: tuple[str, str, str, str],
) -> list[str]:
    """The container's arguments after the engine's command: the model (``flags``: the engine's model,
    revision, host and port flags), where it listens, the planned flags, the flags that turn its metrics on
    (:attr:`Serving.metrics_args`), then the user's ``extraArgs``."""
    model, revision, host, port = flags
    args = [model, spec.model.id]
    if spec.model.revision:
        args += [revision, spec.model.revision]
    return [
        *args,
        host,
        "0.0.0.0",
        port,
        str(serving.port),
        *planned,
        *serving.metrics_args,
        *spec.engine.extra_args,
    ]


def plan_tgi(
    spec: api.InferenceServiceSpec, inputs: resolve.Inputs, kept: EngineFlags | None = None
) -> EnginePlan:
    """TGI's warm-up budget for the spec (the planner of ``kvpilot plan --engine tgi``), its flags rendered
    in mode Auto (``kept``'s instead, where the closed loop retuned them); InfeasiblePlan when TGI would not
    start, or ``--max-total-tokens`` falls below ``serving.minContextLength``."""
    _check_tgi_spec(spec)
    gpu = inputs.gpu.gpu
    budget = compute_tgi_budget(spec, inputs)
    explanation = tuple(engines.explain_tgi_budget(budget))
    where = f"{spec.model.id} on {spec.gpu.count}x {gpu.name} (TGI {tgi.PINNED_TGI_VERSION})"
    if not budget.feasible:
        raise tuner_errors.InfeasiblePlan(f"{where}: {explanation[-1]}")
    floor = spec.serving.min_context_length
    if floor and budget.max_total_tokens < floor:
        raise tuner_errors.InfeasiblePlan(
            f"{where}: --max-total-tokens {budget.max_total_tokens} (the KV blocks TGI infers) is below "
            f"serving.minContextLength {floor}"
        )
    mode = spec.tuning.mode
    kept = kept if mode == "Auto" and isinstance(kept, tgi.TgiSettings) else None
    planned = tuple(tgi.build_tgi_args(budget.rendered if kept is None else kept))
    serving = engines.lookup_engine("TGI").serving
    args = tuple(_launch_args(spec, planned if mode == "Auto" else (), serving, _TGI_FLAGS))
    summary = (
        f"TGI {tgi.PINNED_TGI_VERSION}: {' '.join(planned)}; KV {budget.max_batch_total_tokens} tokens "
        f"(max batch total), {budget.concurrency} request(s) at --max-total-tokens"
    )
    if kept is not None:
        summary = (
            f"TGI {tgi.PINNED_TGI_VERSION}: {' '.join(planned)} (the closed loop's flags, kept: "
            f"status.appliedEngineArgs; the plan: {' '.join(tgi.build_tgi_args(budget.rendered))})"
        )
    return EnginePlan("TGI", serving, args, planned, summary, explanation, mode, spec.gpu.count)


Planner = Callable[[api.InferenceServiceSpec, resolve.Inputs, EngineFlags | None], EnginePlan]
PLANNERS: dict[api.EngineKind, Planner] = {
    "SGLang": plan_sglang,
    "TGI": plan_tgi,
}
"""Each non-vLLM engine's planner (vLLM's: :func:`kvpilot.operator.planning.modes.compute_feasible_plan`)."""
