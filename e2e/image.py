"""The operator image built and run without a Docker engine or a registry: debootstrap, buildah, podman, runc.

No registry image can be pulled on the project's machines, so the base is made from Debian's own packages:
``debootstrap --variant=minbase --include=<BASE_PACKAGES> bookworm``. Its root filesystem is packed once into
``$KVPILOT_CACHE/image/base-<key>.tar`` and imported as ``localhost/kvpilot-base:<key>``. The repository's
Dockerfile is then built with ``buildah build --isolation chroot --layers`` and ``PYTHON_IMAGE`` set to that
base; on a normal machine the same Dockerfile builds from ``python:3.11-slim-bookworm`` unchanged.

Storage is ``vfs`` (no overlay or fuse-overlayfs needed) under ``$KVPILOT_CACHE/containers``, shared by
buildah and podman, so the imported base and buildah's layer cache survive between runs. Containers run with
runc and the cgroupfs manager: crun fails on this machine kind's hybrid cgroups and on raising rlimits.

vfs copies the whole root filesystem into every layer (about 0.4 GB here), and every change to the sources
makes three new ones, so a cache kept between CI runs would fill its disk within a few dozen builds.
Each build therefore keeps only its own layers: the untagged images it neither made nor reused are removed
before and after it (:func:`prune`); its own are listed in ``$KVPILOT_CACHE/image/kept-layers.json``.

CLI::

    python -m e2e.image build      # build (cached layers make a rebuild fast); prints the ref, time and size
    python -m e2e.image tools      # exit 1 naming the missing tools

Only the standard library and subprocess are used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("buildah", "podman", "runc", "debootstrap")
SUITE = "bookworm"
# python3 is the interpreter both stages run; the build stage also needs pip and venv (the Dockerfile's
# `python -m pip`, `python -m venv`) and `python` on PATH. The runtime stage deletes pip and ensurepip again.
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3")
# Build-time only, or documentation (Debian's slim images leave the last four out as well).
BASE_TRIM = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
)
MIRROR = os.environ.get("KVPILOT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
IMAGE = "localhost/kvpilot:dev"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's bundle, which Debian's pip uses too
BASE_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(RuntimeError):
    """A tool is missing or a step failed; the message says which and shows its output."""


def cache_dir() -> Path:
    return Path(os.environ.get("KVPILOT_CACHE") or Path.home() / ".cache" / "kvpilot")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]


def require_tools() -> None:
    if missing := missing_tools():
        raise ImageError(
            f"missing {', '.join(missing)}: `make image-apt` installs them "
            "(apt-get install buildah podman runc debootstrap)"
        )


def storage_args() -> list[str]:
    """Global options for buildah and podman: one vfs store under the cache, its run state under /tmp."""
    store = cache_dir() / "containers"
    return [
        "--root",
        str(store / "storage"),
        "--runroot",
        f"/tmp/kvpilot-containers-{os.getuid()}",
        "--storage-driver",
        "vfs",
    ]


def podman_args() -> list[str]:
    return ["podman", *storage_args(), "--cgroup-manager", "cgroupfs", "--runtime", "runc"]


def _run(argv: Sequence[str], what: str, timeout: float = 1800, **kw: object) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise ImageError(
            f"{what} failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    return str(proc.stdout)


def base_key() -> str:
    text = json.dumps([SUITE, "minbase", BASE_PACKAGES, BASE_TRIM, MIRROR])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_ref() -> str:
    return f"localhost/kvpilot-base:{base_key()}"


def image_exists(ref: str) -> bool:
    return (
        subprocess.run([*podman_args(), "image", "exists", ref], capture_output=True, timeout=120).returncode
        == 0
    )


def ensure_base_tarball() -> Path:
    """debootstrap the base once; its root filesystem is kept as a tarball in the cache."""
    tar = cache_dir() / "image" / f"base-{base_key()}.tar"
    if tar.exists():
        return tar
    tar.parent.mkdir(parents=True, exist_ok=True)
    rootfs = tar.with_name(f"rootfs-{base_key()}.tmp{os.getpid()}")
    shutil.rmtree(rootfs, ignore_errors=True)
    try:
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(rootfs),
                MIRROR,
            ],
            "debootstrap",
        )
        for junk in BASE_TRIM:
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        partial = tar.with_name(f"{tar.name}.tmp{os.getpid()}")
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(partial), "."], "tar")
        partial.rename(tar)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return tar


def ensure_base() -> str:
    """The base image in the store (imported from the cached tarball when missing); returns its ref."""
    ref = base_ref()
    if not image_exists(ref):
        tar = ensure_base_tarball()
        _run(
            [
                *podman_args(),
                "import",
                "--change",
                f"ENV {BASE_PATH_ENV}",
                "--change",
                'CMD ["python3"]',
                str(tar),
                ref,
            ],
            "podman import",
        )
    return ref


@dataclass(frozen=True)
class Built:
    ref: str
    base: str
    seconds: float
    size_bytes: int


def kept_layers_file() -> Path:
    return cache_dir() / "image" / "kept-layers.json"


def read_kept_layers() -> set[str]:
    try:
        return set(json.loads(kept_layers_file().read_text()))
    except (OSError, ValueError):
        return set()


def write_kept_layers(ids: set[str]) -> None:
    path = kept_layers_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sorted(ids)))


# buildah build prints each step's image, made (``--> 1eeaae6148d``) or reused (``--> Using cache <id>``).
_STEP_IMAGE = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})\s*$", re.MULTILINE)


def step_images(build_output: str) -> set[str]:
    """The images a ``buildah build --layers`` made or reused, as its output names them."""
    return set(_STEP_IMAGE.findall(build_output))


def dangling_images() -> list[str]:
    """The store's untagged images that no other image is built on (``podman images --filter dangling``)."""
    out = _run(
        [*podman_args(), "images", "--all", "--quiet", "--no-trunc", "--filter", "dangling=true"],
        "podman images",
        timeout=300,
    )
    return [line.removeprefix("sha256:") for line in out.split()]


