"""Contract: kvpilot's draft-model term is what vLLM 0.33 builds for a ``--speculative-config`` ``model``.

The pair: Qwen3-8B's published config (``tests/data/hf_configs/Qwen__Qwen3-8B.json``) cut to two decoder
layers as the target, Qwen3-0.6B's published config (``Qwen__Qwen3-0.6B.json``, byte for byte, its
embedding tied to its LM head) as the draft, given to vLLM as the ``model`` folder of the speculative
config. vLLM's ``SpeculativeConfig`` infers the method and builds the draft's ``ModelConfig``; the registry's
class for it (``Qwen3ForCausalLM``) is built on the meta device rank by rank (TP 1 and TP 2) under the
draft's own model and parallel configs, prefix ``draft_model``, as ``StandaloneARSpeculator
.load_draft_model`` builds it (:mod:`.spec_drafters`); vLLM's KV planner sizes the pool of the target's
layers and the draft's at TP 1. Compared:

* the method (``draft_model``: inferred from a ``model`` without a method) with kvpilot's reading;
* the draft's parameters on each rank, all of them (nothing is shared with the target after load), with
  :func:`kvpilot.tuner.memory.compute_draft_model_weight_bytes`, byte for byte;
* the KV specs its attention layers declare, per rank, and the pool's blocks with the target's layers,
  with :func:`kvpilot.tuner.memory.with_draft_model_layers` and kvpilot's KV layout;
* vLLM's refusals that kvpilot repeats by name: a vocabulary other than the target's, a
  ``draft_tensor_parallel_size`` neither 1 nor the target's, a missing count.
"""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest
import spec_drafters

from kvpilot.tuner import errors, memory, vllm
from kvpilot.tuner.model import FULL, build_model_spec
from kvpilot.tuner.types import GIB

pytestmark = pytest.mark.contract

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
AVAILABLE = 3 * GIB + 12_345
DRAFT: dict[str, Any] = json.loads((CONFIGS / "Qwen__Qwen3-0.6B.json").read_text())
ARGS = ["--speculative-config", '{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4}']


def _qwen3_8b() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    config.update(num_hidden_layers=2)
    return config


def _flags() -> vllm.SpeculativeFlags:
    flags = vllm.read_speculative_flags(ARGS)
    assert flags is not None
    return dataclasses.replace(flags, draft_config=DRAFT)


@pytest.fixture(scope="module")
def built(vllm: types.ModuleType) -> dict[int, list[dict[str, Any]]]:
    spec = {"method": "draft_model", "num_speculative_tokens": 4}  # the model: the draft's folder
    return {tp: spec_drafters.build_drafter_ranks(_qwen3_8b(), spec, tp, AVAILABLE, DRAFT) for tp in (1, 2)}


def test_the_draft_model_and_its_method_are_vllms(built: dict[int, list[dict[str, Any]]]) -> None:
    found = built[1][0]
    flags = _flags()
    assert found["method"] == flags.method == vllm.DRAFT_MODEL
    assert found["architecture"] == DRAFT["architectures"][0] == "Qwen3ForCausalLM"
    assert found["num_speculative_tokens"] == flags.num_speculative_tokens == 4
    target = build_model_spec(_qwen3_8b())
    assert memory.speculative_unbudgeted_reason(target, flags) is None
    memory.check_speculative_model(target, flags, 1)  # vLLM accepted it: so does kvpilot
    assert "num_speculative_tokens" in found["refused_without_count"]
    with pytest.raises(errors.InvalidEngineArgs, match="needs num_speculative_tokens"):
        vllm.check_speculative_flags(["--speculative-config", '{"model": "Qwen/Qwen3-0.6B"}'])


@pytest.mark.parametrize("tp", [1, 2])
def test_the_draft_model_weights_are_every_parameter_vllm_builds(
    built: dict[int, list[dict[str, Any]]], tp: int
) -> None:
    """The whole draft (its own embedding; its tied LM head counted once), in the target's dtype."""
    target = build_model_spec(_qwen3_8b())
    draft = memory.read_draft_model(_flags())
    ours = memory.compute_draft_model_weight_bytes(draft, target, tensor_parallel_size=tp)
    for rank in built[tp]:
        assert rank["bias_bytes"] == 0
        assert ours == rank["param_bytes"], rank
    total = memory.compute_speculative_bytes(target, _flags(), tensor_parallel_size=tp)
    assert total > ours  # + the standalone speculator's buffers


