"""NVIDIA ModelOpt checkpoints: which format each linear is stored in. Pure.

Sits beside :mod:`kvpilot.tuner.model.quantization`, which calls :func:`build_modelopt_spec` for a
``quantization_config`` whose ``quant_method`` is ``modelopt``; :mod:`kvpilot.tuner.memory.weights` asks
:func:`compute_component_bytes` what one component of one decoder layer costs. The facts are vLLM 0.33's
(``vllm/model_executor/layers/quantization/modelopt.py``):

* ``quant_algo`` (top level, or under ``quantization`` as the older ``hf_quant_config.json`` writes it) names
  one of :data:`LINEAR_ALGOS` (vLLM's table of the same name) or ``MIXED_PRECISION``. ``modelopt`` with an
  NVFP4 algorithm is vLLM's ``modelopt_fp4``, with MXFP8 ``modelopt_mxfp8``: FP4 weights are half the bytes
  of FP8 ones, so an NVFP4 checkpoint sized as FP8 is counted at nearly twice its weight.
* ``ignore`` (``exclude_modules`` in older exports) lists module wildcards vLLM leaves unquantized
  (``is_layer_excluded``: ``fnmatch`` or a substring of the module's name). Published NVFP4 checkpoints
  keep attention, shared experts and the first dense layers in bf16 that way.
* ``MIXED_PRECISION``: ``quantized_layers`` maps module names to their algorithm; a module it does not list
  is unquantized.
* The output head (``ParallelLMHead``) is quantized like any linear
  (``ModelOptQuantConfigBase.get_quant_method``) unless excluded; under ``MIXED_PRECISION`` by the algorithm
  ``quantized_layers`` gives ``lm_head`` (:func:`compute_lm_head_bytes`). A multimodal model's head is
  ``language_model.lm_head`` in vLLM: ``ModelOptMixedPrecisionConfig._quantized_layer_prefix_candidates``
  also tries ``lm_head`` for a prefix ending in ``.lm_head`` (0.22.1, 0.24.0, 0.26.0, 0.28.0, 0.33.0; 0.20.2's
  ``_resolve_quant_algo`` looks up the prefix alone, so such a checkpoint's packed FP4 head cannot load
  there). nvidia/Qwen3.6-27B-NVFP4 loads 19.78 GiB on vLLM 0.23 (W4A16 NVFP4 head: 19.60 GiB counted; a bf16
  head would be 21.30).

A decoder layer's linears fall in four components (:data:`COMPONENTS`): the token mixer (attention, linear
attention, Mamba), the dense MLP, the shared experts, and the routed experts. A component is matched by the
module names Hugging Face checkpoints give it, under the prefixes they use (``model.layers.N``,
``model.language_model.layers.N``, ``language_model.model.layers.N``...). The routed experts are taken as
excluded only when a wildcard excludes the whole layer: an ``mlp*`` wildcard names the dense MLP beside
Gemma 4's experts, not its experts, and no published checkpoint leaves its experts unquantized.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors
from kvpilot.tuner.model.fields import Fields, Limit, refuse

MIXER, DENSE, SHARED, EXPERTS = "mixer", "dense", "shared", "experts"
COMPONENTS = (MIXER, DENSE, SHARED, EXPERTS)

LINEAR_ALGOS: dict[str, tuple[str, float]] = {
    "FP8": ("modelopt", 1.0),
    "FP8_PER_CHANNEL_PER_TOKEN": ("modelopt", 1.0),
    "FP8_PB_WO": ("modelopt", 1.0),
    "NVFP4": ("modelopt_fp4", 0.5 + 1 / 16),
    "W4A16_NVFP4": ("modelopt_fp4", 0.5 + 1 / 16),
    "MXFP8": ("modelopt_mxfp8", 1.0 + 1 / 32),
}
"""vLLM 0.33's ``LINEAR_ALGOS``: each algorithm's owning method and the bytes per weight it stores (FP8: one
byte, per-tensor, per-channel or 128x128 block scales negligible; NVFP4: e2m1 and one FP8 scale per 16;
MXFP8: e4m3 and one e8m0 scale per 32)."""
MIXED_PRECISION = "MIXED_PRECISION"
QUANT_SIDECAR = "hf_quant_config.json"
"""Where ModelOpt 0.29 and before saved the quantization, beside config.json (Nemotron 3's NVFP4 and FP8
builds still do): vLLM reads it when config.json has no ``quantization_config``."""
LEGACY_METHODS = {
    "FP8": "modelopt",
    "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
    "FP8_PB_WO": "modelopt",
    "NVFP4": "modelopt_fp4",
    "MIXED_PRECISION": "modelopt_mixed",
}
"""vLLM's ``_normalize_quantization_config``: the method a sidecar (no ``quant_method``, ``producer`` named
``modelopt``, the algorithm under ``quantization``) gets; any other algorithm there is refused."""
MAX_EXCLUDED = Limit(8192, "Qwen3.5-397B-A17B-NVFP4 excludes 184 module patterns")
MAX_QUANTIZED_LAYERS = Limit(1 << 17, "Qwen3.6-27B-NVFP4 lists 401 modules")
MAX_PATTERN_LENGTH = 512
BLOCK_FP8_ALIASES = {"FP8_BLOCK_SCALES": "FP8_PB_WO"}
"""vLLM's ``_BLOCK_FP8_MOE_ALGOS``: an early name of the block-FP8 layout."""

