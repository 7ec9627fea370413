"""The EngineTuner webhook's TLS: the serving certificate reloaded in place when its files change.

kopf's :class:`kopf.WebhookServer` loads ``tls.crt``/``tls.key`` into an :class:`ssl.SSLContext` when it
starts its aiohttp site; on its own (``file_check_interval``) it would tear the site down and start a new
one when the files change, closing the port meanwhile. :class:`ReloadingWebhookServer` keeps kopf's server
and its one context, and instead calls :meth:`ssl.SSLContext.load_cert_chain` on that same context when the
files change (checked every :data:`CHECK_INTERVAL_S`): new TLS handshakes get the new certificate, the
listening socket and the connections already open stay as they are. The files are a mounted
``kubernetes.io/tls`` Secret, which the kubelet updates in place (a symlink swap) after ``helm upgrade``
or a cert-manager renewal; so a rotated certificate needs no operator restart.

A rotation caught half way (the new certificate next to the old key) does not load: the old certificate
keeps serving, a warning is logged, and the next change of the files is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf

CHECK_INTERVAL_S = 10.0
"""Seconds between two reads of the certificate files (the kubelet syncs a Secret within about a minute)."""
_NEVER_S = 365 * 86400.0
"""kopf's own file check, which would restart the site: never (this class reloads in place)."""

logger = logging.getLogger(__name__)


def compute_digest(*parts: bytes) -> str:
    """A digest of the files' contents (which are not kept)."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part)
        hasher.update(b"\0")
    return hasher.hexdigest()


class ReloadingWebhookServer(kopf.WebhookServer):
    """:class:`kopf.WebhookServer` over TLS from ``certfile``/``pkeyfile``, reloading them in place."""

    def __init__(
        self, *, certfile: str, pkeyfile: str, check_interval_s: float = CHECK_INTERVAL_S, **kwargs: Any
    ) -> None:
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        super().__init__(
            context=context, certfile=certfile, pkeyfile=pkeyfile, file_check_interval=_NEVER_S, **kwargs
        )
        self.tls_context = context
        """The context kopf's site serves with (kopf loads the first certificate into it)."""
        self.check_interval_s = check_interval_s
        self._digest = compute_digest(Path(certfile).read_bytes(), Path(pkeyfile).read_bytes())
        self._refused: str | None = None
        self.reloads = 0
        """Certificates loaded after the first."""

    def reload_if_changed(self) -> bool:
        """Load the certificate files into the serving context if they changed since the last load;
        whether it did. The pair is read once into a private copy and tried on a scratch context first:
        OpenSSL takes a certificate into a context before it checks the key, so loading a mismatched pair
        (caught mid-rotation) into the serving one would leave it serving nothing. Such a pair keeps the
        old certificate, with one warning, until the files change again."""
        cert, key = str(self.certfile), str(self.pkeyfile)
        try:
            pair = Path(cert).read_bytes(), Path(key).read_bytes()
        except OSError as exc:
            logger.warning(f"webhook TLS: cannot read {cert} / {key} ({exc}); serving the loaded certificate")
            return False
        digest = compute_digest(*pair)
        if digest in (self._digest, self._refused):
            return False
        with tempfile.TemporaryDirectory(prefix="kvpilot-webhook-tls-") as tmp:
            copy_cert, copy_key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            copy_cert.write_bytes(pair[0])
            copy_key.touch(mode=0o600)
            copy_key.write_bytes(pair[1])
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(copy_cert, copy_key, self.password)
            except (OSError, ssl.SSLError) as exc:
                self._refused = digest
                logger.warning(
                    f"webhook TLS: the new {cert} / {key} do not load ({exc}); still serving the "
                    "previous certificate"
                )
                return False
            self.tls_context.load_cert_chain(copy_cert, copy_key, self.password)
        self._digest = digest
        self.reloads += 1
        logger.info(f"webhook TLS: loaded the renewed certificate from {cert}")
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            self.reload_if_changed()

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        watcher = asyncio.create_task(self._watch())
        try:
            async for client_config in super().__call__(fn):
                yield client_config
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
