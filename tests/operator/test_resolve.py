"""Resolving a spec's inputs: the node-label cache and the Hugging Face Hub download (no network)."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path

import pytest

from kvpilot.operator import errors
from kvpilot.operator.planning import hub, model_files, resolve
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.model import MAX_CONFIG_BYTES, PROCESSOR_FILES, QUANT_SIDECAR


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
        hub.download_hub_config("acme/m", None, "hf_SECRET")
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
        hub.download_hub_config("acme/m", None, None)
    failure = errors.classify(info.value)
    assert (failure.reason, failure.retry) == (reason, True)
    assert "/var/cache" not in failure.message and "/nonexistent" not in failure.message
    if reason == "HubCacheUnwritable":
        assert "HF_HOME" in failure.message and errno.errorcode[exc.errno] in failure.message


def _serve_hub(
    monkeypatch,
    tmp_path,
    files: dict[str, object],
    sidecar_error: str | None = None,
    failing: str = "hf_quant_config.json",
) -> list[str]:
    """``hf_hub_download`` answering from ``files`` (a missing file: the Hub's 404; ``failing``: the
    ``sidecar_error``); the names asked for. Online: the contract tests' conftest sets ``HF_HUB_OFFLINE``
    for the whole session."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    asked: list[str] = []
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))

    def download(repo_id: str, filename: str, **kw: object) -> str:
        asked.append(filename)
        if filename == failing and sidecar_error:
            raise _hub_error(sidecar_error, 503)
        if filename not in files:
            raise _hub_error("RemoteEntryNotFoundError")
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return asked


def test_hub_download_reads_config(monkeypatch, tmp_path) -> None:
    asked = _serve_hub(monkeypatch, tmp_path, {"config.json": {"model_type": "llama"}})
    assert hub.download_hub_config("acme/m", "main", None) == {"model_type": "llama"}
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
    config = hub.download_hub_config("acme/m", "main", None)
    assert config == {"model_type": "llama", "quantization_config": SIDECAR}
    own = {"model_type": "llama", "quantization_config": {"quant_method": "fp8"}}
    asked = _serve_hub(monkeypatch, tmp_path, {"config.json": own, "hf_quant_config.json": SIDECAR})
    assert hub.download_hub_config("acme/m", "main", None) == own
    assert asked == ["config.json"]  # its own quantization_config: vLLM looks no further


def test_an_unreachable_sidecar_is_retried_not_skipped(monkeypatch, tmp_path) -> None:
    """Sizing an NVFP4 checkpoint as bf16 because the Hub blinked would plan a different service."""
    files: dict[str, object] = {"config.json": {"model_type": "llama"}}
    _serve_hub(monkeypatch, tmp_path, files, sidecar_error="HfHubHTTPError")
    with pytest.raises(Exception) as info:
        hub.download_hub_config("acme/m", "main", None)
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
    assert hub.download_hub_config("acme/m", "main", None) == {"model_type": "llama"}
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, the same error is a Hub not reached
    with pytest.raises(errors.HubUnreachable):
        hub.download_hub_config("acme/m", "main", None)


QWEN35 = next(
    case
    for case in json.loads(
        (Path(__file__).parents[1] / "data" / "vllm_memory_cases_public_2x.json").read_text()
    )
    if case["id"] == "case-104"
)
"""Qwen/Qwen3.5-0.8B's published config.json, and its family's published processor files (image
``size.longest_edge`` 16,777,216): a vision tower kvpilot models."""
IMAGE = {"preprocessor_config.json": QWEN35["preprocessor_config"]}


def test_the_hub_brings_a_multimodal_models_processor_files_and_not_a_text_models(
    monkeypatch, tmp_path
) -> None:
    """Beside config.json, at the same revision with the same token, only where the plan reads them: a text
    model costs no request more than before."""
    import huggingface_hub

    asked = _serve_hub(monkeypatch, tmp_path, {"config.json": QWEN35["hf_config"], **IMAGE})
    calls: list[tuple[str, object, object]] = []
    serve = huggingface_hub.hf_hub_download

    def recorded(repo_id: str, filename: str, **kw: object) -> str:
        calls.append((filename, kw["revision"], kw["token"]))
        return serve(repo_id, filename, **kw)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", recorded)
    files = hub.download_hub_files("Qwen/Qwen3.5-0.8B", "abc123", "hf_TOKEN")
    assert files == model_files.ModelFiles(QWEN35["hf_config"], IMAGE)  # no video file on the Hub: none
    assert asked == ["config.json", QUANT_SIDECAR, *PROCESSOR_FILES]
    assert {(revision, token) for _, revision, token in calls} == {("abc123", "hf_TOKEN")}
    asked = _serve_hub(monkeypatch, tmp_path, {"config.json": {"model_type": "llama"}, **IMAGE})
    assert hub.download_hub_files("acme/m", "main", None) == model_files.ModelFiles({"model_type": "llama"})
    assert asked == ["config.json", QUANT_SIDECAR]


def test_a_hub_model_is_planned_with_its_processor_files(monkeypatch, tmp_path) -> None:
    from operator_fakes import FakeKube

    from kvpilot.operator import api

    resolve.clear_caches()
    _serve_hub(monkeypatch, tmp_path, {"config.json": QWEN35["hf_config"], **IMAGE})
    model = resolve.read_model(api.ModelRef(id="Qwen/Qwen3.5-0.8B", source="Hub"), "ns", FakeKube())
    assert model.spec.vision_tower is not None and model.spec.vision_tower.limits.image_max_pixels == 1 << 24
    assert model.config_key == model_files.compute_files_key(
        model_files.ModelFiles(QWEN35["hf_config"], IMAGE)
    )
    resolve.clear_caches()


def test_an_unreachable_processor_file_is_retried_offline_none(monkeypatch, tmp_path) -> None:
    """As the sidecar: a Hub that blinked is retried (a plan at the default pixels would be another
    service's), a file not cached under HF_HUB_OFFLINE is none."""
    from huggingface_hub import constants

    files: dict[str, object] = {"config.json": QWEN35["hf_config"], **IMAGE}
    _serve_hub(
        monkeypatch, tmp_path, files, sidecar_error="HfHubHTTPError", failing="preprocessor_config.json"
    )
    with pytest.raises(errors.HubUnreachable):
        hub.download_hub_files("Qwen/Qwen3.5-0.8B", "main", None)
    _serve_hub(
        monkeypatch,
        tmp_path,
        files,
        sidecar_error="LocalEntryNotFoundError",
        failing="preprocessor_config.json",
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.download_hub_files("Qwen/Qwen3.5-0.8B", "main", None) == model_files.ModelFiles(
        QWEN35["hf_config"]
    )


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
        hub.download_hub_config("acme/m", "main", None)
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
    files = model_files.read_config_map_files(api.ConfigMapRef(name="cfg"), "ns1", kube)
    assert files == model_files.ModelFiles({"model_type": "llama", "quantization_config": SIDECAR})
    kube.config_maps[("ns1", "cfg")]["hf_quant_config.json"] = "{broken"
    with pytest.raises(tuner_errors.InvalidModelConfig, match="key 'hf_quant_config.json'"):
        model_files.read_config_map_files(api.ConfigMapRef(name="cfg"), "ns1", kube)


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
        hub.download_hub_config("acme/m", None, "hf_SECRET")
    failure = errors.classify(info.value)
    assert failure.reason != "InternalError"
    assert "hf_SECRET" not in failure.message and "denied" not in failure.message
    assert "hf_SECRET" not in caplog.text and "denied: Authorization" in caplog.text
