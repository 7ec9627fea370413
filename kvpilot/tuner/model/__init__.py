"""A model as the memory model sees it: ``config.json`` -> :class:`ModelSpec`, and the built-in catalogue.

* :mod:`.spec` reads a Hugging Face config (a mapping: the caller reads the file) into a frozen
  :class:`ModelSpec`: the text decoder's geometry, every layer's kind, MoE, MLA, linear-attention
  state, quantization, the vision tower's size and the default ``max_model_len``;
* :mod:`.layers` holds the layer kinds and their geometry, :mod:`.quantization` what a
  ``quantization_config`` says;
* :mod:`.fields` reads each value with its type and range checked, against the documented
  limits (``MAX_LAYERS``...); :func:`parse_config_json` is the edges' bounded JSON reader;
  :mod:`.readers` reads the layers, MLA, MoE and vision parts; :mod:`.vision` the Qwen-style vision
  tower whose profile forward the memory model sizes, :mod:`.processors` the checkpoint's processor files
  that size it (read by the caller, beside config.json);
* :mod:`.catalogue` looks popular models' published configs up by Hugging Face id
  (:mod:`.configs` holds them, one module per family).

Above :mod:`kvpilot.tuner.vllm` (which vLLM release derives what), below the memory model.
A config it cannot account for raises :class:`~kvpilot.tuner.errors.InvalidModelConfig` naming the
field: it never guesses.
"""

from kvpilot.tuner.model.catalogue import (
    list_models,
    lookup_checkpoint_bytes,
    lookup_model,
    lookup_model_config,
)
from kvpilot.tuner.model.configs import ModelEntry
from kvpilot.tuner.model.eagle3 import Eagle3DraftSpec, read_eagle3_draft
from kvpilot.tuner.model.fields import MAX_CONFIG_BYTES, MAX_JSON_DEPTH, MAX_JSON_VALUES, parse_config_json
from kvpilot.tuner.model.layers import (
    BLOCK_ATTENTION,
    BLOCK_MIXER,
    BLOCK_MLP,
    BLOCK_MOE,
    CHUNKED,
    COMPRESSED,
    DTYPE_BYTES,
    FULL,
    GDN,
    KDA,
    LINEAR,
    MAMBA1,
    MAMBA2,
    MLA,
    NO_KV,
    SHORT_CONV,
    SLIDING,
    CompressedAttentionSpec,
    LayerSpec,
    LinearStateSpec,
    MlaSpec,
    MoeSpec,
)
from kvpilot.tuner.model.modelopt import (
    DENSE,
    EXPERTS,
    MIXER,
    QUANT_SIDECAR,
    SHARED,
    ModelOptSpec,
    build_config_with_quant_sidecar,
    compute_component_bytes,
    compute_lm_head_bytes,
    is_quantization_in_config,
)
from kvpilot.tuner.model.processors import (
    PREPROCESSOR,
    PROCESSOR_FILES,
    VIDEO_PREPROCESSOR,
    apply_processor_files,
    reads_processor_files,
)
from kvpilot.tuner.model.quantization import QuantSpec, build_quant_spec, compute_bytes_per_weight
from kvpilot.tuner.model.spec import ModelSpec, build_model_spec

__all__ = [
    "BLOCK_ATTENTION",
    "BLOCK_MIXER",
    "BLOCK_MLP",
    "BLOCK_MOE",
    "CHUNKED",
    "COMPRESSED",
    "CompressedAttentionSpec",
    "DENSE",
    "DTYPE_BYTES",
    "EXPERTS",
    "Eagle3DraftSpec",
    "FULL",
    "GDN",
    "KDA",
    "LINEAR",
    "LayerSpec",
    "LinearStateSpec",
    "MAMBA1",
    "MAMBA2",
    "MAX_CONFIG_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MIXER",
    "MLA",
    "MlaSpec",
    "ModelEntry",
    "ModelOptSpec",
    "ModelSpec",
    "MoeSpec",
    "NO_KV",
    "PREPROCESSOR",
    "PROCESSOR_FILES",
    "QUANT_SIDECAR",
    "QuantSpec",
    "SHARED",
    "SHORT_CONV",
    "SLIDING",
    "VIDEO_PREPROCESSOR",
    "apply_processor_files",
    "build_config_with_quant_sidecar",
    "build_model_spec",
    "build_quant_spec",
    "compute_bytes_per_weight",
    "compute_component_bytes",
    "compute_lm_head_bytes",
    "is_quantization_in_config",
    "list_models",
    "lookup_checkpoint_bytes",
    "lookup_model",
    "lookup_model_config",
    "parse_config_json",
    "read_eagle3_draft",
    "reads_processor_files",
]