@pytest.mark.parametrize("tp", [1, 2])
def test_the_draft_model_kv_layers_join_the_pool_as_vllm_plans_it(
    built: dict[int, list[dict[str, Any]]], tp: int
) -> None:
    target = build_model_spec(_qwen3_8b())
    draft = memory.read_draft_model(_flags())
    extended = memory.with_draft_model_layers(target, draft)
    added = extended.layers[target.num_layers :]
    assert len(added) == draft.num_layers == DRAFT["num_hidden_layers"]
    for rank in built[tp]:
        assert len(rank["kv"]) == draft.num_layers
        for layer, (kind, heads, head, head_v) in zip(added, rank["kv"], strict=True):
            assert (kind, layer.kind) == ("FullAttentionSpec", FULL)
            assert (max(1, layer.num_kv_heads // tp), layer.head_dim, layer.head_dim_v) == (
                heads,
                head,
                head_v,
            )
    if tp > 1:
        return  # the planner runs at TP 1 (spec_drafters): the per-rank specs above are the TP 2 check
    found = built[1][0]
    assert found["kv_layers"] == extended.num_layers == target.num_layers + draft.num_layers
    layout = memory.compute_kv_layout(extended, block_size=16)
    assert memory.compute_num_blocks(AVAILABLE, layout) == found["num_blocks"]
    capacity = memory.compute_capacity(layout, AVAILABLE, found["cache"]["max_model_len"], 0)
    assert capacity.max_concurrency == pytest.approx(found["capacity"][1], rel=1e-12)
    plain = memory.compute_num_blocks(AVAILABLE, memory.compute_kv_layout(target, block_size=16))
    assert plain > found["num_blocks"]  # the draft's layers cost tokens


def _speculative_config(tmp: Path, draft: dict[str, Any], tp: int, **spec: Any) -> Any:
    """vLLM's ``SpeculativeConfig`` for the target and ``draft`` (each a folder of its own), in process."""
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    folders = []
    for name, config in (("target", _qwen3_8b()), ("draft", draft)):
        folder = tmp / name
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        folders.append(folder)
    mc = ModelConfig(model=str(folders[0]), skip_tokenizer_init=True, max_model_len=4096, enforce_eager=True)
    pc = ParallelConfig(tensor_parallel_size=tp)
    return SpeculativeConfig(
        model=str(folders[1]),
        num_speculative_tokens=4,
        target_model_config=mc,
        target_parallel_config=pc,
        **spec,
    )


@pytest.mark.usefixtures("vllm")
def test_vllm_refuses_what_kvpilot_refuses_of_a_draft_model(tmp_path: Path) -> None:
    target = build_model_spec(_qwen3_8b())
    other = {**DRAFT, "vocab_size": DRAFT["vocab_size"] + 64}
    with pytest.raises(ValueError, match="same vocabulary size"):
        _speculative_config(tmp_path, other, 1)
    flags = dataclasses.replace(_flags(), draft_config=other)
    with pytest.raises(errors.InvalidEngineArgs, match="same vocabulary size"):
        memory.check_speculative_model(target, flags, 1)
    allowed = dataclasses.replace(flags, heterogeneous_vocab=True)
    memory.check_speculative_model(target, allowed, 1)  # use_heterogeneous_vocab: no refusal
    with pytest.raises(ValueError, match="cannot be other value than 1 or target"):
        _speculative_config(tmp_path, DRAFT, 2, draft_tensor_parallel_size=3)
    three = dataclasses.replace(_flags(), draft_tensor_parallel_size=3)
    with pytest.raises(errors.InvalidEngineArgs, match="cannot be other than 1 or the target"):
        memory.check_speculative_model(target, three, 2)
    sc = _speculative_config(tmp_path, DRAFT, 2, draft_tensor_parallel_size=1)
    assert (sc.method, sc.draft_parallel_config.tensor_parallel_size) == ("draft_model", 1)
    memory.check_speculative_model(target, dataclasses.replace(_flags(), draft_tensor_parallel_size=1), 2)
    with pytest.raises(ValueError, match="not a valid argument"):
        _speculative_config(tmp_path, DRAFT, 1, tensor_parallel_size=1)
    given = ["-sc", '{"model": "m", "num_speculative_tokens": 2, "tensor_parallel_size": 1}']
    with pytest.raises(errors.InvalidEngineArgs, match="'tensor_parallel_size' is not a valid key"):
        vllm.check_speculative_flags(given)
