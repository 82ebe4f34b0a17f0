"""Issue 27, the store: a write-ahead log damaged after a kill -9 is detected (the commit journal).

DuckDB replays a log cut short up to its end without a word, so the committed rows of the lost tail
vanish. The commit journal beside the store (``<db>.commits``, ror_annotate/journal.py) records each
commit's number (and each paid LLM judge response) outside the log; on open a store behind its
journal is the coded error E220, and ``ror recover`` restores the paid judge responses, so that a
re-run of the judge pays for none of them again. Real processes killed with SIGKILL, real DuckDB
logs cut and flipped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ror_annotate.errors import StoreError
from ror_annotate.journal import JOURNAL_SUFFIX, CommitJournal
from ror_annotate.judge import make_judge
from ror_annotate.records import Trace
from ror_annotate.store import Store

from .judge_fixtures import TRACE_A, build_store
from .openai_server import FakeOpenAI, parse_prompt
from .test_harden_store import KILLED_WRITER

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    return env


def _ror(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ror_annotate", *args], cwd=cwd, capture_output=True, text=True, env=_env(), timeout=120)


def _journal_lines(db: Path) -> list[dict]:
    return [json.loads(line) for line in Path(str(db) + JOURNAL_SUFFIX).read_text(encoding="utf-8").splitlines()]


def _paid_notes(db: Path) -> list[dict]:
    try:
        lines = Path(str(db) + JOURNAL_SUFFIX).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines[1:]:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written now
    return [p for r in records for kind, p in r.get("notes", []) if kind == "judge_cache"]


# ------------------------------------------------------------------------------------ a plain writer
# KILLED_WRITER (five traces, a checkpoint, four later commits, then SIGKILL) is test_harden_store's


def _killed_writer(tmp_path: Path) -> Path:
    db = tmp_path / "k.duckdb"
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], env=_env(), timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert Path(str(db) + ".wal").stat().st_size > 0
    return db


def test_a_killed_writer_with_an_intact_log_opens_and_loses_nothing(tmp_path: Path) -> None:
    db = _killed_writer(tmp_path)
    # the journal: a checkpoint line, then one line per commit after it, all fsynced before the kill
    lines = _journal_lines(db)
    assert lines[0]["checkpoint"] and [r["seq"] for r in lines[1:]] == [lines[0]["seq"] + k for k in range(1, 5)]
    with Store(db) as s:
        assert len(s.trace_ids()) == 45
    assert len(_journal_lines(db)) == 1  # closed: checkpointed, the journal is one line again


def test_a_log_cut_short_is_a_coded_error_for_every_command_and_recover_resolves_it(tmp_path: Path) -> None:
    db = _killed_writer(tmp_path)
    wal = Path(str(db) + ".wal")
    data = wal.read_bytes()
    wal.write_bytes(data[: len(data) // 2])  # the tail cut: DuckDB alone would replay the first half silently
    for args in (("status",), ("agree",), ("export", "ds"), ("segment",)):
        out = _ror(*args, "--db", str(db), cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("error [E220]:") and out.stderr.count("\n") == 1, out.stderr
        assert "ror recover" in out.stderr and "cut short" in out.stderr and "no paid LLM judge response" in out.stderr
    with pytest.raises(StoreError) as err:  # the library says the same, read-only or not
        Store(db, read_only=True)
    assert err.value.code == "E220"
    rec = _ror("recover", "--db", str(db), cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert "cut short" in rec.stdout and "committed transaction(s) were missing" in rec.stdout
    with Store(db, read_only=True) as s:
        ids = s.trace_ids()
    assert {f"old{n}" for n in range(5)} <= set(ids) and 5 <= len(ids) < 45 and (len(ids) - 5) % 10 == 0
    assert f"{len(ids)} traces" in rec.stdout
    assert _ror("status", "--db", str(db), cwd=tmp_path).returncode == 0
    again = _ror("recover", "--db", str(db), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to recover" in again.stdout


# ------------------------------------------------------------------------------------ an LLM judge run
_JUDGE_CHILD = """
import sys
from ror_annotate.store import Store
from ror_annotate.judge import make_judge
store = Store(sys.argv[1])
judge = make_judge("openai:gpt-4.1-mini", base_url=sys.argv[2], chunk_size=2, concurrency=2)
judge.label(store, [f"t{i}" for i in range(6)], run=store.start_run("label", {}))
"""


def _request_keys(bodies: list[dict]) -> list[tuple[str, tuple]]:
    out = []
    for body in bodies:
        problem = body["messages"][-1]["content"].split("<problem>\n", 1)[1].split("\n</problem>", 1)[0]
        out.append((problem, tuple(parse_prompt(body["messages"])[1])))
    return out


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_paid_judge_answers_survive_a_damaged_log_and_are_not_paid_again(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "s.duckdb"
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(6)}  # 6 traces x 6 segments, chunks of 2: 18 requests
    build_store(db, traces).close()
    with FakeOpenAI(latency=0.1) as srv:
        child = subprocess.Popen([sys.executable, "-c", _JUDGE_CHILD, str(db), srv.base_url], env=_env())
        deadline = time.monotonic() + 60
        # answers are committed in groups (judge.persist.AnswerWriter): wait for two paid notes, not a request count
        while len(_paid_notes(db)) < 2 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        paid = {p["cache_key"]: p for r in _journal_lines(db)[1:] for kind, p in r["notes"] if kind == "judge_cache"}
        assert 2 <= len(paid) < 18
        wal = Path(str(db) + ".wal")
        data = bytearray(wal.read_bytes())
        if damage == "cut":
            data = data[: len(data) // 3]  # replays silently without the journal
        else:
            for i in range(len(data) // 3, len(data) // 3 + 8):
                data[i] ^= 0xFF  # DuckDB refuses the log (E206)
        wal.write_bytes(bytes(data))
        out = _ror("status", "--db", str(db), cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
        # a cut log replays silently: E220 from the journal; flipped bytes either stop DuckDB (E206) or,
        # where they make an entry read as the log's end, are silent too (E220)
        assert out.stderr.startswith(("error [E220]:",) if damage == "cut" else ("error [E206]:", "error [E220]:")), out.stderr
        if out.stderr.startswith("error [E220]:"):
            assert "paid LLM judge responses of run run-" in out.stderr  # names the run
        rec = _ror("recover", "--db", str(db), cwd=tmp_path)
        assert rec.returncode == 0, rec.stderr
        lost = re.search(r"(\d+) paid LLM judge response\(s\) among them, (\d+) restored", rec.stdout)
        assert lost and 1 <= int(lost.group(1)) <= len(paid), rec.stdout  # some paid responses were in the lost commits
        with Store(db) as store:
            cached = {k for (k,) in store.execute("SELECT cache_key FROM judge_cache").fetchall()}
            assert set(paid) <= cached  # every paid response is back in the cache
            answered = {(f"Problem {t[1:]}.", tuple(json.loads(ids))) for t, ids in store.execute("SELECT trace_id, segment_ids FROM judge_cache").fetchall()}
            before = len(srv.chat_requests())
            make_judge("openai:gpt-4.1-mini", base_url=srv.base_url, chunk_size=2).label(store, list(traces))
            resent = _request_keys(srv.chat_requests()[before:])
            assert not answered & set(resent), "a paid request was sent again"
            n_segments = len(store.segments())  # 6 traces x 6 segments, asked 2 at a time
            assert n_segments == 36 and len(resent) == n_segments // 2 - len(answered)
            rows = store.execute("SELECT trace_id, segment_index, count(*) FROM labels GROUP BY 1, 2").fetchall()
            assert len(rows) == n_segments and {r[2] for r in rows} == {1}


# ------------------------------------------------------------------------------------ journal edge cases
def test_a_journal_one_behind_or_of_another_store_or_cut_mid_line_is_no_loss(tmp_path: Path) -> None:
    db = tmp_path / "j.duckdb"
    with Store(db) as s:
        s.upsert_traces([Trace(trace_id="a", text="x. y.")])
        s.upsert_traces([Trace(trace_id="b", text="x. y.")])
        store_id, seq = s.execute("SELECT store_id, seq FROM store_journal").fetchone()
    assert seq >= 2
    journal = Path(str(db) + JOURNAL_SUFFIX)
    # killed between a COMMIT and its journal line: the journal is one behind the store
    journal.write_text(json.dumps({"store_id": store_id, "seq": seq - 1}) + "\n", encoding="utf-8")
    Store(db).close()
    # killed while appending a line: the unfinished last line is ignored
    journal.write_text(json.dumps({"store_id": store_id, "seq": seq}) + '\n{"store_id": "' + store_id + '", "se', encoding="utf-8")
    assert CommitJournal(str(db)).read().seq == seq
    Store(db).close()
    # a journal left by a store deleted since (another store id) is no loss: moved aside with a warning
    journal.write_text(json.dumps({"store_id": "0" * 32, "seq": seq + 50}) + "\n", encoding="utf-8")
    with Store(db) as s:
        assert sorted(s.trace_ids()) == ["a", "b"]
    lines = _journal_lines(db)
    assert len(lines) == 1 and {k: lines[0][k] for k in ("store_id", "seq", "checkpoint")} == {"store_id": store_id, "seq": seq, "checkpoint": True}
    (aside,) = tmp_path.glob("j.duckdb.commits.other-*")
    assert json.loads(aside.read_text(encoding="utf-8")) == {"store_id": "0" * 32, "seq": seq + 50}
    aside.unlink()
    # an old journal (no file id, no checkpoint past the store) ahead of the store is reported, as before file ids
    journal.write_text(json.dumps({"store_id": store_id, "seq": seq + 3}) + "\n", encoding="utf-8")
    with pytest.raises(StoreError) as err:
        Store(db)
    assert err.value.code == "E220" and f"numbers {seq + 1}..{seq + 3}" in str(err.value) and "older copy" in str(err.value)
    # a journal that is not ror's format is its own coded error
    journal.write_text("not json\n{}\n", encoding="utf-8")
    with pytest.raises(StoreError) as err:
        Store(db)
    assert err.value.code == "E221"


_KILLED_SESSION = """
import os, signal, sys
from ror_annotate.store import Store
from ror_annotate.records import Trace
s = Store(sys.argv[1])
for k in range(3):
    s.upsert_traces([Trace(trace_id=f"late{k}", text="a. b.")])
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("later", ["closed", "killed"])
def test_an_older_copy_put_over_a_store_with_a_journal_is_no_loss_and_a_cut_log_still_is(tmp_path: Path, capfd, later: str) -> None:
    """Issue 27 (E220 false alarm): the journal names the file it belongs to, so an older copy of the same store
    copied over it (same store id) is recognised, whether the later session closed or was killed; a log cut
    short on the restored file is still E220."""
    db = tmp_path / "c.duckdb"
    with Store(db) as s:
        s.upsert_traces([Trace(trace_id="a", text="x. y.")])
    backup = tmp_path / "backup.duckdb"
    backup.write_bytes(db.read_bytes())  # a copy taken between two sessions
    if later == "closed":
        with Store(db) as s:
            for k in range(3):
                s.upsert_traces([Trace(trace_id=f"late{k}", text="a. b.")])
    else:  # killed before any checkpoint: the journal holds the commits after its checkpoint line
        done = subprocess.run([sys.executable, "-c", _KILLED_SESSION, str(db)], env=_env(), timeout=120)
        assert done.returncode == -signal.SIGKILL and len(_journal_lines(db)) == 4
    behind = _journal_lines(db)
    assert behind[-1]["seq"] >= 3
    capfd.readouterr()
    Path(str(db) + ".wal").unlink(missing_ok=True)  # the file is replaced, log and all, by the older copy
    db.write_bytes(backup.read_bytes())
    with Store(db) as s:  # before file ids: E220 "lost its last 3 commits"
        assert s.trace_ids() == ["a"]
    err = capfd.readouterr().err
    assert err.startswith("warning [E222]: the commit journal c.duckdb.commits") and err.count("\n") == 1, err
    assert "another copy of this store file" in err and "nothing of this file was lost" in err
    (aside,) = tmp_path.glob("c.duckdb.commits.other-*")
    assert [json.loads(line) for line in aside.read_text(encoding="utf-8").splitlines()] == behind  # kept as it was
    Store(db).close()
    assert capfd.readouterr().err == ""  # said once: the journal is this file's now
    # real log loss on the restored store is still reported
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], env=_env(), timeout=120)
    assert done.returncode == -signal.SIGKILL
    wal = Path(str(db) + ".wal")
    wal.write_bytes(wal.read_bytes()[: wal.stat().st_size // 2])
    with pytest.raises(StoreError) as lost:
        Store(db)
    assert lost.value.code == "E220"


def test_an_old_journal_without_file_ids_is_read_by_its_checkpoint(tmp_path: Path, capfd) -> None:
    """A journal written before file ids: one whose checkpoint is past the store's counter is another file's
    (a checkpointed commit is in the database file; a damaged log cannot lose it); records past the store after
    its checkpoint are E220 as before."""
    db = tmp_path / "o.duckdb"
    with Store(db) as s:
        s.upsert_traces([Trace(trace_id="a", text="x. y.")])
        store_id, seq = s.execute("SELECT store_id, seq FROM store_journal").fetchone()
    journal = Path(str(db) + JOURNAL_SUFFIX)
    journal.write_text(json.dumps({"store_id": store_id, "seq": seq + 4, "checkpoint": True}) + "\n", encoding="utf-8")
    capfd.readouterr()
    with Store(db, read_only=True) as s:  # read-only: no error, and the journal is left alone
        assert s.trace_ids() == ["a"]
    assert journal.exists() and capfd.readouterr().err == ""
    Store(db).close()
    assert capfd.readouterr().err.startswith("warning [E222]:")
    assert len(list(tmp_path.glob("o.duckdb.commits.other-*"))) == 1
    journal.write_text(
        json.dumps({"store_id": store_id, "seq": seq, "checkpoint": True}) + "\n" + json.dumps({"store_id": store_id, "seq": seq + 1, "notes": []}) + "\n",
        encoding="utf-8",
    )
    with pytest.raises(StoreError) as lost:
        Store(db)
    assert lost.value.code == "E220"


def test_a_rolled_back_transaction_neither_counts_nor_leaves_notes(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    with Store(db) as s:
        s.checkpoint()
        seq0 = s.execute("SELECT seq FROM store_journal").fetchone()[0]
        with pytest.raises(RuntimeError):
            with s.transaction():
                s.journal_note("judge_cache", {"cache_key": "x"})
                raise RuntimeError("boom")
        with s.transaction():
            s.journal_note("judge_cache", {"cache_key": "y"})
        assert s.execute("SELECT seq FROM store_journal").fetchone()[0] == seq0 + 1
        assert _journal_lines(db)[1:] == [{"store_id": _journal_lines(db)[0]["store_id"], "seq": seq0 + 1, "notes": [["judge_cache", {"cache_key": "y"}]]}]


def test_memory_and_read_only_stores_write_no_journal(tmp_path: Path) -> None:
    with Store(":memory:") as s:
        s.upsert_traces([Trace(trace_id="a", text="x.")])
    db = tmp_path / "m.duckdb"
    Store(db).close()
    journal = Path(str(db) + JOURNAL_SUFFIX)
    before = journal.read_bytes()
    with Store(db, read_only=True) as s:
        assert s.trace_ids() == []
    assert journal.read_bytes() == before
