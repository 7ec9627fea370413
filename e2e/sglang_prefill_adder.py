"""Drives SGLang 0.5.23's own ``PrefillAdder`` (``managers/schedule_policy.py``) on a constructed state, for
``e2e/test_fleet_sglang.py``'s admission contract; run by SGLang's interpreter (``.venv-sglang``), not the
fleet's. Reads a JSON list of states on stdin and prints, per state, the admitted requests as JSON.

The state: ``page_size``; ``free`` (the pool's free tokens, ``allocator.available_size()``; no radix cache,
so nothing evictable); ``ratio`` (``new_token_ratio``); ``chunk`` (``chunked_prefill_size``); ``running``
(``[max_new_tokens, generated]`` per running request); ``chunked`` (the request mid-prefill, or null:
``[prompt, computed, max_new_tokens]``); ``waiting`` (``[fill_tokens, max_new_tokens, generated]`` per waiting
request, in order). The loop is ``Scheduler._get_new_batch_prefill_raw``'s (``managers/scheduler.py``): the
chunked request first (``add_chunked_req``), then ``add_one_req`` while ``budget_state`` is not ``OTHER``
and each answers ``CONTINUE``. Printed: ``{"chunked": extend or null, "admitted": [[extend, is_chunked]...],
"result": the last AddReqResult name}``.
"""

from __future__ import annotations

import json
import sys
import types


class _Anything:
    """A tree cache / request stand-in: any attribute not set is a no-op method returning None."""

    def __getattr__(self, name: str):
        return lambda *a, **k: None


class _Req(_Anything):
    """A request stand-in: ``extend_len`` as ``Req`` computes it (``managers/schedule_batch.py``)."""

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len


def main() -> None:
    json.dump([admit(state) for state in json.load(sys.stdin)], sys.stdout)


def admit(state: dict) -> dict:
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    page = state["page_size"]

    tree = _Anything()
    tree.supports_mamba = lambda: False
    tree.supports_prefix_sharing = lambda: False
    tree.evictable_size = lambda: 0
    tree.full_evictable_size = lambda: 0
    tree.buffer_pipeline = None
    tree.disable = True

    alloc = _Anything()
    alloc.page_size = page
    alloc.available_size = lambda: state["free"]
    alloc.request_slot_reserve = lambda **k: 0
    alloc.create_prefill_budget = lambda tc, num_mixed_decode_tokens=0: PrefillBudget(
        alloc, tc, num_mixed_decode_tokens=num_mixed_decode_tokens
    )

    def req(fill: int, max_new: int, generated: int, prefix: int = 0) -> _Req:
        r = _Req()
        r.sampling_params = types.SimpleNamespace(max_new_tokens=max_new, ignore_eos=False)
        r.output_ids = [0] * generated
        r.full_untruncated_fill_ids = [0] * fill
        r.origin_input_ids = [0] * (fill - generated)
        r.prefix_len = prefix
        r.host_hit_length = r.swa_host_hit_length = r.mamba_host_hit_length = 0
        r.auxiliary_swa_host_hit_length = 0
        r.needs_host_load_back = lambda: False
        r.retracted_stain = False
        r.storage_hit_length, r.storage_hit_start = 0, None
        r.kv = types.SimpleNamespace(holds_mamba=False, req_pool_idx=None, holds_kv=False)
        r.fulfilled_storage_hit_len = lambda prefix_len: 0
        r.extend_end = 0
        return r

    running = types.SimpleNamespace(reqs=[req(1, m, g) for m, g in state["running"]])
    adder = PrefillAdder(page, tree, alloc, running, state["ratio"], 1 << 30, state["chunk"])
    adder._replay_len = lambda r, prefix_len: 0  # no encoder replay (a text model)
    out: dict = {"chunked": None, "admitted": [], "result": None}
    if state["chunked"] is not None:
        prompt, computed, max_new = state["chunked"]
        chunked = req(prompt, max_new, 0, prefix=computed)
        before = len(adder.can_run_list)
        adder.add_chunked_req(chunked)
        if len(adder.can_run_list) > before:
            out["chunked"] = chunked.extend_end - computed
    res = None
    for fill, max_new, generated in state["waiting"]:
        if adder.budget_state() == AddReqResult.OTHER:
            res = AddReqResult.OTHER
            break
        r = req(fill, max_new, generated)
        res = adder.add_one_req(r, has_chunked_req=state["chunked"] is not None, truncation_align_size=None)
        if adder.can_run_list and adder.can_run_list[-1] is r:
            out["admitted"].append([r.extend_end, adder.new_chunked_req is r])
        if res != AddReqResult.CONTINUE:
            break
    out["result"] = None if res is None else res.name
    return out


if __name__ == "__main__":
    main()
