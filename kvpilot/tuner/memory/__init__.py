"""vLLM's start-up memory accounting, per GPU rank: weights, activations, graphs, then the KV cache.

* :mod:`.budget` -- :func:`compute_budget`: what vLLM would log at start-up (weights, the
  profile run's activation peak, non-torch memory, CUDA graphs, available KV cache, blocks,
  tokens, concurrency) and whether it starts, with vLLM's own error when it would not;
* :mod:`.graphs` -- the CUDA-graph estimate vLLM subtracts, or the pool captured after the KV cache;
* :mod:`.refusals` -- what makes vLLM refuse to start, checked in vLLM's order on that accounting;
* :mod:`.kv_cache` -- pages, block groups and block counts per layer kind, and the fit check;
* :mod:`.weights` -- the bytes each rank loads, quantization and padding included;
* :mod:`.lora` -- the LoRA buffers vLLM preallocates with ``--enable-lora``, loaded with the weights;
* :mod:`.kv_connector` -- what a ``--kv-transfer-config`` connector allocates after the KV cache is sized;
* :mod:`.speculative` -- an MTP drafter's weights, buffers and KV layers (``--speculative-config``), and the
  drafter a budget counts, resolved once (:class:`Drafter`);
* :mod:`.moe_kernels` -- what the MoE kernel ``--moe-backend`` picks takes in the profile run, where read;
* :mod:`.eagle3` -- an EAGLE3 drafter's weights and KV layers, from its ``config.json``;
* :mod:`.draft_model` -- a separate draft model's weights and KV layers, from its ``config.json``;
* :mod:`.estimate` -- ``kvpilot estimate --cases FILE``: one budget per case of the calibration
  set's schema.

Above :mod:`kvpilot.tuner.model` and :mod:`kvpilot.tuner.vllm` (it asks the latter what each
release does), below the planner.
"""

from kvpilot.tuner.memory.budget import (
    MEMORY_MODEL_VERSION,
    compute_activation_bytes,
    compute_budget,
    compute_non_torch_bytes,
    compute_sampler_state_bytes,
    compute_warmup_logits_bytes,
    graph_speculation,
    resolve_settings,
)
from kvpilot.tuner.memory.draft_model import (
    budgeted_draft_model,
    compute_draft_model_weight_bytes,
    read_draft_model,
    with_draft_model_layers,
)
from kvpilot.tuner.memory.eagle3 import budgeted_eagle3_draft, compute_eagle3_weight_bytes, with_eagle3_layers
from kvpilot.tuner.memory.estimate import OUTPUT_KEYS, CaseError, compute_case_budget, compute_estimates
from kvpilot.tuner.memory.graphs import compute_cuda_graph_bytes, drafter_graph_count
from kvpilot.tuner.memory.kv_cache import (
    KvCapacity,
    KvGroup,
    KvLayout,
    compute_capacity,
    compute_kv_layout,
    compute_longest_fitting_len,
    compute_num_blocks,
)
from kvpilot.tuner.memory.kv_connector import compute_kv_connector_bytes, kv_connector_unbudgeted_reason
from kvpilot.tuner.memory.lora import compute_lora_bytes, compute_punica_bytes, lora_unbudgeted_reason
from kvpilot.tuner.memory.moe_kernels import (
    MoeKernelBytes,
    check_moe_backend_model,
    compute_cutlass_fp4_moe_bytes,
    compute_moe_kernel_bytes,
    describe_unbudgeted_moe_backend,
    nvfp4_experts,
)
from kvpilot.tuner.memory.refusals import CUDA_CONTEXT_GIB, NCCL_GIB
from kvpilot.tuner.memory.speculative import (
    Drafter,
    check_speculative_model,
    compute_drafter_bytes,
    compute_drafter_weight_bytes,
    compute_proposer_buffer_bytes,
    compute_speculative_bytes,
    describe_unbudgeted_speculative,
    resolve_drafter,
    speculative_state_tokens,
    speculative_unbudgeted_reason,
    with_drafter_layers,
    with_mtp_layers,
)
from kvpilot.tuner.memory.weights import (
    ONE_ENGINE,
    ExpertShards,
    WeightBreakdown,
    compute_weight_breakdown,
    compute_weight_bytes,
    padded_vocab_size,
)

__all__ = [
    "CUDA_CONTEXT_GIB",
    "CaseError",
    "Drafter",
    "ExpertShards",
    "KvCapacity",
    "KvGroup",
    "KvLayout",
    "MEMORY_MODEL_VERSION",
    "MoeKernelBytes",
    "NCCL_GIB",
    "ONE_ENGINE",
    "OUTPUT_KEYS",
    "WeightBreakdown",
    "budgeted_draft_model",
    "budgeted_eagle3_draft",
    "check_moe_backend_model",
    "check_speculative_model",
    "compute_activation_bytes",
    "compute_budget",
    "compute_capacity",
    "compute_case_budget",
    "compute_cuda_graph_bytes",
    "compute_cutlass_fp4_moe_bytes",
    "compute_draft_model_weight_bytes",
    "compute_drafter_bytes",
    "compute_drafter_weight_bytes",
    "compute_eagle3_weight_bytes",
    "compute_estimates",
    "compute_kv_connector_bytes",
    "compute_kv_layout",
    "compute_longest_fitting_len",
    "compute_lora_bytes",
    "compute_moe_kernel_bytes",
    "compute_non_torch_bytes",
    "compute_num_blocks",
    "compute_proposer_buffer_bytes",
    "compute_punica_bytes",
    "compute_sampler_state_bytes",
    "compute_speculative_bytes",
    "compute_warmup_logits_bytes",
    "compute_weight_breakdown",
    "compute_weight_bytes",
    "describe_unbudgeted_moe_backend",
    "describe_unbudgeted_speculative",
    "drafter_graph_count",
    "graph_speculation",
    "kv_connector_unbudgeted_reason",
    "lora_unbudgeted_reason",
    "nvfp4_experts",
    "padded_vocab_size",
    "read_draft_model",
    "resolve_drafter",
    "resolve_settings",
    "speculative_state_tokens",
    "speculative_unbudgeted_reason",
    "with_draft_model_layers",
    "with_drafter_layers",
    "with_eagle3_layers",
    "with_mtp_layers",
]
