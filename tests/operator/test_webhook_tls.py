"""The webhook's certificate reloaded in place (kvpilot.operator.enginetuner.webhook_tls): kopf's real aiohttp
server on
127.0.0.1, two certificates made with openssl, TLS handshakes before and after the rotation."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kvpilot.operator.enginetuner import target_webhook, webhook_tls


def make_cert(directory: Path, cn: str, key: Path | None = None) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1 (with a new key, or ``key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, new_key = directory / "tls.crt", key or directory / "tls.key"
    keyargs = ["-key", str(key)] if key else ["-newkey", "rsa:2048", "-nodes", "-keyout", str(new_key)]
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            *keyargs,
            "-days",
            "1",
            "-subj",
            f"/CN={cn}",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    return crt, new_key


def rotate(src: Path, dst: Path) -> None:
    """Replace ``dst`` at once, as the kubelet's symlink swap does."""
    tmp = dst.with_suffix(".new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def der(crt: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(crt.read_text())


async def served_cert(port: int) -> bytes:
    """The certificate a new TLS handshake with 127.0.0.1:``port`` is served."""
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    try:
        peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(peer, bytes)
        return peer
    finally:
        writer.close()
        await writer.wait_closed()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    a_crt, a_key = make_cert(tmp_path / "a", "webhook-a")
    b_crt, b_key = make_cert(tmp_path / "b", "webhook-b")
    c_crt, _ = make_cert(tmp_path / "c", "webhook-c")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copyfile(a_crt, live / "tls.crt")
    shutil.copyfile(a_key, live / "tls.key")
    return {"a": a_crt, "b": b_crt, "b.key": b_key, "c": c_crt, "live": live}


@pytest.fixture
async def server(certs: dict[str, Path]) -> AsyncIterator[tuple[webhook_tls.ReloadingWebhookServer, int]]:
    port = free_port()
    live = certs["live"]
    srv = webhook_tls.ReloadingWebhookServer(
        addr="127.0.0.1",
        port=port,
        certfile=str(live / "tls.crt"),
        pkeyfile=str(live / "tls.key"),
        check_interval_s=0.05,
    )

    async def fn(*_: Any, **__: Any) -> Any:
        raise AssertionError("no admission request in these tests")

    serving = srv(fn)
    await serving.__anext__()  # kopf's site listens
    try:
        yield srv, port
    finally:
        await serving.aclose()


async def _until(cond: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def test_a_rotated_certificate_is_served_without_a_restart(
    server: tuple[webhook_tls.ReloadingWebhookServer, int], certs: dict[str, Path]
) -> None:
    srv, port = server
    assert await served_cert(port) == der(certs["a"])
    rotate(certs["b.key"], certs["live"] / "tls.key")
    rotate(certs["b"], certs["live"] / "tls.crt")
    await _until(lambda: srv.reloads == 1)
    assert await served_cert(port) == der(certs["b"])  # the same listening port: no restart


async def test_a_half_rotated_pair_keeps_the_old_certificate(
    server: tuple[webhook_tls.ReloadingWebhookServer, int], certs: dict[str, Path]
) -> None:
    srv, port = server
    rotate(certs["c"], certs["live"] / "tls.crt")  # the new certificate, its key not written yet
    await asyncio.sleep(0.3)
    assert srv.reloads == 0 and not srv.reload_if_changed()
    assert await served_cert(port) == der(certs["a"])
    # the key arrives: B's pair, loaded at the next check
    rotate(certs["b.key"], certs["live"] / "tls.key")
    rotate(certs["b"], certs["live"] / "tls.crt")
    await _until(lambda: srv.reloads == 1)
    assert await served_cert(port) == der(certs["b"])


def test_build_server_reloads(monkeypatch: pytest.MonkeyPatch, certs: dict[str, Path]) -> None:
    monkeypatch.setenv(target_webhook.PORT_ENV, "9443")
    monkeypatch.setenv(target_webhook.CERT_DIR_ENV, str(certs["live"]))
    srv = target_webhook.build_server()
    assert isinstance(srv, webhook_tls.ReloadingWebhookServer)
    assert srv.certfile == str(certs["live"] / "tls.crt") and srv.port == 9443
