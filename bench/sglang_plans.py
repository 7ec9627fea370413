"""SGLang plans for the catalogue: what ``kvpilot plan --engine sglang`` chooses on three GPUs.

For every catalogue model on an L4, an H100-SXM and an H200 at a 32K context (or the model's own, if
shorter): the fewest GPUs (TP 1/2/4/8) whose SGLang budget fits, its ``--mem-fraction-static`` and
``--chunked-prefill-size``, the KV pool per GPU, ``max_total_num_tokens`` and the 32K requests that fit at
once; or why kvpilot does not plan it (its SGLang model covers text-only full-attention and MLA models).
Estimates of kvpilot's SGLang model (``kvpilot.tuner.engines.sglang_budget``), whose defaults and pool
arithmetic are SGLang 0.5.23's own (tests/contract/test_contract_sglang.py); the free memory before loading
is estimated.

    python bench/sglang_plans.py
"""

from __future__ import annotations

from kvpilot.tuner import engines, errors, gpus, sglang
from kvpilot.tuner.model import build_model_spec, list_models, lookup_checkpoint_bytes, lookup_model_config
from kvpilot.tuner.types import GIB

GPUS = ("L4", "H100-SXM", "H200")
CONTEXT = 32768
TP = (1, 2, 4, 8)


def plan_line(model: str, gpu_name: str) -> str:
    spec = build_model_spec(lookup_model_config(model))
    context = min(CONTEXT, spec.max_model_len)
    gpu = gpus.lookup_gpu(gpu_name)
    budget = None
    for tp in TP:
        settings = sglang.SglangSettings(context_length=context, tp_size=tp)
        budget = engines.plan_sglang_budget(
            spec, gpu, settings, weights_total_bytes=lookup_checkpoint_bytes(model)
        )
        if budget.feasible:
            break
    assert budget is not None
    s = budget.settings
    verdict = "fits" if budget.feasible else "does not fit at TP 8"
    return (
        f"{model:<45} {gpu_name:<9} TP {s.tp_size}  mfs {s.mem_fraction_static:<5}  "
        f"chunk {s.chunked_prefill_size:<5}  "
        f"pool {budget.pool_bytes / GIB:6.1f} GiB  tokens {budget.max_total_tokens:>8}  "
        f"{budget.full_context_requests:>3} x {context}  {verdict}"
    )


def main() -> None:
    counts = {"planned": 0, "refused": 0}
    for model, _ in list_models():
        for gpu_name in GPUS:
            try:
                print(plan_line(model, gpu_name))
                counts["planned"] += 1
            except errors.InvalidEngineArgs as exc:
                print(f"{model:<45} {gpu_name:<9} not planned: {str(exc).split(';')[1].strip()}")
                counts["refused"] += 1
                break
    print(f"\n{counts['planned']} plans, {counts['refused']} models not modelled for SGLang yet")


if __name__ == "__main__":
    main()
