"""Which model runner each vLLM release picks for a model when ``VLLM_USE_V2_MODEL_RUNNER`` is unset.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). Read from each release's own wheel
by ``bench/vllm_release_facts.py`` (``tests/data/vllm_release_facts.json``;
``tests/tuner/test_vllm_release_facts.py`` ties this table to it):

* 0.19-0.21: ``envs.py`` defaults the variable to ``"0"``: the V1 runner;
* 0.22-0.28: ``config/vllm.py::VllmConfig._is_default_v2_model_runner_model`` chooses by model:
  ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (on CUDA), and from 0.25 every dense (non-MoE) model;
  0.22-0.23 also want the model dense and unquantized; 0.25-0.26 exclude hybrids, 0.27-0.28 hybrids
  not listed; 0.25+ exclude attention-free models; generate models only;
* 0.29+: ``VllmConfig.use_v2_model_runner`` returns True (features V2 lacks fall back to V1; not modelled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Version = tuple[int, ...]

V2_BY_DEFAULT_SINCE: Version = (0, 29)
"""The first release whose runner default is V2 for every generate model."""
V2_BY_MODEL_SINCE: Version = (0, 22)
"""The first release that picks V2 for some models (``_is_default_v2_model_runner_model``)."""


@dataclass(frozen=True, slots=True)
class RunnerModel:
    """What ``_is_default_v2_model_runner_model`` reads of a model."""

    architecture: str = ""
    is_moe: bool = False
    is_quantized: bool = False
    is_hybrid: bool = False
    is_attention_free: bool = False


@dataclass(frozen=True, slots=True)
class RunnerRule:
    """One release's ``_is_default_v2_model_runner_model`` (the names are the facts file's)."""

    rule: str
    """``listed_dense_unquantized`` | ``listed`` | ``listed_or_dense``."""
    hybrid: str
    """``allowed`` | ``never`` | ``unless_listed``."""
    attention_free: bool
    """Whether an attention-free model may get V2."""
    architectures: frozenset[str]
    """``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (CUDA)."""


_DEEPSEEK_QWEN_GRANITE = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"})
_INKLING = frozenset(
    {"InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM"}
)

RUNNER_RULES: Mapping[Version, RunnerRule] = {
    (0, 22): RunnerRule("listed_dense_unquantized", "allowed", True, frozenset({"Qwen3ForCausalLM"})),
    (0, 23): RunnerRule(
        "listed_dense_unquantized",
        "allowed",
        True,
        frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
    ),
    (0, 24): RunnerRule(
        "listed",
        "allowed",
        True,
        _DEEPSEEK_QWEN_GRANITE | {"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"},
    ),
    (0, 25): RunnerRule("listed_or_dense", "never", False, _DEEPSEEK_QWEN_GRANITE),
    (0, 26): RunnerRule("listed_or_dense", "never", False, _DEEPSEEK_QWEN_GRANITE | _INKLING),
    (0, 27): RunnerRule(
        "listed_or_dense",
        "unless_listed",
        False,
        _DEEPSEEK_QWEN_GRANITE | _INKLING | {"KimiK3ForConditionalGeneration"},
    ),
    (0, 28): RunnerRule(
        "listed_or_dense",
        "unless_listed",
        False,
        _DEEPSEEK_QWEN_GRANITE | _INKLING | {"KimiK3ForConditionalGeneration", "DeepseekV4ForCausalLM"},
    ),
}
"""Minor release -> its per-model rule, for the releases between :data:`V2_BY_MODEL_SINCE` and
:data:`V2_BY_DEFAULT_SINCE`."""


def default_runner_is_v2(version: Version, model: RunnerModel | None = None) -> bool:
    """The release's runner for this model without ``VLLM_USE_V2_MODEL_RUNNER``; ``model=None`` stands
    for a dense, unquantized, attention-only model of an unlisted architecture."""
    if version >= V2_BY_DEFAULT_SINCE:
        return True
    if version < V2_BY_MODEL_SINCE:
        return False
    rule = RUNNER_RULES[version[:2]]
    m = model or RunnerModel()
    listed = m.architecture in rule.architectures
    if m.is_attention_free and not rule.attention_free:
        return False
    if m.is_hybrid and (rule.hybrid == "never" or (rule.hybrid == "unless_listed" and not listed)):
        return False
    if rule.rule == "listed_dense_unquantized":
        return listed and not m.is_moe and not m.is_quantized
    if rule.rule == "listed":
        return listed
    return listed or not m.is_moe
