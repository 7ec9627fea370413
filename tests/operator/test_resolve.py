"""Resolving a spec's inputs: the node-label cache and the Hugging Face Hub download (no network)."""

from __future__ import annotations

import errno
import json
import threading
import time

import pytest

from kvpilot.operator import errors
from kvpilot.operator.planning import resolve
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


@pytest.mark.parametrize(
    "exc,reason",
    [
        (
            OSError(errno.EROFS, "Read-only file system", "/var/cache/kvpilot/huggingface"),
            "HubCacheUnwritable",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/nonexistent/.cache"), "HubCacheUnwritable"),
        (
            OSError(errno.ENOSPC, "No space left on device", "/var/cache/kvpilot/huggingface/x"),
            "HubCacheUnwritable",
        ),
        (ConnectionError("Connection refused"), "HubUnreachable"),  # the network: no file name
        (TimeoutError("timed out"), "HubUnreachable"),
    ],
)
def test_an_unwritable_hub_cache_is_the_operators_fault_not_the_hubs(
    monkeypatch, exc: Exception, reason: str
) -> None:
    """The chart's read-only root with no HF_HOME volume failed as HubUnreachable, sending the tenant to check
    the Hub; a local file system failure names the operator's cache instead (and never the path)."""
    import huggingface_hub

    def fail(*a, **kw):
        raise exc

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    with pytest.raises(Exception) as info:
        resolve.download_hub_config("acme/m", None, None)
    failure = errors.classify(info.value)
    assert (failure.reason, failure.retry) == (reason, True)
    assert "/var/cache" not in failure.message and "/nonexistent" not in failure.message
    if reason == "HubCacheUnwritable":
        assert "HF_HOME" in failure.message and errno.errorcode[exc.errno] in failure.message


def _serve_hub(
    monkeypatch, tmp_path, files: dict[str, object], sidecar_error: str | None = None
) -> list[str]:
    """``hf_hub_download`` answering from ``files`` (a missing file: the Hub's 404); the names asked for.
    Online: the contract tests' conftest sets ``HF_HUB_OFFLINE`` for the whole session."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    asked: list[str] = []
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))

    def download(repo_id: str, filename: str, **kw: object) -> str:
        asked.append(filename)
        if filename == "hf_quant_config.json" and sidecar_error:
            raise _hub_error(sidecar_error, 503)
        if filename not in files:
            raise _hub_error("RemoteEntryNotFoundError")
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return asked


def test_hub_download_reads_config(monkeypatch, tmp_path) -> None:
    asked = _serve_hub(monkeypatch, tmp_path, {"config.json": {"model_type": "llama"}})
    assert resolve.download_hub_config("acme/m", "main", None) == {"model_type": "llama"}
    assert asked == ["config.json", "hf_quant_config.json"]  # no sidecar: the 404 is not an error


SIDECAR = {
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_quant_algo": None,
        "exclude_modules": ["lm_head"],
    },
}
"""ModelOpt 0.29's hf_quant_config.json layout (the format vLLM's ``_normalize_quantization_config``
reads; not a copy of any one checkpoint's)."""


def test_hub_download_takes_a_modelopt_sidecar_as_vllm_does(monkeypatch, tmp_path) -> None:
    llama = {"model_type": "llama"}
    _serve_hub(monkeypatch, tmp_path, {"config.json": llama, "hf_quant_config.json": SIDECAR})
    config = resolve.download_hub_config("acme/m", "main", None)
    assert config == {"model_type": "llama", "quantization_config": SIDECAR}
    own = {"model_type": "llama", "quantization_config": {"quant_method": "fp8"}}
    asked = _serve_hub(monkeypatch, tmp_path, {"config.json": own, "hf_quant_config.json": SIDECAR})
    assert resolve.download_hub_config("acme/m", "main", None) == own
    assert asked == ["config.json"]  # its own quantization_config: vLLM looks no further


def test_an_unreachable_sidecar_is_retried_not_skipped(monkeypatch, tmp_path) -> None:
    """Sizing an NVFP4 checkpoint as bf16 because the Hub blinked would plan a different service."""
    files: dict[str, object] = {"config.json": {"model_type": "llama"}}
    _serve_hub(monkeypatch, tmp_path, files, sidecar_error="HfHubHTTPError")
    with pytest.raises(Exception) as info:
        resolve.download_hub_config("acme/m", "main", None)
    assert (errors.classify(info.value).reason, errors.classify(info.value).retry) == ("HubUnreachable", True)


def test_offline_with_only_config_json_cached_is_no_sidecar(monkeypatch, tmp_path) -> None:
    """HF_HUB_OFFLINE: what is not in the cache never will be, so a missing sidecar is no sidecar (the
    weights are sized as the config says: the safe, larger size) rather than an endless HubUnreachable."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub import errors as hf

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def cached_only(repo_id: str, filename: str, **_: object) -> str:
        if filename != "config.json":
            raise hf.LocalEntryNotFoundError("outgoing traffic has been disabled")
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_only)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve.download_hub_config("acme/m", "main", None) == {"model_type": "llama"}
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, the same error is a Hub not reached
    with pytest.raises(errors.HubUnreachable):
        resolve.download_hub_config("acme/m", "main", None)


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


def test_a_configmap_carries_the_sidecar_under_its_own_name() -> None:
    from operator_fakes import FakeKube

    from kvpilot.operator import api

    kube = FakeKube()
    kube.config_maps[("ns1", "cfg")] = {
        "config.json": '{"model_type": "llama"}',
        "hf_quant_config.json": json.dumps(SIDECAR),
    }
    config = resolve.read_config_map_config(api.ConfigMapRef(name="cfg"), "ns1", kube)
    assert config == {"model_type": "llama", "quantization_config": SIDECAR}
    kube.config_maps[("ns1", "cfg")]["hf_quant_config.json"] = "{broken"
    with pytest.raises(tuner_errors.InvalidModelConfig, match="key 'hf_quant_config.json'"):
        resolve.read_config_map_config(api.ConfigMapRef(name="cfg"), "ns1", kube)


@pytest.mark.parametrize(
    "name,status",
    [("HfHubHTTPError", 401), ("HfHubHTTPError", 502), ("RepositoryNotFoundError", 404), ("ValueError", 0)],
)
def test_the_hubs_words_never_reach_the_status(monkeypatch, caplog, name: str, status: int) -> None:
    """An upstream body quoting the token (a proxy echoing the Authorization header) stays out of the
    failure (the condition and event) and out of the log; an unknown error: no InternalError quoting it."""
    import httpx
    import huggingface_hub
    from huggingface_hub import errors as hf

    body = "denied: Authorization: Bearer hf_SECRET"
    if name == "ValueError":
        exc: Exception = ValueError(body)
    else:
        response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/x"))
        exc = getattr(hf, name)(body, response=response)

    def fail(*a, **kw):
        raise exc

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    caplog.set_level("DEBUG")
    with pytest.raises(Exception) as info:
        resolve.download_hub_config("acme/m", None, "hf_SECRET")
    failure = errors.classify(info.value)
    assert failure.reason != "InternalError"
    assert "hf_SECRET" not in failure.message and "denied" not in failure.message
    assert "hf_SECRET" not in caplog.text and "denied: Authorization" in caplog.text
