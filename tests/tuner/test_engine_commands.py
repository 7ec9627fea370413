"""SGLang's and TGI's command lines as other stacks write them (:mod:`kvpilot.tuner.sglang.command`,
:mod:`kvpilot.tuner.tgi.command`): found, read with each engine's own parser, rewritten with its renderer
(the owner's other flags kept). TGI's environment variables are checked against the launcher's source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpilot.tuner import errors, sglang, tgi
from kvpilot.tuner.sglang import command as sglang_command
from kvpilot.tuner.tgi import command as tgi_command

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
LAUNCHER_SOURCE = Path(__file__).resolve().parents[1] / "data" / "tgi" / "launcher_args_v3.3.7.rs"


@pytest.mark.parametrize(
    ("command", "args", "form", "in_args"),
    [
        (
            ["python3", "-m", "sglang.launch_server"],
            ["--model-path", LLAMA, "--port", "30000"],
            "launch_server",
            True,
        ),
        (
            ["python3", "-m", "sglang.launch_server", "--model", LLAMA, "--port", "30000"],
            [],
            "launch_server",
            False,
        ),
        (
            ["/usr/bin/python", "/sgl/python/sglang/launch_server.py", "--model-path", LLAMA],
            [],
            "launch_server",
            False,
        ),
        (["sglang", "serve", LLAMA, "--port", "30000"], [], "sglang serve", False),
        (["sglang", "serve"], ["--model-path", LLAMA, "--port", "30000"], "sglang serve", True),
    ],
)
def test_sglangs_exec_forms(command: list[str], args: list[str], form: str, in_args: bool) -> None:
    found = sglang_command.find_sglang_command(command, args)
    assert found is not None
    assert (found.form, found.model, found.in_args) == (form, LLAMA, in_args)
    assert LLAMA not in found.flags or "--model" in " ".join(found.flags)  # a positional model is no flag


def test_sglangs_aliases_and_shell_form() -> None:
    found = sglang_command.find_sglang_command(
        ["python3", "-m", "sglang.launch_server"],
        [
            "--model-path",
            LLAMA,
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size=2",
            "--page-size",
            "16",
        ],
    )
    assert found is not None
    settings = sglang_command.compute_command_settings(found)
    assert (settings.tp_size, settings.pp_size, settings.page_size) == (2, 2, 16)
    script = 'exec python3 -m sglang.launch_server --model-path "$MODEL" --mem-fraction-static 0.8 "$@"'
    shell = sglang_command.find_sglang_command(["sh", "-c", script, "sh"], ["--max-running-requests", "8"])
    assert shell is not None and (shell.form, shell.model, shell.rewritable) == ("shell", "$MODEL", True)
    settings = sglang_command.compute_command_settings(shell)
    assert (settings.mem_fraction_static, settings.max_running_requests) == (0.8, 8)
    closed = sglang_command.find_sglang_command(
        ["sh", "-c", "python3 -m sglang.launch_server --model-path m"], []
    )
    assert closed is not None and not closed.rewritable
    with pytest.raises(errors.InvalidEngineArgs, match=r"\$@"):
        sglang_command.rewrite_tuned_flags(["sh", "-c", "x"], [], closed, sglang.SglangSettings(page_size=1))
    assert sglang_command.find_sglang_command(["vllm", "serve", LLAMA], []) is None
    assert sglang_command.find_sglang_command(["sh", "-c", "ollama serve"], []) is None


def test_sglangs_rewrite_keeps_the_owners_flags_and_shape() -> None:
    command = ["python3", "-m", "sglang.launch_server"]
    args = [
        "--model-path", LLAMA, "--host", "0.0.0.0", "--port", "30000", "--enable-metrics",
        "--mem-fraction-static", "0.9", "--tensor-parallel-size", "2", "--context-length=131072",
    ]  # fmt: skip
    found = sglang_command.find_sglang_command(command, args)
    assert found is not None
    wanted = sglang.SglangSettings(
        context_length=16384, mem_fraction_static=0.8, max_running_requests=32, tp_size=1
    )
    new_command, new_args = sglang_command.rewrite_tuned_flags(command, args, found, wanted)
    assert new_command == command
    assert new_args == [
        "--model-path", LLAMA, "--host", "0.0.0.0", "--port", "30000", "--enable-metrics",
        "--tensor-parallel-size", "2",  # the pod's shape: the owner's
        "--context-length", "16384", "--mem-fraction-static", "0.8", "--max-running-requests", "32",
    ]  # fmt: skip
    again = sglang_command.find_sglang_command(new_command, new_args)
    assert again is not None
    assert sglang_command.compute_command_settings(again) == sglang.SglangSettings(
        context_length=16384, mem_fraction_static=0.8, max_running_requests=32, tp_size=2
    )
    # flags in command stay in command
    inline = ["sglang", "serve", LLAMA, "--max-running-requests", "4"]
    found = sglang_command.find_sglang_command(inline, [])
    assert found is not None
    assert sglang_command.rewrite_tuned_flags(inline, [], found, wanted) == (
        ["sglang", "serve", LLAMA, *sglang.build_sglang_args(sglang.SglangSettings(16384, 0.8, 32))],
        [],
    )


@pytest.mark.parametrize(
    ("command", "args", "image", "form"),
    [
        (["text-generation-launcher"], ["--model-id", LLAMA, "--max-total-tokens", "8192"], "", "launcher"),
        (
            ["/usr/local/bin/text-generation-launcher", "--model-id", LLAMA, "--max-total-tokens", "8192"],
            [],
            "",
            "launcher",
        ),
        ([], ["--model-id", LLAMA, "--max-total-tokens", "8192"], TGI_IMAGE, "image"),
        (
            ["bash", "-c", 'text-generation-launcher --model-id "$M" "$@"', "bash"],
            ["--max-total-tokens", "8192"],
            "",
            "shell",
        ),
    ],
)
def test_tgis_forms(command: list[str], args: list[str], image: str, form: str) -> None:
    found = tgi_command.find_tgi_command(command, args, image, {"M": LLAMA})
    assert found is not None and found.form == form
    assert found.model in (LLAMA, "$M")
    assert tgi_command.compute_command_settings(found).max_total_tokens == 8192
    assert tgi_command.find_tgi_command([], ["--model-id", LLAMA], "registry.local/other:1", {}) is None


def test_tgis_environment_form() -> None:
    env = {"MODEL_ID": LLAMA, "MAX_TOTAL_TOKENS": "8192", "MAX_INPUT_TOKENS": "4096", "NUM_SHARD": "2"}
    found = tgi_command.find_tgi_command([], [], TGI_IMAGE, env)
    assert found is not None
    assert (found.form, found.model, found.model_from_env) == ("image", LLAMA, True)
    assert tgi_command.compute_command_settings(found) == tgi.TgiSettings(
        max_input_tokens=4096, max_total_tokens=8192, num_shard=2
    )
    # a flag on the command line wins over its variable (clap)
    found = tgi_command.find_tgi_command([], ["--max-total-tokens", "6144"], TGI_IMAGE, env)
    assert found is not None and tgi_command.compute_command_settings(found).max_total_tokens == 6144
    # nothing names the model: the launcher's default
    bare = tgi_command.find_tgi_command(["text-generation-launcher"], [], "", {})
    assert bare is not None and bare.model == tgi.MODEL_ID_DEFAULT


def test_tgis_rewrite_sets_flags_and_drops_their_variables() -> None:
    env = {"MODEL_ID": LLAMA, "MAX_TOTAL_TOKENS": "8192", "NUM_SHARD": "2"}
    args = ["--hostname", "0.0.0.0", "--max-batch-prefill-tokens", "4096"]
    found = tgi_command.find_tgi_command([], args, TGI_IMAGE, env)
    assert found is not None
    wanted = tgi.TgiSettings(max_total_tokens=4096, max_concurrent_requests=64, num_shard=1)
    command, new_args, drop = tgi_command.rewrite_tuned_flags([], args, found, wanted)
    assert command == []
    assert new_args == [
        "--hostname",
        "0.0.0.0",
        "--max-total-tokens",
        "4096",
        "--max-concurrent-requests",
        "64",
    ]
    assert "MAX_TOTAL_TOKENS" in drop and "NUM_SHARD" not in drop and "MODEL_ID" not in drop
    kept_env = {k: v for k, v in env.items() if k not in drop}
    again = tgi_command.find_tgi_command(command, new_args, TGI_IMAGE, kept_env)
    assert again is not None
    assert tgi_command.compute_command_settings(again) == tgi.TgiSettings(
        max_total_tokens=4096, max_concurrent_requests=64, num_shard=2
    )


def test_tgis_variables_are_the_launchers() -> None:
    """Every flag kvpilot reads from the environment is a ``#[clap(long, env)]`` field of the launcher's
    ``Args``, whose variable clap names after the field in upper case."""
    text = LAUNCHER_SOURCE.read_text()
    attrs = {
        m.group("name"): m.group("attrs")
        for m in re.finditer(r"#\[clap\((?P<attrs>[^\]]*)\)\]\s*(?P<name>\w+):", text)
    }
    assert len(attrs) > 50
    for flag in tgi.ENV_FLAGS:
        field = flag.removeprefix("--").replace("-", "_")
        assert re.search(r"\benv\b", attrs[field]), field
        assert tgi.env_name(flag) == field.upper()
    assert re.search(r'default_value = "([^"]*)"', attrs["model_id"]).group(1) == tgi.MODEL_ID_DEFAULT  # type: ignore[union-attr]
