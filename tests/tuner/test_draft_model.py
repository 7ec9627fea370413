"""A separate draft model (``--speculative-config '{"model": "Qwen/Qwen3-0.6B", ...}'``, ``draft_model``).

The figures are written out from vLLM 0.33's ``Qwen3ForCausalLM`` for Qwen3-0.6B's published config
(hidden 1024, 16 heads, 8 KV heads of 128, MLP 3072, 28 layers, QK norm, a vocabulary of 151,936 whose
embedding is tied to the LM head) in bfloat16; ``tests/contract/test_contract_draft_model.py`` checks the
same against vLLM's class built on the meta device, and the refusals against vLLM's ``SpeculativeConfig``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import model_configs_for_tests as cfg
import pytest

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.gpus import lookup_gpu
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
QWEN3_06B: dict[str, Any] = json.loads((CONFIGS / "Qwen__Qwen3-0.6B.json").read_text())
QWEN3_32B: dict[str, Any] = json.loads((CONFIGS / "Qwen__Qwen3-32B.json").read_text())
DRAFT_4 = ["--speculative-config", '{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4}']


def _sc(**spec: Any) -> list[str]:
    return ["--speculative-config", json.dumps(spec)]


def _flags(args: list[str], draft: dict[str, Any] | None = QWEN3_06B) -> vllm.SpeculativeFlags:
    flags = vllm.read_speculative_flags(args)
    assert flags is not None
    return dataclasses.replace(flags, draft_config=draft)


def _engine(args: list[str], draft: dict[str, Any] | None = QWEN3_06B) -> vllm.EngineFlags:
    return dataclasses.replace(vllm.build_engine_flags(args), speculative=_flags(args, draft))


def test_a_model_without_a_method_is_a_draft_model_unless_its_name_says_otherwise() -> None:
    assert _flags(DRAFT_4).method == vllm.DRAFT_MODEL
    assert _flags(_sc(method="draft_model", model="org/d", num_speculative_tokens=2)).method == "draft_model"
    # vLLM detects the method from the draft's name once its ModelConfig is built, given or not
    for name, method in (
        ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3"),
        ("yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle"),
        ("z-lab/Qwen3-8B-DFlash-b16", "dflash"),
        ("deepseek-ai/dspark_qwen3_8b_block7", "dspark"),
    ):
        assert _flags(_sc(model=name, num_speculative_tokens=3)).method == method
        assert _flags(_sc(method="draft_model", model=name, num_speculative_tokens=3)).method == method
    assert vllm.draft_method_by_name("Qwen/Qwen3-0.6B") is None
    # and from its config
    assert vllm.draft_method_by_config(QWEN3_06B) == vllm.DRAFT_MODEL
    assert vllm.draft_method_by_config({"model_type": "deepseek_mtp"}) == vllm.MTP
    assert vllm.draft_method_by_config({"architectures": ["Qwen3DSparkModel"]}) == "dspark"
    assert vllm.draft_method_by_config({"architectures": ["DSparkDraftModel"], "model_type": "qwen3"}) == (
        "dspark"
    )


def test_the_draft_keys_are_read_and_what_vllm_refuses_is_refused() -> None:
    flags = _flags(_sc(model="m", num_speculative_tokens=2, draft_tensor_parallel_size=1))
    assert (flags.draft_tensor_parallel_size, flags.heterogeneous_vocab) == (1, False)
    assert _flags(_sc(model="m", num_speculative_tokens=2, use_heterogeneous_vocab=True)).heterogeneous_vocab
    for bad in (0, "2", True, 1.5):
        with pytest.raises(errors.InvalidEngineArgs, match="draft_tensor_parallel_size must be an integer"):
            vllm.check_speculative_flags(
                _sc(model="m", num_speculative_tokens=2, draft_tensor_parallel_size=bad)
            )
    with pytest.raises(errors.InvalidEngineArgs, match="pass 'draft_tensor_parallel_size'"):
        vllm.check_speculative_flags(_sc(model="m", num_speculative_tokens=2, tensor_parallel_size=2))
    vllm.check_speculative_flags(_sc(model="m", num_speculative_tokens=2, tensor_parallel_size=None))


def test_the_draft_weights_are_the_whole_qwen3_0_6b() -> None:
    """Per layer: qkv_proj (h x (16 + 2 x 8) x 128), o_proj, the MLP (3 x h x 3072), two RMSNorms and the
    QK norms (2 x 128); the embedding (151,936 x h, tied: counted once) and the final norm."""
    draft = memory.read_draft_model(_flags(DRAFT_4))
    target = build_model_spec(QWEN3_32B)
    h = 1024
    layer = h * 32 * 128 + 16 * 128 * h + 3 * h * 3072 + 2 * h + 2 * 128
    expected = 2 * (28 * layer + 151936 * h + h)
    assert memory.compute_draft_model_weight_bytes(draft, target) == expected == 1_192_099_840
    tp2 = 28 * (h * 16 * 128 + 8 * 128 * h + 3 * h * 1536 + 2 * h + 2 * 128) + 151936 // 2 * h + h
    assert memory.compute_draft_model_weight_bytes(draft, target, tensor_parallel_size=2) == 2 * tp2
    # in the target's dtype: a float32 target gives the draft float32
    assert memory.compute_draft_model_weight_bytes(draft, target, dtype="float32") == 2 * expected


def test_the_plan_budgets_qwen3_0_6b_for_qwen3_32b_given_its_config() -> None:
    gpu, model = lookup_gpu("H100-SXM"), build_model_spec(QWEN3_32B)
    bounds = ServingBounds(max_context=8192)
    plain = compute_plan(model, gpu, 1, bounds)
    unread = compute_plan(model, gpu, 1, bounds, engine=_engine(DRAFT_4, None))
    plan = compute_plan(model, gpu, 1, bounds, engine=_engine(DRAFT_4))
    assert unread.budget.speculative_gib == 0.0 and unread.budget.weights_gib == plain.budget.weights_gib
    # unread, only the target's graphs for decode batches of 1 + 4 tokens are budgeted (the V2 runner's
    # draft-model speculator captures none): the KV layout is the target's alone
    assert unread.budget.kv_bytes_per_token == plain.budget.kv_bytes_per_token
    assert unread.budget.cuda_graph_gib > plain.budget.cuda_graph_gib
    assert any("--draft-config PATH" in w and "not in kvpilot's memory model" in w for w in unread.warnings)
    weights = 1_192_099_840 / 2**30
    assert weights < plan.budget.speculative_gib < weights + 0.01  # + the speculator's buffers
    # 28 KV layers of 8 heads x 128 in bf16 after the target's 64: 376,832 bytes per token
    assert plain.budget.kv_bytes_per_token == 64 * 4096 and plan.budget.kv_bytes_per_token == 92 * 4096
    assert plan.budget.kv_cache_tokens < plain.budget.kv_cache_tokens
    said = [
        w for w in plan.warnings if w.startswith("--speculative-config (method draft_model, 4 draft tokens)")
    ]
    assert len(said) == 1 and "Qwen3ForCausalLM, 28 layers" in said[0] and "adds 28 KV layers" in said[0]
    assert not any("not in kvpilot's memory model" in w for w in plan.warnings)


def test_the_speculator_buffers_are_the_standalone_ones() -> None:
    """Model Runner V2's StandaloneARSpeculator: no target hidden states, the expanded ids and positions
    of tokens + seqs; V1's DraftModelProposer: hidden states of the draft's width and two token masks."""
    target, flags = build_model_spec(QWEN3_32B), _flags(DRAFT_4)
    draft = memory.read_draft_model(flags)
    t, s = 8192, 256
    kwargs: dict[str, Any] = {"max_num_batched_tokens": t, "max_num_seqs": s}
    mtp_like = memory.compute_proposer_buffer_bytes(target, flags, **kwargs)
    ours = memory.compute_proposer_buffer_bytes(target, flags, draft=draft, **kwargs)
    assert mtp_like - ours == t * 5120 * 2 + 8 * (1 + 2 * s) - (8 * s + 4 * (s + 1) + 8 + (t + s) * 12)
    v1 = memory.compute_proposer_buffer_bytes(target, flags, draft=draft, model_runner_v2=False, **kwargs)
    v1_target = memory.compute_proposer_buffer_bytes(target, flags, model_runner_v2=False, **kwargs)
    assert v1_target - v1 == 2 * t * (5120 - 1024) * 2 - 2 * t


def test_vllms_refusals_of_a_draft_model_are_kvpilots() -> None:
    gpu, model = lookup_gpu("H100-SXM"), build_model_spec(QWEN3_32B)
    other = {**QWEN3_06B, "vocab_size": 151_936 + 64}
    with pytest.raises(errors.InvalidEngineArgs, match="same vocabulary size"):
        compute_plan(model, gpu, 1, ServingBounds(), engine=_engine(DRAFT_4, other))
    heterogeneous = _sc(model="m", num_speculative_tokens=4, use_heterogeneous_vocab=True)
    compute_plan(model, gpu, 1, ServingBounds(), engine=_engine(heterogeneous, other))
    three = _sc(model="m", num_speculative_tokens=4, draft_tensor_parallel_size=3)
    with pytest.raises(errors.InvalidEngineArgs, match="cannot be other than 1 or the target"):
        compute_plan(model, gpu, 2, ServingBounds(), engine=_engine(three))
    # 1 with TP 2: vLLM's Model Runner V2 takes it, its V1 runner refuses it; kvpilot names it
    one = _sc(model="m", num_speculative_tokens=4, draft_tensor_parallel_size=1)
    plan = compute_plan(model, gpu, 2, ServingBounds(), engine=_engine(one))
    assert plan.budget.speculative_gib == 0.0
    assert any("draft_tensor_parallel_size 1 with tensor_parallel_size 2" in w for w in plan.warnings)
    same = _sc(model="m", num_speculative_tokens=4, draft_tensor_parallel_size=2)
    assert compute_plan(model, gpu, 2, ServingBounds(), engine=_engine(same)).budget.speculative_gib > 0.5


def test_the_draft_tp_is_checked_once_the_target_tp_is_chosen_whatever_the_method() -> None:
    """One speculative step in the plan (``memory.check_speculative_model`` with the chosen TP): a
    ``draft_tensor_parallel_size`` neither 1 nor the target's is vLLM's refusal for any method."""
    gpu, model = lookup_gpu("H100-SXM"), build_model_spec(QWEN3_32B)
    ngram = vllm.build_engine_flags(
        _sc(method="ngram", num_speculative_tokens=3, draft_tensor_parallel_size=3)
    )
    with pytest.raises(errors.InvalidEngineArgs, match=r"cannot be other than 1 or the target's .*\(2\)"):
        compute_plan(model, gpu, 2, ServingBounds(), engine=ngram)
    assert ngram.speculative is not None
    memory.check_speculative_model(model, ngram.speculative)  # the target's TP not known: not checked
    with pytest.raises(errors.InvalidEngineArgs, match="cannot be other than 1 or the target"):
        memory.check_speculative_model(model, ngram.speculative, 2)
    # a draft vLLM refuses twice: its TP first (``_verify_and_get_draft_tp`` in ``__post_init__``), then its
    # vocabulary (an after-validator), pinned TP or not
    other = {**QWEN3_06B, "vocab_size": 151_936 + 64}
    both = _engine(_sc(model="m", num_speculative_tokens=4, draft_tensor_parallel_size=3), other)
    for pinned in (EngineSettings(), EngineSettings(tensor_parallel_size=2)):
        with pytest.raises(errors.InvalidEngineArgs, match="cannot be other than 1 or the target"):
            compute_plan(model, gpu, 2, ServingBounds(), pinned=pinned, engine=both)


def test_the_drafter_is_resolved_once_per_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget reads the draft's config.json once (``memory.resolve_drafter``) for its refusal check, its
    weights and buffers, its KV layers and the state's draft tokens, on every stage."""
    from kvpilot.tuner.memory import draft_model

    model, reads = build_model_spec(QWEN3_32B), []

    def counted(config: dict[str, Any]) -> Any:
        reads.append(config)
        return build_model_spec(config)

    monkeypatch.setattr(draft_model, "build_model_spec", counted)
    drafter = memory.resolve_drafter(model, _flags(DRAFT_4), 1, 1)
    assert drafter is not None and len(reads) == 1
    assert (drafter.method, drafter.kv_layers, drafter.state_holds_draft_tokens) == (
        vllm.DRAFT_MODEL,
        28,
        True,
    )
    assert memory.resolve_drafter(model, _flags(DRAFT_4), 2, 1) is None  # pipeline parallelism: not budgeted
    reads.clear()
    settings = EngineSettings(max_model_len=8192, tensor_parallel_size=1)
    budget = memory.compute_budget(model, lookup_gpu("H100-SXM"), settings, speculative=_flags(DRAFT_4))
    assert budget.speculative_gib > 0.5 and len(reads) == 1


