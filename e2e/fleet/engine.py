"""The engine model: one vLLM V1 engine, step by step, in simulated time.

The e2e fleet, the demo and ``bench/closed_loop.py`` all run this one model. Per engine step, as
vLLM V1's scheduler does:

* **Requests** arrive as a Poisson process with uniform or lognormal lengths
  (:class:`e2e.fleet.truth.Workload`).
* **Token budget**: running sequences first, in admission order (one decode token each, or the next
  chunk of a prompt still being prefilled), then waiting requests first come first served, while fewer
  than ``max_num_seqs`` run and the ``max_num_batched_tokens`` budget lasts (chunked prefill); none is
  admitted in a step that preempted.
* **KV blocks, exactly as vLLM 0.32/0.33's ``KVCacheManager``**: block 0 is the null block (usable
  blocks and KV usage are over ``num_gpu_blocks - 1``); a request is admitted only when blocks for its
  whole sequence (prompt, plus the tokens generated before a preemption) are free
  (``scheduler_reserve_full_isl``), and gets blocks for the tokens scheduled; a running request gets a new
  block when its scheduled tokens cross a block boundary (a decode: when its computed tokens are a
  multiple of the block size).
* **Preemption by recomputation**: when a running request's blocks cannot be allocated, the last
  running request (the most recently admitted) is preempted, until it fits or the request itself was
  preempted: its blocks are freed, it keeps its generated tokens and goes to the head of the queue, to be
  prefilled again (prompt + generated) when readmitted.
* **Step time** from a roofline (:class:`e2e.fleet.truth.EnginePerf`): prefill compute-bound, decode
  memory-bound (weights plus the KV of every scheduled context), fp8 KV halving the KV read.
* **Latency** per request: queue time, time to first token, inter-token latency, end to end.
* **Other engines' steps** (:attr:`e2e.fleet.truth.EngineArgs.scheduler`): ``"sglang"`` composes them as
  SGLang 0.5.23's scheduler does without ``--enable-mixed-chunk`` (``Scheduler.get_next_batch_to_run``): a
  step with prefill work (the prompt mid-chunk first, then admissions within the chunk) is a prefill batch
  alone, the decodes waiting; decode steps only without one (:meth:`SimEngine._step_prefill_first`).
  ``"sglang-mixed"`` (``--enable-mixed-chunk``) is vLLM's composition. The step time is the same roofline.
* **SGLang's admission** (both SGLang modes, :meth:`SimEngine._schedule_prefill_sglang`): instead of
  vLLM's "the whole sequence's KV is free", SGLang 0.5.23's ``PrefillAdder``
  (``managers/schedule_policy.py``): the free pool less each running request's future decode tokens
  ``min(max_new_tokens - generated, 4096) x new_token_ratio``, and each request admitted in the pass its
  chunk, a page and ``min(max_new_tokens, 4096)``; a request is admitted while its prompt, its clipped
  remaining ``max_new_tokens`` and a page are less than what is left. ``new_token_ratio`` starts at 0.7,
  decays by (0.7 - 0.098) / 600 per decode step to 0.098, is set from the running batch after a
  retraction, and is back at 0.7 when the engine is idle
  (``managers/scheduler_components/new_token_ratio_tracker.py``). A request's ``max_new_tokens`` is its
  ``output`` (the workload's output length is the client's ``max_tokens``, and the request stops there:
  :attr:`e2e.fleet.truth.Workload.output_tokens`), bounded as SGLang bounds it by the context and the pool.

Decoding sequences advance in lock step (one global decode counter; a heap of finish points), so steps
that only decode are taken several at a time, up to the next finish, the next block shortage, or
``resolution_s`` of simulated time (admissions and arrivals are handled at those boundaries). Their
blocks stay exact in aggregate: each decoding sequence's computed tokens are ``key + counter``, and a
count of sequences per ``key mod block_size`` gives how many cross a block boundary at each step.
``resolution_s=0`` takes one engine step at a time (:meth:`SimEngine.step`, which
``bench/engine_dynamics.py`` compares with the real scheduler step for step). Hours of traffic simulate
in seconds, and a smaller ``resolution_s`` (the fleet's 50 ms) buys timing detail.

No I/O and no wall clock: :meth:`SimEngine.advance` takes a duration. The numbers it produces
(gauges, counter increments, finished requests) are exported by :mod:`e2e.fleet.exposition`.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import random
from collections.abc import Sequence

from e2e.fleet.truth import FP8_KV_DTYPES, EngineArgs, GroundTruth, Workload

SCHEDULERS = frozenset({"vllm", "sglang", "sglang-mixed"})
"""The step compositions the model follows (:attr:`e2e.fleet.truth.EngineArgs.scheduler`)."""

SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
"""``SGLANG_INIT_NEW_TOKEN_RATIO`` (``environ.py`` line 646), times ``--schedule-conservativeness`` (1.0)."""
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
"""``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` (line 647): the ratio's floor over its initial value."""
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
"""``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` (line 648): decode steps from the initial ratio to its floor."""
SGLANG_RETRACT_DECODE_STEPS = 20
"""``SGLANG_RETRACT_DECODE_STEPS`` (line 649): decode tokens per request the ratio after a retraction adds."""
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
"""``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (``managers/schedule_policy.py`` lines 89-91): the most decode
tokens admission reserves for one request."""

DEFAULT_RESOLUTION_S = 0.05
"""Simulated seconds of decode taken at once at most (arrivals and admissions wait for the boundary)."""


@dataclasses.dataclass
class Request:
    id: int
    prompt: int
    output: int
    arrived: float
    generated: int = 0
    computed: int = 0
    """Tokens whose KV is in the cache while prefilling (0 again after a preemption)."""
    blocks: int = 0
    """KV blocks held while prefilling (decoding sequences are counted in aggregate)."""
    key: int = 0
    """While decoding: its computed tokens are ``key + decode counter``."""
    base_generated: int = 0
    base_counter: int = 0
    """While decoding: ``generated = base_generated + (decode counter - base_counter)``."""
    preemptions: int = 0
    left_key: int = 0
    """While decoding in SGLang's mode: its ``max_new_tokens - generated`` is ``left_key - counter``."""
    clipped: bool = False
    """While decoding in SGLang's mode: ``max_new_tokens - generated`` is above the 4,096-token clip."""
    prompt_counted: bool = False
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_reason: str = "stop"

    @property
    def prefill_target(self) -> int:
        """Tokens to (re)compute before the next token can be sampled: vLLM's ``num_tokens``, the prompt
        plus every token generated before a preemption (recomputation keeps them)."""
        return self.prompt + self.generated


