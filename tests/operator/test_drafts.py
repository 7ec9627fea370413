"""A drafter's config.json read beside the model's (:mod:`kvpilot.operator.planning.drafts`): an ``eagle3`` or
``draft_model`` ``--speculative-config`` in ``spec.engine.extraArgs`` is budgeted as ``kvpilot plan
--draft-config`` budgets it, its config from the Hub (the draft's id, the model's token, the speculative
config's revision) or the ConfigMap's ``draft_config.json``; where none is read the plan warns with the
source's advice, never ``kvpilot plan``'s flag.

The configs are published ones: Qwen/Qwen3-32B with Qwen/Qwen3-0.6B as its draft model (as
``tests/test_cli.py``'s draft-model test), Llama-3.1-8B with yuhuili/EAGLE3-LLaMA3.1-Instruct-8B.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kopf
import pytest
from operator_fakes import FakeKube, Harness, condition, isvc

from kvpilot.operator import api, errors
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.planning import drafts, hub, model_files, release, resolve
from kvpilot.operator.planning.model_files import DRAFT_CONFIG_KEY, ModelFiles
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner import vllm
from kvpilot.tuner.model import lookup_model_config

DATA = Path(__file__).resolve().parents[1] / "data"
QWEN3_32B: dict[str, Any] = json.loads((DATA / "hf_configs" / "Qwen__Qwen3-32B.json").read_text())
QWEN3_06B: dict[str, Any] = json.loads((DATA / "hf_configs" / "Qwen__Qwen3-0.6B.json").read_text())
EAGLE3_DRAFT: dict[str, Any] = json.loads(
    (DATA / "eagle3" / "yuhuili__EAGLE3-LLaMA3.1-Instruct-8B.json").read_text()
)
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
TARGET, DRAFT = "Qwen/Qwen3-32B", "Qwen/Qwen3-0.6B"


def _draft_args(model: str = DRAFT, **extra: Any) -> list[str]:
    return ["--speculative-config", json.dumps({"model": model, "num_speculative_tokens": 4, **extra})]


def _spec(model: dict[str, Any], args: list[str]) -> api.InferenceServiceSpec:
    return desired.parse_spec(
        {
            "model": model,
            "gpu": {"count": 1, "product": "H100-SXM"},
            "serving": {"maxContextLength": 8192},
            "engine": {"extraArgs": args},
        }
    )


def _hub_model(**extra: Any) -> dict[str, Any]:
    return {"id": TARGET, "source": "Hub", "hubTokenSecretRef": {"name": "hf"}, **extra}


def _kube() -> FakeKube:
    kube = FakeKube()
    kube.secrets[("ns1", "hf")] = {"token": "hf_TOKEN"}
    return kube


def _target_hub(model_id: str, revision: str | None, token: str | None) -> ModelFiles:
    assert model_id == TARGET, model_id
    return ModelFiles(QWEN3_32B)


def _serve_drafts(monkeypatch, tmp_path, files: dict[str, Any]) -> list[tuple[str, object, object]]:
    """``hf_hub_download`` serving each repository's config.json from ``files`` (another: the Hub's 404 for
    the repository; an exception: raised); the (repo, revision, token) of each config.json asked for."""
    import huggingface_hub
    from huggingface_hub import constants
    from test_resolve import _hub_error

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked: list[tuple[str, object, object]] = []

    def download(repo_id: str, filename: str, **kw: object) -> str:
        if filename != "config.json":
            raise _hub_error("RemoteEntryNotFoundError")
        asked.append((repo_id, kw.get("revision"), kw.get("token")))
        served = files.get(repo_id)
        if served is None:
            raise _hub_error("RepositoryNotFoundError")
        if isinstance(served, Exception):
            raise served
        path = tmp_path / f"{repo_id.replace('/', '__')}.json"
        path.write_text(json.dumps(served))
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return asked


def _plan(spec: api.InferenceServiceSpec, model: resolve.ResolvedModel) -> Any:
    inputs = resolve.Inputs(model, resolve.read_gpu(spec, None))
    decision = desired.build_desired({"name": "llm", "namespace": "ns1"}, spec, inputs).decision
    assert decision is not None
    return decision.plan


@pytest.fixture(autouse=True)
def _fresh_caches():
    resolve.clear_caches()
    yield
    resolve.clear_caches()


def test_a_hub_draft_is_downloaded_with_the_models_token_at_its_revision_and_budgeted(
    monkeypatch, tmp_path
) -> None:
    """The draft's config.json comes from the Hub as the model's does (its token; the speculative config's
    ``revision``, not ``spec.model.revision``), and the plan budgets the whole draft: its speculative GiB
    as ``kvpilot plan --draft-config`` finds it, and no "not given" warning."""
    asked = _serve_drafts(monkeypatch, tmp_path, {DRAFT: QWEN3_06B})
    args = _draft_args(revision="abc123")
    spec = _spec(_hub_model(revision="main"), args)
    model = resolve.read_spec_model(spec, "ns1", _kube(), _target_hub)
    assert asked == [(DRAFT, "abc123", "hf_TOKEN")]
    assert model.draft_config == QWEN3_06B and model.draft_hint is None
    assert model.origin == "the Hugging Face Hub (and the draft model Qwen/Qwen3-0.6B@abc123's config.json)"
    drafted = _plan(spec, model)
    assert 1.11 <= drafted.budget.speculative_gib < 1.12  # tests/test_cli.py's draft-model plan
    assert not any("was not given" in w for w in drafted.warnings)

    unread = _plan(spec, resolve.read_model(spec.model, "ns1", _kube(), _target_hub))
    assert unread.budget.speculative_gib == 0
    assert drafted.budget.kv_cache_tokens < unread.budget.kv_cache_tokens
    # cached: a second resolve asks the Hub nothing more
    resolve.read_spec_model(spec, "ns1", _kube(), _target_hub)
    assert len(asked) == 1
    default = resolve.read_spec_model(_spec(_hub_model(), _draft_args()), "ns1", _kube(), _target_hub)
    assert asked[-1] == (DRAFT, None, "hf_TOKEN") and default.config_key == model.config_key


def test_an_eagle3_drafter_on_the_hub_is_budgeted(monkeypatch, tmp_path) -> None:
    eagle = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    _serve_drafts(monkeypatch, tmp_path, {eagle: EAGLE3_DRAFT})
    llama = lookup_model_config(LLAMA)
    args = [
        "--speculative-config",
        json.dumps({"method": "eagle3", "model": eagle, "num_speculative_tokens": 3}),
    ]
    spec = _spec({"id": LLAMA, "source": "Hub"}, args)
    model = resolve.read_spec_model(spec, "ns1", FakeKube(), lambda *_: ModelFiles(llama))
    assert model.draft_config == EAGLE3_DRAFT
    assert _plan(spec, model).budget.speculative_gib > 0.8  # tests/test_cli.py's EAGLE3 plan


@pytest.mark.parametrize(
    "name,reason,retry,says",
    [
        ("RepositoryNotFoundError", "UnknownModel", False, "Draft model 'Qwen/Qwen3-0.6B' was not found"),
        ("RevisionNotFoundError", "UnknownModel", False, "the 'revision' of --speculative-config"),
        ("RemoteEntryNotFoundError", "InvalidModelConfig", False, f"under key {DRAFT_CONFIG_KEY!r}"),
        ("LocalEntryNotFoundError", "HubUnreachable", True, "the draft model Qwen/Qwen3-0.6B@v1"),
        ("HfHubHTTPError", "HubUnreachable", True, "the draft model Qwen/Qwen3-0.6B@v1"),
    ],
)
def test_hub_errors_for_the_draft_are_mapped_as_the_models_and_name_it(
    monkeypatch, tmp_path, name: str, reason: str, retry: bool, says: str
) -> None:
    from test_resolve import _hub_error

    _serve_drafts(monkeypatch, tmp_path, {DRAFT: _hub_error(name, 503 if name == "HfHubHTTPError" else 404)})
    spec = _spec(_hub_model(), _draft_args(revision="v1"))
    with pytest.raises(Exception) as info:
        resolve.read_spec_model(spec, "ns1", _kube(), _target_hub)
    failure = errors.classify(info.value)
    assert (failure.reason, failure.retry) == (reason, retry)
    assert says in failure.message and "spec.model.id" not in failure.message
    assert "hf_TOKEN" not in failure.message


def test_an_invalid_draft_config_is_refused_naming_the_draft(monkeypatch, tmp_path) -> None:
    """As ``kvpilot plan --draft-config`` refuses it: a draft vLLM reads as MTP, a config that is not one."""
    mtp = {**QWEN3_06B, "model_type": "deepseek_mtp"}
    _serve_drafts(monkeypatch, tmp_path, {DRAFT: mtp})
    spec = _spec(_hub_model(), _draft_args())
    with pytest.raises(tuner_errors.InvalidModelConfig, match="as method 'mtp'") as info:
        resolve.read_spec_model(spec, "ns1", _kube(), _target_hub)
    assert "the config.json of the draft model Qwen/Qwen3-0.6B@main" in info.value.message
    assert (errors.classify(info.value).reason, errors.classify(info.value).retry) == (
        "InvalidModelConfig",
        False,
    )
    kube = FakeKube()
    kube.config_maps[("ns1", "cfg")] = {"config.json": json.dumps(QWEN3_32B), DRAFT_CONFIG_KEY: "{broken"}
    config_map = {"id": TARGET, "source": "ConfigMap", "configMapRef": {"name": "cfg"}}
    with pytest.raises(tuner_errors.InvalidModelConfig, match="not valid JSON") as info:
        resolve.read_spec_model(_spec(config_map, _draft_args()), "ns1", kube)
    assert f"ConfigMap ns1/cfg key {DRAFT_CONFIG_KEY!r}" in info.value.message


async def test_an_invalid_draft_config_makes_the_service_not_ready(harness: Harness) -> None:
    harness.kube.config_maps[("ns1", "cfg")] = {
        "config.json": json.dumps(QWEN3_32B),
        DRAFT_CONFIG_KEY: json.dumps({**QWEN3_06B, "model_type": "deepseek_mtp"}),
    }
    body = isvc(
        model={"id": TARGET, "source": "ConfigMap", "configMapRef": {"name": "cfg"}},
        engine={"extraArgs": _draft_args()},
    )
    with pytest.raises(kopf.PermanentError):
        await harness.run(body)
    ready = condition(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidModelConfig")
    assert f"key {DRAFT_CONFIG_KEY!r}" in ready["message"] and "as method 'mtp'" in ready["message"]
    assert harness.kube.applied == []


async def test_a_configmaps_draft_key_is_budgeted_and_its_absence_warned_with_configmap_advice(
    planner: Harness,
) -> None:
    """The draft's config.json under ``draft_config.json`` (a draft the pod loads from a path): budgeted as
    from the Hub; without the key the service still deploys, its warning says to add the key."""
    config_map = {"id": TARGET, "source": "ConfigMap", "configMapRef": {"name": "cfg"}}
    extra = {
        "engine": {"extraArgs": _draft_args("/models/draft")},
        "gpu": {"count": 1, "product": "H100-SXM"},
    }
    planner.kube.config_maps[("ns1", "cfg")] = {
        "config.json": json.dumps(QWEN3_32B),
        DRAFT_CONFIG_KEY: json.dumps(QWEN3_06B),
    }
    body = isvc(model=config_map, serving={"maxContextLength": 8192}, **extra)
    await planner.run(body)
    assert 1.11 <= body["status"]["budget"]["speculativeGiB"] < 1.12
    resolved = condition(body, "ConfigResolved")["message"]
    assert f"ConfigMap ns1/cfg (the draft's config.json under {DRAFT_CONFIG_KEY!r})" in resolved
    assert not any("was not given" in w for w in body["status"]["warnings"])

    resolve.clear_caches()
    planner.kube.config_maps[("ns1", "cfg")] = {"config.json": json.dumps(QWEN3_32B)}
    body = isvc(name="other", model=config_map, serving={"maxContextLength": 8192}, **extra)
    await planner.run(body)
    assert not body["status"]["budget"].get("speculativeGiB")
    (warning,) = (w for w in body["status"]["warnings"] if "was not given" in w)
    assert f"put it under key {DRAFT_CONFIG_KEY!r} of ConfigMap ns1/cfg" in warning
    assert "--draft-config" not in warning and "source: Hub" not in warning  # a path: not on the Hub


def test_the_advice_names_each_source_and_the_cli_keeps_its_flag() -> None:
    """One sentence (``describe_missing_draft_config``), each caller's advice: the ConfigMap's key (and the
    Hub, for a Hub id), the Catalogue's other sources, a local path with source Hub; the CLI's flag."""
    kube = FakeKube()
    kube.config_maps[("ns1", "cfg")] = {"config.json": json.dumps(QWEN3_32B)}
    config_map = {"id": TARGET, "source": "ConfigMap", "configMapRef": {"name": "cfg"}}
    cases = [
        (_spec(config_map, _draft_args()), kube, "or use source: Hub, which downloads it"),
        (_spec({"id": TARGET}, _draft_args()), None, "use source: Hub (the draft's Hub id is downloaded) or"),
        (_spec({"id": TARGET}, _draft_args("/d")), None, "no draft configs: use source: ConfigMap with"),
        (_spec(_hub_model(), _draft_args("./draft")), _kube(), "the draft is not a Hub id"),
    ]
    for spec, cluster, says in cases:
        model = resolve.read_spec_model(spec, "ns1", cluster, _target_hub)
        assert model.draft_config is None and model.draft_hint is not None and says in model.draft_hint
        (warning,) = (w for w in _plan(spec, model).warnings if "was not given" in w)
        assert says in warning and DRAFT_CONFIG_KEY in warning and "--draft-config" not in warning
        assert warning.startswith("--speculative-config") or "loads the draft model" in warning
    cli_flags = vllm.build_engine_flags(_draft_args())
    spec = _spec({"id": TARGET}, _draft_args())
    engine = release.resolve_release(spec)  # no model given: the flags' own (the CLI's) advice
    assert engine.flags == cli_flags
    assert cli_flags.speculative is not None and cli_flags.speculative.draft_config_hint is None


def test_the_model_key_changes_with_the_draft_and_not_without_one(monkeypatch, tmp_path) -> None:
    """A text model with no drafter keeps config.json's key (its TuningProfiles still match), even with a
    stray draft key in its ConfigMap; each draft config is another key, whatever source gives it."""
    kube = FakeKube()
    kube.config_maps[("ns1", "cfg")] = {
        "config.json": json.dumps(QWEN3_32B),
        DRAFT_CONFIG_KEY: json.dumps(QWEN3_06B),
    }
    ref = api.ModelRef(id=TARGET, source="ConfigMap", configMapRef=api.ConfigMapRef(name="cfg"))
    plain = resolve.read_model(ref, "ns1", kube)
    assert plain.config_key == model_files.compute_config_key(QWEN3_32B) and plain.draft_config is None
    ngram = vllm.read_speculative_flags(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    )
    assert resolve.read_model(ref, "ns1", kube, speculative=ngram).config_key == plain.config_key
    speculative = vllm.read_speculative_flags(_draft_args())
    drafted = resolve.read_model(ref, "ns1", kube, speculative=speculative)
    expected = model_files.compute_draft_key(plain.config_key, QWEN3_06B)
    assert drafted.config_key == expected != plain.config_key
    assert drafted.spec == plain.spec
    other = {**QWEN3_06B, "num_hidden_layers": 20}
    kube.config_maps[("ns1", "cfg")][DRAFT_CONFIG_KEY] = json.dumps(other)
    changed = resolve.read_model(ref, "ns1", kube, speculative=speculative)
    assert changed.config_key not in (plain.config_key, drafted.config_key)
    # the Hub gives the same key for the same files
    _serve_drafts(monkeypatch, tmp_path, {DRAFT: QWEN3_06B})
    from_hub = resolve.read_spec_model(_spec(_hub_model(), _draft_args()), "ns1", _kube(), _target_hub)
    assert from_hub.config_key == expected
    hub_plain = resolve.read_spec_model(_spec(_hub_model(), []), "ns1", _kube(), _target_hub)
    assert hub_plain.config_key == plain.config_key


def test_needs_and_hub_ids() -> None:
    read = vllm.read_speculative_flags
    mtp = read(["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'])
    assert not drafts.needs_draft_config(mtp) and not drafts.needs_draft_config(None)
    for path in ("/models/draft", "./draft", "../draft"):
        flags = read(_draft_args(path))
        assert flags is not None and drafts.needs_draft_config(flags) and drafts.find_hub_draft(flags) is None
    flags = read(_draft_args())
    assert flags is not None and drafts.find_hub_draft(flags) == DRAFT and flags.draft_revision is None
    assert hub.DRAFT.noun == "draft model"


@pytest.mark.parametrize("with_key", [True, False])
async def test_the_enginetuner_reads_its_targets_drafter_as_the_model_s(with_key: bool) -> None:
    """An EngineTuner's target running an EAGLE3 drafter from a path in its pod: the draft's config.json
    from the tuner's ConfigMap budgets it; without the key the plan warns with the ConfigMap's advice."""
    from test_enginetuner import NS, FakeTargetKube, deployment, pod_of, run, tuner

    from kvpilot.operator.status.events import RecordingEmitter

    kube = FakeTargetKube()
    kube.config_maps[(NS, "cfg")] = {"config.json": json.dumps(lookup_model_config(LLAMA))}
    if with_key:
        kube.config_maps[(NS, "cfg")][DRAFT_CONFIG_KEY] = json.dumps(EAGLE3_DRAFT)
    eagle = json.dumps({"method": "eagle3", "model": "/models/eagle3", "num_speculative_tokens": 3})
    command = ["vllm", "serve", LLAMA, "--max-model-len", "8192", "--speculative-config", eagle]
    workload = deployment("llama", command)
    kube.workloads[(NS, "Deployment", "llama")] = workload
    kube.pods = [pod_of(workload, "llama-abc12-x")]
    body = tuner("Off", model={"id": LLAMA, "source": "ConfigMap", "configMapRef": {"name": "cfg"}})
    await run(body, kube, RecordingEmitter())
    status = body["status"]
    missing = [w for w in status.get("warnings", []) if "was not given" in w]
    if with_key:
        assert status["budget"]["speculativeGiB"] > 0.8 and not missing
    else:
        assert not status["budget"].get("speculativeGiB")
        (warning,) = missing
        assert f"put it under key {DRAFT_CONFIG_KEY!r} of ConfigMap {NS}/cfg" in warning


@pytest.mark.parametrize(
    "args,says",
    [
        (_draft_args("acme/x/../../etc"), "neither a Hugging Face id"),
        (_draft_args("~/draft"), "neither a Hugging Face id"),
        (_draft_args(revision="../../refs"), "no '..'"),
        (_draft_args(revision="a b"), "at most 128"),
    ],
)
def test_a_draft_id_or_revision_spec_model_would_refuse_is_refused_before_the_hub(
    monkeypatch, tmp_path, args: list[str], says: str
) -> None:
    asked = _serve_drafts(monkeypatch, tmp_path, {DRAFT: QWEN3_06B})
    with pytest.raises(errors.InvalidSpec, match=says) as info:
        resolve.read_spec_model(_spec(_hub_model(), args), "ns1", _kube(), _target_hub)
    assert asked == [] and "spec.engine.extraArgs" in info.value.message


def test_an_offline_operator_without_the_draft_cached_plans_without_it(monkeypatch) -> None:
    """HF_HUB_OFFLINE: what is not cached never will be, so the service is planned as before the operator
    read drafts (the warning says why and what to do) rather than retried for ever; online, retried."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub import errors as hf

    def cached_only(repo_id: str, filename: str, **_: object) -> str:
        raise hf.LocalEntryNotFoundError("outgoing traffic has been disabled")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached_only)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    spec = _spec(_hub_model(), _draft_args())
    model = resolve.read_spec_model(spec, "ns1", _kube(), _target_hub)
    assert model.draft_config is None and model.config_key == model_files.compute_config_key(QWEN3_32B)
    assert model.draft_hint is not None and "HF_HUB_OFFLINE" in model.draft_hint
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    resolve.clear_caches()
    with pytest.raises(errors.HubUnreachable):
        resolve.read_spec_model(spec, "ns1", _kube(), _target_hub)
