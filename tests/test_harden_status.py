"""Issue 27, `ror status`: one row per stage (the judge's running cost in the info column), a
finished run's stale progress is not shown as running, a progress file of the wrong shape is one
coded line, its text is printed without Rich markup, and at 80 columns done/total and time are
never cut.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ror_annotate.store import Store

ROR = [sys.executable, "-m", "ror_annotate"]


def _status(db: Path, columns: int = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": str(columns)}
    return subprocess.run([*ROR, "status", "--db", str(db), "--lock-timeout", "0.2"], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def locked_store(tmp_path: Path):
    """A store whose write lock another process holds (as a running ror job would)."""
    db = tmp_path / "s.duckdb"
    Store(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ok', flush=True); time.sleep(120)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
    yield db, holder.pid
    holder.kill()
    holder.wait()


def _progress(db: Path, state: object) -> None:
    Path(str(db.resolve()) + ".progress.json").write_text(json.dumps(state), encoding="utf-8")


def test_tracked_progress_keys_a_stage_by_its_first_description() -> None:
    from ror_annotate.pipeline import _TrackedProgress

    calls: list[tuple[str, int, int | None, str]] = []

    class Recorder:
        def report_progress(self, stage: str, *, done: int, total: int | None, info: str = "") -> None:
            calls.append((stage, done, total, info))

    tracked = _TrackedProgress(Recorder())  # type: ignore[arg-type]
    task = tracked.add_task("judge gpt", total=3)
    for n in range(1, 4):
        tracked.update(task, advance=1, description=f"judge · {n} req · $0.00{n}")
    assert {c[0] for c in calls} == {"judge gpt"}
    assert calls[-1] == ("judge gpt", 3, 3, "judge · 3 req · $0.003")


def test_running_job_progress_is_one_row_per_stage(locked_store) -> None:
    db, pid = locked_store
    _progress(db, {"run_id": "r1", "command": "ror label", "pid": pid, "status": "running", "updated_at": "2026-01-01T00:00:00",
                   "stages": {"judge gpt": {"done": 123456, "total": 654321, "info": "judge · 9 req · 1200k in (0k cached) · 3k out · $1.2345"}}})
    out = _status(db)
    assert out.returncode == 0, out.stderr
    assert "123456" in out.stdout and "654321" in out.stdout and "$1.2345" in out.stdout.replace("\n", "")
    assert out.stdout.count("judge gpt") == 1


def test_stale_progress_of_a_finished_run_is_not_shown_as_running(locked_store) -> None:
    db, pid = locked_store
    _progress(db, {"run_id": "old", "command": "ror segment", "pid": 1, "status": "done", "updated_at": "2026-01-01T00:00:00",
                   "stages": {"segment": {"done": 40, "total": 40, "info": ""}}})
    out = _status(db)
    assert out.returncode == 0, out.stderr
    assert "not reported its progress yet" in out.stdout
    assert "stage" not in out.stdout and "status: done" not in out.stdout
    # a "running" state whose process is gone is stale too
    _progress(db, {"run_id": "old", "command": "ror label", "pid": 2**22 + 12345, "status": "running", "stages": {}})
    assert "not reported its progress yet" in _status(db).stdout


@pytest.mark.parametrize("state", [{"stages": "x"}, [], {"stages": {"a": 5}}, "text"])
def test_progress_file_of_the_wrong_shape_is_one_coded_line(locked_store, state) -> None:
    db, pid = locked_store
    _progress(db, state)
    out = _status(db)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error [E204]:") and out.stderr.count("\n") == 1, out.stderr


def test_progress_text_is_printed_without_rich_markup(locked_store) -> None:
    db, pid = locked_store
    _progress(db, {"run_id": "r", "command": "ror [bold]label[/bold]", "pid": pid, "status": "running",
                   "stages": {"[red]stage[/red]": {"done": 1, "total": 2, "info": "[link=http://x]y[/link]"}}})
    out = _status(db, columns=200)
    assert out.returncode == 0, out.stderr
    for text in ("ror [bold]label[/bold]", "[red]stage[/red]", "[link=http://x]y[/link]"):
        assert text in out.stdout


def test_progress_bar_at_80_columns_never_cuts_done_total_or_time() -> None:
    import importlib

    from rich.console import Console

    cli_app = importlib.import_module("ror_annotate.cli.app")

    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    old = cli_app.err_console
    cli_app.err_console = console
    try:
        progress = cli_app.progress_display()
    finally:
        cli_app.err_console = old
    progress.live.transient = False
    task = progress.add_task("judge · 1234 req · 5678k in (1234k cached) · 345k out · $12.3456", total=654321)
    progress.update(task, completed=123456)
    time.sleep(0.01)
    progress.start()
    progress.refresh()
    progress.stop()
    text = console.file.getvalue()
    assert "123456/654321" in text and "0:00:0" in text
