"""How SGLang's scheduler admits requests into its KV pool: what the loop sizes ``--max-running-requests`` by.

Part of :mod:`kvpilot.tuner.sglang` (every SGLang fact lives there). SGLang 0.5.23 admits a waiting request
(``PrefillAdder.add_one_req``, ``managers/schedule_policy.py`` line 1395) only while the pool's free and
evictable tokens (``PrefillBudget.remaining_total``, ``mem_cache/prefill_budget.py`` line 100) hold its
prompt and its whole remaining output (``min(max_new_tokens - generated, 4096)``, the 4096 being
``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``) *after* every running request's remaining output, each counted
at ``new_token_ratio`` (``_get_running_request_total_token_offset``, line 785, summed into the budget's
``total_offset`` at line 674). The ratio starts at ``SGLANG_INIT_NEW_TOKEN_RATIO`` (0.7) times
``--schedule-conservativeness``, decays to 0.14 of that while decode goes on without a retraction and is
raised from the decoded share after one (``managers/scheduler_components/new_token_ratio_tracker.py``).
So SGLang keeps the decode room of the requests it runs by itself, and retracts only when their outputs
outgrow its estimate.

vLLM keeps no such room: its scheduler admits a request when the cache has blocks for its prompt and
preempts when the running sequences' outputs outgrow the cache, which is why kvpilot's vLLM rules size
``--max-num-seqs`` to fill the cache only to ``PolicyConfig.target_kv_usage`` (0.88). An SGLang
running-request limit sized that way stops admission below where SGLang's own estimate would: the limit
binds with the pool's last tokens idle (the closed-loop bench's ``sglang-slow-start``: 218 running at 0.87
usage where SGLang's admission alone ran 245 and served 2 % more with four retractions in three hours).
The loop sizes it to the running requests the whole pool holds (:data:`ADMISSION_TOKEN_USAGE`), leaving the
decode room to SGLang.
"""

from __future__ import annotations

ADMISSION_TOKEN_USAGE = 1.0
"""The token usage (``sglang:token_usage``: used / pool) up to which SGLang's own admission guards the pool
(the whole of it: admission reserves the running requests' decode room itself); the share of the pool a
``--max-running-requests`` sized from a window's usage per running request may fill."""
