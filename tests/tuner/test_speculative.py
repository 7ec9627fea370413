"""``--speculative-config``: the flags kvpilot reads, the MTP drafter it budgets and what the plan says.

The drafter figure is written out from vLLM 0.33's ``DeepSeekMultiTokenPredictorLayer`` for DeepSeek-V3
in bfloat16 (its fp8 ``quantization_config`` dropped): one MLA + MoE decoder layer (hidden 7168, 128
heads, q_lora 1536, kv_lora 512, nope 128 / rope 64 / v 128, 256 experts of 2048 and one shared expert),
``eh_proj`` (2h x h, whole on every rank) and three RMSNorms; the embedding and head are the target's.
``tests/contract/test_contract_speculative.py`` checks the same arithmetic against vLLM's own class.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.model import read_eagle3_draft
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import GIB, EngineSettings, ServingBounds

MTP_1 = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']


def _bf16_deepseek(**changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(cfg.DEEPSEEK_V3)
    config.pop("quantization_config", None)
    config.update(changes)
    return config


def _flags(*args: str) -> vllm.SpeculativeFlags:
    flags = vllm.read_speculative_flags(list(args))
    assert flags is not None
    return flags


def _sc(**fields: Any) -> list[str]:
    return ["--speculative-config", json.dumps(fields)]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (MTP_1, vllm.SpeculativeFlags("mtp", 1, "mtp")),
        (
            ["-sc", '{"method": "deepseek_mtp", "num_speculative_tokens": 2}'],
            vllm.SpeculativeFlags("mtp", 2, "deepseek_mtp"),
        ),
        (
            ['--speculative_config={"method": "[ngram]", "num-speculative-tokens": 3}'],
            vllm.SpeculativeFlags("ngram", 3, "[ngram]"),
        ),
        (["--spec-method", "suffix"], vllm.SpeculativeFlags("suffix", None, "suffix")),
        (
            ["--spec-model", "org/draft", "--spec-tokens", "4"],
            vllm.SpeculativeFlags("draft_model", 4, "model 'org/draft'", "org/draft"),
        ),
        (_sc(method="mtp", model="org/x"), vllm.SpeculativeFlags("mtp", None, "mtp", "org/x")),
        (["--enable-lora"], None),
    ],
)
def test_the_flags_are_read_as_vllm_maps_them(
    args: list[str], expected: vllm.SpeculativeFlags | None
) -> None:
    vllm.check_engine_flags(args)
    assert vllm.read_speculative_flags(args) == expected
    assert vllm.build_engine_flags(args).speculative == expected


SC = "--speculative-config"


@pytest.mark.parametrize(
    ("args", "flag", "words"),
    [
        ([SC, "{method: mtp}"], SC, "takes a JSON object"),
        ([SC, "[1, 2]"], SC, "takes a JSON object"),
        (_sc(method=3, num_speculative_tokens=1), SC, "a string"),
        (_sc(method="mtp", num_speculative_tokens=0), SC, "at least 1"),
        (_sc(method="mtp", num_speculative_tokens=True), SC, "at least 1"),
        (_sc(method="mtp"), SC, "needs num_speculative_tokens"),
        (["--spec-method", "ngram"], SC, "needs num_speculative_tokens"),
        (["--spec-tokens", "two", "--spec-method", "mtp"], "--spec-tokens", "at least 1"),
        ([*MTP_1, "--spec-method", "mtp"], "--spec-method", "mutually exclusive"),
        ([*MTP_1, "--spec-tokens", "2"], "--spec-tokens", "mutually exclusive"),
    ],
)
def test_what_vllm_refuses_is_refused_naming_the_flag(args: list[str], flag: str, words: str) -> None:
    with pytest.raises(errors.InvalidEngineArgs, match=words) as raised:
        vllm.check_engine_flags(args)
    assert raised.value.flag == flag
    assert vllm.read_speculative_flags(args) is None  # never raises: not read


def test_the_drafter_weights_are_the_mtp_layer_without_embedding_and_head() -> None:
    model = build_model_spec(_bf16_deepseek())
    h, heads, experts, inter = 7168, 128, 256, 2048
    attention = h * (1536 + 512 + 64) + 1536 * heads * 192 + 512 * heads * 256 + heads * 128 * h + 512 + 1536
    moe = experts * 3 * h * inter + 3 * h * inter + h * experts + 2 * h  # experts, shared, router, norms
    extra = 2 * h * h + 3 * h  # eh_proj, enorm / hnorm / shared_head.norm
    assert model.num_mtp_layers == 1
    assert memory.compute_drafter_weight_bytes(model) == 2 * (attention + moe + extra)
    tp8 = memory.compute_drafter_weight_bytes(model, tensor_parallel_size=8)
    split = (1536 * heads * 192 + 512 * heads * 256 + heads * 128 * h) // 8 + (
        experts * 3 * h * inter + 3 * h * inter
    ) // 8
    whole = h * (1536 + 512 + 64) + 512 + 1536 + h * experts + 2 * h + extra  # eh_proj is an nn.Linear
    assert tp8 == 2 * (split + whole)
    two = build_model_spec(_bf16_deepseek(num_nextn_predict_layers=2))
    assert memory.compute_drafter_weight_bytes(two) == 2 * memory.compute_drafter_weight_bytes(model)


def test_the_budget_counts_the_drafter_and_its_kv_layer() -> None:
    model = build_model_spec(cfg.DEEPSEEK_V3)
    gpu = lookup_gpu("H200")
    settings = EngineSettings(
        max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=8192, tensor_parallel_size=8
    )
    plain = memory.compute_budget(model, gpu, settings)
    spec = memory.compute_budget(model, gpu, settings, speculative=_flags(*MTP_1))
    assert plain.speculative_gib == 0.0 and spec.speculative_gib > 1.0
    assert spec.weights_gib - plain.weights_gib == pytest.approx(spec.speculative_gib)
    # the drafter, and the CUDA graphs for decode batches of 1 + 1 tokens with the drafter's layer in them
    graphs = spec.cuda_graph_gib - plain.cuda_graph_gib
    assert graphs > 0
    assert plain.available_kv_cache_gib - spec.available_kv_cache_gib == pytest.approx(
        spec.speculative_gib + graphs
    )
    # one more MLA layer in 61: the bytes per token grow by 62/61
    assert spec.kv_bytes_per_token * 61 == plain.kv_bytes_per_token * 62
    assert spec.kv_cache_tokens < plain.kv_cache_tokens
    weights = memory.compute_drafter_weight_bytes(model, tensor_parallel_size=8)
    buffers = memory.compute_proposer_buffer_bytes(
        model, _flags(*MTP_1), max_num_batched_tokens=8192, max_num_seqs=64
    )
    assert spec.speculative_gib * GIB == pytest.approx(weights + buffers)
    assert (
        buffers
        == 8192 * (4 + 8 + 1)
        + 4 * 65
        + 2 * 4 * 64
        + 64 * (8 + 4 + 8)
        + 64 * 1 * (8 + 4)
        + 8192 * 7168 * 2
        + 8 * 129
    )
    v1 = memory.compute_proposer_buffer_bytes(
        model, _flags(*MTP_1), max_num_batched_tokens=8192, max_num_seqs=64, model_runner_v2=False
    )
    assert v1 == 8192 * (4 + 8 + 8) + 2 * 8192 * 7168 * 2 + 4 * 8192 + 4 * 64
    for method in ('{"method": "ngram", "num_speculative_tokens": 3}', '{"method": "suffix"}'):
        cpu = memory.compute_budget(model, gpu, settings, speculative=_flags("--speculative-config", method))
        # a CPU proposer: nothing on the GPU but the target's graphs for decode batches of 1 + k tokens
        # (suffix decoding: k is its tree depth, 24 by default)
        assert cpu.speculative_gib == 0.0 and cpu.weights_gib == plain.weights_gib
        assert (
            cpu.kv_bytes_per_token == plain.kv_bytes_per_token and cpu.cuda_graph_gib > plain.cuda_graph_gib
        )


def test_the_plan_shows_the_drafter_and_names_what_it_does_not_budget() -> None:
    gpu = lookup_gpu("H200")
    model = build_model_spec(cfg.DEEPSEEK_V3)
    engine = vllm.build_engine_flags(MTP_1)
    assert engine.unmodelled == () and engine.speculative_flags == ("--speculative-config",)
    plan = compute_plan(model, gpu, 8, ServingBounds(), engine=engine)
    said = [w for w in plan.warnings if w.startswith("--speculative-config")]
    assert len(said) == 1 and said[0].startswith(
        f"--speculative-config (method mtp, 1 draft token): the MTP drafter's 1 layer takes "
        f"{plan.budget.speculative_gib:.2f} GiB per GPU"
    )
    assert "CUDA graphs" in said[0] and "not budgeted" in said[0]
    plain = compute_plan(model, gpu, 8, ServingBounds())
    assert plan.budget.kv_bytes_per_token > plain.budget.kv_bytes_per_token
    ngram = compute_plan(
        model,
        gpu,
        8,
        ServingBounds(),
        engine=vllm.build_engine_flags(["--spec-method", "ngram", "--spec-tokens", "3"]),
    )
    assert any(
        w.startswith("--spec-method (method ngram, 3 draft tokens): the proposer runs on the CPU")
        for w in ngram.warnings
    )
    # a CPU proposer: nothing on the GPU but the graphs vLLM captures for decode batches of 1 + 3 tokens
    assert ngram.budget.speculative_gib == 0.0 and ngram.budget.weights_gib == plain.budget.weights_gib
    assert ngram.budget.kv_bytes_per_token == plain.budget.kv_bytes_per_token
    assert ngram.budget.cuda_graph_gib > plain.budget.cuda_graph_gib


@pytest.mark.parametrize(
    ("config", "gpus", "args", "why"),
    [
        (
            cfg.DEEPSEEK_V3,
            8,
            ["-sc", '{"method": "eagle3", "model": "org/eagle3", "num_speculative_tokens": 3}'],
            "method 'eagle3' loads the draft checkpoint 'org/eagle3', whose config.json kvpilot was not "
            "given (kvpilot plan --draft-config PATH gives it",
        ),
        (
            cfg.DEEPSEEK_V3,
            8,
            _sc(model="org/draft", num_speculative_tokens=3),
            "method \"model 'org/draft'\" loads the draft model 'org/draft', whose config.json kvpilot was "
            "not given (kvpilot plan --draft-config PATH gives it",
        ),
        (cfg.DEEPSEEK_V3, 8, _sc(method="mtp", model="org/x"), "the draft checkpoint 'org/x'"),
        (
            cfg.DEEPSEEK_V3,
            8,
            ["--speculative-config.method=mtp", "--speculative-config.num_speculative_tokens=1"],
            "in this form",
        ),
    ],
)
def test_a_drafter_kvpilot_does_not_model_is_named_not_guessed(
    config: dict[str, Any], gpus: int, args: list[str], why: str
) -> None:
    engine = vllm.build_engine_flags(args)
    plan = compute_plan(build_model_spec(config), lookup_gpu("H200"), gpus, ServingBounds(), engine=engine)
    named = [w for w in plan.warnings if "is not in kvpilot's memory model" in w]
    assert len(named) == 1 and named[0].startswith("--speculative-config is not")
    assert why in named[0] and "--kv-cache-memory-bytes" in named[0]
    assert plan.budget.speculative_gib == 0.0


def test_pipeline_parallelism_and_a_count_vllm_refuses() -> None:
    model = build_model_spec(cfg.DEEPSEEK_V3)
    assert memory.speculative_unbudgeted_reason(model, _flags(*MTP_1), pp=2) is not None
    assert memory.compute_speculative_bytes(model, _flags(*MTP_1), pipeline_parallel_size=2) == 0
    two = build_model_spec(_bf16_deepseek(num_nextn_predict_layers=2))
    with pytest.raises(errors.InvalidEngineArgs, match="divisible by the 2 MTP layers") as raised:
        memory.check_speculative_model(two, _flags("--spec-method", "mtp", "--spec-tokens", "3"))
    assert raised.value.flag == "--speculative-config"
    memory.check_speculative_model(two, _flags("--spec-method", "mtp", "--spec-tokens", "4"))
    none = build_model_spec(_bf16_deepseek(num_nextn_predict_layers=0))
    with pytest.raises(errors.InvalidEngineArgs, match="num_nextn_predict_layers = 0"):
        compute_plan(none, lookup_gpu("H200"), 8, ServingBounds(), engine=vllm.build_engine_flags(MTP_1))


def test_an_abbreviation_of_a_speculative_flag_is_refused_by_its_full_name() -> None:
    with pytest.raises(errors.InvalidEngineArgs, match="abbreviates --spec-tokens") as raised:
        vllm.check_engine_flags(["--spec-method", "ngram", "--spec-tok", "3"])
    assert raised.value.flag == "--spec-tok"
    vllm.check_engine_flags(["--speculative-config.method=mtp"])  # vLLM's dotted form: read as not read
    assert vllm.build_engine_flags(["--speculative-config.method=mtp"]).speculative is None


def _glm_4_5(**changes: Any) -> dict[str, Any]:
    """GLM-4.5's geometry (``Glm4MoeForCausalLM``: hidden 5120, 92 layers, 96 heads, 8 KV heads of 128,
    QK norm and attention bias, 160 experts of 1536 and one shared, the first 3 layers dense, one MTP
    layer); no GLM-4.5 config.json is stored (``tests/data/hf_configs/INDEX.md``)."""
    config: dict[str, Any] = {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "torch_dtype": "bfloat16",
        "vocab_size": 151552,
        "hidden_size": 5120,
        "intermediate_size": 12288,
        "num_hidden_layers": 92,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "rope_theta": 1000000,
        "partial_rotary_factor": 0.5,
        "attention_bias": True,
        "use_qk_norm": True,
        "moe_intermediate_size": 1536,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "n_routed_experts": 160,
        "routed_scaling_factor": 2.5,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 3,
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 1,
    }
    config.update(changes)
    return config


def test_glm_4_5s_drafter_is_one_more_glm_moe_layer_and_full_attention_kv_layer() -> None:
    """vLLM 0.33's ``Glm4MoeMultiTokenPredictorLayer``: a ``Glm4MoeDecoderLayer`` (GQA with bias and QK
    norm, MoE with an fp32 router), ``eh_proj`` and three RMSNorms; embedding and head the target's."""
    model = build_model_spec(_glm_4_5())
    assert model.num_mtp_layers == 1
    h, heads, kv, hd, experts, inter = 5120, 96, 8, 128, 160, 1536
    attention = h * (heads + 2 * kv) * hd + (heads + 2 * kv) * hd + heads * hd * h + 2 * hd  # bias, q/k norm
    moe = experts * 3 * h * inter + 3 * h * inter + 2 * h * experts + 2 * h  # fp32 router: twice
    extra = 2 * h * h + 3 * h
    assert memory.compute_drafter_weight_bytes(model) == 2 * (attention + moe + extra)
    air = build_model_spec(_glm_4_5(use_qk_norm=False, attention_bias=False))  # GLM-4.5-Air's attention
    assert memory.compute_drafter_weight_bytes(model) - memory.compute_drafter_weight_bytes(air) == 2 * (
        (heads + 2 * kv) * hd + 2 * hd
    )
    gpu = lookup_gpu("H200")
    settings = EngineSettings(
        max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=8192, tensor_parallel_size=8
    )
    plain = memory.compute_budget(model, gpu, settings)
    spec = memory.compute_budget(model, gpu, settings, speculative=_flags(*MTP_1))
    assert spec.speculative_gib > 0.5 and plain.speculative_gib == 0.0
    assert spec.weights_gib - plain.weights_gib == pytest.approx(spec.speculative_gib)
    assert spec.kv_bytes_per_token * 92 == plain.kv_bytes_per_token * 93  # one more full-attention layer
    engine = vllm.build_engine_flags(_sc(method="glm4_moe_mtp", num_speculative_tokens=3))
    plan = compute_plan(model, gpu, 8, ServingBounds(), engine=engine)
    assert not [w for w in plan.warnings if "is not in kvpilot's memory model" in w]
    assert plan.budget.speculative_gib > 0.5
    none = build_model_spec(_glm_4_5(num_nextn_predict_layers=0))
    with pytest.raises(errors.InvalidEngineArgs, match="num_nextn_predict_layers = 0"):
        compute_plan(none, gpu, 8, ServingBounds(), engine=vllm.build_engine_flags(MTP_1))


