"""The fleet's real vLLM engines: which pods get one, and each one's launch, readiness and exit.

:class:`e2e.fleet.fleet.Fleet` plays every pod; for a pod labelled ``e2e.kvpilot.io/engine: real``
(:data:`e2e.fleet.pod.ENGINE_LABEL`) or of a service named in :meth:`RealEngines.add_service`, it asks
:meth:`RealEngines.poll` each tick what the pod's real engine process did (:mod:`e2e.vllm_cpu.engine_process`
runs it) and reports that as kubelet would: Ready on the real ``/health``, a crash with the real exit code.
Launching (building the tiny model for a new context length takes seconds) runs in a thread of its own, so
the simulation tick never waits on it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from e2e.fleet.pod import STOPPED, PodEngine
from e2e.vllm_cpu.engine_process import (
    EngineLaunch,
    EngineProcess,
    build_engine_launch,
    engine_python,
    ensure_tiny_model,
)

log = logging.getLogger("e2e.fleet")

HEALTH_EVERY_S = 1.0
"""How often a starting engine's ``/health`` is asked."""

LAUNCHED, READY = "launched", "ready"


class RealEngines:
    """Real engine processes for some of the fleet's pods; launch failures go to ``errors``."""

    def __init__(self, log_root: Path, errors: list[str]) -> None:
        self.log_root = log_root
        self.errors = errors
        self._services: set[tuple[str, str]] = set()
        self._launching: set[tuple[str, str]] = set()
        self._launched: dict[tuple[str, str], EngineLaunch] = {}
        self._next_health: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def add_service(self, namespace: str, instance: str = "*") -> None:
        """Pods of ``instance`` (``"*"``: the namespace) that start from now on run a real engine."""
        engine_python()  # a missing engine fails here, loudly, not in the simulation thread
        with self._lock:
            self._services.add((namespace, instance))

    def adopt(self, e: PodEngine) -> None:
        """Mark a newly seen pod real when its label or its service asks for it; give it the log root."""
        with self._lock:
            asked = bool({(e.namespace, e.instance), (e.namespace, "*")} & self._services)
        e.real_engine = e.real_engine or asked
        e.log_root = self.log_root

    def poll(self, e: PodEngine, now: float) -> str | int | None:
        """What the pod's engine did since the last poll: :data:`LAUNCHED` (with :meth:`launched` saying
        how), :data:`READY` (``/health`` answered while starting), its exit code, or ``None``."""
        with self._lock:
            if e.process is None:
                if e.key not in self._launching:
                    self._launching.add(e.key)
                    threading.Thread(
                        target=self._launch, args=(e,), name=f"launch-{e.name}", daemon=True
                    ).start()
                return None
            if e.key in self._launched:
                return LAUNCHED
        code = e.process.exit_code()
        if code is not None:
            return code
        if e.process.ready_at is None and now >= self._next_health.get(e.key, 0.0):
            self._next_health[e.key] = now + HEALTH_EVERY_S
            if e.process.healthy():
                return READY
        return None

    def launched(self, e: PodEngine) -> EngineLaunch | None:
        """The launch :meth:`poll` just reported (once)."""
        with self._lock:
            return self._launched.pop(e.key, None)

    def _launch(self, e: PodEngine) -> None:
        try:
            launch = build_engine_launch(
                e.args,
                e.scenario.truth,
                port=e.port,
                model_dir=ensure_tiny_model(e.scenario.truth.max_model_len(e.args)),
            )
            log_file = e.log_file()
            assert log_file is not None
            process = EngineProcess(launch, log_file)
            with self._lock:
                if e.state == STOPPED or self.stopping.is_set():
                    abandoned: EngineProcess | None = process
                else:
                    abandoned, e.process = None, process
                    self._launched[e.key] = launch
            if abandoned is not None:
                abandoned.stop()
        except Exception as exc:  # a broken launch is the test's failure, not a crash of the pod
            log.exception("launching the real engine of %s/%s failed", e.namespace, e.name)
            self.errors.append(f"{e.namespace}/{e.name}: {exc!r}")
        finally:
            with self._lock:
                self._launching.discard(e.key)

    def release(self, e: PodEngine, *, wait: bool) -> None:
        """Take the pod's process away and stop its process group (now, or in a thread)."""
        with self._lock:
            process, e.process = e.process, None
            self._launched.pop(e.key, None)
        if process is None:
            return
        if wait:
            process.stop()
        else:
            threading.Thread(target=process.stop, daemon=True).start()
