"""``--kv-transfer-config``: the connector kvpilot reads, what it budgets for it, and what the plan says.

The figures are written out from LMCache 0.5.6's staging buffer (:mod:`kvpilot.tuner.vllm.kv_connectors`):
``(2, layers, chunk_size, kv_heads / tp, head_size)`` in the KV cache's dtype. Llama-3.1-8B: 32 layers, 8 KV
heads of 128, bfloat16: 2 x 32 x 256 x 8 x 128 x 2 B = 32 MiB at LMCache's default chunk of 256 tokens.
``tests/contract/test_contract_kv_connectors.py`` checks the parsing against vLLM's own.
"""

from __future__ import annotations

import json

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import GIB, EngineSettings, ServingBounds

LLAMA = build_model_spec(cfg.LLAMA_31_8B)
FLAG = vllm.KV_TRANSFER_CONFIG_FLAG
MIB = 1 << 20


def _args(name: str = "LMCacheConnectorV1", role: str = "kv_both", **fields: object) -> list[str]:
    return [FLAG, json.dumps({"kv_connector": name, "kv_role": role, **fields})]


def _connector(*args: str, env: dict[str, str] | None = None, **fields: object) -> vllm.KvConnector:
    connector = vllm.read_kv_connector(list(args) or _args(**fields), env)  # type: ignore[arg-type]
    assert connector is not None
    return connector


def _bytes(connector: vllm.KvConnector, **kw: object) -> int:
    return memory.compute_kv_connector_bytes(LLAMA, connector, **kw)  # type: ignore[arg-type]


def test_lmcaches_default_staging_chunk_of_llama_8b_is_32_mib() -> None:
    connector = _connector()
    assert connector.lmcache == vllm.LMCacheSettings()
    assert _bytes(connector) == 2 * 32 * 256 * 8 * 128 * 2 == 32 * MIB


def test_the_buffer_follows_the_ranks_share_the_chunk_and_the_kv_dtype() -> None:
    connector = _connector()
    assert _bytes(connector, tensor_parallel_size=2) == 16 * MIB  # 4 KV heads a rank
    assert _bytes(connector, tensor_parallel_size=16) == 4 * MIB  # one KV head, replicated
    assert _bytes(connector, pipeline_parallel_size=2, pp_rank=1) == 16 * MIB  # 16 layers a stage
    assert _bytes(connector, kv_cache_dtype="fp8") == 16 * MIB
    bigger = _connector(kv_connector_extra_config={"lmcache.chunk_size": 1024})
    assert _bytes(bigger) == 128 * MIB


def test_mla_stages_one_latent_plane() -> None:
    deepseek = build_model_spec(cfg.DEEPSEEK_V3)
    assert deepseek.mla is not None
    latent = deepseek.mla.kv_lora_rank + deepseek.mla.qk_rope_head_dim
    got = memory.compute_kv_connector_bytes(deepseek, _connector(), tensor_parallel_size=8)
    assert got == deepseek.num_layers * 256 * latent * 2


def test_the_sources_of_lmcaches_settings_in_lmcaches_order() -> None:
    """Defaults, then ``LMCACHE_<KEY>`` of the pod's environment, then ``lmcache.<key>`` of the extra config;
    a value LMCache cannot convert leaves what it had."""
    env = {"LMCACHE_CHUNK_SIZE": "512", "LMCACHE_MAX_LOCAL_CPU_SIZE": "20", "LMCACHE_LOCAL_CPU": "False"}
    extra = {"lmcache.chunk_size": 1024, "lmcache.max_local_cpu_size": "lots", "chunk_size": 8}
    settings = vllm.read_kv_connector(_args(kv_connector_extra_config=extra), env)
    assert settings is not None and settings.lmcache is not None
    assert settings.lmcache.chunk_size == 1024
    assert settings.lmcache.max_local_cpu_size == 20.0
    assert settings.lmcache.local_cpu is False
    lots = vllm.read_kv_connector(_args(), {"LMCACHE_MAX_LOCAL_CPU_SIZE": "lots"})
    assert lots is not None and lots.lmcache is not None
    assert lots.lmcache.unread_env == ("LMCACHE_MAX_LOCAL_CPU_SIZE",)  # LMCache would set None
    assert vllm.compute_lmcache_host_bytes(lots, 1) is None


