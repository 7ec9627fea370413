"""The ``kvpilot`` command: in process through ``main(argv)``, and as a subprocess for its error paths."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot import cli
from kvpilot.tuner import model as models

CASES_FILE = Path(__file__).resolve().parent / "data" / "vllm_memory_cases.json"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_process(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpilot.cli", *argv], capture_output=True, text=True, timeout=120, check=False
    )


# -- plan ---------------------------------------------------------------------------------------


def test_plan_json_has_the_settings_at_the_top() -> None:
    code, out, err = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--json")
    assert code == 0, err
    plan = json.loads(out)
    for key in ("max_model_len", "max_num_seqs", "gpu_memory_utilization", "kv_cache_dtype"):
        assert plan[key] is not None, key
    assert plan["feasible"] is True
    assert plan["model"] == LLAMA
    assert plan["gpu"] == "H100-SXM"
    assert plan["budget"]["available_kv_cache_gib"] > 0
    assert plan["args"][:2] == ["--max-model-len", str(plan["max_model_len"])]
    assert isinstance(plan["reasons"], list)


def test_plan_can_pin_the_kv_pool() -> None:
    code, out, err = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--pin-kv-cache-memory", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["kv_cache_memory_bytes"] > 0 and plan["gpu_memory_utilization"] is None
    assert "--gpu-memory-utilization" not in plan["args"]
    args = plan["args"]
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(plan["kv_cache_memory_bytes"])
    code, table, _ = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--pin-kv-cache-memory")
    assert code == 0 and "KV pool pinned" in table and "= KV cache (pinned)" in table


def test_plan_table() -> None:
    code, out, _ = run("plan", "--model", LLAMA, "--gpu", "L4")
    assert code == 0
    for text in ("Engine settings", "Memory per GPU (GiB)", "= KV cache", "Concurrency", "--max-model-len"):
        assert text in out


def test_plan_auto_nodes_says_one_node_is_not_enough_and_shows_two() -> None:
    code, out, _ = run(
        "plan",
        "--model",
        "deepseek-ai/DeepSeek-V3",
        "--gpu",
        "H100-SXM",
        "--max-context",
        "32768",
        "--nodes",
        "auto",
    )
    assert code == 0
    assert out.startswith("deepseek-ai/DeepSeek-V3 on 2 node(s) x 8 x H100-SXM")
    assert "Nothing fits one node of 8 x H100-SXM: " in out and "Layout: " in out
    assert "--data-parallel-size 4 --data-parallel-size-local 2 --enable-expert-parallel" in out
    assert "gpu.nodesPerReplica 2 renders this split as a LeaderWorkerSet" in out


def test_plan_gpus_above_a_node_span_nodes_tp_within_pp_across() -> None:
    code, out, _ = run(
        "plan",
        "--model",
        "meta-llama/Llama-3.1-70B-Instruct",
        "--gpu",
        "H100-SXM",
        "--gpus",
        "16",
        "--max-context",
        "32768",
        "--json",
    )
    plan = json.loads(out)
    assert code == 0
    assert plan["layout"]["nodes"] == 2 and plan["layout"]["pipeline_parallel_size"] == 2
    assert plan["tensor_parallel_size"] == 8
    assert [r["layers"] for r in plan["ranks"]] == [[0, 40], [40, 80]]
    assert plan["args"][-2:] == ["--pipeline-parallel-size", "2"]
    assert any(line.startswith("Chosen: TP 8 x PP 2") for line in plan["explanation"])


def test_plan_node_arguments_that_disagree_are_refused() -> None:
    code, _, err = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--gpus", "12")
    assert code == 2 and "--gpus 12 spans nodes of 8 GPUs (--gpus-per-node) unevenly" in err
    code, _, err = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--gpus", "8", "--nodes", "2")
    assert code == 2 and "--gpus 8 is not --nodes 2 x --gpus-per-node 8" in err
    done = run_process("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--nodes", "0")
    assert done.returncode == 2 and "--nodes: expected a positive integer, got '0'" in done.stderr


def test_plan_on_one_node_is_unchanged_by_the_node_flags() -> None:
    assert run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--gpus", "8") == run(
        "plan", "--model", LLAMA, "--gpu", "H100-SXM", "--gpus", "8", "--gpus-per-node", "8"
    )


def test_plan_bounds_reach_the_planner() -> None:
    code, out, _ = run(
        "plan",
        "--model",
        "qwen/qwen3-8b",
        "--gpu",
        "h100",
        "--gpus",
        "2",
        "--max-context",
        "8192",
        "--concurrency",
        "16",
        "--allow-fp8-kv",
        "--json",
    )
    plan = json.loads(out)
    assert code == 0
    assert plan["max_model_len"] == 8192
    assert plan["tensor_parallel_size"] == 2
    assert plan["gpu_count"] == 2


def test_plan_from_a_config_file_and_its_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(models.lookup_model_config(LLAMA)))
    gpu = ("--gpu", "A100-80GB", "--json")
    by_file = json.loads(run("plan", "--config", str(tmp_path / "config.json"), *gpu)[1])
    by_folder = json.loads(run("plan", "--config", str(tmp_path), *gpu)[1])
    by_id = json.loads(run("plan", "--model", LLAMA, *gpu)[1])
    assert by_file["max_model_len"] == by_folder["max_model_len"] == by_id["max_model_len"]


def test_plan_from_a_folder_reads_its_preprocessor_config(tmp_path: Path) -> None:
    """A checkpoint's ``preprocessor_config.json`` sizes the vision profile: Qwen3-VL's published 16,384-token
    images (one item of 65,536 patches) peak above transformers' default 980-token ones (8 of them)."""
    data = Path(__file__).resolve().parent / "data" / "hf_configs" / "Qwen__Qwen3-VL-32B-Instruct.json"
    (tmp_path / "config.json").write_text(data.read_text())
    gpu = ("--gpu", "H100-SXM", "--gpus", "2", "--max-context", "32768", "--json")
    default = json.loads(run("plan", "--config", str(tmp_path), *gpu)[1])
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"longest_edge": 16777216}}))
    published = json.loads(run("plan", "--config", str(tmp_path), *gpu)[1])
    assert published["budget"]["activation_gib"] > default["budget"]["activation_gib"] + 0.3
    assert published["budget"]["kv_cache_tokens"] < default["budget"]["kv_cache_tokens"]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": "many"}))
    code, _, err = run("plan", "--config", str(tmp_path), *gpu)
    assert code == 2 and "max_pixels" in err


