"""scripts/labelstudio.sh without a Label Studio install: settings checks, busy port, health without curl, env lines."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "labelstudio.sh"
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def _run(action: str, env: dict[str, str], path: str | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LS_", "POSTGRE_"))} | env
    if path is not None:
        full["PATH"] = path
    return subprocess.run([BASH, str(SCRIPT), action], env=full, capture_output=True, text=True, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "label-studio"
    exe.write_text("#!/bin/sh\nexit 3\n")
    exe.chmod(0o755)
    return venv


def test_env_prints_the_public_url_defaulting_to_the_server_url():
    r = _run("env", {"LS_PORT": "8123"})
    assert r.stdout.splitlines() == [
        "export LABEL_STUDIO_URL=http://127.0.0.1:8123",
        "export LABEL_STUDIO_PUBLIC_URL=http://127.0.0.1:8123",
        "export LABEL_STUDIO_API_KEY=0123456789abcdef0123456789abcdef01234567",
    ]
    r = _run("env", {"LS_PORT": "8123", "LS_HOST": "0.0.0.0", "LS_PUBLIC_URL": "https://review.lab.example/"})
    assert r.stdout.splitlines()[:2] == ["export LABEL_STUDIO_URL=http://127.0.0.1:8123",
                                         "export LABEL_STUDIO_PUBLIC_URL=https://review.lab.example"]


def test_a_taken_port_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run("start", {"LS_PORT": str(port), "LS_VENV": str(_fake_venv(tmp_path)), "LS_DATA": str(tmp_path / "d")})
    assert r.returncode == 1
    assert f"port {port} on 127.0.0.1 is already taken by another process" in r.stderr and "LS_PORT" in r.stderr
    assert not (tmp_path / "d" / "server.pid").exists()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LS_HOST": "0.0.0.0"}, "published development default"),
        ({"LS_PUBLIC_URL": "https://review.lab.example"}, "published development default"),
        ({"LS_PUBLIC_URL": "https://lab.example/ls", "LS_ADMIN_TOKEN": "t" * 40, "LS_ADMIN_PASSWORD": "p" * 20}, "no path"),
        ({"LS_DB": "postgresql"}, "needs POSTGRE_PASSWORD"),
        ({"LS_DB": "mysql"}, "LS_DB must be sqlite or postgresql"),
    ],
)
def test_unsafe_or_incomplete_settings_are_refused_before_starting(tmp_path, env, message):
    r = _run("start", {"LS_PORT": str(_free_port()), "LS_VENV": str(_fake_venv(tmp_path)), "LS_DATA": str(tmp_path / "d")} | env)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"status": "UP"}).encode()
        self.send_response(200 if self.path == "/health/" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_status_needs_no_curl(tmp_path):
    # PATH holds only python3 and dirname: a curl-based health check would report DOWN.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        up = _run("status", {"LS_PORT": str(port)}, path=str(bin_dir))
        assert (up.returncode, up.stdout.strip()) == (0, f"UP http://127.0.0.1:{port}"), up.stderr
    finally:
        server.shutdown()
    down = _run("status", {"LS_PORT": str(port)}, path=str(bin_dir))
    assert (down.returncode, down.stdout.strip()) == (1, f"DOWN http://127.0.0.1:{port}")


def test_test_sh_sets_the_stop_trap_before_starting():
    lines = [ln.strip() for ln in (SCRIPT.parent / "test.sh").read_text().splitlines() if not ln.lstrip().startswith("#")]
    trap = next(i for i, ln in enumerate(lines) if ln.startswith("trap ") and "labelstudio.sh stop" in ln)
    start = next(i for i, ln in enumerate(lines) if ln == "bash scripts/labelstudio.sh start")
    assert trap < start
