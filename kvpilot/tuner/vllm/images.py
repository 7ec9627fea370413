"""Which vLLM release an engine image runs: read from its tag, or given explicitly.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). The operator asks
:func:`resolve_image_version` for ``spec.engine.image`` (and ``spec.engine.vllmVersion``) and
plans with the answer; the memory model is version-aware (:mod:`.versions`), so a deployment of
``vllm/vllm-openai:v0.19.1`` is sized as 0.19 sizes it. Pure string parsing: no registry is asked.

Tag forms read (``tests/tuner/test_images.py``): ``v0.33.0``, ``0.33.0``, ``v0.33``, a release
candidate or post release (``v0.33.0rc1``, ``0.19.1.post1``), a variant suffix after a dash
(``v0.33.0-cu130``), a registry with a port (``registry:5000/vllm/vllm-openai:v0.19.1``), a tag
pinned by digest (``...:v0.33.0@sha256:...``). Not read, so the pinned release is assumed with a
warning: no tag (Docker's ``latest``), ``latest``, ``nightly``, a bare digest, any custom tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpilot.tuner.vllm.versions import PINNED_VERSION, PINNED_VLLM_VERSION, Version, parse_version

OLDEST_MODELLED: Version = (0, 8)
"""The oldest release the memory model has start-up evidence for with the V1 engine (0.8.5 logs);
older releases ran the V0 engine by default, which kvpilot does not model."""

IMAGE_USER_UID = 2000
IMAGE_USER_GID = 0
IMAGE_USER_HOME = "/home/vllm"
"""The non-root user the ``vllm/vllm-openai`` image ships (vllm-project/vllm#40275, in releases since mid
2026): ``vllm``, UID 2000 in group 0, home ``/home/vllm`` (group-0 writable, OpenShift's arbitrary-UID
pattern). The image still runs as root by default. As this user, Hugging Face, vLLM, Triton and Inductor
caches resolve under ``$HOME/.cache``; ``getpass.getuser()`` (torch's compile cache) finds the passwd entry.
``spec.podSecurity: Restricted`` runs the pods as this user (:mod:`kvpilot.operator.pods.pod_template`)."""

_RELEASE_TAG = re.compile(
    r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)*"  # the release (0.10.1.1: a fourth part is a patch of it)
    r"(?:\.?(?:rc|post|dev)\d*)*"  # a release candidate, post or dev release of it
    r"(?:-[A-Za-z0-9][A-Za-z0-9._-]*)?"  # a build variant (-cu130)
)
_EXPLICIT = re.compile(r"\d+\.\d+(?:\.\d+)?")


@dataclass(frozen=True, slots=True)
class ImageVersion:
    """The release kvpilot models a deployment with."""

    version: str
    """``"0.33.0"``: what the planner and the memory model are given."""
    assumed: bool
    """The image did not say (or said a release kvpilot has no evidence for): the pinned release."""
    warning: str | None = None
    """Why the release was assumed, for ``status.warnings`` and an event."""


def image_tag(image: str) -> str | None:
    """The tag of an image reference (``None`` without one): the part after the last ``:`` of the
    last path component, before any ``@digest``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    return last.rsplit(":", 1)[1] or None


def read_tag_version(image: str) -> Version | None:
    """The release an image's tag names (``v0.33.0`` -> ``(0, 33, 0)``), or ``None`` when it names none."""
    tag = image_tag(image)
    if tag is None:
        return None
    match = _RELEASE_TAG.fullmatch(tag)
    if match is None:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def _format(version: Version) -> str:
    return ".".join(str(part) for part in (*version, 0, 0)[: max(3, len(version))])


def resolve_image_version(image: str, explicit: str | None = None) -> ImageVersion:
    """The release to model ``image`` with: ``explicit`` (``spec.engine.vllmVersion``) if given, else the
    image's tag; the pinned release, with a warning, when neither names one kvpilot models
    (:data:`OLDEST_MODELLED` up to :data:`~kvpilot.tuner.vllm.versions.PINNED_VLLM_VERSION`)."""
    if explicit is not None and _EXPLICIT.fullmatch(explicit.strip()):
        version: Version | None = parse_version(explicit.strip())
        source = f"spec.engine.vllmVersion {explicit.strip()}"
    else:
        version = read_tag_version(image)
        source = f"image {image}"
    if version is None:
        return ImageVersion(
            PINNED_VLLM_VERSION,
            True,
            f"VersionAssumed: the vLLM release of {source} cannot be read from its tag; sized as vLLM "
            f"{PINNED_VLLM_VERSION} (set spec.engine.vllmVersion to say which release it runs).",
        )
    if version[:2] < OLDEST_MODELLED or version[:2] > PINNED_VERSION[:2]:
        return ImageVersion(
            PINNED_VLLM_VERSION,
            True,
            f"VersionAssumed: {source} is vLLM {_format(version)}, outside the releases kvpilot's memory "
            f"model covers ({'.'.join(map(str, OLDEST_MODELLED))} to {PINNED_VLLM_VERSION}); sized as vLLM "
            f"{PINNED_VLLM_VERSION}.",
        )
    return ImageVersion(_format(version), False)
