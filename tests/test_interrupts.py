"""SIGINT / SIGTERM at every stage of the main job: one line, exit 130, the run recorded
"interrupted", what finished kept, and a re-run that completes to the same dataset.

The test watches the store's progress file and sends the signal once the targeted stage is
running, so each case interrupts the stage it names (not a random point).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ror_annotate.store import ProgressFile, Store

ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]

_SENTENCES = [
    "Let me try a different approach to the problem.",
    "First, I compute {a} + {b} = {c}.",
    "Wait, is that right?",
    "Hmm, that contradicts what I found before, so let me check again.",
    "Recall that a prime number has exactly two divisors.",
    "So the answer is {c}.",
    "The problem asks for the sum of the first {a} odd numbers.",
    "Then {a} times {b} gives {d}, which is even.",
    "Alternatively, we could factor the expression as (x - {a})(x + {b}).",
]


def _corpus(path: Path, n_traces: int, n_sentences: int) -> Path:
    rng = random.Random(7)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n_traces):
            parts = []
            for _ in range(n_sentences):
                a, b = rng.randint(2, 99), rng.randint(2, 99)
                parts.append(rng.choice(_SENTENCES).format(a=a, b=b, c=a + b, d=a * b))
            fh.write(json.dumps({"trace_id": f"syn-{i:04d}", "problem": f"Problem {i}", "trace": " ".join(parts)}) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", n_traces=160, n_sentences=60)


def _env() -> dict[str, str]:
    return {**os.environ, "ROR_PROGRESS_INTERVAL": "0", "SOURCE_DATE_EPOCH": "1700000000"}


def _segments_rows(out: Path) -> list[tuple]:
    import datasets

    dd = datasets.load_from_disk(str(out / "segments"))
    rows = []
    for split in sorted(dd):
        for r in dd[split]:
            rows.append((r["trace_id"], r["segment_index"], r["char_start"], r["char_end"], r["label"]))
    return sorted(rows)


@pytest.fixture(scope="module")
def reference_rows(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple]:
    work = tmp_path_factory.mktemp("reference")
    done = subprocess.run([*ROR, "run", str(corpus), "--db", str(work / "s.duckdb"), "--out", str(work / "out")],
                          capture_output=True, text=True, env=_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    return _segments_rows(work / "out")


def _wait_for_stage(proc: subprocess.Popen, db: Path, stage: str, min_done: int, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        state = ProgressFile.read(db) or {}
        info = (state.get("stages") or {}).get(stage)
        if state.get("status") == "running" and info is not None and info.get("done", 0) >= min_done:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "min_done", "signum"),
    [
        ("ingest", 0, signal.SIGINT),
        ("segment", 20, signal.SIGINT),
        ("baseline labels", 20, signal.SIGTERM),
        ("export", 0, signal.SIGINT),
    ],
)
def test_interrupt_at_each_stage_keeps_finished_work_and_resumes(
    corpus: Path, reference_rows: list[tuple], tmp_path: Path, stage: str, min_done: int, signum: int
) -> None:
    db, out = tmp_path / "s.duckdb", tmp_path / "out"
    proc = subprocess.Popen([*ROR, "run", str(corpus), "--db", str(db), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    reached = _wait_for_stage(proc, db, stage, min_done)
    assert reached, f"the job never reached stage {stage!r} (exit {proc.poll()})"
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, stderr[-2000:])
    error_lines = [line for line in stderr.splitlines() if line.strip() and not line.lstrip().startswith(("⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"))]
    assert "Traceback" not in stderr
    assert any(line.startswith("interrupted") for line in error_lines), stderr[-2000:]
    with Store(db, read_only=True) as store:
        (run,) = [r for r in store.runs() if r.command == "run"]
        assert run.status == "interrupted"
        # every trace recorded as segmented has exactly its segments (no half-written trace)
        lengths = {}
        for seg in store.segment_lengths():
            lengths[seg.trace_id] = lengths.get(seg.trace_id, 0) + 1
        recorded = store.segmentations()
        assert lengths == {t: n for t, (_, _, n) in recorded.items()}
        if stage == "ingest":
            assert store.counts()["traces"] in (0, 160)  # the input is stored whole or not at all
        if stage in ("baseline labels", "export"):
            assert len(recorded) == 160  # segmentation had finished: all of it is kept
    assert not out.exists() or (out / "ror_export.json").exists()  # never a half-written export
    again = subprocess.run([*ROR, "run", str(corpus), "--db", str(db), "--out", str(out)],
                           capture_output=True, text=True, env=_env(), timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _segments_rows(out) == reference_rows
