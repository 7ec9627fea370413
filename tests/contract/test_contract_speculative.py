"""Contract: kvpilot's speculative-decoding term is what vLLM 0.33 builds for ``--speculative-config``.

The drafter is vLLM's own: ``SpeculativeConfig`` maps the method and rewrites the target's config, the
registry's class for it is built on the meta device rank by rank (TP 1 and TP 2), and vLLM's KV planner
sizes the pool of the target's layers with the drafter's (:mod:`.spec_drafters` says how). Compared:

* the drafter's class, method and MTP layer count with :data:`kvpilot.tuner.vllm.MTP_DRAFTERS` and
  :class:`~kvpilot.tuner.vllm.SpeculativeFlags` read from the same arguments;
* its weights on each rank, less the embedding and LM heads the proposer replaces with the target's
  after load, with :func:`kvpilot.tuner.memory.compute_drafter_weight_bytes`, byte for byte but for one
  explained exception: DeepSeek's MoE gate ``e_score_correction_bias`` (fp32, one per routed expert), a
  parameter kvpilot's weight model counts in no MoE layer, the target's included (reported by name, its
  bytes taken from vLLM's parameter, never guessed: 32 bytes per MTP layer of the cut configs below);
* the KV specs of its attention layers with the layers :func:`kvpilot.tuner.memory.with_mtp_layers`
  appends, and vLLM's block count and concurrency for the target's and the drafter's layers together
  with kvpilot's; for a gated-DeltaNet hybrid (Qwen3-Next, Qwen3.5, Qwen3.6) the target's ``MambaSpec``
  layers are in the plan too, as vLLM's own layers declare them under the speculative config (their conv
  state ``num_speculative_tokens`` positions longer, ``num_speculative_blocks`` more pages per request),
  the attention block aligned to the state page as a CUDA start aligns it (vLLM's CPU platform does not;
  :func:`spec_drafters._align_hybrid`), and kvpilot's state page, pages per request and block size are
  compared with them, for Triton's GDN prefill and for FlashInfer's (Hopper: one prefill-checkpoint page
  per request more and a 64-token block grid, given to vLLM's own specs as its GDN layer gives it there).

The configs are DeepSeek-V3's (``DeepseekV3ForCausalLM``) without its
fp8 ``quantization_config`` (vLLM's CPU platform has no ScaledMM kernel for it, as
``test_contract_model_classes.py`` records), cut to four decoder layers (the fourth, past
``first_k_dense_replace``, a MoE layer like the MTP layer) and eight routed experts; one with two MTP
layers and four speculative tokens (the layers reused), and one without ``num_nextn_predict_layers`` (the
config class's default), too; and GLM-4.5's (``Glm4MoeForCausalLM``, drafter ``Glm4MoeMTPModel``: no
GLM-4.5 / 4.6 / 4.7 config.json is stored, ``tests/data/hf_configs/INDEX.md``, so the shape is
transformers' ``Glm4MoeConfig`` defaults with the published configs' ``head_dim``, QK norm and
attention bias, cut to two layers and eight experts), with QK norm and bias and without, one MTP layer
and three tokens, and two MTP layers and four tokens. GLM's MoE gate has the same fp32
``e_score_correction_bias`` (``glm4_moe.py:148``): the same one exception. And Qwen3-Next-80B-A3B's
(``Qwen3NextMTP``), cut to three gated DeltaNet layers and one full-attention layer and eight experts, with
one and two speculative tokens (``mtp``, ``qwen3_next_mtp``); Qwen3.6-35B-A3B's (``Qwen3_5MoeMTP``, the
multimodal wrapper with its vision tower, its text model cut alike) with two (``qwen3_5_mtp``); Qwen3.5-9B's
(``Qwen3_5MTP``, dense) with one: no ``e_score_correction_bias``, and their top-level ``lm_head`` is the
target's after load. Every case builds on vLLM's CPU platform; none is left out.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest
import spec_drafters

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.model import FULL, LINEAR, MLA, NO_KV, build_model_spec, read_eagle3_draft
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
AVAILABLE = 3 * GIB + 12_345


def _deepseek(**cut: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / "deepseek-ai__DeepSeek-V3.json").read_text())
    config.pop("quantization_config")
    config.update(num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=2, **cut)
    return config


def _qwen3_next(**cut: Any) -> dict[str, Any]:
    """Qwen3-Next-80B-A3B's config cut to four decoder layers (three gated DeltaNet, the fourth full
    attention: ``full_attention_interval`` 4, like the 48th) and eight routed experts; no
    ``num_nextn_predict_layers`` (the published config has none: the drafter builds one layer)."""
    config: dict[str, Any] = json.loads((CONFIGS / "Qwen__Qwen3-Next-80B-A3B-Instruct.json").read_text())
    config.update(num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, **cut)
    return config


def _qwen3_5(name: str) -> dict[str, Any]:
    """A Qwen3.5 / Qwen3.6 config (the multimodal wrapper, its vision tower whole) whose text model is cut
    to its first four layers (three gated DeltaNet, one full attention) and, for a MoE, eight experts."""
    config: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    text = config["text_config"]
    text.update(num_hidden_layers=4, layer_types=text["layer_types"][:4])
    if "num_experts" in text:
        text.update(num_experts=8, num_experts_per_tok=2)
    return config


def _glm(**cut: Any) -> dict[str, Any]:
    """GLM-4.5's shape: transformers' ``Glm4MoeConfig`` defaults (GLM-4.5-Air's geometry) with the
    ``head_dim``, ``attention_bias`` and ``use_qk_norm`` the published GLM-4.5 / 4.6 configs set, cut to
    two decoder layers (the second, past ``first_k_dense_replace``, a MoE layer like the MTP layer) and
    eight routed experts."""
    config: dict[str, Any] = {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "dtype": "bfloat16",
        "vocab_size": 151552,
        "hidden_size": 4096,
        "intermediate_size": 10944,
        "num_hidden_layers": 2,
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
        "moe_intermediate_size": 1408,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 1,
    }
    config.update(cut)
    return config


CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "qwen3-next-mtp-1": (
        _qwen3_next(),
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
    ),
    "qwen3-next-qwen3_next_mtp-2": (
        _qwen3_next(),
        ["--speculative-config", '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}'],
    ),
    "qwen3.6-moe-qwen3_5_mtp-2": (
        _qwen3_5("Qwen__Qwen3.6-35B-A3B"),
        ["--speculative-config", '{"method": "qwen3_5_mtp", "num_speculative_tokens": 2}'],
    ),
    "qwen3.5-dense-mtp-1": (
        _qwen3_5("Qwen__Qwen3.5-9B"),
        ["--spec-method", "mtp", "--spec-tokens", "1"],
    ),
    "glm-4.5-mtp-1": (
        _glm(),
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
    ),
    "glm-4.5-glm4_moe_mtp-3": (
        _glm(use_qk_norm=False, attention_bias=False),  # GLM-4.5-Air's attention
        ["--speculative-config", '{"method": "glm4_moe_mtp", "num_speculative_tokens": 3}'],
    ),
    "glm-4.5-2-layers-4-tokens": (
        _glm(num_nextn_predict_layers=2),
        ["--spec-method", "mtp", "--spec-tokens", "4"],
    ),
    "deepseek-v3-mtp-1": (
        _deepseek(),
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
    ),
    "deepseek-v3-deepseek_mtp-2": (
        _deepseek(),
        ["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 2}'],
    ),
    # no num_nextn_predict_layers: transformers' DeepseekV3Config default (1) is what vLLM reads
    "deepseek-v3-no-layer-count": (
        {k: v for k, v in _deepseek().items() if k != "num_nextn_predict_layers"},
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
    ),
    "deepseek-v3-2-layers-4-tokens": (
        _deepseek(num_nextn_predict_layers=2),
        ["--spec-method", "mtp", "--spec-tokens", "4"],
    ),
}


def _vllm_spec(flags: vllm.SpeculativeFlags) -> dict[str, Any]:
    """The ``--speculative-config`` object vLLM would validate: the user's method (as spelled) and count."""
    spec: dict[str, Any] = {"method": flags.given_method}
    if flags.num_speculative_tokens is not None:
        spec["num_speculative_tokens"] = flags.num_speculative_tokens
    return spec


def _flags(args: list[str]) -> vllm.SpeculativeFlags:
    flags = vllm.read_speculative_flags(args)
    assert flags is not None
    return flags


@pytest.fixture(scope="module")
def theirs(vllm: types.ModuleType) -> dict[int, dict[str, list[dict[str, Any]]]]:
    return {
        tp: {
            name: spec_drafters.build_drafter_ranks(config, _vllm_spec(_flags(args)), tp, AVAILABLE)
            for name, (config, args) in CASES.items()
        }
        for tp in (1, 2)
    }


@pytest.mark.parametrize("case", list(CASES))
def test_the_drafter_and_its_method_are_vllms(
    theirs: dict[int, dict[str, list[dict[str, Any]]]], case: str
) -> None:
    config, args = CASES[case]
    model = build_model_spec(copy.deepcopy(config))
    flags = _flags(args)
    built = theirs[1][case][0]
    assert built["method"] == flags.method == vllm.MTP
    assert built["architecture"] == vllm.MTP_DRAFTERS[model.model_type].architecture
    # vLLM's n_predict: the config's count (transformers' default for DeepSeek); None for Qwen3-Next,
    # whose config has none, and whose predictor then builds getattr(config, ..., 1) layers
    text = config.get("text_config", config)
    drafter = vllm.MTP_DRAFTERS[model.model_type]
    expected = text.get(drafter.layers_key, 1 if model.model_type != "qwen3_next" else None)
    assert built["n_predict"] == expected
    assert len(built["kv"]) == model.num_mtp_layers  # the MTP layers vLLM built
    assert built["num_speculative_tokens"] == flags.num_speculative_tokens
    memory.check_speculative_model(model, flags)  # vLLM accepted it: so does kvpilot
    # without a count (and without a model) vLLM refuses the same method: so does kvpilot
    assert "num_speculative_tokens must be provided" in built["refused_without_count"]
    with pytest.raises(errors.InvalidEngineArgs, match="needs num_speculative_tokens"):
        vllm.check_speculative_flags(["--speculative-config", json.dumps({"method": flags.given_method})])


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_the_drafter_weights_are_the_bytes_vllm_keeps_after_load(
    theirs: dict[int, dict[str, list[dict[str, Any]]]], case: str, tp: int
) -> None:
    config, _ = CASES[case]
    model = build_model_spec(copy.deepcopy(config))
    ours = memory.compute_drafter_weight_bytes(model, tensor_parallel_size=tp)
    for rank in theirs[tp][case]:
        assert rank["shared_bytes"] > 0  # the embedding and the heads are there, and then the target's
        assert (
            rank["bias_bytes"] == 4 * config.get("n_routed_experts", 0) * model.num_mtp_layers
        )  # the one exception (DeepSeek's and GLM's gates; Qwen's have none)
        assert ours == rank["param_bytes"] - rank["shared_bytes"] - rank["bias_bytes"], rank


@pytest.mark.parametrize("case", list(CASES))
def test_the_drafter_kv_layers_join_the_pool_as_vllm_plans_it(
    theirs: dict[int, dict[str, list[dict[str, Any]]]], case: str
) -> None:
    config, args = CASES[case]
    model = build_model_spec(copy.deepcopy(config))
    tokens = _flags(args).num_speculative_tokens or 0
    built = theirs[1][case][0]
    extended = memory.with_mtp_layers(model)
    added = extended.layers[model.num_layers :]
    assert len(added) == len(built["kv"]) == model.num_mtp_layers
    for layer, (kind, heads, head, head_v) in zip(added, built["kv"], strict=True):
        assert (kind, layer.kind) in (("MLAAttentionSpec", MLA), ("FullAttentionSpec", FULL))
        assert (layer.num_kv_heads, layer.head_dim) == (heads, head)
        # MLA: kvpilot's head_dim_v and vLLM's head_size_v are both 0 (the latent is one page); full
        # attention: vLLM's head_size_v is the head size unless the class gives another
        assert layer.head_dim_v == (head_v if kind == "MLAAttentionSpec" else head_v or head)
    assert built["kv_layers"] == sum(layer.kind != NO_KV for layer in extended.layers)
    # no compute capability: Triton's GDN prefill, no checkpoint page (what spec_drafters aligns for)
    layout = memory.compute_kv_layout(
        extended, block_size=16, compute_capability=None, num_speculative_tokens=tokens
    )
    assert memory.compute_num_blocks(AVAILABLE, layout) == built["num_blocks"]
    capacity = memory.compute_capacity(layout, AVAILABLE, built["cache"]["max_model_len"], 0)
    assert capacity.max_concurrency == pytest.approx(built["capacity"][1], rel=1e-12)
    plain = memory.compute_kv_layout(model, block_size=16, compute_capability=None)
    assert memory.compute_num_blocks(AVAILABLE, plain) > built["num_blocks"]  # the drafter costs tokens
    states = [g for g in layout.groups if g.kind == LINEAR]
    assert bool(states) == bool(built["states"])
    if states:  # gated DeltaNet: the state grows with the speculative tokens, as vLLM declares it
        assert layout.block_size == built["cache"]["block_size"]
        for _, _, page, spec_blocks, _, pages in built["states"]:
            assert spec_blocks == tokens
            assert {(g.page_bytes, g.state_pages) for g in states} == {(page, pages)}
        without = memory.compute_kv_layout(extended, block_size=16, compute_capability=None)
        assert (without.state_blocks_per_request(), without.bytes_per_block) != (
            layout.state_blocks_per_request(),
            layout.bytes_per_block,
        )
        # on Hopper (FlashInfer's GDN prefill): one checkpoint page more and a 64-token grid
        hopper = memory.compute_kv_layout(
            extended, block_size=16, compute_capability=(9, 0), num_speculative_tokens=tokens
        )
        flashinfer = built["flashinfer"]
        assert hopper.block_size == flashinfer["block_size"]
        assert memory.compute_num_blocks(AVAILABLE, hopper) == flashinfer["num_blocks"]
        assert {g.state_pages for g in hopper.groups if g.kind == LINEAR} == set(flashinfer["state_pages"])
        assert flashinfer["state_pages"] == [2 + tokens + 1]
        capacity = memory.compute_capacity(hopper, AVAILABLE, built["cache"]["max_model_len"], 0)
        assert capacity.max_concurrency == pytest.approx(flashinfer["concurrency"], rel=1e-12)
    else:
        assert "flashinfer" not in built


def test_the_speculative_flags_and_methods_are_vllms(vllm_parser: Any) -> None:
    from typing import get_args

    from vllm.config.speculative import MTPModelTypes

    assert set(vllm.MTP_METHODS) == set(get_args(MTPModelTypes))
    for args in (
        ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'],
        ["-sc", '{"method": "mtp", "num_speculative_tokens": 2}'],
        ['--speculative_config={"method": "mtp", "num_speculative_tokens": 2}'],
    ):
        parsed = vllm_parser.parse_args(args)
        assert parsed.speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
        assert _flags(args) == vllm.SpeculativeFlags("mtp", 2, "mtp")
    parsed = vllm_parser.parse_args(["--spec-method", "ngram", "--spec-tokens", "3", "--spec-model", "x"])
    assert (parsed.spec_method, parsed.spec_tokens, parsed.spec_model) == ("ngram", 3, "x")
    assert vllm.speculative_flag_names(["-sc", "{}", "--spec-tokens", "3"]) == (
        "--speculative-config",
        "--spec-tokens",
    )


# -- EAGLE3 -------------------------------------------------------------------------------------------
# The target: Llama-3.1-8B-Instruct's published config cut to two decoder layers; the draft: the shape of
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (``tests/data/eagle3/README.md`` says where each field comes from),
# given to vLLM as the ``model`` folder of ``--speculative-config``. Every point builds on the CPU.

EAGLE3_DRAFT: dict[str, Any] = json.loads(
    (CONFIGS.parent / "eagle3" / "yuhuili__EAGLE3-LLaMA3.1-Instruct-8B.json").read_text()
)
EAGLE3_ARGS = [
    "--speculative-config",
    '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}',
]


def _llama_8b() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())
    config.update(num_hidden_layers=2)
    return config