_PREFIXES = (
    "model.layers.",
    "model.language_model.layers.",
    "language_model.model.layers.",
    "model.decoder.layers.",
    "backbone.layers.",
    "transformer.h.",
    "layers.",
)
_NAMES: dict[str, tuple[str, ...]] = {  # the routed experts: only with their whole layer
    MIXER: (
        "self_attn.q_proj",
        "self_attn.o_proj",
        "attn.wq_a",
        "linear_attn.in_proj_qkv",
        "linear_attn.out_proj",
        "mixer.in_proj",
        "attention.wqkv",
        "self_attention.linear_qkv",
    ),
    DENSE: ("mlp.gate_proj", "mlp.down_proj", "feed_forward.w1", "ffn.w1", "mlp.fc1", "mixer.up_proj"),
    SHARED: (
        "mlp.shared_expert.down_proj",
        "mlp.shared_experts.down_proj",
        "ffn.shared_experts.w1",
        "block_sparse_moe.shared_experts.w1",
        "feed_forward.shared_expert.w1",
    ),
}
"""Module names (after a layer's prefix) that stand for each component when a wildcard is tried on them."""
_LAYER = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.(.+)$")


@dataclass(frozen=True, slots=True)
class ModelOptSpec:
    """What a ModelOpt ``quantization_config`` says about the weights."""

    algo: str
    """``quant_algo``, upper-cased (a key of :data:`LINEAR_ALGOS`, or ``MIXED_PRECISION``)."""
    excluded: tuple[str, ...] = ()
    """``ignore`` / ``exclude_modules``: modules left unquantized."""
    layer_algos: tuple[tuple[str, str], ...] = ()
    """``MIXED_PRECISION``: ``quantized_layers`` as (module, algorithm)."""

    @property
    def method(self) -> str:
        """vLLM's quantization method for the checkpoint (``modelopt``, ``modelopt_fp4``...)."""
        return "modelopt_mixed" if self.algo == MIXED_PRECISION else LINEAR_ALGOS[self.algo][0]

    @property
    def bytes_per_weight(self) -> float:
        """A quantized linear's bytes per weight (mixed precision: the heaviest algorithm it lists)."""
        if self.algo != MIXED_PRECISION:
            return LINEAR_ALGOS[self.algo][1]
        return max(LINEAR_ALGOS[a][1] for _, a in self.layer_algos)


def _algo(text: str | None, where: str) -> str:
    algo = (text or "").upper()
    algo = BLOCK_FP8_ALIASES.get(algo, algo)
    if algo not in LINEAR_ALGOS and algo != MIXED_PRECISION:
        known = ", ".join([*LINEAR_ALGOS, MIXED_PRECISION])
        raise errors.InvalidModelConfig(
            f"{where} {(text or '')[:40]!r} is not a ModelOpt algorithm vLLM 0.33 loads ({known})",
            field=where,
        )
    return algo


