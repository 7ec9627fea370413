"""Plans that span nodes: how a replica of several GPU nodes splits, chosen from the memory model.

A replica of ``nodes`` nodes of ``gpus_per_node`` GPUs runs one of two layouts vLLM 0.33 supports without
Ray (:mod:`kvpilot.tuner.vllm.parallel`):

* **TP x PP**: tensor parallelism within a node (:func:`~.topology.compute_tensor_parallel` of the node's
  GPUs), pipeline stages across nodes; each stage holds the layers ``get_pp_indices`` gives it
  (:meth:`~kvpilot.tuner.model.ModelSpec.layer_range`), the first the embedding, the last the LM head;
* **DP x EP** (MoE models): ``nodes x gpus_per_node / tp`` data-parallel engines of ``tp`` GPUs, each with
  the attention and dense layers whole (replicated across the ranks) and its own KV cache, the routed
  experts split over all the group's GPUs with ``--enable-expert-parallel``
  (:class:`~kvpilot.tuner.memory.ExpertShards`).

Tensor parallelism across nodes is never planned: it all-reduces every layer's output over the network.

The choice: a layout that fits beats one that does not; then the longer context served; then the more
sequences of that context the replica holds at once (a DP group holds its ranks' sum); then TP x PP, which
needs no all-to-all between nodes. Without a node count the planner adds nodes (up to ``max_nodes``) until a
layout fits with the wanted context, not shortened, and takes the fewest nodes among the layouts serving
the longest context; it says why one node is not enough.

One node is the single-node planner's own answer (:func:`~.planner.compute_plan`), unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.plan.planner import NOTHING_PINNED, check_no_data_parallel, compute_plan
from kvpilot.tuner.plan.topology import compute_tensor_parallel, tensor_parallel_ok
from kvpilot.tuner.types import GIB, EngineSettings, GpuSpec, Plan, ServingBounds

MAX_NODES = 8
"""The most nodes per replica the node search tries when no count is given."""


@dataclass(frozen=True, slots=True)
class Layout:
    """How a replica's GPUs split: ``data_parallel_size`` engines of ``tp x pp`` GPUs over ``nodes`` nodes."""

    nodes: int
    gpus_per_node: int
    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self, *, where: bool = True) -> str:
        """``TP 8 x PP 2 on 2 nodes of 8 GPUs``, ``DP 16 x TP 1, experts over 16 GPUs (EP), on ...``
        (``where=False``: without the nodes)."""
        nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''} of {self.gpus_per_node} GPUs"
        if self.data_parallel_size > 1:
            ep = f", experts over {self.gpus} GPUs (EP)" if self.expert_parallel else ""
            text = f"DP {self.data_parallel_size} x TP {self.tensor_parallel_size}{ep}"
            return f"{text}, on {nodes}" if where else text
        pp = f" x PP {self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        text = f"TP {self.tensor_parallel_size}{pp}"
        return f"{text} on {nodes}" if where else text

    def parallel_args(self) -> tuple[str, ...]:
        """The group-wide flags beside the plan's ``--tensor-parallel-size``."""
        return vllm.build_parallel_args(
            pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size,
            data_parallel_size_local=self.data_parallel_size // self.nodes
            if self.data_parallel_size > 1
            else None,
            expert_parallel=self.expert_parallel,
        )


@dataclass(frozen=True, slots=True)
class RankBudget:
    """What one GPU of a role holds: a pipeline stage's layers, or a data-parallel rank's expert share."""

    role: str
    """``stage 0 (node 0)``, ``each DP rank``."""
    layers: range
    weights_gib: float
    experts: int | None = None
    """Routed experts per GPU (DP x EP); ``None``: every expert, split by TP."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout the planner weighed, with the plan of one of its engines."""

    layout: Layout
    plan: Plan

    @property
    def context(self) -> int:
        return self.plan.settings.max_model_len or 0

    @property
    def concurrency(self) -> float:
        """Sequences of the served context the whole replica holds at once."""
        return self.plan.concurrency_at_max_len * self.layout.data_parallel_size

    def summary(self) -> str:
        verdict = "fits" if self.plan.feasible else "does not fit"
        return (
            f"{self.layout.describe()}: {verdict}, {self.concurrency:.2f} sequences of {self.context} "
            f"tokens, {self.plan.budget.weights_gib:.1f} GiB of weights per GPU"
        )


