"""Serve a built viewer site on 127.0.0.1 (``ror view --serve``) for local browsing.

The site works from ``file://`` as well; serving it only helps browsers or setups that restrict
local files. Only the loopback interface is bound, and only files under the site folder are served.
"""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

from ..errors import ViewError


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def make_server(site: str | Path, port: int = 8765) -> http.server.ThreadingHTTPServer:
    """An HTTP server for ``site`` bound to 127.0.0.1:``port`` (0: any free port); call ``serve_forever()``.

    Raises
    ------
    ViewError
        E855: ``site`` has no ``index.html``; E856: the port is taken.
    """
    root = Path(site)
    if not (root / "index.html").is_file():
        raise ViewError(f"no viewer site in {root} (no index.html); build it first with `ror view --out {root}`", code="E855")
    handler = functools.partial(_QuietHandler, directory=str(root))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise ViewError(f"cannot serve on 127.0.0.1:{port} ({exc.strerror}); pick another port with --port", code="E856") from exc
