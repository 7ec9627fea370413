"""Closed-loop load on a real vLLM engine's OpenAI endpoint: token-id prompts, ``ignore_eos``.

Each of ``clients`` threads sends ``POST /v1/completions`` with a prompt of ``prompt_tokens`` token ids and
``max_tokens = output_tokens``, ``ignore_eos`` and greedy sampling, so every request generates exactly its
output length whatever the tiny model's random weights say; then it sends the next one, until
:meth:`LoadGenerator.stop`. ``target`` is read before each request, so the load follows a service from
pod to pod (a retune's new pod); so are ``prompt_tokens`` and ``output_tokens`` (a length shift). The
counts say what was served.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class LoadCounts:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    last_error: str = ""
    output_tokens: int = 0
    """Output tokens of the completed requests (each generates exactly its ``max_tokens``)."""


class LoadGenerator:
    """``clients`` closed-loop clients against ``target()`` (``(port, served model name)`` or ``None``)."""

    def __init__(
        self,
        target: Callable[[], tuple[int, str] | None],
        *,
        clients: int,
        prompt_tokens: int,
        output_tokens: int,
        vocab_size: int = 2048,
        timeout_s: float = 600.0,
        seed: int = 0,
    ) -> None:
        self.target = target
        self.clients = clients
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.counts = LoadCounts()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._threads = [
            threading.Thread(target=self._client, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(clients)
        ]

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LoadGenerator:
        for t in self._threads:
            t.start()
        return self

    def stop(self, join_s: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(join_s)

    def body(self, client: int, model: str) -> dict[str, object]:
        """One request: fresh token ids (no prefix-cache hits), exactly ``output_tokens`` out."""
        with self._lock:
            prompt = [self._rng.randrange(2, self.vocab_size) for _ in range(self.prompt_tokens)]
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": self.output_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": False,
            "user": f"client-{client}",
        }

    def _client(self, client: int) -> None:
        while not self._stop.is_set():
            target = self.target()
            if target is None:
                self._stop.wait(1.0)
                continue
            port, model = target
            body = self.body(client, model)
            with self._lock:
                self.counts.sent += 1
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=self.timeout_s)
                try:
                    conn.request(
                        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
                    )
                    response = conn.getresponse()
                    text = response.read()
                finally:
                    with contextlib.suppress(OSError):
                        conn.close()
                ok, error = response.status == 200, f"HTTP {response.status}: {text[:200]!r}"
            except OSError as exc:  # the pod went away, or is not up yet
                ok, error = False, repr(exc)
            with self._lock:
                if ok:
                    self.counts.ok += 1
                    self.counts.output_tokens += int(str(body["max_tokens"]))
                else:
                    self.counts.failed += 1
                    self.counts.last_error = error
            if not ok:
                self._stop.wait(0.5)