def stale_images(keep: set[str]) -> list[str]:
    """The untagged, unused images not in ``keep`` (ids or their prefixes)."""
    return [i for i in dangling_images() if not any(i.startswith(k) for k in keep)]


def prune(keep: set[str]) -> int:
    """Remove the untagged images not in ``keep`` (ids or their prefixes), then the parents that leaves
    untagged and unused, until none is left; returns how many were removed. Tagged images (the base, the
    operator image) and their ancestors are never touched."""
    removed, doomed = 0, stale_images(keep)
    while doomed:
        proc = subprocess.run([*podman_args(), "rmi", *doomed], capture_output=True, text=True, timeout=600)
        left = stale_images(keep)  # what is still there, and the parents this round left unused
        gone = len(set(doomed) - set(left))
        if gone == 0:
            raise ImageError(f"podman rmi removed none of {doomed}: {proc.stderr.strip()[-2000:]}")
        removed, doomed = removed + gone, left
    return removed


def build(ref: str = IMAGE) -> Built:
    """Build the repository's Dockerfile on the local base; the last build's layers are cached, so a rebuild
    is fast, and older ones are removed (:func:`prune`)."""
    require_tools()
    t0 = time.monotonic()
    base = ensure_base()
    prune(read_kept_layers())
    # The RUN steps trust what this machine trusts (its egress proxy's CA is in the host bundle): the bundle
    # is mounted for the build only and is not in any layer.
    trust = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if Path(HOST_CA_BUNDLE).is_file() else []
    output = _run(
        [
            "buildah",
            *storage_args(),
            "build",
            "--isolation",
            "chroot",
            "--layers",
            "--force-rm",
            "--pull=never",
            *trust,
            "--build-arg",
            f"PYTHON_IMAGE={base}",
            "-f",
            str(ROOT / "Dockerfile"),
            "-t",
            ref,
            str(ROOT),
        ],
        "buildah build",
    )
    kept = step_images(output)
    write_kept_layers(kept)
    prune(kept)
    seconds = time.monotonic() - t0
    return Built(ref=ref, base=base, seconds=seconds, size_bytes=image_size(ref))


def inspect(ref: str) -> dict[str, object]:
    (obj,) = json.loads(_run([*podman_args(), "image", "inspect", ref], "podman image inspect"))
    return dict(obj)


def image_size(ref: str) -> int:
    return int(str(inspect(ref)["Size"]))


def run_argv(ref: str, *, options: Sequence[str] = (), command: Sequence[str] = ()) -> list[str]:
    """``podman run`` as it works on this machine kind: host network, rlimits it may set, runc, cgroupfs."""
    limits = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    return [*podman_args(), "run", "--network", "host", *limits, *options, ref, *command]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.image")
    parser.add_argument("what", choices=("build", "tools"))
    parser.add_argument("--tag", default=IMAGE)
    args = parser.parse_args(argv)
    if args.what == "tools":
        missing = missing_tools()
        print(f"missing: {' '.join(missing)}" if missing else "buildah, podman, runc and debootstrap found")
        return 1 if missing else 0
    built = build(args.tag)
    print(
        f"{built.ref}: built in {built.seconds:.1f} s from {built.base}; size {built.size_bytes / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