def test_plan_from_a_folder_reads_a_modelopt_sidecar(tmp_path: Path) -> None:
    """Nemotron 3 Nano NVFP4 keeps its quantization in hf_quant_config.json (ModelOpt 0.29's layout; not the
    checkpoint's own file): read beside config.json, its weights are FP4 and its KV cache grows."""
    data = Path(__file__).resolve().parent / "data" / "hf_configs"
    config = data / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4.json"
    (tmp_path / "config.json").write_text(config.read_text())
    gpu = ("--gpu", "H100-SXM", "--json")
    bf16 = json.loads(run("plan", "--config", str(tmp_path), *gpu)[1])
    quantization = {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}
    sidecar = {"producer": {"name": "modelopt"}, "quantization": quantization}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(sidecar))
    fp4 = json.loads(run("plan", "--config", str(tmp_path), *gpu)[1])
    assert fp4["budget"]["weights_gib"] < 0.4 * bf16["budget"]["weights_gib"]
    assert fp4["budget"]["kv_cache_tokens"] > bf16["budget"]["kv_cache_tokens"]
    refused = {**sidecar, "quantization": {"quant_algo": "INT1"}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(refused))
    code, _, err = run("plan", "--config", str(tmp_path), *gpu)
    assert code == 2 and "INT1" in err


def test_infeasible_plan_exits_1_and_says_why() -> None:
    code, out, _ = run("plan", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "L4", "--json")
    plan = json.loads(out)
    assert code == cli.EXIT_INFEASIBLE
    assert plan["feasible"] is False
    assert plan["reasons"]


