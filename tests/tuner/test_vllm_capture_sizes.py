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
    assert max(vllm.cuda_graph_capture_sizes((0, 28), B200, 1024, 16384)) == 1024
    assert max(vllm.cuda_graph_capture_sizes((0, 27), B200, 1024, 16384)) == 512
