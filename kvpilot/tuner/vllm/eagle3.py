"""vLLM 0.33's EAGLE3 drafter (``--speculative-config '{"method": "eagle3", "model": ..., ...}'``).

The draft checkpoint's own ``config.json`` becomes an ``EAGLEConfig`` (``config/speculative.py:1514``)
whose ``architectures`` are the checkpoint's, each prefixed ``Eagle3`` unless it already starts or ends
with it (``transformers_utils/configs/eagle.py:55``: ``LlamaForCausalLM`` -> ``Eagle3LlamaForCausalLM``,
``LlamaForCausalLMEagle3`` stays); the registry maps those of Llama's shape to ``Eagle3LlamaForCausalLM``
(``model_executor/models/registry.py:698``-``:704``). The draft's ``ModelConfig`` takes the target's
dtype (``config/speculative.py:1418``).

``Eagle3LlamaForCausalLM`` (``model_executor/models/llama_eagle3.py``):

* ``num_hidden_layers`` decoder layers (``:198``, named ``layers.{target layers + i}``, ``:202``), each a
  Llama decoder layer (``LlamaAttention`` with the draft's heads, KV heads and ``head_dim``, its o_proj
  biased as ``attention_bias``; ``LlamaMLP``, biased as ``mlp_bias``; ``input_layernorm`` and
  ``post_attention_layernorm``) whose ``qkv_proj`` is rebuilt with ``2 x hidden`` inputs in the first
  layer (the embedding and the hidden state concatenated; ``hidden`` after) and a bias when
  ``attention_bias`` (``:82``-``:96``), and one more RMSNorm, ``hidden_norm`` (``:98``). The drafter's
  quantization is its own checkpoint's (``get_draft_quant_config``, ``:108``);
* its own ``embed_tokens`` (``VocabParallelEmbedding`` of ``vocab_size``, ``:192``), which the proposer
  replaces with the target's after load unless the checkpoint holds one that differs
  (``process_eagle_weight``, ``models/utils.py:1178``, sets ``has_own_embed_tokens``;
  ``maybe_share_target_embed``, ``v1/worker/gpu/spec_decode/eagle/utils.py:45``, ``_should_share``,
  ``:18``; V1: ``llm_base_proposer.py:1418``): the published EAGLE3 checkpoints hold none;
* ``fc``, a ``ReplicatedLinear`` (whole on every TP rank) from ``target_hidden_size`` (default
  ``hidden_size``) times the aux hidden states (``num_aux_hidden_states``, else the length of
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, else 3) to ``hidden_size`` (``:218``-``:250``),
  when ``eagle_config.use_aux_hidden_state`` (default true); an ``input_norm`` of that width with
  ``norm_before_fc``, one RMSNorm of ``target_hidden_size`` per aux state with ``fc_norm``
  (``:223``-``:240``); the final ``norm`` (``:253``);
* its own ``lm_head``, a ``ParallelLMHead`` over ``draft_vocab_size`` (``vocab_size`` when absent,
  ``:314``, ``:329``), kept after load when the checkpoint holds one (``has_own_lm_head``, ``_should_share``
  compares it with the target's: a head of another vocabulary always differs);
* ``draft_id_to_target_id`` (the checkpoint's ``d2t``), an ``int64`` parameter of ``draft_vocab_size``
  when that differs from the target's vocabulary (``:339``); ``t2d`` is not loaded (``:426``);
  ``mask_hidden`` only with ``parallel_drafting`` (``:349``).

Its attention layers join the target's in one KV cache config (``llm_base_proposer.py:1328``; Model
Runner V2 builds the drafter inside ``load_eagle_model``, ``eagle/utils.py:80``, and plans its layers
with the target's): vLLM's planner sees the target's layers and the drafter's.
"""

from __future__ import annotations

EAGLE3 = "eagle3"
"""The method (``config/speculative.py:72``)."""
EAGLE3_LLAMA_ARCHITECTURES = (
    "Eagle3LlamaForCausalLM",
    "Eagle3MiniMaxM2ForCausalLM",
    "Eagle3Qwen2_5vlForCausalLM",
    "Eagle3Qwen3vlForCausalLM",
    "LlamaForCausalLMEagle3",
)
"""The drafter architectures (after :func:`eagle3_architecture`) the registry builds as
``Eagle3LlamaForCausalLM`` (``model_executor/models/registry.py:700``-``:704``), the class kvpilot
budgets."""
DRAFT_CONFIG_FLAG = "--draft-config"
"""``kvpilot plan``'s flag that gives the draft checkpoint's ``config.json``."""


def eagle3_architecture(architecture: str) -> str:
    """The architecture vLLM gives the draft of ``architecture`` under ``eagle3``
    (``transformers_utils/configs/eagle.py:59``)."""
    if architecture.startswith("Eagle3") or architecture.endswith("Eagle3"):
        return architecture
    return f"Eagle3{architecture}"
