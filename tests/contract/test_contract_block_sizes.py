"""Contract: kvpilot's per-backend block sizes (``kvpilot/tuner/vllm/block_sizes.py``) are the pinned vLLM's.

Each MLA backend class that imports on the CPU platform is asked for ``get_preferred_block_size`` of
``CacheConfig.DEFAULT_BLOCK_SIZE`` (what ``Platform.update_block_size_for_backend`` asks when
``--block-size`` is not given) and for the compute capabilities it accepts; FlashInfer MLA's
``supports_combination`` is asked about ``qk_nope_head_dim``. CUTLASS MLA allocates a CUDA workspace and
FlashAttention MLA imports CUDA kernels at import time, and ``platforms/cuda.py`` (the priority order) needs
``libcuda``: those facts are read from the source (the module's docstring says where), not called.
"""

from __future__ import annotations

import types

import pytest

from kvpilot.tuner import vllm as kv_vllm

pytestmark = pytest.mark.contract


def test_backend_block_sizes_are_the_wheels(vllm: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.config.cache import CacheConfig
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.mla import flashinfer_mla
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import (
        FlashInferMLASparseSM120Backend,
        FlashInferMLASparseTRTLLMBackend,
    )
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

    from kvpilot.tuner.vllm import block_sizes

    default = CacheConfig.DEFAULT_BLOCK_SIZE
    assert default == block_sizes.DEFAULT_BLOCK_SIZE
    flashinfer = flashinfer_mla.FlashInferMLABackend
    assert flashinfer.get_preferred_block_size(default) == block_sizes.FLASHINFER_MLA_BLOCK
    assert TritonMLABackend.get_preferred_block_size(default) == default
    assert FlashMLASparseBackend.get_preferred_block_size(default) == block_sizes.SPARSE_MLA_BLOCK
    assert FlashInferMLASparseSM120Backend.get_preferred_block_size(default) == block_sizes.SPARSE_MLA_BLOCK
    trtllm = FlashInferMLASparseTRTLLMBackend.get_preferred_block_size(default)
    assert trtllm == block_sizes.FLASHINFER_SPARSE_MLA_BLOCK
    capabilities = {c: DeviceCapability(*c) for c in ((8, 0), (9, 0), (10, 0), (12, 0))}
    assert [c for c, d in capabilities.items() if flashinfer.supports_compute_capability(d)] == [(10, 0)]
    assert [
        c for c, d in capabilities.items() if FlashInferMLASparseSM120Backend.supports_compute_capability(d)
    ] == [(12, 0)]
    for nope in (32, 64, 96, 128, 192, 256):
        hf = types.SimpleNamespace(qk_nope_head_dim=nope)
        fake = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=hf))
        monkeypatch.setattr(flashinfer_mla, "get_current_vllm_config", lambda fake=fake: fake)
        refused = flashinfer.supports_combination(
            576, None, "auto", None, True, False, False, False, capabilities[(10, 0)]
        )
        accepted = nope in block_sizes.FLASHINFER_MLA_QK_NOPE_HEAD_DIMS
        assert (refused is None) == accepted, nope
        expected = block_sizes.FLASHINFER_MLA_BLOCK if accepted else block_sizes.CUTLASS_MLA_BLOCK
        assert (
            kv_vllm.default_kv_block_size(kv_vllm.PINNED_VERSION, (10, 0), mla=True, qk_nope_head_dim=nope)
            == expected
        )