def build_config_with_quant_sidecar(
    config: Mapping[str, Any], sidecar: Mapping[str, Any] | None
) -> Mapping[str, Any]:
    """config.json with the :data:`QUANT_SIDECAR` as its ``quantization_config``, as vLLM reads a checkpoint
    (``transformers_utils/config.py``): only when config.json has none (at the top or in ``text_config``)."""
    if sidecar is None or is_quantization_in_config(config):
        return config
    return {**config, "quantization_config": dict(sidecar)}


def is_quantization_in_config(config: Mapping[str, Any]) -> bool:
    """Whether config.json has a ``quantization_config`` of its own (vLLM then reads no sidecar)."""
    text = config.get("text_config")
    return "quantization_config" in config or (isinstance(text, Mapping) and "quantization_config" in text)


def is_legacy_sidecar(q: Fields) -> bool:
    """A ModelOpt sidecar that names no ``quant_method``: vLLM sets it from the algorithm."""
    producer = q.child("producer")
    inner = q.child("quantization")
    legacy = inner is not None and inner.present("modelopt_quant_config")
    return (
        not q.present("quant_method")
        and inner is not None
        and (legacy or (producer is not None and producer.string("name") == "modelopt"))
    )


def compute_legacy_method(q: Fields) -> str:
    """The method vLLM gives a sidecar (:data:`LEGACY_METHODS`), or a refusal naming the algorithm."""
    inner = q.child("quantization")
    assert inner is not None
    algo = (inner.string("quant_algo") or "").upper()
    if algo not in LEGACY_METHODS:
        raise errors.InvalidModelConfig(
            f"{inner.path('quant_algo')} {algo[:40]!r}: vLLM 0.33 refuses it in {QUANT_SIDECAR} "
            f'("Unknown ModelOpt quant algo"; it reads {", ".join(LEGACY_METHODS)} there)',
            field=inner.path("quant_algo"),
        )
    return LEGACY_METHODS[algo]


def build_modelopt_spec(q: Fields) -> ModelOptSpec:
    """Parse a ModelOpt ``quantization_config`` (config.json's compressed-tensors-like form, or the
    ``quantization`` object of ``hf_quant_config.json``)."""
    inner = q.child("quantization") or q
    algo = _algo(inner.string("quant_algo"), inner.path("quant_algo"))
    key = "ignore" if inner.present("ignore") else "exclude_modules"
    excluded = inner.strings(key) or []
    if len(excluded) > MAX_EXCLUDED.maximum:
        raise refuse(
            inner.path(key),
            f"at most {MAX_EXCLUDED.maximum} patterns ({MAX_EXCLUDED.published})",
            f"{len(excluded)} patterns",
        )
    long = next((p for p in excluded if len(p) > MAX_PATTERN_LENGTH), None)
    if long is not None:
        raise refuse(inner.path(key), f"module patterns of at most {MAX_PATTERN_LENGTH} characters", long)
    layer_algos: list[tuple[str, str]] = []
    if algo == MIXED_PRECISION:
        layers = inner.child("quantized_layers")
        if layers is not None and len(layers.data) > MAX_QUANTIZED_LAYERS.maximum:
            raise refuse(
                inner.path("quantized_layers"),
                f"at most {MAX_QUANTIZED_LAYERS.maximum} modules ({MAX_QUANTIZED_LAYERS.published})",
                f"{len(layers.data)} modules",
            )
        for name in layers.data if layers is not None else ():
            entry = layers.child(name) if layers is not None else None
            where = f"{inner.path('quantized_layers')}.{name}.quant_algo"
            layer_algos.append((name, _algo(entry.string("quant_algo") if entry else None, where)))
        if not layer_algos:
            raise errors.InvalidModelConfig(
                "a MIXED_PRECISION ModelOpt config needs a 'quantized_layers' mapping",
                field=inner.path("quantized_layers"),
            )
    return ModelOptSpec(algo, tuple(excluded), tuple(layer_algos))


def _component_of(tail: str) -> str | None:
    """The component a module name (after ``layers.N.``) belongs to; ``None``: a router or a norm."""
    parts = tail.split(".")
    if "shared_expert" in tail or "shared_experts" in tail:
        return SHARED
    if "experts" in parts:
        return EXPERTS
    if parts[0] in ("self_attn", "attn", "linear_attn", "attention", "self_attention", "mixer"):
        return MIXER
    if parts[0] in ("mlp", "feed_forward", "ffn") and parts[-1] not in ("gate", "router"):
        return DENSE
    return None


