"""The GPU bytes a KV connector (``--kv-transfer-config``) allocates at start-up on one rank.

The facts are :mod:`kvpilot.tuner.vllm.kv_connectors`' (vLLM 0.33 and LMCache 0.5.6, cited there): the
worker's connector is built after vLLM has sized the KV cache, so these bytes do not shrink the KV cache;
they come out of the memory ``--gpu-memory-utilization`` leaves free (the budget's start check holds them
there, :mod:`.refusals`). Only LMCache's default GPU connector has a buffer of its own at start-up: one
``chunk_size`` chunk of KV, ``(K/V planes, layers of the stage, chunk_size, kv_heads / tp, head_size)`` in
the KV cache's dtype. Models LMCache's vLLM adapter shapes otherwise (state-space or compressed attention)
are not counted: :func:`kv_connector_unbudgeted_reason` says so and the plan warns.
"""

from __future__ import annotations

import math

from kvpilot.tuner import vllm
from kvpilot.tuner.model import DTYPE_BYTES, ModelSpec


def kv_connector_unbudgeted_reason(model: ModelSpec, connector: vllm.KvConnector) -> str | None:
    """Why :func:`compute_kv_connector_bytes` cannot count ``connector``'s buffer for this model, or
    ``None``."""
    if not vllm.lmcache_staging_chunk(connector):
        return None
    if model.linear_state is not None or any(layer.with_state for layer in model.layers):
        return "its state-space / linear-attention layers"
    if model.compressed is not None:
        return "its compressed attention"
    return None


def compute_kv_connector_bytes(
    model: ModelSpec,
    connector: vllm.KvConnector | None,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pp_rank: int = 0,
    kv_cache_dtype: str | None = None,
    dtype: str | None = None,
) -> int:
    """GPU bytes ``connector`` allocates on one (TP, PP) rank at start-up: LMCache's staging buffer of
    ``chunk_size`` tokens of KV (``VLLMPagedMemGPUConnectorV2``); 0 for connectors with none, and for a
    model :func:`kv_connector_unbudgeted_reason` refuses."""
    chunk = vllm.lmcache_staging_chunk(connector)
    if not chunk or connector is None or kv_connector_unbudgeted_reason(model, connector) is not None:
        return 0
    layers = model.num_layers_per_rank(pipeline_parallel_size, pp_rank)
    heads = model.kv_heads_per_rank(tensor_parallel_size)
    if model.mla is not None:  # one latent plane: kv_lora_rank + the rope part (get_head_size)
        planes, head_size = 1, model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    else:
        planes, head_size = 2, model.head_dim
    element = vllm.kv_element_bytes(kv_cache_dtype, DTYPE_BYTES[dtype or model.dtype])
    return math.ceil(planes * layers * chunk * heads * head_size * element)
