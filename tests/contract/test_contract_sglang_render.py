"""Contract: the SGLang pod the operator renders (``spec.engine.kind: SGLang``) parses with SGLang's parser.

``kvpilot render``'s container arguments for SGLang InferenceServices (Auto with the plan's flags, a
revision, an extra arg; Recommend with SGLang's defaults) go through ``ServerArgs.add_cli_args`` of SGLang
0.5.23 in ``.venv-sglang`` (``sglang_probe.py``, prefixes refused), and the values SGLang reads back are the
ones kvpilot planned. Never skipped: without ``.venv-sglang`` it fails, naming ``make sglang-venv``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpilot.operator.inferenceservice import render
from kvpilot.tuner import sglang

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
PROBE = Path(__file__).with_name("sglang_probe.py")
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _isvc(**spec: Any) -> dict[str, Any]:
    engine = {"kind": "SGLang", "image": "lmsysorg/sglang:v0.5.23", **spec.pop("engine", {})}
    body: dict[str, Any] = {"model": {"id": LLAMA_8B}, "gpu": {"count": 1, "product": "L4"}, "engine": engine}
    return {"kind": "InferenceService", "metadata": {"name": "s"}, "spec": {**body, **spec}}


CASES = {
    "auto": _isvc(serving={"maxContextLength": 16384, "concurrency": 24}),
    "auto-tp2-revision-extra": _isvc(
        model={"id": LLAMA_8B, "revision": "main"},
        gpu={"count": 2, "product": "L4"},
        engine={"extraArgs": ["--trust-remote-code"]},
    ),
    "tp2-pp2": _isvc(gpu={"count": 4, "product": "L4", "tensorParallelSize": 2}),
    "recommend": _isvc(tuning={"mode": "Recommend"}),
}


def _container(body: dict[str, Any]) -> dict[str, Any]:
    deployment = next(m for m in render.build_manifests(body) if m["kind"] == "Deployment")
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    if not PYTHON.exists():
        pytest.fail(
            f"SGLang {sglang.PINNED_SGLANG_VERSION} is required for this contract and {PYTHON} is missing: "
            "build it with `make sglang-venv`.",
            pytrace=False,
        )
    request = json.dumps({"parse": argvs, "resolve": []})
    done = subprocess.run(
        [str(PYTHON), str(PROBE)], input=request, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    answer = json.loads(done.stdout)
    assert answer["version"] == sglang.PINNED_SGLANG_VERSION
    return list(answer["parse"])


def test_rendered_sglang_args_parse_with_sglangs_parser_to_the_planned_values() -> None:
    containers = {name: _container(body) for name, body in CASES.items()}
    parsed = dict(zip(containers, _parse([c["args"] for c in containers.values()]), strict=True))
    for name, c in containers.items():
        args, got = c["args"], parsed[name]
        assert "error" not in got, (name, got)
        assert got["model_path"] == LLAMA_8B and got["enable_metrics"] is True, name
        assert (got["host"], got["port"]) == ("0.0.0.0", c["ports"][0]["containerPort"]), name
        for field, flag in sglang.FLAGS.items():  # every planned flag read back as rendered
            text = _flag(args, flag)
            if text is not None:
                assert str(got[field]) == text, (name, field)
    auto = parsed["auto"]
    assert auto["context_length"] == 16384 and auto["tp_size"] == 1 and 0 < auto["mem_fraction_static"] < 1
    assert auto["max_running_requests"] == 24
    assert parsed["auto-tp2-revision-extra"]["tp_size"] == 2
    assert (parsed["tp2-pp2"]["tp_size"], parsed["tp2-pp2"]["pp_size"]) == (2, 2)
    recommend = parsed["recommend"]
    assert recommend["mem_fraction_static"] is None and recommend["context_length"] is None


def test_a_group_over_two_nodes_parses_as_one_engine_of_tensor_parallel_ranks_on_each() -> None:
    """gpu.nodesPerReplica 2: a LeaderWorkerSet whose leader and worker run SGLang with its own node flags;
    with LWS's variables substituted as the kubelet does, SGLang's parser reads one engine of 16 TP ranks
    over two nodes, rank 0 the leader (which alone serves the API), rendezvous at the leader's address."""
    body = _isvc(
        model={"id": "meta-llama/Llama-3.1-70B-Instruct"},
        gpu={"count": 8, "product": "H100-SXM", "nodesPerReplica": 2},
    )
    group = next(m for m in render.build_manifests(body) if m["kind"] == "LeaderWorkerSet")
    roles = group["spec"]["leaderWorkerTemplate"]
    leader, worker = (roles[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    env = {"$(LWS_LEADER_ADDRESS)": "s-0.s.team", "$(LWS_WORKER_INDEX)": "1"}
    argvs = [
        [env.get(a, a).replace("$(LWS_LEADER_ADDRESS)", "s-0.s.team") for a in c["args"]]
        for c in (leader, worker)
    ]
    got_leader, got_worker = _parse(argvs)
    for got in (got_leader, got_worker):
        assert "error" not in got, got
        assert (got["tp_size"], got["nnodes"], got["dist_init_addr"]) == (16, 2, "s-0.s.team:20000")
    assert (got_leader["node_rank"], got_worker["node_rank"]) == (0, 1)
    assert "ports" in leader and "readinessProbe" in leader
    assert "ports" not in worker and "readinessProbe" not in worker
