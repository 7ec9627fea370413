"""Which SGLang release kvpilot models, and where each fact was read.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there). The facts are read from the
``sglang`` 0.5.23 wheel on PyPI (``pip download sglang==0.5.23 --no-deps``:
``sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl``); the ``SOURCE_*`` constants name the files
(with the line of each fact in the constants that quote them), and ``tests/contract/test_contract_sglang.py``
checks the facts against that release's own ``ServerArgs`` where it runs on CPU.
"""

from __future__ import annotations

PINNED_SGLANG_VERSION = "0.5.23"
"""The release whose ``server_args`` and pool configurator the model follows."""

SOURCE_MEMORY_HOOK = "python/sglang/srt/arg_groups/memory_hook.py"
"""``handle_gpu_memory_settings`` (lines 47-343): the GPU-tier defaults and ``mem_fraction_static``'s
reserve; ``reserve_for_graph_mb`` (lines 356-398)."""
SOURCE_POOL_CONFIGURATOR = "python/sglang/srt/model_executor/pool_configurator.py"
"""``MemoryPoolConfig.__post_init__`` (lines 94-99: the start-up failure text) and the MHA cell size and
token count (lines 492-498, 637-647)."""
SOURCE_KV_CACHE_CONFIGURATOR = "python/sglang/srt/mem_cache/kv_cache_configurator.py"
"""``_profile_available_bytes`` (lines 2990-3061): the KV pool is what is free after the weights less
``pre_model_load_memory * (1 - mem_fraction_static)``."""
SOURCE_SCHEDULER = "python/sglang/srt/managers/scheduler.py"
"""The retraction warning (line 4526)."""
SOURCE_METRICS = "python/sglang/srt/observability/metrics_collector.py"
"""The Prometheus series (lines 365-2068)."""
SOURCE_FIELDS = "python/sglang/srt/arg_groups/fields/"
"""The server arguments, one dataclass field per flag (``schedule.py``, ``model.py``, ``parallel.py``,
``serving.py``, ``observability.py``)."""
