"""CUDA-graph memory of one vLLM rank: the pool a capture takes, and the estimate vLLM subtracts for it.

Two quantities, because vLLM has two accountings (:func:`kvpilot.tuner.vllm.subtracts_cuda_graphs`):

* **the estimate** (V1 runner from 0.20, Model Runner V2 from 0.29): ``profile_cudagraph_memory``
  captures the largest graph of each mode into a throw-away pool ("first capture") and the next one
  ("per graph"), and extrapolates (``v1/worker/gpu_model_runner.py``; V2 measures its PIECEWISE graphs
  in full, ``v1/worker/gpu/cudagraph_utils.py``). It is subtracted from the KV budget before the pool
  is sized. Modelled from 34 public 0.18-0.26 logs of the estimate line
  (``tests/data/vllm_graph_estimates.json``): a cost per layer per graph, the graphs being every
  PIECEWISE size plus the FULL decode sizes (those up to ``max_num_seqs``; with ``k`` speculative tokens
  the sizes the runner re-cuts to multiples of ``1 + k``, FULL up to ``(1 + k) x max_num_seqs``:
  :func:`kvpilot.tuner.vllm.cuda_graph_counts`), an EAGLE / MTP drafter's layers in the graphs it
  captures inside the estimate (:func:`drafter_graph_count`), more with tensor parallelism, and a first
  capture of its own for 4-bit MoE kernels;
* **the pool** (0.19 and before, and V2 in 0.22-0.28, whose estimate is 0): captured after the KV cache
  is allocated, in the memory the utilisation leaves free; the 0.19 fit on V1 pools at 51 sizes. Only
  the post-capture checks (:mod:`.refusals`) and the planner's head-room use it.

Pure arithmetic; the capture sizes are :func:`kvpilot.tuner.vllm.cuda_graph_capture_sizes`'.
"""

from __future__ import annotations

from kvpilot.tuner import vllm
from kvpilot.tuner.model import ModelSpec
from kvpilot.tuner.types import GIB, GpuSpec

MIB = 1 << 20

GRAPH_BASE_GIB = 0.45
GRAPH_PER_LAYER_GIB = 0.0145
"""CUDA-graph pool (0.19 V1): a base plus a per-layer cost at 51 capture sizes (scaled by the real count)."""
GRAPH_MOE_FACTOR = 1.25
"""A fused-MoE layer's graph nodes cost about a quarter more than a dense MLP's (0.19 pools)."""
GRAPH_MXFP4_MOE_FACTOR = 3.5
"""MXFP4 MoE layers (gpt-oss: triton matmul_ogs / Marlin kernels) cost several times a dense layer (0.19
pools)."""

ESTIMATE_PER_LAYER_GRAPH_BYTES = int(0.248 * MIB)
"""The estimate's cost of one layer in one captured graph: the least-squares slope through the origin of
eight dense single-GPU logs (Qwen2.5-7B, Qwen3.5-0.8B/4B/9B, Gemma-4-E4B/31B, LFM2.5-1.2B; 7 to 136
graphs), each within 0.11 GiB of its logged estimate."""
ESTIMATE_TP_FACTOR = 1.65
"""Tensor-parallel ranks log more per graph: Qwen2.5-72B at TP 4 (2.73 GiB over 86 graphs of 80 layers,
1.64x the slope), DeepSeek-V4-Flash and MiniMax-M3 at TP 2 (1.58 and 1.97 GiB)."""
ESTIMATE_FP4_MOE_FIRST_CAPTURE_BYTES = 9 * MIB
"""Per MoE layer on the rank, what the first capture of a 4-bit (NVFP4, MXFP4) MoE model adds whatever the
graphs: Qwen3.6-35B-A3B NVFP4 0.36-0.47 GiB with one graph per mode (40 layers), Gemma-4-26B-A4B NVFP4
0.26 GiB with five (30 layers): the fused kernels' workspaces, allocated in the graph pool. FP8 and 16-bit
MoE show none (Qwen3-235B-A22B FP8 at TP 4: at most 0.76 GiB with its activation over 18 graphs)."""
_FP4_METHODS = frozenset({"nvfp4", "mxfp4"})


def compute_cuda_graph_bytes(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    pp: int,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    version: vllm.Version = vllm.PINNED_VERSION,
    performance_mode: str | None = None,
    enforce_eager: bool = False,
    tp: int = 1,
    model_runner_v2: bool = False,
    num_speculative_tokens: int = 0,
    drafter_layers: int = 0,
) -> int:
    """CUDA-graph memory on one rank as this release accounts it: the estimate it subtracts
    (:func:`compute_graph_estimate_bytes`) or, where it subtracts none, the pool captured after the KV
    cache (:func:`compute_graph_pool_bytes`); none with ``--enforce-eager``.

    ``num_speculative_tokens``: ``k`` of ``--speculative-config`` (decode query length ``1 + k``), which
    changes the sizes and the graphs (:func:`kvpilot.tuner.vllm.cuda_graph_counts`). ``drafter_layers``: the
    decoder layers of a drafter whose graphs the estimate captures (:func:`drafter_graph_count`); 0 for
    none."""
    if enforce_eager:
        return 0
    piecewise, full = vllm.cuda_graph_counts(
        version,
        gpu,
        max_num_seqs,
        max_num_batched_tokens,
        performance_mode,
        num_speculative_tokens=num_speculative_tokens,
        model_runner_v2=model_runner_v2,
    )
    if vllm.subtracts_cuda_graphs(version, model_runner_v2):
        drafter = 0
        if drafter_layers > 0:
            drafter = drafter_layers * drafter_graph_count(
                version,
                gpu,
                max_num_seqs,
                max_num_batched_tokens,
                performance_mode,
                num_speculative_tokens=num_speculative_tokens,
                model_runner_v2=model_runner_v2,
            )
        return compute_graph_estimate_bytes(
            model, piecewise=piecewise, full=full, pp=pp, tp=tp, drafter_layer_graphs=drafter
        )
    return compute_graph_pool_bytes(model, piecewise, pp=pp)