# -- catalogues and estimate ----------------------------------------------------------------------


def test_gpus_and_models_list_the_catalogues() -> None:
    _, gpus_table, _ = run("gpus")
    assert "H100-SXM" in gpus_table and "NVIDIA-H100-80GB-HBM3" in gpus_table
    _, models_table, _ = run("models")
    assert LLAMA in models_table
    assert {g["name"] for g in json.loads(run("gpus", "--json")[1])} >= {"H200", "L4", "MI300X"}
    assert LLAMA in {m["id"] for m in json.loads(run("models", "--json")[1])}


def test_estimate_prints_one_row_per_case(tmp_path: Path) -> None:
    cases = [
        {"id": "a", "hf_config": models.lookup_model_config(LLAMA), "gpu": "H100-SXM", "max_model_len": 8192},
        {"id": "b", "model": "acme/not-in-the-catalogue", "gpu": "H100-SXM"},
        {"id": "c", "hf_config": models.lookup_model_config(LLAMA), "gpu": "Imaginary-GPU"},
    ]
    file = tmp_path / "cases.json"
    file.write_text(json.dumps(cases))
    code, out, err = run("estimate", "--cases", str(file))
    assert code == 0, err
    rows = json.loads(out)
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["error"] is None and rows[0]["starts"] is True
    assert rows[1]["error"] and rows[2]["error"]  # questions the model answers: per row, not refused


_GOOD = {"id": "ok", "model": LLAMA, "gpu": "H100-SXM", "max_model_len": 8192}
HOSTILE_CASES: dict[str, tuple[object, str]] = {
    "not-an-object": ([_GOOD, 7], "case #1 must be a JSON object"),
    "id-wrong-type": ([{**_GOOD, "id": {"x": 1}}], "case #0: id must be a string or an integer"),
    "len-a-string": ([{**_GOOD, "max_model_len": "8"}], 'case "ok" (#0): max_model_len must be an integer'),
    "len-a-float": ([{**_GOOD, "max_model_len": 8192.5}], "max_model_len must be an integer"),
    "len-a-bool": ([{**_GOOD, "max_model_len": True}], "max_model_len must be an integer"),
    "len-huge": ([{**_GOOD, "max_model_len": 10**30}], "max_model_len must be an integer in [1, 16777216]"),
    "len-zero": ([{**_GOOD, "max_model_len": 0}], "max_model_len must be an integer"),
    "seqs-negative": ([{**_GOOD, "max_num_seqs": -4}], "max_num_seqs must be an integer"),
    "tp-huge": ([{**_GOOD, "tensor_parallel_size": 4096}], "tensor_parallel_size must be an integer in"),
    "util-nan": ([{**_GOOD, "gpu_memory_utilization": float("nan")}], "gpu_memory_utilization must be"),
    "util-above-one": ([{**_GOOD, "gpu_memory_utilization": 1.5}], "gpu_memory_utilization must be"),
    "gib-infinite": ([{**_GOOD, "gpu": None, "gpu_total_gib": float("inf")}], "gpu_total_gib must be"),
    "gib-huge": ([{**_GOOD, "gpu_total_gib": 1e308}], "gpu_total_gib must be a number"),
    "gpu-a-number": ([{**_GOOD, "gpu": 80}], "gpu must be a string"),
    "eager-a-string": ([{**_GOOD, "enforce_eager": "yes"}], "enforce_eager must be true or false"),
    "config-a-list": ([{**_GOOD, "hf_config": [1, 2]}], "hf_config must be a JSON object"),
    "no-model": ([{"id": "x", "gpu": "L4"}], 'case "x" (#0): hf_config (the model\'s config.json) or model'),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CASES))
