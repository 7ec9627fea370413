"""kvpilot.tuner.vllm.command: the vLLM engine in other stacks' command lines, read and rewritten."""

from __future__ import annotations

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import command as c

# vLLM production-stack's chart (helm/templates/deployment-vllm-multi.yaml): everything in `command`,
# underscores in --gpu_memory_utilization.
PRODUCTION_STACK = [
    "vllm",
    "serve",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--no-enable-prefix-caching",
    "--max-model-len",
    "131072",
    "--dtype",
    "bfloat16",
    "--max-num-seqs",
    "256",
    "--gpu_memory_utilization",
    "0.95",
]
# KServe's vLLM runtime (config/runtimes/kserve-vllmserver.yaml): a bash script passing "$@".
KSERVE_COMMAND = [
    "bash",
    "-c",
    "export MODEL=${MODEL_DIR}\nvllm serve ${MODEL} --host 0.0.0.0 --port 8000 $@\n",
    "bash",
]
KSERVE_ARGS = ["--max-model-len=65536", "--max-num-seqs", "128"]


def test_production_stack_form() -> None:
    found = c.find_vllm_command(PRODUCTION_STACK, [])
    assert found is not None and found.form == "vllm serve" and not found.in_args
    assert found.model == "meta-llama/Llama-3.1-8B-Instruct"
    s = c.compute_command_settings(found)
    assert (s.max_model_len, s.max_num_seqs, s.gpu_memory_utilization) == (131072, 256, 0.95)


def test_kserve_shell_form_reads_the_positional_flags() -> None:
    found = c.find_vllm_command(KSERVE_COMMAND, KSERVE_ARGS)
    assert found is not None and found.form == "shell" and found.in_args
    assert found.model == "${MODEL}"
    s = c.compute_command_settings(found)
    assert (s.max_model_len, s.max_num_seqs) == (65536, 128)


def test_api_server_form_and_binary_path() -> None:
    found = c.find_vllm_command(["python3", "-m", c.API_SERVER_MODULE], ["--model", "org/m", "-tp", "2"])
    assert found is not None and found.form == "api_server" and found.model == "org/m"
    assert c.compute_command_settings(found).tensor_parallel_size == 2
    found = c.find_vllm_command(["/opt/venv/bin/vllm", "serve", "--model=org/x"], [])
    assert found is not None and found.model == "org/x"


def test_not_vllm() -> None:
    assert c.find_vllm_command(["python", "server.py"], ["--port", "80"]) is None
    assert c.find_vllm_command(["sh", "-c", "exec nginx"], []) is None


def test_config_file_args_are_overridden_by_the_command_line() -> None:
    found = c.find_vllm_command(
        ["vllm", "serve", "m/x", "--config", "/etc/v/c.yaml", "--max-num-seqs", "8"], []
    )
    assert found is not None and found.config_file == "/etc/v/c.yaml"
    config = c.build_config_file_args({"max-num-seqs": 64, "max_model_len": 4096, "enforce-eager": True})
    s = c.compute_command_settings(found, config)
    assert (s.max_num_seqs, s.max_model_len) == (8, 4096)


def test_rewrite_production_stack_changes_only_tuned_flags() -> None:
    found = c.find_vllm_command(PRODUCTION_STACK, [])
    assert found is not None
    want = EngineSettings(
        max_model_len=16384, max_num_seqs=32, gpu_memory_utilization=0.9, tensor_parallel_size=4
    )
    cmd, args = c.rewrite_tuned_flags(PRODUCTION_STACK, [], found, want)
    assert args == []
    assert cmd[:10] == PRODUCTION_STACK[:8] + ["--dtype", "bfloat16"]  # untouched, in order
    again = c.find_vllm_command(cmd, args)
    assert again is not None
    s = c.compute_command_settings(again)
    assert (s.max_model_len, s.max_num_seqs, s.gpu_memory_utilization) == (16384, 32, 0.9)
    assert s.tensor_parallel_size is None  # the pod's shape is not rewritten
    assert "--gpu_memory_utilization" not in cmd and cmd.count("--max-model-len") == 1


def test_rewrite_removes_a_flag_the_plan_leaves_at_vllms_default() -> None:
    cmd = ["vllm", "serve", "m/x", "--max-num-batched-tokens=512", "--max-num-seqs", "4"]
    found = c.find_vllm_command(cmd, [])
    assert found is not None
    new, _ = c.rewrite_tuned_flags(cmd, [], found, EngineSettings(max_num_seqs=16))
    assert new == ["vllm", "serve", "m/x", "--max-num-seqs", "16"]


def test_rewrite_kserve_edits_args_only() -> None:
    found = c.find_vllm_command(KSERVE_COMMAND, KSERVE_ARGS)
    assert found is not None
    cmd, args = c.rewrite_tuned_flags(KSERVE_COMMAND, KSERVE_ARGS, found, EngineSettings(max_model_len=8192))
    assert cmd == KSERVE_COMMAND
    assert args == ["--max-model-len", "8192"]


def test_bad_tuned_value_is_refused() -> None:
    found = c.find_vllm_command(["vllm", "serve", "m/x", "--max-num-seqs", "many"], [])
    assert found is not None
    with pytest.raises(errors.InvalidEngineArgs):
        c.compute_command_settings(found)
