"""Target mode for SGLang and TGI: what such a target runs, and the InferenceService plan for it.

Pure. The
workload, its pods' nodes' labels and its SGLang or TGI container come in (:func:`find_target_engine`); an
:class:`EngineDiscovery` (the flags it runs, read by the engine's own parser:
:func:`.target_engines.compute_settings`) and the plan go out. The plan is the InferenceService's for
``spec.engine.kind`` SGLang or TGI (:func:`kvpilot.operator.planning.engines.compute_engine_plan`: each
engine's own memory model and flags), from the spec :func:`build_engine_plan_spec` makes
(:func:`kvpilot.operator.enginetuner.target_reading.read_engine_plan` asks it), so an EngineTuner and an
InferenceService plan such a model alike.

SGLang in a LeaderWorkerSet's group of several nodes (``--nnodes``, its tensor parallelism across them) is
planned as an InferenceService with ``gpu.nodesPerReplica`` plans it: each pod's GPUs are its share of
``--tp-size x --pp-size`` (:func:`compute_engine_gpus`), and the leader's and the workers' new pods get the
recommendation alike (the webhook's). TGI shards within one node: in a group of several nodes it is
:class:`~.target.UnsupportedEngine`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.enginetuner import target, target_engines
from kvpilot.operator.enginetuner.target_engines import EngineCommand
from kvpilot.operator.planning.engines import EngineFlags
from kvpilot.operator.pods import capacity
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import flags, sglang, tgi
from kvpilot.tuner.tgi.command import TgiCommand


@dataclass(frozen=True, slots=True)
class EngineDiscovery:
    """What a target running SGLang or TGI runs: its container, flags, model and GPUs."""

    kind: api.EngineKind
    container: str
    command: EngineCommand
    settings: EngineFlags
    """The tuned flags it runs, in the engine's own type."""
    model: api.ModelRef
    model_origin: str
    args_origin: str
    image: str
    gpu_count: int
    gpu_product: str | None = None
    gpu_labels: Mapping[str, str] | None = None
    nodes: int = 1
    """The pods of one replica: a LeaderWorkerSet group's size (SGLang only; 1 otherwise)."""

    @property
    def args(self) -> tuple[str, ...]:
        """The tuned flags it runs, as the engine renders them."""
        return tuple(render_args(self.settings))


def render_args(settings: EngineFlags) -> list[str]:
    """``settings`` as their engine's flags (its own renderer)."""
    if isinstance(settings, sglang.SglangSettings):
        return sglang.build_sglang_args(settings)
    return tgi.build_tgi_args(settings)


def find_target_engine(
    spec: api.EngineTunerSpec, workload: Mapping[str, Any]
) -> tuple[Mapping[str, Any], EngineCommand] | None:
    """The SGLang or TGI container the EngineTuner tunes and what it runs; ``None`` when the container it
    would tune runs vLLM (picked first) or no engine kvpilot knows (:func:`.target.build_discovery` says
    so by name)."""
    pod_spec = target.pod_template(workload)
    if target.runs_vllm_container(pod_spec, spec.container_name):
        return None
    return target_engines.find_engine_container(pod_spec, spec.container_name)


def _args_origin(command: EngineCommand, container: Mapping[str, Any]) -> str:
    found = command.found
    where = "args" if container.get("args") and found.in_args else "command"
    if found.form == "shell":
        where = "a shell script in command, and args"
    if isinstance(found, TgiCommand) and tgi.build_env_args(target_engines.literal_env(container)):
        where += " and the environment"
    return where