@dataclass(frozen=True, slots=True)
class NodePlan:
    """The planner's answer for a replica that may span nodes."""

    layout: Layout
    plan: Plan
    """The plan of one engine of the layout (for DP x EP, of each data-parallel rank)."""
    args: tuple[str, ...]
    """The plan's vLLM arguments and the layout's parallelism flags (:meth:`Layout.parallel_args`)."""
    ranks: tuple[RankBudget, ...]
    explanation: tuple[str, ...]
    considered: tuple[Candidate, ...]

    @property
    def feasible(self) -> bool:
        return self.plan.feasible


def compute_node_plan(
    model: ModelSpec,
    gpu: GpuSpec,
    gpus_per_node: int,
    bounds: ServingBounds,
    *,
    nodes: int | None = None,
    max_nodes: int = MAX_NODES,
    pinned: EngineSettings = NOTHING_PINNED,
    **plan_kwargs: Any,
) -> NodePlan:
    """Plan ``model`` on ``nodes`` nodes of ``gpus_per_node`` x ``gpu`` (``None``: the fewest that fit, at
    most ``max_nodes``). ``plan_kwargs`` go to :func:`~.planner.compute_plan` (version, checkpoint size,
    engine flags)."""
    if gpus_per_node < 1 or (nodes is not None and nodes < 1) or max_nodes < 1:
        raise errors.TunerError(
            f"nodes ({nodes}), GPUs per node ({gpus_per_node}) and max_nodes ({max_nodes}) must be at least 1"
        )
    counts = [nodes] if nodes is not None else list(range(1, max_nodes + 1))
    wanted = pinned.max_model_len or min(bounds.max_context or model.max_model_len, model.max_model_len)
    tried: list[Candidate] = []
    for count in counts:
        candidates = _weigh_layouts(model, gpu, gpus_per_node, count, bounds, pinned, plan_kwargs)
        tried += candidates
        if any(c.plan.feasible and c.context >= wanted for c in candidates):
            break
    best = max(tried, key=_rank_search)
    return NodePlan(
        layout=best.layout,
        plan=best.plan,
        args=(*best.plan.args, *best.layout.parallel_args()),
        ranks=_rank_budgets(model, best, plan_kwargs.get("weights_total_bytes")),
        explanation=_explain(best, tried, gpu, wanted),
        considered=tuple(tried),
    )


def _rank(c: Candidate) -> tuple[bool, int, float, bool]:
    """Fits, then the longer context, then the more sequences, then TP x PP."""
    return c.plan.feasible, c.context, round(c.concurrency, 6), c.layout.data_parallel_size == 1


def _rank_search(c: Candidate) -> tuple[bool, int, int, float, bool]:
    """:func:`_rank` over several node counts: at the same context, the fewer nodes first."""
    fits, context, concurrency, simple = _rank(c)
    return fits, context, -c.layout.nodes, concurrency, simple


def _weigh_layouts(
    model: ModelSpec,
    gpu: GpuSpec,
    per_node: int,
    nodes: int,
    bounds: ServingBounds,
    pinned: EngineSettings,
    plan_kwargs: dict[str, Any],
) -> list[Candidate]:
    """The TP x PP layout of ``nodes`` nodes and, for a MoE model over several nodes, its DP x EP layouts."""
    if nodes == 1:  # the single-node planner's answer, as it always was
        plan = compute_plan(model, gpu, per_node, bounds, pinned=pinned, **plan_kwargs)
        tp = plan.settings.tensor_parallel_size or 1
        return [Candidate(Layout(1, per_node, tp, plan.pipeline_parallel_size), plan)]
    check_no_data_parallel(plan_kwargs.get("engine", vllm.DEFAULT_ENGINE))
    tp = pinned.tensor_parallel_size or compute_tensor_parallel(model, per_node)
    plan = compute_plan(
        model, gpu, nodes * per_node, bounds, pinned=pinned.replace(tensor_parallel_size=tp), **plan_kwargs
    )
    out = [Candidate(Layout(nodes, per_node, tp, plan.pipeline_parallel_size), plan)]
    if model.moe is None:
        return out
    for dp_tp in _data_parallel_tps(model, per_node, pinned):
        dp = nodes * per_node // dp_tp
        layout = Layout(nodes, per_node, dp_tp, 1, dp, expert_parallel=True)
        rank_bounds = dataclasses.replace(
            bounds, concurrency=math.ceil(bounds.concurrency / dp) if bounds.concurrency else None
        )
        rank_plan = compute_plan(
            model,
            gpu,
            dp_tp,
            rank_bounds,
            pinned=pinned.replace(tensor_parallel_size=dp_tp),
            expert_shards=memory.ExpertShards(dp * dp_tp, expert_parallel=True),
            **plan_kwargs,
        )
        out.append(Candidate(layout, rank_plan))
    return out


