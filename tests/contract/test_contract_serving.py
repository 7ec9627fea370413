"""vLLM's serving facts (kvpilot.tuner.vllm.serving) against the pinned release's own code: the port its
frontend defaults to, the routes it serves, and every metric series the operator queries (declared in
``vllm/v1/metrics/loggers.py``; a counter is exposed with ``_total``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpilot.tuner.vllm import serving

pytestmark = pytest.mark.contract


def _vllm_root() -> Path:
    import importlib.util

    found = importlib.util.find_spec("vllm")
    if found is None or found.origin is None:
        pytest.fail("the pinned vllm is not installed: make install")
    return Path(found.origin).parent


def _declared_series() -> set[str]:
    text = (_vllm_root() / "v1" / "metrics" / "loggers.py").read_text()
    return set(re.findall(r'name\s*=\s*"(vllm:[a-z_:]+)"', text))


def test_the_frontend_defaults_to_the_port_kvpilot_renders() -> None:
    from vllm.entrypoints.common.cli_args import FrontendArgs

    assert FrontendArgs.port == serving.PORT


def test_the_server_answers_the_health_and_metrics_paths() -> None:
    routes = "".join(p.read_text() for p in (_vllm_root() / "entrypoints").rglob("*.py"))
    assert f'@router.get("{serving.HEALTH_PATH}"' in routes
    assert f'Mount("{serving.METRICS_PATH}"' in routes


@pytest.mark.parametrize(
    "series",
    [
        serving.KV_USAGE,
        serving.PREEMPTIONS,
        serving.RUNNING,
        serving.WAITING,
        serving.PROMPT_TOKENS,
        serving.GENERATION_TOKENS,
        serving.CACHE_CONFIG_INFO,
        serving.TTFT,
        serving.ITL,
    ],
)
def test_every_series_the_operator_queries_is_one_vllm_declares(series: str) -> None:
    declared = _declared_series()
    assert series in declared or series.removesuffix("_total") in declared, sorted(declared)


def test_the_fallbacks_are_older_names_the_pinned_release_no_longer_declares() -> None:
    declared = _declared_series()
    assert serving.KV_USAGE_LEGACY not in declared  # removed in 0.12: read only from older images
    assert serving.PREEMPTIONS_BARE in declared  # declared bare, exposed with _total
