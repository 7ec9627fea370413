"""Which vLLM release an image runs: every tag form, the explicit version, and what is assumed."""

from __future__ import annotations

import pytest

from kvpilot.tuner import vllm

PINNED = vllm.PINNED_VLLM_VERSION


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.33.0", "0.33.0"),
        ("vllm/vllm-openai:0.19.1", "0.19.1"),
        ("vllm/vllm-openai:v0.19", "0.19.0"),
        ("docker.io/vllm/vllm-openai:v0.27.1", "0.27.1"),
        ("registry.example.com:5000/vllm/vllm-openai:v0.19.1", "0.19.1"),  # a port is not a tag
        ("vllm/vllm-openai:v0.33.0rc1", "0.33.0"),
        ("vllm/vllm-openai:v0.10.1.1", "0.10.1"),
        ("vllm/vllm-openai:0.19.1.post1", "0.19.1"),
        ("vllm/vllm-openai:v0.33.0-cu130", "0.33.0"),
        ("rocm/vllm:v0.29.1", "0.29.1"),
        ("vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64, "0.33.0"),
    ],
)
def test_a_release_tag_is_read(image: str, version: str) -> None:
    resolved = vllm.resolve_image_version(image)
    assert resolved == vllm.ImageVersion(version, False)


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai",  # no tag: Docker pulls latest
        "vllm/vllm-openai:latest",
        "vllm/vllm-openai:nightly",
        "vllm/vllm-openai@sha256:" + "b" * 64,
        "registry.example.com:5000/vllm/vllm-openai",
        "ghcr.io/acme/vllm:prod-2026-11",
        "ghcr.io/acme/vllm:cuda12",
    ],
)
def test_an_unreadable_tag_assumes_the_pinned_release_with_a_warning(image: str) -> None:
    resolved = vllm.resolve_image_version(image)
    assert resolved.version == PINNED and resolved.assumed
    assert resolved.warning is not None and resolved.warning.startswith("VersionAssumed")
    assert image in resolved.warning and "spec.engine.vllmVersion" in resolved.warning


@pytest.mark.parametrize(
    "image", ["vllm/vllm-openai:v0.6.6", "vllm/vllm-openai:v0.40.0", "vllm/vllm-openai:v1.0.0"]
)
def test_a_release_outside_the_model_assumes_the_pinned_one(image: str) -> None:
    resolved = vllm.resolve_image_version(image)
    assert resolved.version == PINNED and resolved.assumed
    assert resolved.warning is not None and "outside the releases" in resolved.warning


def test_the_explicit_version_wins_over_the_tag() -> None:
    assert vllm.resolve_image_version("ghcr.io/acme/vllm:prod", "0.19.0") == vllm.ImageVersion(
        "0.19.0", False
    )
    assert vllm.resolve_image_version("vllm/vllm-openai:v0.33.0", "0.27") == vllm.ImageVersion(
        "0.27.0", False
    )
    assert vllm.resolve_image_version("vllm/vllm-openai:v0.33.0", "0.7.2").assumed


def test_the_default_image_is_the_pinned_release() -> None:
    assert vllm.resolve_image_version(f"vllm/vllm-openai:v{PINNED}") == vllm.ImageVersion(PINNED, False)


def test_the_tag_is_the_last_components() -> None:
    assert vllm.image_tag("host:5000/a/b") is None
    assert vllm.image_tag("host:5000/a/b:v1.2") == "v1.2"
    assert vllm.read_tag_version("a/b:latest") is None
    assert vllm.read_tag_version("a/b:0.19.1") == (0, 19, 1)