def compute_engine_gpus(
    spec: api.EngineTunerSpec, settings: EngineFlags, container: Mapping[str, Any], nodes: int = 1
) -> int:
    """GPUs per pod: ``spec.gpu.count``, else SGLang's ``--tp-size`` x ``--pp-size`` (1 each by default)
    over the group's ``nodes``, TGI's ``--num-shard`` (by default every GPU the launcher sees: the
    container's ``nvidia.com/gpu``). SGLang ranks that do not split evenly over the nodes are
    :class:`~.target.DiscoveryIncomplete`, with what to set."""
    if spec.gpu.count:
        return spec.gpu.count
    if isinstance(settings, sglang.SglangSettings):
        ranks = (settings.tp_size or 1) * (settings.pp_size or 1)
        if ranks % nodes:
            raise target.DiscoveryIncomplete(
                f"SGLang's {ranks} ranks ({sglang.FLAGS['tp_size']} x {sglang.FLAGS['pp_size']}) do not "
                f"split over the group's {nodes} nodes; set spec.gpu.count to the GPUs of each pod"
            )
        return ranks // nodes
    return settings.num_shard or capacity.compute_gpu_request({"containers": [container]}) or 1


def build_engine_discovery(
    spec: api.EngineTunerSpec,
    workload: Mapping[str, Any],
    node_labels: Sequence[Mapping[str, str]],
    container: Mapping[str, Any],
    command: EngineCommand,
) -> EngineDiscovery:
    """Everything read from a target whose container runs SGLang or TGI (:func:`find_target_engine`)."""
    ref = spec.target_ref
    target.refuse_a_groups_part(workload, ref.kind, ref.name)
    nodes = target.group_size(workload)
    if nodes > 1 and command.kind != "SGLang":
        raise target.UnsupportedEngine(
            f"container {container.get('name')!r} runs {command.kind} over a LeaderWorkerSet group of "
            f"{nodes} nodes: {command.kind} shards a model within one node (--num-shard), so kvpilot plans "
            "it one node per replica; run it as a Deployment or StatefulSet"
        )
    try:
        settings = target_engines.compute_settings(command)
    except tuner_errors.InvalidEngineArgs as exc:
        raise target.DiscoveryIncomplete(
            f"the target's {command.kind} arguments do not parse: {exc.message}"
        ) from None
    revision_flag = sglang.REVISION_FLAG if command.kind == "SGLang" else tgi.REVISION_FLAG
    from_env = isinstance(command.found, TgiCommand) and command.found.model_from_env
    model, model_origin = target.compute_model_ref(
        spec,
        command.model,
        flags.find_flag_value(command.flags, (revision_flag,)),
        container,
        engine=command.kind,
        origin="the container's environment (MODEL_ID)" if from_env else "the container's arguments",
    )
    product, labels = target.compute_gpu_product(spec, node_labels)
    return EngineDiscovery(
        kind=command.kind,
        container=str(container.get("name")),
        command=command,
        settings=settings,
        model=model,
        model_origin=model_origin,
        args_origin=_args_origin(command, container),
        image=str(container.get("image") or ""),
        gpu_count=compute_engine_gpus(spec, settings, container, nodes),
        gpu_product=product,
        gpu_labels=labels,
        nodes=nodes,
    )


def build_engine_plan_spec(spec: api.EngineTunerSpec, found: EngineDiscovery) -> api.InferenceServiceSpec:
    """The InferenceService spec that plans this target: ``engine.kind`` the engine it runs, its model,
    GPUs (SGLang's tensor-parallel size the owner's, over the group's nodes: the pod's shape is not
    kvpilot's to change; TGI shards over every GPU of the pod), serving and tuning bounds."""
    tuning = api.Tuning(mode="Recommend", **spec.tuning.model_dump())
    tp = found.settings.tp_size if isinstance(found.settings, sglang.SglangSettings) else None
    own_image = {"SGLang": sglang.serving.IMAGE_REPOSITORY, "TGI": tgi.serving.IMAGE_REPOSITORY}[found.kind]
    usable = found.image and len(found.image) <= 512 and not found.image.startswith("vllm/")
    image = found.image if usable else own_image
    return api.InferenceServiceSpec(
        model=found.model,
        gpu=api.GpuRequest(count=found.gpu_count, tensor_parallel_size=tp, nodes_per_replica=found.nodes),
        serving=spec.serving,
        engine=api.Engine(kind=found.kind, image=image),
        tuning=tuning,
    )
