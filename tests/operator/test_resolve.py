"""Resolving a spec's inputs: the node-label cache and the Hugging Face Hub download (no network)."""

from __future__ import annotations

import threading
import time

import pytest

from kvpilot.operator import errors, resolve
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.model import MAX_CONFIG_BYTES


def test_node_cache_single_flight_and_ttl() -> None:
    calls = []

    class SlowKube:
        def list_node_labels(self, selector: str) -> list[dict[str, str]]:
            calls.append(selector)
            time.sleep(0.05)
            return [{"a": "b"}]

    now = [0.0]
    cache = resolve.NodeCache(ttl_s=30, clock=lambda: now[0])
    threads = [threading.Thread(target=cache.list, args=(SlowKube(), "x=y")) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["x=y"]
    now[0] = 31.0
    assert cache.list(SlowKube(), "x=y") == [{"a": "b"}]
    assert len(calls) == 2


def _hub_error(name: str, status: int = 404) -> Exception:
    import httpx
    from huggingface_hub import errors as hf

    cls = getattr(hf, name)
    if issubclass(cls, hf.HfHubHTTPError):
        response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x"))
        return cls("boom", response=response)
    return cls("boom")


@pytest.mark.parametrize(
    "name,status,reason",
    [
        ("LocalEntryNotFoundError", 0, "HubUnreachable"),  # connection refused, after the library's retries
        ("OfflineModeIsEnabled", 0, "HubUnreachable"),
        ("GatedRepoError", 403, "HubAccessDenied"),
        ("RepositoryNotFoundError", 404, "UnknownModel"),
        ("RevisionNotFoundError", 404, "UnknownModel"),
        ("RemoteEntryNotFoundError", 404, "InvalidModelConfig"),
        ("HfHubHTTPError", 401, "HubAccessDenied"),
        ("HfHubHTTPError", 503, "HubUnreachable"),
    ],
)
def test_hub_errors_are_mapped(monkeypatch, name: str, status: int, reason: str) -> None:
    import huggingface_hub

    exc = _hub_error(name, status)

    def fail(*a, **kw):
        raise exc

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    with pytest.raises(Exception) as info:
        resolve.download_hub_config("acme/m", None, "hf_SECRET")
    failure = errors.classify(info.value)
    assert failure.reason == reason
    assert failure.retry == (reason in ("HubUnreachable", "HubAccessDenied"))
    assert "hf_SECRET" not in failure.message


def test_hub_download_reads_config(monkeypatch, tmp_path) -> None:
    import huggingface_hub

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **kw: str(tmp_path / "config.json"))
    assert resolve.download_hub_config("acme/m", "main", None) == {"model_type": "llama"}


@pytest.mark.parametrize(
    "content,detail",
    [
        (b'{"model_type": "\xff\xfe llama"}', "not valid JSON"),  # not UTF-8
        (b'{"pad": "' + b"x" * MAX_CONFIG_BYTES + b'"}', f"{MAX_CONFIG_BYTES + 1} bytes"),  # oversize
    ],
    ids=["non-utf8", "oversize"],
)
def test_hub_download_refuses_bad_config_file(monkeypatch, tmp_path, content: bytes, detail: str) -> None:
    import huggingface_hub

    (tmp_path / "config.json").write_bytes(content)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **kw: str(tmp_path / "config.json"))
    with pytest.raises(tuner_errors.InvalidModelConfig, match=detail) as info:
        resolve.download_hub_config("acme/m", "main", None)
    assert "config.json of acme/m@main" in info.value.message
    failure = errors.classify(info.value)
    assert (failure.reason, failure.retry) == ("InvalidModelConfig", False)