def test_a_draft_its_tp_cannot_split_is_vllms_refusal() -> None:
    """The draft's heads must divide its TP (``verify_with_parallel_config``): 14 heads over 4 ranks."""
    model = build_model_spec(QWEN3_32B)
    odd = {**QWEN3_06B, "num_attention_heads": 14, "num_key_value_heads": 2}
    settings = EngineSettings(max_model_len=8192, tensor_parallel_size=4)
    budget = memory.compute_budget(model, lookup_gpu("H100-SXM"), settings, speculative=_flags(DRAFT_4, odd))
    assert not budget.starts and budget.error is not None
    assert budget.error.startswith("the draft model Qwen3ForCausalLM: Total number of attention heads (14)")
    two = dataclasses.replace(settings, tensor_parallel_size=2)
    assert memory.compute_budget(model, lookup_gpu("H100-SXM"), two, speculative=_flags(DRAFT_4, odd)).starts


def test_a_draft_kvpilot_cannot_size_is_named() -> None:
    model = build_model_spec(QWEN3_32B)
    for draft, why in (
        (cfg.QWEN3_NEXT_80B, "linear_attention layers"),
        ({**QWEN3_06B, "model_type": "deepseek_mtp"}, "as method 'mtp'"),
    ):
        flags = _flags(DRAFT_4, draft)
        reason = memory.speculative_unbudgeted_reason(model, flags)
        assert reason is not None and why in reason, reason
        assert memory.compute_speculative_bytes(model, flags) == 0
        with pytest.raises(errors.InvalidModelConfig):
            memory.read_draft_model(flags)
    kv8 = _flags(_sc(model="m", num_speculative_tokens=4, kv_cache_dtype="fp8", quantization=None))
    assert kv8.draft_overrides == ("kv_cache_dtype",)
    assert "kv_cache_dtype for the draft" in (memory.speculative_unbudgeted_reason(model, kv8) or "")
    given = _flags(DRAFT_4)
    assert given.draft_overrides == ()
    assert "pipeline parallelism" in (memory.speculative_unbudgeted_reason(model, given, pp=2) or "")
    assert memory.compute_speculative_bytes(model, given, pipeline_parallel_size=2) == 0
    assert memory.with_draft_model_layers(model, memory.read_draft_model(given)).num_layers == 64 + 28
