"""A local webhook receiver (http.server on 127.0.0.1, random port) and a fake sendmail on PATH."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator


@contextmanager
def webhook_server(status: int = 200, delay: float = 0.0) -> Iterator[tuple[str, list[dict]]]:
    """Yields (url, received): every POSTed JSON body lands in ``received``; each answer after ``delay`` s."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            n = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(n)
            if delay:
                time.sleep(delay)
            received.append({"path": self.path, "type": self.headers.get("Content-Type"), **json.loads(body)})
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/hooks/secret-token", received
    finally:
        srv.shutdown()
        srv.server_close()


def fake_sendmail(folder: Path) -> Path:
    """A `sendmail` that appends its arguments and stdin to folder/mails.log; returns the log path."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "mails.log"
    script = folder / "sendmail"
    script.write_text(f"#!/bin/sh\n{{ echo \"ARGS $*\"; cat; echo '----'; }} >> '{log}'\n")
    script.chmod(0o755)
    return log


def mails(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [m for m in log.read_text().split("----\n") if m.strip()]