def test_no_buffer_at_start_up_without_lmcaches_default_gpu_connector() -> None:
    for extra in ({"lmcache.enable_pd": True}, {"lmcache.use_layerwise": True}, {"use_native": True}):
        connector = _connector(kv_connector_extra_config=extra)
        assert _bytes(connector) == 0
    for name in ("NixlConnector", "NixlPullConnector", "OffloadingConnector", "MooncakeConnector"):
        assert _bytes(_connector(name=name)) == 0


def test_what_is_not_established_is_named() -> None:
    assert vllm.kv_connector_unmodelled(_connector()) is None
    assert vllm.kv_connector_unmodelled(_connector(name="NixlConnector")) is None
    cpu_staged = vllm.kv_connector_unmodelled(_connector(name="NixlConnector", kv_buffer_device="cpu"))
    assert cpu_staged is not None and "host copy of the whole KV cache" in cpu_staged
    mooncake = vllm.kv_connector_unmodelled(_connector(name="MooncakeConnector"))
    assert mooncake is not None and mooncake.startswith("MooncakeConnector: ")
    external = vllm.kv_connector_unmodelled(_connector(name="Mine", kv_connector_module_path="my.mod"))
    assert external is not None and "my.mod" in external
    layerwise = vllm.kv_connector_unmodelled(
        _connector(kv_connector_extra_config={"lmcache.use_layerwise": 1})
    )
    assert layerwise is not None and "use_layerwise" in layerwise
    filed = vllm.kv_connector_unmodelled(_connector(*_args(), env={"LMCACHE_CONFIG_FILE": "/etc/lmc.yaml"}))
    assert filed is not None and "LMCACHE_CONFIG_FILE" in filed
    secret = vllm.kv_connector_unmodelled(_connector(*_args(), env={"LMCACHE_CHUNK_SIZE": ""}))
    assert secret is not None and "LMCACHE_CHUNK_SIZE" in secret
    qwen_next = build_model_spec(cfg.QWEN3_NEXT_80B)
    assert memory.kv_connector_unbudgeted_reason(qwen_next, _connector()) is not None
    assert memory.compute_kv_connector_bytes(qwen_next, _connector()) == 0


def test_lmcaches_pinned_host_memory_per_worker() -> None:
    assert vllm.compute_lmcache_host_bytes(_connector(), 4) == 4 * 5 * GIB
    small = _connector(kv_connector_extra_config={"lmcache.max_local_cpu_size": 1.5})
    assert vllm.compute_lmcache_host_bytes(small, 2) == 3 * GIB
    off = _connector(kv_connector_extra_config={"lmcache.enable_pd": True, "lmcache.local_cpu": False})
    assert vllm.compute_lmcache_host_bytes(off, 2) is None
    assert vllm.compute_lmcache_host_bytes(_connector(name="NixlConnector"), 2) is None
    filed = _connector(*_args(), env={"LMCACHE_CONFIG_FILE": "/etc/lmc.yaml"})
    assert vllm.compute_lmcache_host_bytes(filed, 2) is None  # the file may size it: not stated


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([FLAG, "{not json"], "must be a JSON object"),
        (_args(bogus=1), "no field bogus"),
        (_args(role="both"), "unsupported kv_role"),
        ([FLAG, json.dumps({"kv_connector": "NixlConnector"})], "please specify kv_role"),
        (_args(name="P2pNcclConnector"), "Unsupported connector type: P2pNcclConnector"),
        (_args(kv_connector_module_path=""), "cannot be an empty string"),
        ([FLAG, json.dumps({"kv_connector": 5, "kv_role": "kv_both"})], "must be a string"),
    ],
)
def test_what_vllm_refuses_is_refused_by_name(args: list[str], says: str) -> None:
    with pytest.raises(errors.InvalidEngineArgs, match=says) as refused:
        vllm.check_engine_flags(args)
    assert refused.value.flag == FLAG


def test_an_external_connector_and_a_registered_one_pass() -> None:
    vllm.check_engine_flags(_args(name="Mine", kv_connector_module_path="my.mod"))
    vllm.check_engine_flags(_args(name="NixlConnector", kv_buffer_device="cuda"))


