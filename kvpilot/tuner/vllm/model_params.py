"""Parameters of vLLM 0.33's model classes that a config.json does not state the way other models do.

A vLLM fact, so it lives here (rule 1):

* GLM-4.5 / 4.6 / 4.7 (``Glm4MoeForCausalLM``, ``model_type`` ``glm4_moe``): the MoE router is a
  ``GateLinear`` of ``params_dtype=torch.float32`` (``model_executor/models/glm4_moe.py:141``-``:146``),
  twice a 16-bit weight, in every MoE layer and in the MTP drafter's; its attention normalises queries
  and keys per head (``q_norm`` / ``k_norm``, ``head_dim`` weights each) only when the config's
  ``use_qk_norm`` is true (``glm4_moe.py:296``, ``:350``: GLM-4.5 and 4.6 set it, GLM-4.5-Air does not).

``tests/contract/test_contract_speculative.py`` holds both to vLLM's own ``Glm4MoeMTP`` built on the meta
device (its MTP layer is a ``Glm4MoeDecoderLayer``, the target's).
"""

from __future__ import annotations

FP32_ROUTER_MODEL_TYPES = frozenset({"glm4_moe"})
"""Model types whose MoE router weight vLLM keeps in fp32 (``glm4_moe.py:141``)."""
QK_NORM_FLAG_MODEL_TYPES = frozenset({"glm4_moe"})
"""Model types whose per-head ``q_norm`` / ``k_norm`` exist only when the config's ``use_qk_norm`` is
true (``glm4_moe.py:296``)."""
