"""Contract: kvpilot's TGI memory model and rendering against TGI 3.3.7's own source text.

TGI is archived and cannot share kvpilot's environment (its server pins its own torch and kernels; its
launcher and router are Rust). FALLBACK CONTRACT, clearly: the source at tag v3.3.7 (commit ``dfb3fbe7``)
is copied verbatim into ``tests/data/tgi/`` (``launcher_args_v3.3.7.rs``: the launcher's ``struct Args``;
``launcher_memory_v3.3.7.rs``: its defaults and card table; ``server_memory_v3.3.7.py.txt``: the warm-up,
the wiggle room, the block sizes, the model registry), and this test reads the constants and flags out
of that text and compares them with :mod:`kvpilot.tuner.tgi`. It does not run TGI: the free memory the
warm-up measures needs a GPU, and kvpilot's weights, CUDA context and prefill activations are estimates.

Every flag ``kvpilot plan --engine tgi`` renders, for every catalogue model TGI serves and kvpilot sizes, on
every catalogue GPU, at 1, 2, 4 and 8 shards, must be a ``long`` field of the launcher's ``Args``, with a
value of the field's type.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpilot.tuner import engines, errors, gpus, tgi
from kvpilot.tuner.model import build_model_spec, list_models, lookup_checkpoint_bytes, lookup_model_config
from kvpilot.tuner.tgi import models as tgi_models
from kvpilot.tuner.tgi import warmup
from tests.tuner.test_tgi import _launcher_args

pytestmark = pytest.mark.contract

DATA = Path(__file__).resolve().parents[1] / "data" / "tgi"
LAUNCHER = (DATA / "launcher_memory_v3.3.7.rs").read_text()
SERVER = (DATA / "server_memory_v3.3.7.py.txt").read_text()


def _one(pattern: str, text: str) -> str:
    found = re.findall(pattern, text)
    assert len(found) == 1, (pattern, found)
    return str(found[0])


def test_server_constants_are_tgis() -> None:
    assert float(_one(r'TGI_WIGGLE_ROOM = float\(os.getenv\("TGI_WIGGLE_ROOM", "([\d.]+)"\)\)', SERVER)) == (
        warmup.TGI_WIGGLE_ROOM
    )
    assert float(
        _one(r'MEMORY_FRACTION = float\(os.getenv\("CUDA_MEMORY_FRACTION", "([\d.]+)"\)\)', SERVER)
    ) == (tgi.CUDA_MEMORY_FRACTION_DEFAULT)
    sizes = dict(re.findall(r'ATTENTION == "([\w-]+)":\n    BLOCK_SIZE = (\d+)', SERVER))
    sizes["paged"] = _one(r"else:\n    BLOCK_SIZE = (\d+)", SERVER)
    assert {k: int(v) for k, v in sizes.items()} == dict(warmup.BLOCK_SIZES)
    # the formulas kvpilot ports, as TGI writes them
    for line in (
        "free_memory = max(0, total_free_memory - (1 - memory_fraction) * total_gpu_memory)",
        "cache_block_size = BLOCK_SIZE * self.num_kv_heads * self.head_size",
        "total_cache_size = self.num_layers * cache_block_size * 2 * dtype_size",
        "free_memory = get_free_memory(self.device, MEMORY_FRACTION * TGI_WIGGLE_ROOM)",
        "int(kv_memory // total_cache_size)",
        "+ batch_num_blocks",
        "num_blocks * BLOCK_SIZE, model_max_length, max_position_embeddings",
        "max_input_tokens = max_total_tokens - 1",
        'f"Not enough memory to handle {num_tokens} prefill tokens. "',
    ):
        assert line in SERVER, line
    kv_dtypes = re.findall(r'kv_cache_dtype == "(\w+)"', SERVER)
    assert set(kv_dtypes) == set(warmup.KV_CACHE_DTYPE_BYTES)


def test_the_model_registry_is_tgis() -> None:
    registry = set(re.findall(r'"type": "([\w-]+)"', SERVER))
    assert registry == set(tgi_models.REGISTRY_MODEL_TYPES)
    assert registry >= tgi_models.MODELLED_MODEL_TYPES
    multimodal = set(
        re.findall(r'"type": "([\w-]+)",\n\s+"name": "[^"]+",\n\s+"url": "[^"]+",\n\s+"multimodal"', SERVER)
    )
    assert multimodal and not multimodal & tgi_models.MODELLED_MODEL_TYPES
    assert _one(r'if method in \{"gptq", "awq", "exl2"\}', SERVER)
    assert (
        'method == "fbgemm_fp8" or method == "fp8"' in SERVER and 'method == "compressed-tensors"' in SERVER
    )


def test_launcher_constants_are_tgis() -> None:
    flops = dict(re.findall(r"Gpu::(\w+) => Some\((\d+) \* 10u64.pow\(12\)\)", LAUNCHER))
    names = dict(re.findall(r'"(nvidia-[\w-]+)" => Gpu::(\w+),', LAUNCHER))
    assert set(names) == set(warmup.CARD_NAMES)
    for name, variant in names.items():
        family = warmup.CARD_NAMES[name]
        assert warmup.CARD_F16_FLOPS[family] == int(flops[variant]) * 10**12, name
    assert (
        float(_one(r"\.unwrap_or\(([\d.]+)\);\n\s+let total = amount", LAUNCHER))
        == warmup.LAUNCHER_WIGGLE_ROOM
    )
    assert int(_one(r"if optimal_size > (\d+)", LAUNCHER)) == warmup.MIN_COMPUTE_OPTIMAL
    assert int(_one(r"_ => (\d+),\n\s+\},\n\s+None => \d+", LAUNCHER)) == warmup.DEFAULT_PREFILL_TOKENS
    arms = re.findall(r'Some\("(\w+)"\)(?: \| Some\("(\w+)"\))? => ([\d_]+),', LAUNCHER)
    by_type = {name: int(value) for *names, value in arms for name in names if name}
    assert by_type == dict(warmup.PREFILL_DEFAULT_BY_MODEL_TYPE)
    heads = {
        int(h) for h in re.findall(r"h == (\d+)", _one(r"Some\(h\) if ([^=]+==[^=]+==[^=]+== \d+)", LAUNCHER))
    }
    assert heads == warmup.FLASHINFER_HEAD_DIMS
    assert set(
        re.findall(r'Some\("(\w+)"\)', _one(r'(Some\("falcon"\) \| Some\("deepseek_v2"\)) =>', LAUNCHER))
    ) == (warmup.FALLBACK_ATTENTION_MODEL_TYPES)
    for line in (
        "Some((mlp_size + mlp_size / 2) * self.num_experts * dtype_size * 3)",
        "Some(self.num_kv_heads? * 2 * self.get_head_dim()? * 2 * self.num_layers?)",
        "let attn_layer_flops = q_flops + k_flops + v_flops + attn_flops + o_flops;",
        "let gate_up_down_flops = 2 * 3 * hidden_size * intermediate_size;",
        "let params = layer_vram * self.num_layers? + 2 * vocab;",
        "let tokens_allowed = vram / token_vram;",
        "default.min(max_position_embeddings)",
        "value.min(vram_maximum)",
        "let cardname = fullname.replace(' ', \"-\").to_lowercase();",
    ):
        assert line in LAUNCHER, line


def _catalogue_plans() -> list[tuple[str, str, int, engines.TgiBudget]]:
    plans = []
    for model, _ in list_models():
        spec = build_model_spec(lookup_model_config(model))
        for gpu in gpus.CATALOGUE:
            for shards in (1, 2, 4, 8):
                try:
                    budget = engines.plan_tgi_budget(
                        spec,
                        gpu,
                        tgi.TgiSettings(num_shard=shards),
                        weights_total_bytes=lookup_checkpoint_bytes(model),
                    )
                except errors.InvalidEngineArgs:
                    continue
                plans.append((model, gpu.name, shards, budget))
    return plans


def test_every_rendered_flag_is_a_launcher_flag_of_its_type() -> None:
    fields = _launcher_args()
    by_flag = {"--" + name.replace("_", "-"): kind for name, (kind, _) in fields.items()}
    plans = _catalogue_plans()
    served = {model for model, *_ in plans}
    assert {"meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3"} <= served
    assert any(budget.feasible for *_, budget in plans)
    for model, gpu, shards, budget in plans:
        args = tgi.build_tgi_args(budget.rendered)
        for flag, value in zip(args[::2], args[1::2], strict=True):
            kind = by_flag.get(flag)
            assert kind is not None, (model, gpu, shards, flag)
            inner = kind.removeprefix("Option<").removesuffix(">")
            if inner in ("usize", "u32", "u16"):
                assert int(value) >= 0, (model, gpu, flag, value)
            else:
                assert inner == "f32" and 0 < float(value) <= 1, (model, gpu, flag, value)