def test_a_read_connector_leaves_the_unmodelled_list_and_a_dotted_one_stays() -> None:
    read = vllm.build_engine_flags(_args())
    assert read.unmodelled == () and read.kv_connector == _connector()
    dotted = vllm.build_engine_flags([*_args(), "--kv-transfer-config.kv_role=kv_producer"])
    assert dotted.unmodelled == (FLAG,) and dotted.kv_connector is None
    last = vllm.build_engine_flags([*_args(name="NixlConnector"), *_args()])
    assert last.kv_connector is not None and last.kv_connector.name == "LMCacheConnectorV1"


def test_the_buffer_leaves_the_kv_cache_and_takes_from_what_the_utilisation_leaves() -> None:
    gpu = lookup_gpu("H100-SXM")
    settings = EngineSettings(max_model_len=8192, gpu_memory_utilization=0.9)
    plain = memory.compute_budget(LLAMA, gpu, settings)
    lm = memory.compute_budget(LLAMA, gpu, settings, kv_connector=_connector())
    assert lm.kv_cache_tokens == plain.kv_cache_tokens and lm.starts
    assert lm.kv_connector_gib * GIB == 32 * MIB and plain.kv_connector_gib == 0
    # leave less than the 32 MiB beside the CUDA context: the connector's torch.empty runs out of memory
    context = memory.CUDA_CONTEXT_GIB * GIB
    tight = (gpu.total_bytes - context - 16 * MIB) / gpu.total_bytes
    squeezed = EngineSettings(max_model_len=8192, gpu_memory_utilization=round(tight, 6))
    assert memory.compute_budget(LLAMA, gpu, squeezed).starts
    refused = memory.compute_budget(LLAMA, gpu, squeezed, kv_connector=_connector())
    assert not refused.starts and refused.error is not None
    assert refused.error.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0.03 GiB")


def test_the_plan_names_the_connectors_term() -> None:
    gpu = lookup_gpu("H100-SXM")
    engine = vllm.build_engine_flags(_args())
    plan = compute_plan(LLAMA, gpu, 1, ServingBounds(), engine=engine)
    plain = compute_plan(LLAMA, gpu, 1, ServingBounds())
    assert plan.budget.kv_cache_tokens == plain.budget.kv_cache_tokens
    said = [w for w in plan.warnings if w.startswith(FLAG)]
    assert said == [
        f"{FLAG} LMCacheConnectorV1: 0.03 GiB per GPU at start-up (a staging chunk of 256 tokens of KV), "
        "allocated after vLLM sizes the KV cache: the KV cache is unchanged, the buffer comes out of the "
        "memory --gpu-memory-utilization leaves free; LMCache's CPU backend pins 5.0 GiB of host memory per "
        "GPU (max_local_cpu_size), out of the pod's memory."
    ]
    mooncake = compute_plan(
        LLAMA, gpu, 1, ServingBounds(), engine=vllm.build_engine_flags(_args("MooncakeConnector"))
    )
    assert [w for w in mooncake.warnings if w.startswith(FLAG)] == [
        f"{FLAG} is not wholly in kvpilot's memory model: "
        f"{vllm.kv_connector_unmodelled(_connector(name='MooncakeConnector'))}."
    ]


def test_a_connector_without_hma_on_a_mixed_model_is_named_with_what_vllm_turns_off() -> None:
    gpu = lookup_gpu("H100-SXM")
    gemma = build_model_spec(cfg.GEMMA_3_27B)
    assert len(set(gemma.layer_kinds)) > 1
    plan = compute_plan(gemma, gpu, 1, ServingBounds(), engine=vllm.build_engine_flags(_args()))
    assert any("does not support vLLM's hybrid KV cache manager" in w for w in plan.warnings)
    nixl = compute_plan(
        gemma, gpu, 1, ServingBounds(), engine=vllm.build_engine_flags(_args("NixlConnector"))
    )
    assert not any("hybrid KV cache manager" in w for w in nixl.warnings)
    llama = compute_plan(LLAMA, gpu, 1, ServingBounds(), engine=vllm.build_engine_flags(_args()))
    assert not any("hybrid KV cache manager" in w for w in llama.warnings)