@pytest.fixture(scope="module")
def eagle3(vllm: types.ModuleType) -> dict[int, list[dict[str, Any]]]:
    spec = {"method": "eagle3", "num_speculative_tokens": 3}  # the model: the draft's folder
    return {
        tp: spec_drafters.build_drafter_ranks(_llama_8b(), spec, tp, AVAILABLE, EAGLE3_DRAFT) for tp in (1, 2)
    }


def _eagle3_flags() -> vllm.SpeculativeFlags:
    return dataclasses.replace(_flags(EAGLE3_ARGS), draft_config=EAGLE3_DRAFT)


def test_the_eagle3_drafter_is_vllms(eagle3: dict[int, list[dict[str, Any]]]) -> None:
    built = eagle3[1][0]
    draft = read_eagle3_draft(EAGLE3_DRAFT)
    assert built["method"] == _flags(EAGLE3_ARGS).method == vllm.EAGLE3
    assert built["architecture"] == draft.architecture == "LlamaForCausalLMEagle3"
    assert built["architecture"] in vllm.EAGLE3_LLAMA_ARCHITECTURES
    assert built["num_speculative_tokens"] == 3
    assert memory.speculative_unbudgeted_reason(build_model_spec(_llama_8b()), _eagle3_flags()) is None


@pytest.mark.parametrize("tp", [1, 2])
def test_the_eagle3_drafter_weights_are_the_bytes_vllm_keeps_after_load(
    eagle3: dict[int, list[dict[str, Any]]], tp: int
) -> None:
    """vLLM's parameters less ``embed_tokens`` (the target's after load: the checkpoint holds none); the
    ``lm_head`` over ``draft_vocab_size`` and ``d2t`` (``draft_id_to_target_id``) are the drafter's."""
    model = build_model_spec(_llama_8b())
    ours = memory.compute_eagle3_weight_bytes(read_eagle3_draft(EAGLE3_DRAFT), model, tensor_parallel_size=tp)
    for rank in eagle3[tp]:
        assert rank["shared_bytes"] > 0 and rank["bias_bytes"] == 0
        assert ours == rank["param_bytes"] - rank["shared_bytes"], rank
    assert (
        memory.compute_speculative_bytes(model, _eagle3_flags(), tensor_parallel_size=tp) > ours
    )  # + buffers


@pytest.mark.parametrize("tp", [1, 2])
def test_the_eagle3_kv_layer_joins_the_pool_as_vllm_plans_it(
    eagle3: dict[int, list[dict[str, Any]]], tp: int
) -> None:
    model = build_model_spec(_llama_8b())
    draft = read_eagle3_draft(EAGLE3_DRAFT)
    extended = memory.with_eagle3_layers(model, draft)
    for rank in eagle3[tp]:
        assert rank["kv"] == [
            ("FullAttentionSpec", max(1, draft.num_kv_heads // tp), draft.head_dim, draft.head_dim)
        ]
    if tp > 1:
        return  # the planner runs at TP 1 (spec_drafters): the per-rank specs above are the TP 2 check
    built = eagle3[1][0]
    assert built["kv_layers"] == extended.num_layers == model.num_layers + 1
    layout = memory.compute_kv_layout(extended, block_size=16)
    assert memory.compute_num_blocks(AVAILABLE, layout) == built["num_blocks"]
    plain = memory.compute_num_blocks(AVAILABLE, memory.compute_kv_layout(model, block_size=16))
    assert plain > built["num_blocks"]  # the drafter's layer costs tokens
