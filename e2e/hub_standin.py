"""A stand-in Hugging Face Hub on the host: ``huggingface_hub``'s own download protocol, for ``source: Hub``.

``hf_hub_download`` asks ``{HF_ENDPOINT}/{org}/{repo}/resolve/{revision}/{file}`` with a HEAD (it wants
``X-Repo-Commit``, an ``ETag`` and the length) and then a GET; a 404 with ``X-Error-Code: EntryNotFound`` is a
missing file. :class:`StandInHub` serves the files it is given by repository, the same bytes for every
revision, and counts the requests. Used by ``test_image`` (a real config resolved by the operator from its
image) and ``test_hub_memory`` (hostile configs).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Callable
from types import TracebackType

COMMIT = "0123456789abcdef0123456789abcdef01234567"

Files = Callable[[str, str], bytes | None]
"""``(repository, file name) -> bytes``, or None where the Hub has no such file."""


class StandInHub:
    """``with StandInHub(files) as hub:`` serves ``files`` at ``hub.url`` until the block ends."""

    def __init__(self, files: Files) -> None:
        self.requests = 0
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _file(self) -> bytes | None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) == 5 and parts[2] == "resolve":
                    return files(f"{parts[0]}/{parts[1]}", parts[4])
                return None

            def _headers(self, body: bytes | None) -> None:
                hub.requests += 1
                if body is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()

            def do_HEAD(self) -> None:
                self._headers(self._file())

            def do_GET(self) -> None:
                body = self._file()
                self._headers(body)
                if body is not None:
                    self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandInHub:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