@dataclass(frozen=True, slots=True)
class _Matcher:
    """vLLM's ``is_layer_excluded`` over every pattern at once: a wildcard match (``fnmatch``), or a
    pattern as a substring of the module's name."""

    wildcard: re.Pattern[str] | None
    substring: re.Pattern[str] | None
    whole_layer: re.Pattern[str] | None
    """The wildcards alone (a whole layer is excluded only by one: ``model.layers.0*``)."""

    def excluded(self, name: str) -> bool:
        return bool(
            (self.wildcard and self.wildcard.match(name)) or (self.substring and self.substring.search(name))
        )


def _alternatives(parts: Iterable[str]) -> re.Pattern[str] | None:
    joined = "|".join(f"(?:{p})" for p in parts)
    return re.compile(joined) if joined else None


@functools.lru_cache(maxsize=64)
def _matcher(excluded: tuple[str, ...]) -> _Matcher:
    return _Matcher(
        _alternatives(fnmatch.translate(p) for p in excluded),
        _alternatives(re.escape(p) for p in excluded),
        _alternatives(fnmatch.translate(p) for p in excluded if "*" in p),
    )


@functools.lru_cache(maxsize=64)
def _mixed_table(layer_algos: tuple[tuple[str, str], ...]) -> dict[tuple[int, str], float]:
    """``quantized_layers`` as the bytes per weight of each (layer, component) it lists (the heaviest
    algorithm where a component's modules differ); MTP modules are not decoder layers."""
    table: dict[tuple[int, str], float] = {}
    for name, algo in layer_algos:
        found = None if name.startswith("mtp") else _LAYER.search(name)
        component = _component_of(found.group(2)) if found else None
        if found and component:
            key = (int(found.group(1)), component)
            table[key] = max(table.get(key, 0.0), LINEAR_ALGOS[algo][1])
    return table


def component_names(layer: int, component: str) -> list[str]:
    """The module names that stand for ``component`` of decoder layer ``layer`` when a wildcard is tried
    on them (the routed experts: a name only a whole-layer wildcard matches)."""
    if component == EXPERTS:
        return [f"{p}{layer}.__layer__" for p in _PREFIXES]
    return [f"{p}{layer}.{tail}" for p in _PREFIXES for tail in _NAMES[component]]


@functools.lru_cache(maxsize=1 << 14)
def compute_component_bytes(spec: ModelOptSpec, layer: int, component: str, dtype_bytes: float) -> float:
    """Bytes per weight of ``component`` in decoder layer ``layer``: the model dtype's when vLLM leaves it
    unquantized (excluded, or not listed by a mixed-precision config), else its algorithm's."""
    if spec.excluded:
        match = _matcher(spec.excluded)
        names = component_names(layer, component)
        if component == EXPERTS:  # excluded only with the whole layer
            whole = match.whole_layer
            if whole is not None and any(whole.match(n) for n in names):
                return dtype_bytes
        elif any(match.excluded(n) for n in names):
            return dtype_bytes
    if spec.algo != MIXED_PRECISION:
        return LINEAR_ALGOS[spec.algo][1]
    return _mixed_table(spec.layer_algos).get((layer, component), dtype_bytes)


LM_HEAD_NAMES = ("lm_head", "language_model.lm_head", "model.language_model.lm_head")
"""The output head's names: a causal LM's, vLLM's multimodal prefix, a Hugging Face multimodal
checkpoint's."""


def compute_lm_head_bytes(spec: ModelOptSpec, dtype_bytes: float) -> float:
    """Bytes per weight of the output head as vLLM loads it: the model dtype's when a pattern excludes it
    (``is_layer_excluded``: published NVFP4 builds list ``lm_head``), under ``MIXED_PRECISION`` the algorithm
    ``quantized_layers`` gives it (none: unquantized), else the checkpoint's algorithm."""
    if spec.excluded and any(_matcher(spec.excluded).excluded(n) for n in LM_HEAD_NAMES):
        return dtype_bytes
    if spec.algo != MIXED_PRECISION:
        return LINEAR_ALGOS[spec.algo][1]
    listed = [LINEAR_ALGOS[a][1] for name, a in spec.layer_algos if name in LM_HEAD_NAMES]
    return max(listed) if listed else dtype_bytes