@dataclasses.dataclass(frozen=True)
class Finished:
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    finished_reason: str
    preemptions: int
    queue_s: float
    ttft_s: float
    e2e_s: float
    inference_s: float

    @property
    def itl_s(self) -> float:
        """Mean inter-token latency (vLLM's TPOT: decode time over the tokens after the first)."""
        return (self.e2e_s - self.ttft_s) / max(1, self.generation_tokens - 1)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One engine step as vLLM's scheduler leaves it (blocks allocated, finished requests not yet freed)."""

    running: int
    waiting: int
    kv: float
    tokens: int
    """Tokens scheduled in the step (decodes, prefill chunks)."""
    preempted: int


@dataclasses.dataclass
class Deltas:
    """What happened since the last :meth:`SimEngine.drain`."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    refused: int = 0
    """Requests turned away at arrival (an admission limit: TGI's 429 "Model is overloaded")."""
    iterations: int = 0
    iteration_tokens: list[int] = dataclasses.field(default_factory=list)
    finished: list[Finished] = dataclasses.field(default_factory=list)


class SimEngine:
    def __init__(
        self,
        truth: GroundTruth,
        workload: Workload,
        args: EngineArgs,
        *,
        seed: int = 0,
        closed_loop_clients: int | None = None,
        resolution_s: float = DEFAULT_RESOLUTION_S,
        num_gpu_blocks: int | None = None,
        admission_limit: int | None = None,
    ) -> None:
        """``closed_loop_clients``: instead of Poisson arrivals, that many clients each send their next
        request when the last one finishes (``vllm bench serve --max-concurrency N --request-rate inf``).
        ``num_gpu_blocks``: the KV blocks (``--num-gpu-blocks-override``) instead of the truth's.
        ``admission_limit``: requests in the engine (waiting and running) at most; one arriving beyond it is
        refused, not queued (TGI's ``--max-concurrent-requests``: 429), and counted in ``Deltas.refused``."""
        self.truth = truth
        self.workload = workload
        self.args = args
        self.rng = random.Random(seed)
        self.block_size = truth.block(args)
        self.num_blocks = truth.num_gpu_blocks(args) if num_gpu_blocks is None else num_gpu_blocks
        self.usable_blocks = max(0, self.num_blocks - 1)
        """All but the null block (vLLM's ``BlockPool`` takes block 0 for it)."""
        self.max_num_seqs = truth.max_num_seqs(args)
        self.max_model_len = truth.max_model_len(args)
        self.max_num_batched_tokens = truth.max_num_batched_tokens(args)
        self.fp8_kv = args.kv_cache_dtype in FP8_KV_DTYPES and truth.fp8_kv_supported
        if args.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {args.scheduler!r}: one of {sorted(SCHEDULERS)}")
        self.prefill_alone = args.scheduler == "sglang"
        """SGLang without ``--enable-mixed-chunk``: a step with prefill work prefills only (the decodes
        wait); ``"sglang-mixed"`` composes its steps as vLLM does (decodes first, then the chunk's rest)."""
        self.sglang = args.scheduler != "vllm"
        """SGLang's admission (:meth:`_schedule_prefill_sglang`) and its ``new_token_ratio`` (False in an
        SGLang mode: vLLM's admission with SGLang's steps, the model before it had SGLang's admission; for
        comparisons)."""
        self.ratio_init = min(SGLANG_INIT_NEW_TOKEN_RATIO, 1.0)
        self.ratio_min = min(self.ratio_init * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.ratio_init - self.ratio_min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.ratio_init
        """SGLang's ``NewTokenRatioTracker.current`` (``new_token_ratio_tracker.py``)."""
        self._clipped: list[tuple[int, int]] = []
        """(counter at which a decoding request's remaining ``max_new_tokens`` falls to the clip, id)."""
        self._n_clipped = self._n_unclipped = self._left0 = 0
        """Decoding requests above the clip, below it, and the sum of the latter's ``left_key``: the running
        requests' reservation is ``n_clipped x 4096 + left0 - n_unclipped x counter`` (times the ratio)."""
        self.batch_is_full = False
        """SGLang's ``running_batch.batch_is_full``: set when admission ran out of room (or of request slots)
        beside running requests; no admission is tried until a running request leaves the batch."""
        self.resolution_s = resolution_s
        self.now = 0.0
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: list[Request] = []
        self.decoding: dict[int, Request] = {}
        """In admission order (the last is the first preempted)."""
        self._finish_heap: list[tuple[int, int]] = []
        self.counter = 0
        self._ctx0 = 0
        """sum over decoding requests of ``key``: their computed tokens = _ctx0 + n x counter."""
        self.decode_blocks = 0
        """Blocks the decoding requests hold (after the current step's allocation)."""
        self._residues = [0] * self.block_size
        """Decoding requests per ``key mod block_size``: those with ``(key + counter) % block_size == 0``
        need a new block at the step taken at ``counter``."""
        self.prefill_blocks = 0
        self._step_preemptions = 0
        self.last_step: StepRecord | None = None
        self._next_id = 0
        self._clients = closed_loop_clients
        self._next_arrival = math.inf if closed_loop_clients else self._interarrival()
        self.deltas = Deltas()
        self.total_preemptions = 0
        self.total_finished = 0
        self.admission_limit = admission_limit
        self.total_refused = 0
        self.busy_s = 0.0
        for _ in range(closed_loop_clients or 0):
            self._new_request(self.now)

    # ------------------------------------------------------------------ traffic
    def _interarrival(self) -> float:
        rate = self.workload.arrival_rate
        return self.rng.expovariate(rate) if rate > 0 else math.inf

    def _length(self, mean: int) -> int:
        w = self.workload
        if w.distribution == "lognormal" and w.spread > 0:
            sigma = math.sqrt(math.log(1 + w.spread**2))
            return max(1, int(round(self.rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma))))
        return max(1, int(round(mean * self.rng.uniform(1 - w.spread, 1 + w.spread))))

    def _new_request(self, at: float) -> None:
        self.submit(self._length(self.workload.prompt_tokens), self._length(self.workload.output_tokens), at)

    def submit(self, prompt: int, output: int, at: float | None = None) -> None:
        """A request of ``prompt`` tokens asking for ``output`` tokens joins the waiting queue (or, at the
        admission limit, is refused)."""
        limit = self.admission_limit
        if limit is not None and len(self.waiting) + self.num_running >= limit:
            self.deltas.refused += 1
            self.total_refused += 1
            return
        prompt = min(prompt, self.max_model_len - 1)
        req = Request(self._next_id, prompt, output, self.now if at is None else at)
        if prompt + output > self.max_model_len:
            req.output = self.max_model_len - prompt
            req.finished_reason = "length"
        self._next_id += 1
        self.waiting.append(req)

    def take_over(self, requests: Sequence[Request]) -> None:
        """Requests another engine had waiting (a removed pod's queue, handed back by the load balancer)
        join the front of this one's queue in their order, each under a new id of this engine: the running
        set is keyed by id, and the other engine's ids collide with this one's."""
        for req in reversed(requests):
            req.id = self._next_id
            self._next_id += 1
            self.waiting.appendleft(req)

    def _arrive(self) -> None:
        while self._next_arrival <= self.now:
            self._new_request(self._next_arrival)
            self._next_arrival += self._interarrival()

    # ------------------------------------------------------------------ KV accounting
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _decode_tokens(self) -> int:
        return self._ctx0 + len(self.decoding) * self.counter

    def _crossings(self, start: int, steps: int) -> int:
        """New blocks the decoding requests need over ``steps`` decode steps from counter ``start``."""
        cycles, rest = divmod(steps, self.block_size)
        partial = sum(self._residues[-(start + j) % self.block_size] for j in range(rest))
        return cycles * len(self.decoding) + partial

    def _decode_room(self, start: int) -> int:
        """Decode steps from counter ``start`` whose new blocks the free blocks cover."""
        n = len(self.decoding)
        if not n:
            return 1 << 30
        cycles, left = divmod(self._free_blocks(), n)
        steps = cycles * self.block_size
        while (need := self._residues[-(start + steps) % self.block_size]) <= left:
            left -= need
            steps += 1
        return steps

    @property
    def used_blocks(self) -> int:
        return self.decode_blocks + self.prefill_blocks

    def _generated(self, req: Request) -> int:
        return req.base_generated + self.counter - req.base_counter

    # ------------------------------------------------------------------ state changes
    def _start_decoding(self, req: Request) -> None:
        """``req`` sampled a token at the end of its prefill: it joins the lock step."""
        self.prefill_blocks -= req.blocks
        req.blocks = 0
        req.base_generated, req.base_counter = req.generated, self.counter
        self.decoding[req.id] = req
        req.key = req.computed - self.counter
        self._ctx0 += req.key
        self.decode_blocks += self._blocks_for(req.computed)
        self._residues[req.key % self.block_size] += 1
        heapq.heappush(self._finish_heap, (self.counter + req.output - req.generated, req.id))
        if self.sglang:
            req.left_key = self._max_new(req) - req.generated + self.counter
            req.clipped = req.left_key - self.counter > SGLANG_CLIP_MAX_NEW_TOKENS
            if req.clipped:
                self._n_clipped += 1
                heapq.heappush(self._clipped, (req.left_key - SGLANG_CLIP_MAX_NEW_TOKENS, req.id))
            else:
                self._n_unclipped += 1
                self._left0 += req.left_key

    def _stop_decoding(self, req: Request) -> None:
        del self.decoding[req.id]
        req.generated = self._generated(req)
        self._ctx0 -= req.key
        self.decode_blocks -= self._blocks_for(req.key + self.counter)
        self._residues[req.key % self.block_size] -= 1
        if self.sglang:
            if req.clipped:
                self._n_clipped -= 1
                req.clipped = False
            else:
                self._n_unclipped -= 1
                self._left0 -= req.left_key

    def _preempt_last(self) -> Request:
        """Preempt the most recently admitted running request (prefills were admitted after the decodes
        they run beside), as V1's scheduler does; it keeps its generated tokens."""
        if self.prefilling:
            victim = self.prefilling.pop()
            self.prefill_blocks -= victim.blocks
        else:
            victim = self.decoding[next(reversed(self.decoding))]
            self._stop_decoding(victim)
        victim.blocks = victim.computed = 0
        victim.preemptions += 1
        self.batch_is_full = False
        self.waiting.appendleft(victim)
        self._step_preemptions += 1
        self.deltas.preemptions += 1
        self.total_preemptions += 1
        return victim

    def _finish_due(self) -> None:
        while self._finish_heap and self._finish_heap[0][0] <= self.counter:
            _, rid = heapq.heappop(self._finish_heap)
            req = self.decoding.get(rid)
            if req is None or self._generated(req) < req.output:
                continue  # preempted since (a stale heap entry)
            self._stop_decoding(req)
            req.generated = min(req.generated, req.output)
            self._finish(req)

    # ------------------------------------------------------------------ scheduling
    def _free_blocks(self) -> int:
        return self.usable_blocks - self.used_blocks

    def _allocate_decodes(self) -> None:
        """This step's new blocks for the decoding requests, in running order; on a shortage the last
        running request is preempted until the one short of a block fits, or was itself the last."""
        need = self._residues[-self.counter % self.block_size]
        if need > self._free_blocks():
            self._resolve_decode_shortage()
            need = self._residues[-self.counter % self.block_size]
            if self.sglang and self._step_preemptions:
                self.new_token_ratio = self._ratio_after_retract()
        self.decode_blocks += need

    def _max_new(self, req: Request) -> int:
        """SGLang's ``sampling_params.max_new_tokens`` for ``req``: the client's ``max_tokens`` (its
        ``output``), within the context (``Scheduler.init_req_max_new_tokens``, ``managers/scheduler.py``
        lines 2710-2716: ``max_req_len - input_len - 1``) and the empty pool
        (``max_new_tokens_for_memory``, ``mem_cache/allocator/base.py`` lines 102-105)."""
        page = self.block_size
        capacity = self.usable_blocks * page
        return max(
            0,
            min(
                req.output,
                self.max_model_len - 2 - req.prompt,
                capacity - -(-req.prompt // page) * page - page - 1,
            ),
        )

    def _running_reserve(self) -> int:
        """The decoding requests' ``min(max_new_tokens - generated, CLIP_MAX_NEW_TOKENS)``, summed."""
        while self._clipped and self._clipped[0][0] <= self.counter:
            at, rid = heapq.heappop(self._clipped)
            req = self.decoding.get(rid)
            if req is not None and req.clipped and req.left_key - SGLANG_CLIP_MAX_NEW_TOKENS == at:
                req.clipped = False
                self._n_clipped -= 1
                self._n_unclipped += 1
                self._left0 += req.left_key
        return self._n_clipped * SGLANG_CLIP_MAX_NEW_TOKENS + self._left0 - self._n_unclipped * self.counter

    def _ratio_after_retract(self) -> float:
        """``estimate_new_token_ratio_after_retract`` over the requests left decoding
        (``new_token_ratio_tracker.py``; ``retract_decode``, ``managers/schedule_batch.py`` line 3536)."""
        reqs = list(self.decoding.values())
        decoded = sum(self._generated(r) for r in reqs)
        wanted = sum(self._max_new(r) for r in reqs)
        return min(1.0, (decoded + SGLANG_RETRACT_DECODE_STEPS * len(reqs)) / (wanted + 1))

    def _decay_ratio(self, steps: int) -> None:
        """``NewTokenRatioTracker.decay_step`` once per decode step without a retraction."""
        if steps > 0:
            self.new_token_ratio = max(self.new_token_ratio - steps * self.ratio_decay, self.ratio_min)

    def _resolve_decode_shortage(self) -> None:
        order = list(self.decoding.values())
        lo, hi, taken = 0, len(order), 0
        while lo < hi:
            req = order[lo]
            need = 1 if (req.key + self.counter) % self.block_size == 0 else 0
            while need > self._free_blocks() - taken:
                from_decoding = not self.prefilling
                victim = self._preempt_last()
                hi -= from_decoding
                if victim is req:
                    break
            taken += need
            lo += 1

    def _schedule_prefill(self, budget: int, mixed: int = 0) -> list[tuple[Request, int]]:
        """Prefill chunks within ``budget``: requests already prefilling first, then admissions (SGLang's
        modes: :meth:`_schedule_prefill_sglang`, ``mixed`` decode rows in the batch)."""
        if self.sglang:
            return self._schedule_prefill_sglang(budget, mixed)
        work: list[tuple[Request, int]] = []
        for req in list(self.prefilling):
            if budget <= 0 or all(r is not req for r in self.prefilling):
                break  # out of budget, or preempted for an earlier one
            tokens = min(req.prefill_target - req.computed, budget)
            need = self._blocks_for(req.computed + tokens) - req.blocks
            while need > self._free_blocks():
                if self._preempt_last() is req:  # the newest first: possibly req itself
                    break
            if all(r is not req for r in self.prefilling):
                break
            req.blocks += need
            self.prefill_blocks += need
            work.append((req, tokens))
            budget -= tokens
        while (
            self.waiting
            and not self._step_preemptions
            and len(self.decoding) + len(self.prefilling) < self.max_num_seqs
            and budget > 0
        ):
            req = self.waiting[0]
            if self._blocks_for(min(req.prefill_target, self.max_model_len)) > self._free_blocks():
                break  # its whole sequence must fit (scheduler_reserve_full_isl)
            tokens = min(req.prefill_target - req.computed, budget)
            self._admit(req, tokens, work)
            budget -= tokens
        return work

    def _admit(self, req: Request, tokens: int, work: list[tuple[Request, int]]) -> None:
        """The head of the queue starts prefilling with a chunk of ``tokens`` (its blocks allocated)."""
        need = self._blocks_for(req.computed + tokens) - req.blocks
        self.waiting.popleft()
        req.blocks += need
        self.prefill_blocks += need
        self.prefilling.append(req)
        if req.scheduled_at is None:
            req.scheduled_at = self.now
        if not req.prompt_counted:
            req.prompt_counted = True
            self.deltas.prompt_tokens += req.prompt
        work.append((req, tokens))

    def _schedule_prefill_sglang(self, budget: int, mixed: int) -> list[tuple[Request, int]]:
        """SGLang 0.5.23's prefill pass (``Scheduler._get_new_batch_prefill_raw``, ``managers/scheduler.py``
        lines 4098-4300, and ``PrefillAdder``, ``managers/schedule_policy.py``), on a pool without a radix
        cache, in tokens (a page is a block):

        * No pass while ``batch_is_full`` or the queue is empty, unless a request is mid-chunk (lines
          4098-4101); ``batch_is_full`` is cleared when the running batch is empty or shrinks.
        * The budget (``PrefillBudget``, ``mem_cache/prefill_budget.py``): the free tokens less
          ``total_offset``, which starts at the mixed decode rows (``num_mixed_decode_tokens``) plus, per
          running (decoding) request, ``min(max_new_tokens - generated, CLIP_MAX_NEW_TOKENS) x
          new_token_ratio`` (``_get_running_request_total_token_offset``, lines 785-795); each chunk taken
          adds its paged tokens, a page, and, when it ends the prompt, ``min(max_new_tokens,
          CLIP_MAX_NEW_TOKENS)`` (``_update_prefill_budget`` / ``PrefillBudget.reserve``).
        * The request mid-chunk first (``add_chunked_req``): a chunk of ``min(chunk budget, what is left)``
          tokens, the whole chunk budget when nothing is left (``available_chunk_tokens``).
        * Then the queue in order (``add_one_req``): a request is admitted while its prefill, its clipped
          remaining ``max_new_tokens`` and a page are less than what is left (``check_prefill``); else
          NO_TOKEN: the pass ends, ``batch_is_full`` when something runs or was admitted. One longer than the
          chunk budget left is cut to it, page-aligned, and reserves no decode tokens yet. The pass ends when
          the chunk budget is spent (``budget_state``: OTHER), when what is left is <= 0 after an admission
          (NO_TOKEN), or at ``max_num_seqs`` (``--max-running-requests``: ``batch_is_full``).

        ``max_prefill_tokens`` (16384, the pass's input cap) is not modelled: the chunk binds first
        whenever it is smaller."""
        work: list[tuple[Request, int]] = []
        if not self.decoding:
            self.batch_is_full = False  # an empty batch has no request left to leave (lines 4093-4096)
        if (self.batch_is_full or not self.waiting) and not self.prefilling:
            return work
        page = self.block_size
        free = self._free_blocks() * page
        ratio = self.new_token_ratio
        total = current = float(mixed)
        total += self._running_reserve() * ratio
        rem_chunk = budget
        for req in list(self.prefilling):  # the chunked request (add_chunked_req)
            if all(r is not req for r in self.prefilling):
                break  # preempted for an earlier one
            left = min(rem_chunk, int(free - total))
            extend = req.prefill_target - req.computed
            tokens = min(extend, left if left > 0 else rem_chunk)
            paged = -(-tokens // page) * page
            total += (
                paged
                + page
                + (min(self._max_new(req), SGLANG_CLIP_MAX_NEW_TOKENS) if tokens >= extend else 0)
            )
            current += paged + page
            rem_chunk -= paged
            need = self._blocks_for(req.computed + tokens) - req.blocks
            while need > self._free_blocks():
                if self._preempt_last() is req:
                    break
            if all(r is not req for r in self.prefilling):
                break
            req.blocks += need
            self.prefill_blocks += need
            work.append((req, tokens))
        while self.waiting and not self._step_preemptions and rem_chunk > 0:
            if len(self.decoding) + len(self.prefilling) >= self.max_num_seqs or self.batch_is_full:
                self.batch_is_full = True
                break
            req = self.waiting[0]
            extend = req.prefill_target - req.computed
            max_new = self._max_new(req)
            if (
                not extend + min(max(max_new - req.generated, 0), SGLANG_CLIP_MAX_NEW_TOKENS) + page
                < free - total
            ):
                self.batch_is_full = bool(work) or bool(self.decoding)  # NO_TOKEN (lines 4280-4285)
                break
            tokens, reserve = extend, min(max_new, SGLANG_CLIP_MAX_NEW_TOKENS)
            if -(-extend // page) * page > rem_chunk:  # chunked: cut to the chunk budget, page-aligned
                tokens, reserve = rem_chunk // page * page, 0
                if tokens <= 0:
                    break
            paged = -(-tokens // page) * page
            total += paged + page + reserve
            current += paged + page
            rem_chunk -= paged
            self._admit(req, tokens, work)
            if not (free - total > 0 and free - current > 0):  # budget_state: NO_TOKEN
                self.batch_is_full = True
                break
        return work

    def _step_seconds(self, decode: int, context: int, prefill: int, pairs: float) -> float:
        return self.truth.perf.step_seconds(
            decode=decode,
            prefill=prefill,
            context_tokens=context,
            prefill_pairs=pairs,
            kv_bytes_per_token=self.truth.kv_bytes_per_token,
            fp8_kv=self.fp8_kv,
        )

    def _step(self, until: float) -> bool:
        """One engine step, or several decode-only ones; False when idle until ``until``."""
        self._arrive()
        self._step_preemptions = 0
        if self.prefill_alone:
            return self._step_prefill_first(until)
        self._allocate_decodes()
        n = len(self.decoding)
        work = self._schedule_prefill(self.max_num_batched_tokens - n, n)
        if not work and not n:
            if self.sglang and not self.waiting:
                self.new_token_ratio = self.ratio_init  # idle (Scheduler.on_idle)
            nxt = min(self._next_arrival, until)
            self.now = max(self.now, nxt)
            return self._next_arrival <= until
        context = self._decode_tokens()
        prefill = sum(t for _, t in work)
        pairs = sum(t * (req.computed + t / 2) for req, t in work)
        step = self._step_seconds(n, context, prefill, pairs)
        k = 1
        if not work and n:
            k, step = self._decode_run(n, context, until)
            if self.sglang:
                self._decay_ratio(k - (1 if self._step_preemptions else 0))
        self.last_step = StepRecord(
            running=n + len(self.prefilling),
            waiting=len(self.waiting),
            kv=self.kv_usage,
            tokens=n + prefill,
            preempted=self._step_preemptions,
        )
        self.now += step * k
        self.busy_s += step * k
        self.counter += k
        self.deltas.generation_tokens += n * k
        self._complete_prefills(work)
        self._finish_due()
        self.deltas.iterations += k
        self.deltas.iteration_tokens.extend([n + prefill] * min(k, 4))
        return True

    def _complete_prefills(self, work: list[tuple[Request, int]]) -> None:
        """The step's prefill chunks computed: a prompt's last chunk samples its first token."""
        for req, tokens in work:
            req.computed += tokens
            if req.computed >= req.prefill_target:  # the prefill's last chunk samples a token
                self.prefilling.remove(req)
                req.generated += 1
                self.deltas.generation_tokens += 1
                if req.first_token_at is None:
                    req.first_token_at = self.now
                if req.generated >= req.output:
                    self.prefill_blocks -= req.blocks
                    req.blocks = 0
                    self._finish(req)
                else:
                    self._start_decoding(req)

    def _step_prefill_first(self, until: float) -> bool:
        """SGLang's step (``Scheduler.get_next_batch_to_run``, no mixed chunk): a prefill batch when there is
        prefill work (the chunked request's next chunk first, then waiting requests while running requests
        stay under the limit and the chunk lasts; ``_get_new_batch_prefill_raw``), run alone: the decoding
        requests neither advance nor read their KV in it. Only without one does the running batch decode
        (``update_running_batch``: its new KV, retracting the newest requests when short), several steps at
        a time as vLLM's decode-only steps are. Admission is SGLang's (:meth:`_schedule_prefill_sglang`)."""
        work = self._schedule_prefill(self.max_num_batched_tokens)
        if not work:
            return self._decode_steps(until)
        prefill = sum(t for _, t in work)
        pairs = sum(t * (req.computed + t / 2) for req, t in work)
        step = self._step_seconds(0, 0, prefill, pairs)
        self.last_step = StepRecord(
            running=self.num_running,
            waiting=len(self.waiting),
            kv=self.kv_usage,
            tokens=prefill,
            preempted=self._step_preemptions,
        )
        self.now += step
        self.busy_s += step
        self._complete_prefills(work)
        self._finish_due()
        self.deltas.iterations += 1
        self.deltas.iteration_tokens.append(prefill)
        return True

    def _decode_run(self, n: int, context: int, until: float) -> tuple[int, float]:
        """Decode-only steps taken at once, vLLM's and SGLang's alike: as many as fit before the next finish,
        a block shortage, ``resolution_s`` or ``until`` (the KV blocks they cross counted), and the time of
        one at their mean context."""
        step = self._step_seconds(n, context, 0, 0.0)
        k = min(
            self._finish_heap[0][0] - self.counter if self._finish_heap else 1,
            1 + self._decode_room(self.counter + 1),
        )
        k = max(1, min(k, int(self.resolution_s / step) or 1, int(max(0.0, until - self.now) / step) + 1))
        self.decode_blocks += self._crossings(self.counter + 1, k - 1)
        return k, self._step_seconds(n, context + n * (k - 1) // 2, 0, 0.0)

    def _decode_steps(self, until: float) -> bool:
        """SGLang's decode batch (no prefill work this step): every decoding request one token, with its
        new KV (retracting the newest on a shortage), taken several steps at a time up to the next finish,
        block shortage or ``resolution_s``, as :meth:`_step` takes vLLM's decode-only steps; False when
        idle until ``until``."""
        self._allocate_decodes()
        n = len(self.decoding)
        if not n:
            if not self.waiting:
                self.new_token_ratio = self.ratio_init  # idle (Scheduler.on_idle, line 5318)
            nxt = min(self._next_arrival, until)
            self.now = max(self.now, nxt)
            return self._next_arrival <= until
        k, step = self._decode_run(n, self._decode_tokens(), until)
        self._decay_ratio(k - (1 if self._step_preemptions else 0))  # update_running_batch, lines 4513/4542
        self.last_step = StepRecord(
            running=self.num_running,
            waiting=len(self.waiting),
            kv=self.kv_usage,
            tokens=n,
            preempted=self._step_preemptions,
        )
        self.now += step * k
        self.busy_s += step * k
        self.counter += k
        self.deltas.generation_tokens += n * k
        self._finish_due()
        self.deltas.iterations += k
        self.deltas.iteration_tokens.extend([n] * min(k, 4))
        return True

    def _finish(self, req: Request) -> None:
        self.total_finished += 1
        self.batch_is_full = False  # the running batch shrank (SGLang's filter_batch)
        scheduled = req.scheduled_at if req.scheduled_at is not None else self.now
        first = req.first_token_at if req.first_token_at is not None else self.now
        self.deltas.finished.append(
            Finished(
                prompt_tokens=req.prompt,
                generation_tokens=req.generated,
                max_tokens=req.output,
                finished_reason=req.finished_reason,
                preemptions=req.preemptions,
                queue_s=scheduled - req.arrived,
                ttft_s=first - req.arrived,
                e2e_s=self.now - req.arrived,
                inference_s=self.now - scheduled,
            )
        )
        if self._clients:
            self._new_request(self.now)

    # ------------------------------------------------------------------ API
    def advance(self, dt: float) -> None:
        """Run the engine for ``dt`` simulated seconds."""
        until = self.now + dt
        while self.now < until:
            if not self._step(until):
                self.now = until
                break

    def step(self) -> StepRecord | None:
        """One engine step now (arrivals due are queued first); None when there was nothing to run."""
        return self.last_step if self._step(self.now) else None

    def drain(self) -> Deltas:
        d, self.deltas = self.deltas, Deltas()
        return d

    def drop_stale(self, max_wait_s: float) -> int:
        """Clients give up on requests never scheduled for ``max_wait_s``: removed, and counted."""
        dropped = 0
        while (
            self.waiting
            and self.waiting[0].scheduled_at is None
            and self.waiting[0].arrived < self.now - max_wait_s
        ):
            self.waiting.popleft()
            dropped += 1
        return dropped

    @property
    def running(self) -> list[Request]:
        """The running requests (prefilling and decoding), with their generated tokens brought up to date."""
        for req in self.decoding.values():
            req.generated = self._generated(req)
        return [*self.prefilling, *self.decoding.values()]

    @property
    def kv_usage(self) -> float:
        """vLLM's ``BlockPool.get_usage``: blocks in use over all but the null block."""
        return min(1.0, self.used_blocks / self.usable_blocks) if self.usable_blocks else 0.0

    @property
    def total_arrived(self) -> int:
        return self._next_id

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)
