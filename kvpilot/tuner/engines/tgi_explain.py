"""TGI's budget in words (:class:`~.tgi_budget.TgiBudget`), one line per step of its warm-up, as
``kvpilot plan --engine tgi`` prints it and the operator's ``Planned`` condition explains it. Pure."""

from __future__ import annotations

from kvpilot.tuner import tgi
from kvpilot.tuner.engines.tgi_budget import TgiBudget
from kvpilot.tuner.tgi import warmup
from kvpilot.tuner.types import GIB


def _gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def _explain_prefill(budget: TgiBudget) -> str:
    d = budget.prefill_default
    prefill = budget.max_batch_prefill_tokens
    if d is None:
        return f"--max-batch-prefill-tokens {prefill} (given)"
    if d.compute_optimal is not None:
        how = f"compute-optimal {d.compute_optimal} (card {d.card}'s f16 flops x shards / the model's flops)"
    else:
        why = f"card {d.card} has no flops entry" if d.card else "card unknown to the launcher"
        how = f"default {d.fallback} ({why})"
    caps = f"max_position_embeddings {d.max_position_embeddings}"
    if d.vram_maximum is not None:
        caps += f", VRAM maximum {d.vram_maximum}"
    elif d.model_vram is None:
        caps += ", no VRAM maximum (quantized: the launcher has no estimate)"
    else:
        caps += ", no VRAM maximum (the launcher's model estimate exceeds its VRAM estimate)"
    text = f"Launcher's --max-batch-prefill-tokens: {how}, capped by {caps} -> {d.value}"
    if prefill != d.value:
        text += f"; {prefill} here (halved until the warm-up prefill fits)"
    return text


def explain_tgi_budget(budget: TgiBudget) -> list[str]:
    """The budget in words, one line per step, as ``kvpilot plan --engine tgi`` prints it."""
    s = budget.settings
    requests = budget.warmup_requests
    fraction = budget.memory_fraction
    lines = [
        _explain_prefill(budget),
        f"Attention {budget.attention} -> KV block of {budget.block_size} token(s); prefill chunking "
        f"{'on' if budget.chunking else 'off'}",
        f"KV block {budget.block_bytes} bytes = {budget.block_size} token(s) x {budget.layers} layers x "
        f"{budget.kv_heads_per_shard} KV head(s)/shard x {budget.head_size} x 2 (K, V) x "
        f"{budget.kv_dtype_bytes} byte(s)",
        f"Warm-up batch: {len(requests)} request(s), {sum(r.prompt_tokens for r in requests)} prompt tokens, "
        f"reserving {budget.warmup_blocks} KV blocks ({_gib(budget.warmup_kv_bytes)})",
        f"Warm-up peak {_gib(budget.warmup_peak_bytes)} of {_gib(budget.total_bytes)} = CUDA context "
        f"{_gib(budget.non_torch_bytes)} + weights {_gib(budget.weight_bytes)} + warm-up KV "
        f"{_gib(budget.warmup_kv_bytes)} + prefill activations {_gib(budget.activation_bytes)} "
        f"({budget.activation_bytes_per_token} bytes/token, the launcher's MLP estimate)",
    ]
    if not budget.weights_fit:
        shards = budget.settings.num_shard or 1
        return [
            *lines,
            f"Does not start: the weights ({_gib(budget.weight_bytes)} per shard) and the CUDA context "
            f"do not fit {fraction} x {_gib(budget.total_bytes)}; shard the model over more GPUs than "
            f"{shards} (--gpus, rendered --num-shard)",
        ]
    if not budget.prefill_fits:
        return [*lines, "Does not start: " + tgi.prefill_tokens_error(budget.max_batch_prefill_tokens)]
    lines += [
        f"KV memory = free {_gib(budget.free_after_prefill_bytes)} - (1 - {fraction} x "
        f"{warmup.TGI_WIGGLE_ROOM}) x {_gib(budget.total_bytes)} = {_gib(budget.kv_free_bytes)}",
        f"num_blocks = {budget.kv_free_bytes} // {budget.block_bytes} + {budget.warmup_blocks} warm-up "
        f"blocks = {budget.num_blocks} -> max batch total tokens {budget.max_batch_total_tokens} "
        "(tgi_batch_max_total_tokens)",
        f"--max-total-tokens {s.max_total_tokens} (TGI's default: min({budget.max_batch_total_tokens}, "
        f"max_position_embeddings {budget.max_position_embeddings}) = {budget.default_max_total_tokens}), "
        f"--max-input-tokens {s.max_input_tokens}",
        f"Concurrency at --max-total-tokens: {budget.max_batch_total_tokens} // {s.max_total_tokens} = "
        f"{budget.concurrency} request(s) at once; --max-concurrent-requests {s.max_concurrent_requests} "
        "admits more to the queue (429 beyond)",
    ]
    return lines + [f"Does not start: {text}" for text in budget.refusals]