def test_estimate_refuses_a_bad_case_in_one_line_naming_case_and_field(case: str, tmp_path: Path) -> None:
    cases, expected = HOSTILE_CASES[case]
    file = tmp_path / "cases.json"
    file.write_text(json.dumps(cases))  # NaN and Infinity as Python's json writes (and reads) them
    code, out, err = run("estimate", "--cases", str(file))
    assert (code, out) == (cli.EXIT_USAGE, "")
    assert err.startswith(f"kvpilot: error: {file}: ") and err.count("\n") == 1, err
    assert expected in err, err


def test_estimate_refuses_deep_nesting_without_a_traceback(tmp_path: Path) -> None:
    file = tmp_path / "deep.json"
    file.write_text("[" * 100_000 + "]" * 100_000)
    proc = run_process("estimate", "--cases", str(file))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "nested too deeply" in proc.stderr, proc.stderr[-500:]


def test_estimate_runs_over_the_calibration_cases() -> None:
    code, out, _ = run("estimate", "--cases", str(CASES_FILE))
    assert code == 0
    assert len(json.loads(out)) == len(json.loads(CASES_FILE.read_text()))


def test_render_prints_service_and_deployment(tmp_path: Path) -> None:
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(
        "apiVersion: kvpilot.io/v1alpha1\nkind: InferenceService\nmetadata: {name: llama, namespace: ml}\n"
        f"spec:\n  model: {{id: {LLAMA}}}\n  gpu: {{count: 1, product: H100-SXM}}\n"
    )
    code, out, err = run("render", "-f", str(manifest))
    assert code == 0, err
    assert "kind: Service" in out and "kind: Deployment" in out
    assert "--max-model-len" in out
    assert "&id" not in out


# -- error paths: one message, exit 2, never a traceback -------------------------------------------


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "malformed": ("cases.json", "[{not json"),
        "object": ("cases.json", '{"id": "a"}'),
        "config-list": ("config.json", "[1, 2]"),
        "config-deep": ("config.json", '{"text_config": ' + "[" * 50_000 + "]" * 50_000 + "}"),
        "config-negative-heads": (
            "config.json",
            '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": -8}',
        ),
        "yaml": ("isvc.yaml", "spec: [unclosed"),
        "not-isvc": ("isvc.yaml", "- 1\n- 2\n"),
        "bad-spec": ("isvc.yaml", "kind: InferenceService\nspec: {model: {id: 3}, gpu: {count: -1}}\n"),
    }
    paths = {}
    for name, (filename, text) in files.items():
        folder = tmp_path / name
        folder.mkdir()
        paths[name] = folder / filename
        paths[name].write_text(text)
    return paths


