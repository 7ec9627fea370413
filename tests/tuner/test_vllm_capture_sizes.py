"""CUDA-graph capture sizes per release, against each release's own ``_set_cudagraph_sizes``.

``tests/data/vllm_capture_sizes.json`` holds what the function of every wheel from 0.19 to 0.33
returns over a grid (``bench/vllm_capture_sizes.py`` ran the releases' own code); kvpilot's
:func:`kvpilot.tuner.vllm.cuda_graph_capture_sizes` must give the same sizes at every point.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kvpilot.tuner import vllm
from kvpilot.tuner.types import GIB, GpuSpec

DATA = json.loads((pathlib.Path(__file__).parent.parent / "data" / "vllm_capture_sizes.json").read_text())
H100 = GpuSpec("H100", 80 * GIB, (9, 0), True, "nvlink")
B200 = GpuSpec("B200", 178 * GIB, (10, 0), True, "nvlink")

CASES = [
    (release, point)
    for entry in DATA["functions"].values()
    for release in entry["releases"]
    for point in entry["points"]
]


def test_the_data_covers_every_modelled_release() -> None:
    releases = {release for release, _ in CASES}
    assert releases == {".".join(w.split(".")[:2]) for w in DATA["wheels"]}
    assert len(releases) == 15


@pytest.mark.parametrize(
    "release", sorted({r for r, _ in CASES}, key=lambda r: tuple(map(int, r.split("."))))
)
def test_capture_sizes_match_the_release_s_own_function(release: str) -> None:
    version = vllm.parse_version(release)
    points: list[dict[str, Any]] = [p for r, p in CASES if r == release]
    wrong = []
    for point in points:
        gpu = B200 if point["blackwell"] else H100
        ours = vllm.cuda_graph_capture_sizes(
            version, gpu, point["max_num_seqs"], point["max_num_batched_tokens"], point["performance_mode"]
        )
        if list(ours) != point["sizes"]:
            wrong.append((point, ours))
    assert not wrong, f"{len(wrong)} of {len(points)} points differ, e.g. {wrong[0]}"


def test_the_switches_sit_where_the_releases_put_them() -> None:
    """A mutation guard: moving either switch by one release makes the data disagree."""
    assert vllm.CAPTURE_OFF_GRID_SIZES_SINCE == (0, 31)
    assert vllm.BLACKWELL_CAPTURE_LIMIT_SINCE == (0, 28)
    assert 100 in vllm.cuda_graph_capture_sizes((0, 31), H100, 100, 8192)
    assert 100 not in vllm.cuda_graph_capture_sizes((0, 30), H100, 100, 8192)
    assert vllm.CAPTURE_BATCHED_TOKENS_SINCE == (0, 20)
    assert 300 in vllm.cuda_graph_capture_sizes((0, 20), H100, 256, 300)
    assert 300 not in vllm.cuda_graph_capture_sizes((0, 19), H100, 256, 300)
    assert max(vllm.cuda_graph_capture_sizes((0, 28), B200, 1024, 16384)) == 1024
    assert max(vllm.cuda_graph_capture_sizes((0, 27), B200, 1024, 16384)) == 512


SPEC_CASES = [
    (release, point)
    for entry in DATA["speculative"].values()
    for release in entry["releases"]
    for point in entry["points"]
]


def test_the_speculative_data_covers_every_release_and_count() -> None:
    assert {r for r, _ in SPEC_CASES} == {r for r, _ in CASES}
    assert {p["num_speculative_tokens"] for _, p in SPEC_CASES} == {1, 3, 4}


@pytest.mark.parametrize(
    "release", sorted({r for r, _ in SPEC_CASES}, key=lambda r: tuple(map(int, r.split("."))))
)
def test_speculative_sizes_match_the_release_s_own_functions(release: str) -> None:
    """The config's sizes (``_set_cudagraph_sizes`` at decode query length 1 + k), the V1 runner's re-cut
    (``adjust_cudagraph_sizes_for_spec_decode``) and its FULL decode sizes (``initialize_cudagraph_keys``),
    each release's own code, at every point."""
    version = vllm.parse_version(release)
    points: list[dict[str, Any]] = [p for r, p in SPEC_CASES if r == release]
    wrong = []
    for point in points:
        gpu = B200 if point["blackwell"] else H100
        k = point["num_speculative_tokens"]
        sizes = vllm.cuda_graph_capture_sizes(
            version,
            gpu,
            point["max_num_seqs"],
            point["max_num_batched_tokens"],
            point["performance_mode"],
            num_speculative_tokens=k,
        )
        adjusted = vllm.adjust_sizes_for_spec_decode(sizes, k)
        full = vllm.full_decode_sizes(adjusted, point["max_num_seqs"], k)
        want_adjusted = point["adjusted"] or []
        want_full = point["full_decode"] or []
        if (list(sizes), list(adjusted), list(full)) != (point["sizes"], want_adjusted, want_full):
            wrong.append((point, sizes, adjusted, full))
    assert not wrong, f"{len(wrong)} of {len(points)} points differ, e.g. {wrong[0]}"


@pytest.mark.parametrize("release", ["0.24", "0.28", "0.29", "0.33"])
@pytest.mark.parametrize("runner_v2", [False, True])
def test_graph_counts_follow_the_runner(release: str, runner_v2: bool) -> None:
    """PIECEWISE counts the V1 runner's re-cut sizes (any runner before 0.25) or, under Model Runner V2
    from 0.25, the config's; FULL is the same set either way; without speculation, the plain rule."""
    version = vllm.parse_version(release)
    for point in (p for r, p in SPEC_CASES if r == release and p["adjusted"] is not None):
        k = point["num_speculative_tokens"]
        counts = vllm.cuda_graph_counts(
            version,
            B200 if point["blackwell"] else H100,
            point["max_num_seqs"],
            point["max_num_batched_tokens"],
            point["performance_mode"],
            num_speculative_tokens=k,
            model_runner_v2=runner_v2,
        )
        recut = not runner_v2 or version < vllm.SPEC_DECODE_ADJUST_ANY_RUNNER_BEFORE
        piecewise = len(point["adjusted"]) if recut else len(point["sizes"])
        assert counts == (piecewise, len(point["full_decode"])), point
    for point in (p for r, p in CASES if r == release):
        counts = vllm.cuda_graph_counts(
            version,
            B200 if point["blackwell"] else H100,
            point["max_num_seqs"],
            point["max_num_batched_tokens"],
            point["performance_mode"],
            model_runner_v2=runner_v2,
        )
        full = [s for s in point["sizes"] if s <= point["max_num_seqs"]]
        assert counts == (len(point["sizes"]), len(full)), point


def test_the_speculative_switches_sit_where_the_releases_put_them() -> None:
    assert vllm.UNIFORM_DECODE_SIZES_SINCE == (0, 29)
    assert vllm.SPEC_DECODE_ADJUST_ANY_RUNNER_BEFORE == (0, 25)
    assert 12 in vllm.cuda_graph_capture_sizes((0, 29), H100, 3, 8192, num_speculative_tokens=3)
    assert 12 not in vllm.cuda_graph_capture_sizes((0, 28), H100, 3, 8192, num_speculative_tokens=3)