def _data_parallel_tps(model: ModelSpec, per_node: int, pinned: EngineSettings) -> list[int]:
    """Tensor-parallel sizes of a data-parallel rank within a node: the node's divisors vLLM accepts."""
    if pinned.tensor_parallel_size is not None:
        return [pinned.tensor_parallel_size] if per_node % pinned.tensor_parallel_size == 0 else []
    return [tp for tp in range(per_node, 0, -1) if per_node % tp == 0 and tensor_parallel_ok(model, tp)]


def _rank_budgets(model: ModelSpec, best: Candidate, checkpoint: int | None) -> tuple[RankBudget, ...]:
    """Weights per GPU of each pipeline stage (a node's, when the stages are the nodes), or of a DP rank."""
    layout, plan = best.layout, best.plan
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    if layout.data_parallel_size > 1:
        ranks = layout.data_parallel_size * tp
        experts = -(-model.moe.num_experts // ranks) if model.moe else None
        return (RankBudget("each DP rank", model.layer_range(1, 0), plan.budget.weights_gib, experts),)
    per_node_stages = max(1, pp // layout.nodes)
    out = []
    for rank in range(pp):
        weights = memory.compute_weight_bytes(
            model,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            pp_rank=rank,
            weights_total_bytes=checkpoint,
        )
        node = f" (node {rank // per_node_stages})" if layout.nodes > 1 else ""
        out.append(RankBudget(f"stage {rank}{node}", model.layer_range(pp, rank), weights / GIB))
    return tuple(out)


def _explain(best: Candidate, tried: list[Candidate], gpu: GpuSpec, wanted: int) -> tuple[str, ...]:
    """Why this layout: what one node lacks, what was weighed, and the rule that chose."""
    layout, lines = best.layout, []
    singles = [c for c in tried if c.layout.nodes == 1]
    if singles and layout.nodes > 1:
        single = singles[0].plan
        why = (
            single.reasons[0]
            if single.reasons
            else f"it serves at most {singles[0].context} of the wanted {wanted} tokens"
        )
        lines.append(f"Nothing fits one node of {layout.gpus_per_node} x {gpu.name}: {why}")
    if not best.plan.feasible:
        lines.append(f"Nothing fits {layout.nodes} node(s) of {layout.gpus_per_node} x {gpu.name} either.")
    lines.append(f"Chosen: {best.summary()}.")
    if layout.data_parallel_size > 1:
        lines.append(
            f"Each of the {layout.data_parallel_size} data-parallel engines holds the attention and dense "
            f"layers whole and its own KV cache; the routed experts split over all {layout.gpus} GPUs, and "
            "work on every engine's tokens (vLLM 0.33's default all-to-all gathers them). Not in the budget: "
            "other all-to-all backends' buffers (DeepEP and others); no multi-node start-up was measured."
        )
    elif layout.pipeline_parallel_size > 1:
        lines.append(
            f"Tensor parallel {layout.tensor_parallel_size} within a node, {layout.pipeline_parallel_size} "
            "pipeline stages across the nodes (vLLM's get_pp_indices splits the layers); tensor parallelism "
            "across nodes is not planned (it all-reduces every layer over the network)."
        )
    others = [c for c in tried if c.layout.nodes == layout.nodes and c is not best]
    lines += [f"Weighed: {c.summary()}." for c in others]
    if others:
        lines.append(
            "Rule: a layout that fits, then the longer context, then more sequences at once, then TP x PP."
        )
    return tuple(lines)
