"""Which model architectures a vLLM release serves: the ones it removed, and since when.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). The memory model refuses an
architecture the pinned release no longer runs rather than predict a start that cannot happen
(``Llama-3.2-11B-Vision``'s ``MllamaForConditionalGeneration`` went with 0.10.2's V0 engine).
Source: the pinned wheel's ``vllm/model_executor/models/registry.py::_PREVIOUSLY_SUPPORTED_MODELS``
(the last release that served each); ``tests/contract/test_contract_architectures.py`` ties the
two.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.registry_data import REGISTRY_RELEASES, SERVED
from kvpilot.tuner.vllm.versions import NEWEST_MODELLED, PINNED_VLLM_VERSION, Version, parse_version

_PREVIOUSLY_SUPPORTED: Mapping[str, str] = {
    "MotifForCausalLM": "0.10.2",
    "Phi3SmallForCausalLM": "0.9.2",
    "Phi4FlashForCausalLM": "0.10.2",
    "Phi4MultimodalForCausalLM": "0.12.0",
    "JAISLMHeadModel": "0.22.0",
    "ErnieModel": "0.23.0",
    "ErnieForSequenceClassification": "0.23.0",
    "ErnieForTokenClassification": "0.23.0",
    "InternLM2VEForCausalLM": "0.23.0",
    "QWenLMHeadModel": "0.23.0",
    "QwenVLForConditionalGeneration": "0.23.0",
    "InternLMForCausalLM": "0.23.0",
    "DonutForConditionalGeneration": "0.10.2",
    "MllamaForConditionalGeneration": "0.10.2",
    "XverseForCausalLM": "0.23.0",
    "Dots1ForCausalLM": "0.23.0",
    "BambaForCausalLM": "0.23.0",
    "MiniMaxForCausalLM": "0.23.0",
    "MiniMaxText01ForCausalLM": "0.23.0",
    "MiniMaxM1ForCausalLM": "0.23.0",
    "MiniMaxVL01ForConditionalGeneration": "0.23.0",
    "BaiChuanForCausalLM": "0.23.0",
    "BaichuanForCausalLM": "0.23.0",
    "AquilaModel": "0.24.0",
    "AquilaForCausalLM": "0.24.0",
    "Grok1ModelForCausalLM": "0.24.0",
    "Grok1ForCausalLM": "0.24.0",
    "TarsierForConditionalGeneration": "0.24.0",
    "Tarsier2ForConditionalGeneration": "0.23.0",
    "MantisForConditionalGeneration": "0.24.0",
    "MusicFlamingoForConditionalGeneration": "0.24.0",
    "AyaVisionForConditionalGeneration": "0.24.0",
    "TeleChatForCausalLM": "0.25.0",
    "PersimmonForCausalLM": "0.25.0",
    "FuyuForCausalLM": "0.25.0",
    "Plamo2ForCausalLM": "0.26.0",
    "OuroForCausalLM": "0.26.0",
    "ArcticForCausalLM": "0.28.0",
    "ChameleonForConditionalGeneration": "0.28.0",
    "Cheers": "0.28.0",
    "CheersForConditionalGeneration": "0.28.0",
    "Fairseq2LlamaForCausalLM": "0.28.0",
    "FireRedLIDForConditionalGeneration": "0.28.0",
    "GritLM": "0.28.0",
    "HCXVisionForCausalLM": "0.28.0",
    "MPTForCausalLM": "0.28.0",
    "MptForCausalLM": "0.28.0",
    "RWForCausalLM": "0.28.0",
    "StableLMEpochForCausalLM": "0.28.0",
    "PrithviGeoSpatialMAE": "0.28.0",
}
PREVIOUSLY_SUPPORTED_ARCHITECTURES: Mapping[str, str] = _PREVIOUSLY_SUPPORTED
"""Architecture -> the last vLLM release that served it (vLLM 0.33.0's own table)."""


def check_architecture_served(architecture: str, version: Version | None = None) -> None:
    """Raise :class:`~kvpilot.tuner.errors.InvalidModelConfig` for an architecture the release removed.

    ``version``: the release to ask about (the pinned one by default); one at or before the last
    release that served the architecture accepts it.
    """
    last = PREVIOUSLY_SUPPORTED_ARCHITECTURES.get(architecture)
    if last is None:
        return
    release = version or parse_version(PINNED_VLLM_VERSION)
    if release <= parse_version(last):
        return
    shown = ".".join(str(part) for part in release[:2])
    raise errors.InvalidModelConfig(
        f"vLLM {shown} does not support {architecture}: vLLM removed it after {last} "
        f"(its registry's _PREVIOUSLY_SUPPORTED_MODELS), so no engine arguments can start this model "
        f"on the pinned release",
        field="architectures",
    )


OLDEST_REGISTRY: Version = parse_version(REGISTRY_RELEASES[0])
"""The oldest release whose registry kvpilot read (``registry_data.py``); older ones are not checked."""


@functools.cache
def served_architectures(version: Version) -> frozenset[str]:
    """The architectures the release's ``ModelRegistry`` serves (a release newer than the newest
    modelled answers as that one); empty before :data:`OLDEST_REGISTRY`."""
    minor = min(version[:2], NEWEST_MODELLED)
    return frozenset(
        name
        for name, spans in SERVED.items()
        if any(parse_version(a) <= minor <= parse_version(b) for a, b in spans)
    )


def check_architecture_registered(architecture: str, release: Version) -> None:
    """Raise :class:`~kvpilot.tuner.errors.InvalidModelConfig` for an architecture the release's model
    registry does not hold (vLLM refuses to start it), naming the close names it does hold.

    ``release``: the release the plan is for; a newer one than modelled answers as the newest; one
    older than :data:`OLDEST_REGISTRY` is not checked (kvpilot has not read its registry). An empty
    name (a config without ``architectures``) is not checked."""
    check_architecture_served(architecture, release)
    if not architecture or release[:2] < OLDEST_REGISTRY:
        return
    served = served_architectures(release)
    if architecture in served:
        return
    shown = ".".join(str(part) for part in min(release[:2], NEWEST_MODELLED))
    close = difflib.get_close_matches(architecture, sorted(served), n=3, cutoff=0.6)
    hint = f" (supported close names: {', '.join(close)})" if close else " (no supported name is close)"
    raise errors.InvalidModelConfig(
        f"vLLM {shown} does not support architecture {architecture}{hint}: its model registry "
        f"(vllm/model_executor/models/registry.py) has no such class, so vLLM would refuse to start",
        field="architectures",
    )