@pytest.mark.parametrize(
    ("file", "model_type"),
    [
        ("XiaomiMiMo__MiMo-V2-Flash.json", "mimo_v2_flash"),  # MiMoV2MTPModel: its own sliding layer
        ("zai-org__GLM-5.json", "glm_moe_dsa"),  # DeepseekV32MTPModel: an indexer and its buffer
        ("deepseek-ai__DeepSeek-V3.2.json", "deepseek_v32"),
    ],
)
def test_the_mtp_drafters_of_published_families_not_modelled_stay_named(file: str, model_type: str) -> None:
    config = json.loads((Path(__file__).resolve().parents[1] / "data" / "hf_configs" / file).read_text())
    model = build_model_spec(config)
    flags = _flags(*MTP_1)
    reason = memory.speculative_unbudgeted_reason(model, flags)
    assert reason is not None and f"model_type {model.model_type!r}) is not modelled" in reason
    assert model.model_type == model_type and model.num_mtp_layers == 0
    assert memory.compute_speculative_bytes(model, flags) == 0
    warning = memory.describe_unbudgeted_speculative(model, flags, ("--speculative-config",))
    assert warning is not None and "glm4_moe" in warning and "deepseek_v3" in warning


# -- EAGLE3 -------------------------------------------------------------------------------------------