def drafter_graph_count(
    version: vllm.Version,
    gpu: GpuSpec,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    performance_mode: str | None = None,
    *,
    num_speculative_tokens: int,
    model_runner_v2: bool = False,
) -> int:
    """The graphs an EAGLE / MTP drafter captures inside vLLM's CUDA-graph estimate, its layers once in each.

    * V1 runner (0.33 ``v1/worker/gpu_model_runner.py``): ``profile_cudagraph_memory`` (6268-6395) points
      every ``CUDAGraphWrapper`` (the drafter's included) at the profiling pool (6306-6313) and captures the
      two largest graphs of each mode with ``_warmup_and_capture`` (6523-6569), whose ``_dummy_run`` runs
      ``drafter.dummy_run`` with ``use_cudagraphs`` only when capturing PIECEWISE (5794-5836); the drafter's
      dispatcher holds PIECEWISE keys only (``v1/spec_decode/llm_base_proposer.py:420-435``, set up by
      ``initialize_metadata_builders`` 6797-6815 during the profile's minimal KV cache). So each sampled
      PIECEWISE graph carries the drafter's layers and the per-graph cost is extrapolated over every
      PIECEWISE size: one drafter graph per PIECEWISE graph, none per FULL one.
    * Model Runner V2 (0.29-0.33 ``v1/worker/gpu/cudagraph_utils.py::profile_cudagraph_memory``, 0.33
      922-1028: "PIECEWISE, encoder and speculator graphs are measured in full"): ``capture_model``
      (``v1/worker/gpu/model_runner.py:1137-1139``) runs ``speculator.capture()``; an EAGLE or MTP
      speculator (``spec_decode/target_dependent_ar/speculator.py:89-162``) captures a prefill graph set with
      the target's own sizes and mode at query length ``1 + k`` (as many PIECEWISE and FULL graphs as the
      target) and, with ``k > 1``, FULL decode graphs at query length 1 (sizes up to ``max_num_seqs``),
      counted here once each (a fused decode loop replays ``k - 1`` steps in one graph; not modelled).
      A separate draft model (``standalone_ar/speculator.py:67-71``) captures none: the caller passes 0
      layers for it.
    """
    piecewise, full = vllm.cuda_graph_counts(
        version,
        gpu,
        max_num_seqs,
        max_num_batched_tokens,
        performance_mode,
        num_speculative_tokens=num_speculative_tokens,
        model_runner_v2=model_runner_v2,
    )
    if not model_runner_v2:
        return piecewise
    decode = 0
    if num_speculative_tokens > 1:
        sizes = vllm.cuda_graph_capture_sizes(
            version, gpu, max_num_seqs, max_num_batched_tokens, performance_mode, num_speculative_tokens
        )
        decode = len(vllm.full_decode_sizes(sizes, max_num_seqs))
    return piecewise + full + decode


def compute_graph_estimate_bytes(
    model: ModelSpec, *, piecewise: int, full: int, pp: int, tp: int, drafter_layer_graphs: int = 0
) -> int:
    """``profile_cudagraph_memory``'s estimate for ``piecewise`` + ``full`` graphs: the layers on the rank
    times the graphs at :data:`ESTIMATE_PER_LAYER_GRAPH_BYTES` (x :data:`ESTIMATE_TP_FACTOR` on a
    tensor-parallel rank), plus ``drafter_layer_graphs`` (a drafter's layers times its graphs) at the same
    cost, plus a 4-bit MoE model's first capture."""
    layers = model.num_layers_per_rank(pp)
    per = ESTIMATE_PER_LAYER_GRAPH_BYTES * (ESTIMATE_TP_FACTOR if tp > 1 else 1.0)
    first = 0
    if model.moe is not None and _fp4_weights(model):
        moe_layers = round(layers * model.moe.num_moe_layers / model.num_layers)
        first = moe_layers * ESTIMATE_FP4_MOE_FIRST_CAPTURE_BYTES
    return int(first + per * (layers * (piecewise + full) + drafter_layer_graphs))


def compute_graph_pool_bytes(model: ModelSpec, sizes: int, *, pp: int) -> int:
    """The pool a capture takes after the KV cache (0.19's V1 pools at ``sizes`` capture sizes)."""
    layers = model.num_layers_per_rank(pp)
    moe_share = (model.moe.num_moe_layers / model.num_layers) if model.moe else 0.0
    mxfp4 = model.quantization is not None and model.quantization.method == "mxfp4"
    factor = GRAPH_MXFP4_MOE_FACTOR if mxfp4 else GRAPH_MOE_FACTOR
    weighted_layers = layers * (1 + (factor - 1) * moe_share)
    return int((GRAPH_BASE_GIB + GRAPH_PER_LAYER_GIB * weighted_layers * sizes / 51) * GIB)


def _fp4_weights(model: ModelSpec) -> bool:
    """NVFP4 or MXFP4 weights: the method, compressed-tensors NVFP4, or a ModelOpt mixed-precision checkpoint
    with an FP4 algorithm."""
    q = model.quantization
    if q is None:
        return False
    if q.method in _FP4_METHODS or q.nvfp4:
        return True
    return q.modelopt is not None and any("FP4" in algo for _, algo in q.modelopt.layer_algos)
