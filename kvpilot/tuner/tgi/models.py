"""Which models and quantizations TGI 3.3.7 serves with its own (flash) code, and which of them kvpilot sizes.

Part of :mod:`kvpilot.tuner.tgi` (every TGI fact lives there). From
``server/text_generation_server/models/__init__.py`` at ``v3.3.7``: the ``ModelType`` registry (lines
217-419) names every ``model_type`` TGI has a model of its own for; ``get_model`` (lines 425-1797) serves
each with a ``FlashCausalLM`` (or a VLM) when flash attention is available, some without flash
(``mamba``, ``opt``, ``t5``, ``galactica``, ``bloom``, ``mpt``, ``idefics``). Any other ``model_type`` goes
to transformers' implementation (line 1742) or is refused, "Unsupported model type" (line 1797).
Quantization: ``quant_method`` ``gptq``, ``awq``, ``exl2`` (line 449), ``fp8`` / ``fbgemm_fp8`` (line 452)
and ``compressed-tensors`` (line 455) are picked up from the config; any other is "Unknown quantization
method" (line 462) and loads as if unquantized.
"""

from __future__ import annotations

from kvpilot.tuner import errors

REGISTRY_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "idefics2",
        "idefics3",
        "llava_next",
        "llama",
        "llama4",
        "phi3",
        "granite",
        "gemma",
        "paligemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "cohere",
        "dbrx",
        "mamba",
        "mistral",
        "mixtral",
        "gpt_bigcode",
        "phi",
        "phimoe",
        "baichuan",
        "falcon",
        "starcoder2",
        "qwen2",
        "qwen2_vl",
        "qwen2_5_vl",
        "opt",
        "t5",
        "galactica",
        "santacoder",
        "bloom",
        "mpt",
        "gpt2",
        "gpt_neox",
        "gptj",
        "idefics",
        "mllama",
    }
)
"""``ModelType`` (``models/__init__.py`` lines 217-419), each entry's ``"type"``."""

MODELLED_MODEL_TYPES = frozenset(
    {
        "llama",
        "phi3",
        "granite",
        "gemma",
        "gemma2",
        "gemma3_text",
        "cohere",
        "dbrx",
        "mistral",
        "mixtral",
        "gpt_bigcode",
        "phi",
        "phimoe",
        "baichuan",
        "falcon",
        "starcoder2",
        "qwen2",
        "santacoder",
        "gpt2",
        "gpt_neox",
        "gptj",
    }
)
"""The text-only flash models kvpilot sizes: ``FlashCausalLM`` with one K and one V per KV head in every layer
(``flash_causal_lm.py`` lines 1519-1521). Not modelled: DeepSeek's MLA (its own ``head_size``), the VLMs,
and the non-flash models (``warmup`` answers no max batch total tokens: ``backends/v3/src/lib.rs``
lines 73-85)."""

QUANTIZE_METHODS = frozenset({"gptq", "awq", "fp8", "compressed-tensors"})
"""Of kvpilot's normalised ``quant_method`` names, those TGI picks up (``models/__init__.py`` lines
449-460)."""


def check_served(model_type: str, *, multimodal: bool, quant_method: str | None) -> None:
    """Refuse, by name, a model TGI 3.3.7 does not serve with its own code, or that kvpilot does not size."""
    if model_type not in REGISTRY_MODEL_TYPES:
        raise errors.InvalidEngineArgs(
            f"TGI 3.3.7 has no model of its own for model_type {model_type!r} (ModelType, "
            "server/text_generation_server/models/__init__.py lines 217-419): it would fall back to "
            "transformers' implementation or refuse it ('Unsupported model type'); kvpilot does not model "
            "that fallback's memory"
        )
    if multimodal:
        raise errors.InvalidEngineArgs(
            f"kvpilot's TGI memory model covers text-only models; this {model_type!r} model has a vision "
            "tower, which TGI serves as a VLM (its own warm-up batch with an image): not modelled yet"
        )
    if model_type not in MODELLED_MODEL_TYPES:
        raise errors.InvalidEngineArgs(
            f"TGI 3.3.7 serves model_type {model_type!r}, but kvpilot's TGI memory model covers only its "
            f"text-only flash models ({', '.join(sorted(MODELLED_MODEL_TYPES))}); not modelled yet"
        )
    if quant_method is not None and quant_method not in QUANTIZE_METHODS:
        raise errors.InvalidEngineArgs(
            f"TGI 3.3.7 does not load {quant_method!r} quantization (models/__init__.py lines 449-462 know "
            f"{', '.join(sorted(QUANTIZE_METHODS))}): it would warn 'Unknown quantization method'"
        )
