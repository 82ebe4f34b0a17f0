"""The main job through the real `ror` entry point: end to end, idempotent, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from ror_annotate.store import Store

ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]


def ror(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*ROR, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture
def small_input(tmp_path: Path, real_trace_rows: list[dict]) -> Path:
    rows = sorted(real_trace_rows, key=lambda r: (len(r["trace"]), r["trace_id"]))[:8]  # the 8 shortest
    path = tmp_path / "small.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_run_end_to_end_and_rerun_changes_nothing(tmp_path: Path, small_input: Path) -> None:
    db, out = tmp_path / "s.duckdb", tmp_path / "export"
    first = ror("run", str(small_input), "--db", str(db), "--out", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "ror run: summary" in first.stdout
    with Store(db) as store:
        counts = store.counts()
        segments = store.segments()
        trace_text = {t.trace_id: t.text for t in store.iter_traces()}
    assert counts["traces"] == 8 and counts["segments"] == counts["labels"] > 8
    assert all(trace_text[s.trace_id][s.char_start:s.char_end] == s.text for s in segments)
    exported = datasets.load_from_disk(str(out / "segments"))
    assert sum(len(split) for split in exported.values()) == counts["segments"]
    second = ror("run", str(small_input), "--db", str(db), "--out", str(out), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    with Store(db) as store:
        assert store.counts()["segments"] == counts["segments"] and store.counts()["labels"] == counts["labels"]
        assert [r.status for r in store.runs()] == ["ok", "ok"]


def test_bad_input_is_one_line_exit_2_and_stores_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trace": "Let me think."}\n{"trace": \n', encoding="utf-8")
    db = tmp_path / "s.duckdb"
    result = ror("ingest", str(bad), "--db", str(db), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"error [E100]: {bad}:2: malformed JSON" in " ".join(result.stderr.split())
    with Store(db) as store:
        assert store.counts()["traces"] == 0
    skipped = ror("ingest", str(bad), "--db", str(db), "--skip-invalid", cwd=tmp_path)
    assert skipped.returncode == 0 and "1 new" in skipped.stdout and "1 skipped" in skipped.stdout


def test_locked_store_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; from ror_annotate.store import Store; s = Store({str(db)!r}); print('ok', flush=True); time.sleep(8)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        result = ror("status", "--db", str(db), "--lock-timeout", "0.3", cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error [E201]" in result.stderr and "locked by another process" in result.stderr


def test_unknown_judge_lists_available(tmp_path: Path, small_input: Path) -> None:
    result = ror("run", str(small_input), "--db", str(tmp_path / "s.duckdb"), "--judge", "nope:x", cwd=tmp_path)
    assert result.returncode == 2 and "unknown judge 'nope:x'" in result.stderr and "baseline" in result.stderr