EAGLE3_DRAFT = json.loads(
    (
        Path(__file__).resolve().parents[1] / "data" / "eagle3" / "yuhuili__EAGLE3-LLaMA3.1-Instruct-8B.json"
    ).read_text()
)
EAGLE3_3 = _sc(method="eagle3", model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", num_speculative_tokens=3)


def _with_draft(args: list[str], draft: dict[str, Any] | None = EAGLE3_DRAFT) -> vllm.EngineFlags:
    engine = vllm.build_engine_flags(args)
    assert engine.speculative is not None
    return dataclasses.replace(
        engine, speculative=dataclasses.replace(engine.speculative, draft_config=draft)
    )


def test_the_eagle3_drafter_weights_are_its_layer_fc_norms_head_and_d2t() -> None:
    """Written out from ``Eagle3LlamaForCausalLM`` (llama_eagle3.py) for the Llama-3.1-8B draft in bf16:
    qkv_proj from 2h (6144 outputs), o_proj, the MLP (3 x h x 14336), three norms, fc (3h -> h), the
    final norm, an lm_head of 32000 x h and the int64 d2t of 32000; the embedding is the target's.
    ``tests/contract/test_contract_speculative.py`` checks the same against vLLM's class."""
    draft = read_eagle3_draft(EAGLE3_DRAFT)
    h = 4096
    layer = 2 * h * (4096 + 2 * 1024) + 4096 * h + 3 * h * 14336 + 3 * h
    expected = 2 * (layer + 3 * h * h + h + 32000 * h) + 8 * 32000
    target = build_model_spec(cfg.LLAMA_31_8B)
    assert memory.compute_eagle3_weight_bytes(draft, target) == expected == 849_635_328
    two = (
        2 * (2 * h * (2048 + 2 * 512) + 2048 * h + 3 * h * 7168 + 3 * h + 3 * h * h + h + 16000 * h)
        + 8 * 32000
    )
    assert memory.compute_eagle3_weight_bytes(draft, target, tensor_parallel_size=2) == two
    # the same vocabulary as the target's: no d2t
    same = read_eagle3_draft({**EAGLE3_DRAFT, "draft_vocab_size": 128256})
    assert memory.compute_eagle3_weight_bytes(same, target) == expected - 8 * 32000 + 2 * (128256 - 32000) * h


def test_the_plan_budgets_an_eagle3_drafter_given_its_config() -> None:
    gpu, model = lookup_gpu("H100-SXM"), build_model_spec(cfg.LLAMA_31_8B)
    bounds = ServingBounds(max_context=8192)
    plain = compute_plan(model, gpu, 1, bounds)
    unread = compute_plan(model, gpu, 1, bounds, engine=vllm.build_engine_flags(EAGLE3_3))
    plan = compute_plan(model, gpu, 1, bounds, engine=_with_draft(EAGLE3_3))
    assert unread.budget.speculative_gib == 0.0
    assert any("--draft-config" in w and "not in kvpilot's memory model" in w for w in unread.warnings)
    assert plan.budget.speculative_gib > 0.8
    assert plan.budget.kv_cache_tokens < unread.budget.kv_cache_tokens <= plain.budget.kv_cache_tokens
    # one more KV layer of 8 heads x 128 in bf16: 4 KiB more per token (32 layers -> 33)
    assert plan.budget.kv_bytes_per_token == plain.budget.kv_bytes_per_token * 33 // 32
    assert not any("not in kvpilot's memory model" in w or "not read" in w for w in plan.warnings)
    said = [w for w in plan.warnings if w.startswith("--speculative-config (method eagle3, 3 draft tokens)")]
    assert len(said) == 1 and f"takes {plan.budget.speculative_gib:.2f} GiB per GPU" in said[0]


def test_the_eagle3_drafter_is_resolved_with_its_layers() -> None:
    model, spec = build_model_spec(cfg.LLAMA_31_8B), _with_draft(EAGLE3_3).speculative
    drafter = memory.resolve_drafter(model, spec)
    assert drafter is not None and drafter.eagle3 == read_eagle3_draft(EAGLE3_DRAFT)
    assert (drafter.method, drafter.kv_layers, drafter.state_holds_draft_tokens) == (vllm.EAGLE3, 1, False)
    assert memory.with_drafter_layers(model, drafter).num_layers == model.num_layers + 1
    assert memory.resolve_drafter(model, spec, pp=2) is None


def test_an_eagle3_draft_kvpilot_cannot_size_is_named() -> None:
    model = build_model_spec(cfg.LLAMA_31_8B)
    qwen = _with_draft(EAGLE3_3, {**EAGLE3_DRAFT, "architectures": ["Qwen3ForCausalLM"]}).speculative
    assert qwen is not None
    reason = memory.speculative_unbudgeted_reason(model, qwen)
    assert (
        reason is not None and "'Eagle3Qwen3ForCausalLM' under eagle3, which kvpilot does not model" in reason
    )
    assert memory.compute_speculative_bytes(model, qwen) == 0
    given = _with_draft(EAGLE3_3).speculative
    assert given is not None
    assert memory.speculative_unbudgeted_reason(model, given, pp=2) is not None
    assert memory.compute_speculative_bytes(model, given, pipeline_parallel_size=2) == 0
    with pytest.raises(errors.InvalidModelConfig, match="hidden_size"):
        read_eagle3_draft({k: v for k, v in EAGLE3_DRAFT.items() if k != "hidden_size"})
    # eagle (EAGLE-1) stays named as not read, whatever config is given (a draft model: test_draft_model.py)
    eagle = _sc(method="eagle", model="org/eagle", num_speculative_tokens=3)
    assert "kvpilot does not read" in (memory.speculative_unbudgeted_reason(model, _flags(*eagle)) or "")


QWEN_MTP_2 = _sc(method="mtp", num_speculative_tokens=2)


def test_qwen3_nexts_drafter_is_one_full_attention_moe_layer_an_fc_and_three_norms() -> None:
    """vLLM 0.33's ``Qwen3NextMultiTokenPredictor`` (``qwen3_next_mtp.py``): one ``Qwen3NextDecoderLayer``
    built as full attention (gated query: ``q_proj`` twice the heads; QK norm; no bias), the MoE of 512
    experts of 512 with a shared expert and its sigmoid gate; one ``fc`` (2h -> h, split over TP) and
    ``norm`` / ``pre_fc_norm_hidden`` / ``pre_fc_norm_embedding``; embedding and ``lm_head`` the target's.
    The published config has no ``num_nextn_predict_layers``: the predictor's default, one layer."""
    model = build_model_spec(cfg.QWEN3_NEXT_80B)
    assert model.model_type == "qwen3_next" and model.num_mtp_layers == 1
    h, heads, kv, hd, experts, inter = 2048, 16, 2, 256, 512, 512
    attention = h * (2 * heads + 2 * kv) * hd + heads * hd * h + 2 * hd + 2 * h  # q/k norm, two norms
    moe = experts * 3 * h * inter + 3 * h * inter + h + h * experts  # shared expert and its gate, router
    assert memory.compute_drafter_weight_bytes(model) == 2 * (attention + moe + 2 * h * h + 3 * h)
    tp4 = memory.compute_drafter_weight_bytes(model, tensor_parallel_size=4)
    # two KV heads over four ranks: one whole head on each (vLLM replicates them)
    split = (h * 2 * heads * hd + heads * hd * h + experts * 3 * h * inter + 3 * h * inter) // 4 + 2 * h * hd
    assert tp4 == 2 * (split + 2 * hd + 2 * h + h + h * experts + 2 * h * h // 4 + 3 * h)
    # its KV layer is a copy of the last full-attention layer, never a gated DeltaNet one
    extended = memory.with_mtp_layers(model)
    assert extended.layers[-1] == model.layers[-1] and extended.layers[-1].kind == "full"


def test_qwen3_next_on_4_h100_with_two_mtp_tokens_budgets_the_drafter_and_the_state_growth() -> None:
    model = build_model_spec(cfg.QWEN3_NEXT_80B)
    gpu = lookup_gpu("H100-SXM")
    engine = vllm.build_engine_flags(QWEN_MTP_2)
    plan = compute_plan(model, gpu, 4, ServingBounds(), engine=engine)
    plain = compute_plan(model, gpu, 4, ServingBounds())
    assert plan.budget.speculative_gib > 0 and plain.budget.speculative_gib == 0.0
    assert not [w for w in plan.warnings if "is not in kvpilot's memory model" in w]
    assert not [w for w in plan.warnings if "not modelled" in w]
    said = [w for w in plan.warnings if w.startswith("--speculative-config")]
    assert len(said) == 1 and "(method mtp, 2 draft tokens): the MTP drafter's 1 layer takes" in said[0]
    assert "state holds 2 more pages per state group and its conv state 2 more positions" in said[0]
    assert plan.budget.kv_cache_tokens < plain.budget.kv_cache_tokens
    assert plan.budget.max_concurrency < plain.budget.max_concurrency
    settings = EngineSettings(
        max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=8192, tensor_parallel_size=4
    )
    flags = _flags(*QWEN_MTP_2)
    spec = memory.compute_budget(model, gpu, settings, speculative=flags)
    base = memory.compute_budget(model, gpu, settings)
    assert spec.weights_gib - base.weights_gib == pytest.approx(spec.speculative_gib)
    # the GDN state: two more conv positions per page and two more pages per request (align mode)
    ext = memory.with_mtp_layers(model)
    kwargs: dict[str, Any] = {"tensor_parallel_size": 4}
    one = memory.compute_kv_layout(ext, **kwargs)
    two = memory.compute_kv_layout(ext, num_speculative_tokens=2, **kwargs)
    assert two.state_blocks_per_request() == one.state_blocks_per_request() + 2 * one.state_groups
    state = model.linear_state
    assert state is not None
    assert state.state_bytes(4, 2, 2) - state.state_bytes(4, 2) == 2 * state.conv_dim // 4 * 2
    assert memory.speculative_state_tokens(model, flags) == 2
    # ngram: a CPU proposer, but vLLM's GDN state holds its draft tokens too: named, not budgeted
    ngram_flags = vllm.build_engine_flags(["--spec-method", "ngram", "--spec-tokens", "3"])
    ngram = compute_plan(model, gpu, 4, ServingBounds(), engine=ngram_flags)
    assert any("linear-attention state also holds" in w and "not budgeted" in w for w in ngram.warnings)


@pytest.mark.parametrize(
    ("file", "model_type", "architecture"),
    [
        ("Qwen__Qwen3.5-27B.json", "qwen3_5_text", "Qwen3_5MTP"),
        ("Qwen__Qwen3.5-9B.json", "qwen3_5_text", "Qwen3_5MTP"),
        ("Qwen__Qwen3.5-35B-A3B.json", "qwen3_5_moe_text", "Qwen3_5MoeMTP"),
        ("Qwen__Qwen3.6-35B-A3B.json", "qwen3_5_moe_text", "Qwen3_5MoeMTP"),
        ("Qwen__Qwen3.5-397B-A17B.json", "qwen3_5_moe_text", "Qwen3_5MoeMTP"),
    ],
)
def test_qwen3_5_and_3_6_drafters_are_budgeted(file: str, model_type: str, architecture: str) -> None:
    config = json.loads((Path(__file__).resolve().parents[1] / "data" / "hf_configs" / file).read_text())
    model = build_model_spec(config)
    flags = _flags(*MTP_1)
    assert model.model_type == model_type and model.num_mtp_layers == 1  # mtp_num_hidden_layers
    assert vllm.MTP_DRAFTERS[model_type].architecture == architecture
    assert memory.speculative_unbudgeted_reason(model, flags) is None
    assert memory.describe_unbudgeted_speculative(model, flags, ("--speculative-config",)) is None
    assert memory.compute_drafter_weight_bytes(model) > 0