ERROR_CASES = {
    "unknown-gpu": (["plan", "--model", LLAMA, "--gpu", "H1000"], "H1000"),
    "unknown-model": (["plan", "--model", "acme/unknown-7b", "--gpu", "H100-SXM"], "--config"),
    "missing-config": (["plan", "--config", "/nonexistent/config.json", "--gpu", "L4"], "cannot read"),
    "config-list": (["plan", "--config", "{config-list}", "--gpu", "L4"], "JSON object"),
    "config-deep": (["plan", "--config", "{config-deep}", "--gpu", "L4"], "deeper than 32 levels"),
    "config-negative-heads": (
        ["plan", "--config", "{config-negative-heads}", "--gpu", "L4"],
        "num_attention_heads must be a positive integer, got -8",
    ),
    "malformed-cases": (["estimate", "--cases", "{malformed}"], "not valid JSON"),
    "cases-not-a-list": (["estimate", "--cases", "{object}"], "JSON list"),
    "missing-cases": (["estimate", "--cases", "/nonexistent.json"], "cannot read"),
    "bad-yaml": (["render", "-f", "{yaml}"], "not valid YAML"),
    "not-isvc": (["render", "-f", "{not-isvc}"], "InferenceService"),
    "bad-spec": (["render", "-f", "{bad-spec}"], "spec"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_errors_are_one_message_and_exit_2(case: str, tmp_path: Path) -> None:
    argv, expected = ERROR_CASES[case]
    paths = {name: str(path) for name, path in _bad_files(tmp_path).items()}
    argv = [arg.format(**paths) if arg.startswith("{") else arg for arg in argv]
    code, out, err = run(*argv)
    assert code == cli.EXIT_USAGE
    assert err.startswith("kvpilot: error: ")
    assert expected in err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", ["unknown-gpu", "malformed-cases", "cases-not-a-list", "bad-yaml"])
def test_error_paths_as_a_process(case: str, tmp_path: Path) -> None:
    argv, expected = ERROR_CASES[case]
    paths = {name: str(path) for name, path in _bad_files(tmp_path).items()}
    proc = run_process(*[arg.format(**paths) if arg.startswith("{") else arg for arg in argv])
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "argv",
    [[], ["plan"], ["plan", "--model", LLAMA], ["plan", "--model", LLAMA, "--gpu", "L4", "--gpus", "0"]],
)
def test_usage_errors_exit_2_without_traceback(argv: list[str]) -> None:
    proc = run_process(*argv)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unexpected_failures_are_still_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(models, "lookup_model_config", boom)
    code, _, err = run("plan", "--model", LLAMA, "--gpu", "L4")
    assert code == 2
    assert "kaboom" in err


def test_plan_for_the_engine_flags_the_pods_run() -> None:
    """--engine-args: an eager engine reserves no CUDA graphs; an abbreviation is refused by name."""
    base = ("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--json")
    graphs = json.loads(run(*base)[1])["budget"]
    eager = json.loads(run(*base, "--engine-args=--enforce-eager")[1])["budget"]
    assert graphs["cuda_graph_gib"] > 0 and eager["cuda_graph_gib"] == 0
    assert eager["kv_cache_tokens"] > graphs["kv_cache_tokens"]
    code, _, err = run(*base, "--engine-args=--perf interactivity")
    assert code == 2 and "--performance-mode" in err


def test_plan_shows_the_mtp_drafter_in_the_budget() -> None:
    """--engine-args with --speculative-config: DeepSeek-V3's MTP drafter is a line of the weights; a bad
    JSON value is refused naming the flag."""
    base = ("plan", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H200", "--gpus", "8")
    mtp = (
        """--engine-args=--speculative-config '{"method":"mtp","num_speculative_tokens":1}'"""  # shell-quoted
    )
    code, out, err = run(*base, mtp)
    assert code == 0, err
    assert "    (of which drafter)           1.66" in out
    assert (
        "warning: --speculative-config (method mtp, 1 draft token): the MTP drafter's 1 layer takes 1.66 GiB"
        in out
    )
    plain = run(*base)[1]
    assert "MTP drafter" not in plain and "71,424 B per token" in out and "70,272 B per token" in plain
    code, _, err = run(*base, "--engine-args=--speculative-config {method:mtp}")
    assert code == 2 and "--speculative-config takes a JSON object" in err


EAGLE3_DRAFT = (
    Path(__file__).resolve().parent / "data" / "eagle3" / "yuhuili__EAGLE3-LLaMA3.1-Instruct-8B.json"
)
EAGLE3 = (
    "--engine-args=--speculative-config "
    """'{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'"""
)


def test_plan_budgets_an_eagle3_drafter_given_its_config(tmp_path: Path) -> None:
    """--draft-config (a config.json, or a folder holding one) budgets the EAGLE3 drafter; without it the
    plan warns naming --draft-config."""
    base = ("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--max-context", "8192", "--json")
    code, out, err = run(*base, EAGLE3)
    assert code == 0, err
    unread = json.loads(out)
    assert unread["budget"]["speculative_gib"] == 0
    assert any("--draft-config PATH" in w for w in unread["warnings"])
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text(EAGLE3_DRAFT.read_text())
    for given in (str(EAGLE3_DRAFT), str(folder)):
        code, out, err = run(*base, EAGLE3, "--draft-config", given)
        assert code == 0, err
        plan = json.loads(out)
        assert plan["budget"]["speculative_gib"] > 0.8
        assert plan["budget"]["kv_cache_tokens"] < unread["budget"]["kv_cache_tokens"]
        assert not any("--draft-config PATH" in w for w in plan["warnings"])
        assert any(
            w.startswith("--speculative-config (method eagle3, 3 draft tokens)") for w in plan["warnings"]
        )
    code, out, err = run(*base[:-1], EAGLE3, "--draft-config", str(EAGLE3_DRAFT))
    assert code == 0 and "(of which drafter)" in out, err


def test_plan_refuses_a_draft_config_it_cannot_use(tmp_path: Path) -> None:
    base = ("plan", "--model", LLAMA, "--gpu", "H100-SXM")
    code, _, err = run(*base, "--draft-config", str(EAGLE3_DRAFT))
    assert code == 2 and "--draft-config gives a draft checkpoint's config.json" in err
    assert "no --speculative-config" in err
    mtp = """--engine-args=--speculative-config '{"method":"ngram","num_speculative_tokens":3}'"""
    code, _, err = run(*base, mtp, "--draft-config", str(EAGLE3_DRAFT))
    assert code == 2 and "(got method 'ngram')" in err
    code, _, err = run(*base, EAGLE3, "--draft-config", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err
    qwen = tmp_path / "qwen.json"
    qwen.write_text(
        json.dumps({**json.loads(EAGLE3_DRAFT.read_text()), "architectures": ["Qwen3ForCausalLM"]})
    )
    code, _, err = run(*base, EAGLE3, "--draft-config", str(qwen))
    assert code == 2 and "kvpilot does not model" in err
    code, _, err = run(*base, "--engine", "sglang", "--draft-config", str(EAGLE3_DRAFT))
    assert code == 2 and "--engine vllm only" in err
    (tmp_path / "deep.json").write_text("[" * 100 + "]" * 100)
    code, _, err = run(*base, EAGLE3, "--draft-config", str(tmp_path / "deep.json"))
    assert code == 2, err


QWEN3_06B = Path(__file__).resolve().parent / "data" / "hf_configs" / "Qwen__Qwen3-0.6B.json"
DRAFT_MODEL = (
    """--engine-args=--speculative-config '{"model":"Qwen/Qwen3-0.6B","num_speculative_tokens":4}'"""
)


def test_plan_budgets_a_draft_model_given_its_config(tmp_path: Path) -> None:
    """A ``model`` without a method is vLLM's draft_model: --draft-config budgets the whole draft and its
    28 KV layers; without it the plan names --draft-config; a draft vLLM reads as MTP is refused."""
    base = ("plan", "--model", "Qwen/Qwen3-32B", "--gpu", "H100-SXM", "--max-context", "8192", "--json")
    code, out, err = run(*base, DRAFT_MODEL)
    assert code == 0, err
    unread = json.loads(out)
    assert unread["budget"]["speculative_gib"] == 0
    assert any("--draft-config PATH" in w for w in unread["warnings"])
    code, out, err = run(*base, DRAFT_MODEL, "--draft-config", str(QWEN3_06B))
    assert code == 0, err
    plan = json.loads(out)
    assert 1.11 <= plan["budget"]["speculative_gib"] < 1.12
    assert plan["budget"]["kv_bytes_per_token"] == 376_832 > unread["budget"]["kv_bytes_per_token"]
    assert any(
        w.startswith("--speculative-config (method draft_model, 4 draft tokens)") for w in plan["warnings"]
    )
    mtp = tmp_path / "mtp.json"
    mtp.write_text(json.dumps({**json.loads(QWEN3_06B.read_text()), "model_type": "deepseek_mtp"}))
    code, _, err = run(*base, DRAFT_MODEL, "--draft-config", str(mtp))
    assert code == 2 and "as method 'mtp'" in err


def test_plan_for_a_release_newer_than_modelled_warns() -> None:
    code, out, err = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--vllm-version", "9.9.9")
    assert code == 0, err
    assert "warning: vLLM 9.9.9 is newer than the newest release kvpilot models (0.33.0)" in out


def test_plan_refuses_an_unparseable_release() -> None:
    code, _, err = run("plan", "--model", LLAMA, "--gpu", "H100-SXM", "--vllm-version", "nightly")
    assert code == 2 and "'nightly'" in err


def test_plan_refuses_an_architecture_vllm_does_not_serve(tmp_path: Path) -> None:
    config = dict(models.lookup_model_config(LLAMA))
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = run("plan", "--config", str(tmp_path), "--gpu", "H100-SXM")
    assert code == 2, out
    assert "vLLM 0.33 does not support architecture NoSuchModelForCausalLM" in err


# -- plan --engine sglang -----------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["L4", "H100-SXM", "B200"])
def test_plan_sglang_prints_its_budget_explained(gpu: str) -> None:
    code, out, err = run(
        "plan", "--engine", "sglang", "--model", LLAMA, "--gpu", gpu, "--max-context", "8192"
    )
    assert code == 0, err
    assert "(SGLang 0.5.23)" in out and "--mem-fraction-static" in out and "--context-length 8192" in out
    for text in ("Reserved outside --mem-fraction-static", "= KV pool", "max_total_num_tokens"):
        assert text in out, text


def test_plan_sglang_json_and_infeasible_exit() -> None:
    code, out, _ = run("plan", "--engine", "sglang", "--model", LLAMA, "--gpu", "T4", "--json")
    plan = json.loads(out)
    assert code == 1 and plan["feasible"] is False and plan["engine"] == "SGLang"
    assert plan["args"][:2] == ["--context-length", "131072"]
    code, out, _ = run(
        "plan", "--engine", "sglang", "--model", LLAMA, "--gpu", "H200", "--gpus", "2", "--json"
    )
    plan = json.loads(out)
    assert code == 0 and plan["args"][-2:] == ["--tp-size", "2"] and plan["max_total_tokens"] > 0


def test_plan_sglang_takes_an_fp8_kv_cache_where_allowed() -> None:
    """On an L4, 32K of Llama-3.1-8B fits SGLang's pool only in fp8."""
    base = ("plan", "--engine", "sglang", "--model", LLAMA, "--gpu", "L4", "--max-context", "32768", "--json")
    code, out, _ = run(*base)
    assert code == 1 and "--kv-cache-dtype" not in json.loads(out)["args"]
    code, out, _ = run(*base, "--allow-fp8-kv")
    plan = json.loads(out)
    assert code == 0 and plan["feasible"] and "fp8_e4m3" in plan["args"]


def test_an_infeasible_sglang_plan_says_an_fp8_kv_cache_would_fit_and_how_to_allow_it() -> None:
    """As vLLM's infeasible plan: on an L4, 32K of Llama-3.1-8B misses SGLang's 16-bit pool, the fp8 one holds
    it; the plan names the dtype and the permission. Not on an A10G (no fp8 KV), nor at 64K (fp8 misses)."""
    base = ("plan", "--engine", "sglang", "--model", LLAMA, "--max-context")
    code, out, _ = run(*base, "32768", "--gpu", "L4")
    hint = "An fp8 KV cache (--kv-cache-dtype fp8_e4m3) fits"
    assert (
        code == 1 and hint in out and "spec.tuning.allowFp8KvCache: true" in out and "--allow-fp8-kv" in out
    )
    code, out, _ = run(*base, "32768", "--gpu", "L4", "--json")
    assert code == 1 and json.loads(out)["explanation"][-1].startswith(hint)
    for gpu, context in (("A10G", "32768"), ("L4", "65536")):
        code, out, _ = run(*base, context, "--gpu", gpu)
        assert code == 1 and "fp8" not in out.split("Does not fit")[-1]


def test_plan_engine_vllm_is_the_default() -> None:
    assert run("plan", "--model", LLAMA, "--gpu", "L4") == run(
        "plan", "--engine", "vllm", "--model", LLAMA, "--gpu", "L4"
    )


def test_plan_sglang_refuses_what_it_does_not_model() -> None:
    code, _, err = run("plan", "--engine", "sglang", "--model", LLAMA, "--gpu", "L4", "--min-context", "8192")
    assert code == 2 and "--min-context is not supported with --engine sglang" in err
    code, _, err = run(
        "plan", "--engine", "sglang", "--model", "mistralai/Mistral-7B-Instruct-v0.1", "--gpu", "L4"
    )
    assert code == 2 and "full-attention and MLA models only" in err


def test_plan_sglang_over_nodes_is_one_engine_of_every_gpu() -> None:
    """--nodes 2 of 8 H100s: one SGLang engine, --tp-size 16 (as gpu.nodesPerReplica renders it), each rank
    holding a sixteenth of the weights; --gpus disagreeing with the nodes is refused."""
    one = json.loads(run("plan", "--engine", "sglang", "--model", LLAMA_70B, "--gpu", "H100", "--json")[1])
    code, out, _ = run(
        "plan", "--engine", "sglang", "--model", LLAMA_70B, "--gpu", "H100", "--nodes", "2", "--json"
    )
    two = json.loads(out)
    assert code == 0 and two["args"][-2:] == ["--tp-size", "16"]
    assert two["max_total_tokens"] > one["max_total_tokens"]
    code, _, err = run(
        "plan", "--engine", "sglang", "--model", LLAMA_70B, "--gpu", "H100", "--nodes", "2", "--gpus", "8"
    )
    assert code == 2 and "--gpus 8 is not --nodes 2 x --gpus-per-node 8" in err


# -- plan --engine tgi --------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["L4", "A100-80GB", "H100-SXM"])
def test_plan_tgi_prints_its_budget_and_launcher_flags(gpu: str) -> None:
    code, out, err = run("plan", "--engine", "tgi", "--model", LLAMA, "--gpu", gpu)
    assert code == 0, err
    assert "(TGI 3.3.7)" in out
    for flag in (
        "--max-input-tokens",
        "--max-total-tokens",
        "--max-batch-prefill-tokens",
        "--max-concurrent-requests",
    ):
        assert flag in out, flag
    for text in ("compute-optimal", "Warm-up batch", "max batch total tokens", "request(s) at once"):
        assert text in out, text
    assert "--num-shard" not in out and "--cuda-memory-fraction" not in out


def test_plan_tgi_json_context_shards_and_infeasible_exit() -> None:
    code, out, _ = run(
        "plan", "--engine", "tgi", "--model", LLAMA, "--gpu", "L4", "--max-context", "8192", "--json"
    )
    plan = json.loads(out)
    assert code == 0 and plan["engine"] == "TGI" and plan["feasible"] is True
    assert plan["args"][:4] == ["--max-input-tokens", "8191", "--max-total-tokens", "8192"]
    assert plan["concurrency"] == plan["max_batch_total_tokens"] // 8192
    seventy = "meta-llama/Llama-3.1-70B-Instruct"
    code, out, _ = run("plan", "--engine", "tgi", "--model", seventy, "--gpu", "H100-SXM", "--json")
    assert code == 1 and json.loads(out)["feasible"] is False
    code, out, _ = run("plan", "--engine", "tgi", "--model", seventy, "--gpu", "H100-SXM", "--gpus", "4")
    assert code == 0 and "--num-shard 4" in out


def test_plan_tgi_refuses_an_unknown_architecture_by_name(tmp_path: Path) -> None:
    config = dict(models.lookup_model_config(LLAMA), model_type="kvpilot_unknown")
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _, err = run("plan", "--engine", "tgi", "--config", str(tmp_path), "--gpu", "L4")
    assert code == 2 and "no model of its own for model_type 'kvpilot_unknown'" in err
    code, _, err = run("plan", "--engine", "tgi", "--model", "Qwen/Qwen3-8B", "--gpu", "L4")
    assert code == 2 and "model_type 'qwen3'" in err
    code, _, err = run("plan", "--engine", "tgi", "--model", LLAMA, "--gpu", "L4", "--allow-fp8-kv")
    assert code == 2 and "--allow-fp8-kv is not supported with --engine tgi" in err
