"""The operator image's build keeps only its own layers (e2e/image.py): which images a build made or reused
is read from buildah's own output. The output below is buildah 1.28's (Debian bookworm), as `make image`
prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import image

BUILD_OUTPUT = """\
[1/2] STEP 1/7: FROM localhost/kvpilot-base:d4070a0e156a AS build
[1/2] STEP 2/7: ENV PIP_DISABLE_PIP_VERSION_CHECK=1     PIP_NO_CACHE_DIR=1
--> Using cache 1eeaae6148dcd071da44b36d8a360484b5fee0d2595eb2ac9ced4674f236f939
--> 1eeaae6148d
[1/2] STEP 5/7: COPY kvpilot ./kvpilot
--> 88179bfddec
[2/2] STEP 8/9: ENTRYPOINT ["kopf"]
--> Using cache 63f42744cac77b8e7b2abc0824ba52719ba7862c602f0b5640858e31e34c7d77
--> 63f42744cac
[2/2] COMMIT localhost/kvpilot:dev
--> 7064e4f4ed0
Successfully tagged localhost/kvpilot:dev
7064e4f4ed09d4c2b1a6e0d42ac67d3b6f54a1b0b7bd0b7f3f12c0b5dbb3a4a1
"""


def test_a_builds_steps_are_the_images_it_made_or_reused() -> None:
    assert image.step_images(BUILD_OUTPUT) == {
        "1eeaae6148dcd071da44b36d8a360484b5fee0d2595eb2ac9ced4674f236f939",
        "1eeaae6148d",
        "88179bfddec",
        "63f42744cac77b8e7b2abc0824ba52719ba7862c602f0b5640858e31e34c7d77",
        "63f42744cac",
        "7064e4f4ed0",
    }


def test_a_step_line_must_be_a_whole_image_id() -> None:
    """A RUN step's own output that happens to start with an arrow is not an image."""
    assert image.step_images("--> installing kvpilot\n--> 12ab\n-->  7064e4f4ed0\n") == set()


def test_the_kept_layers_survive_a_write_and_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPILOT_CACHE", str(tmp_path))
    assert image.read_kept_layers() == set()  # no record: everything untagged is stale
    image.write_kept_layers({"7064e4f4ed0", "1eeaae6148d"})
    assert image.read_kept_layers() == {"7064e4f4ed0", "1eeaae6148d"}
