"""Issue 27, the store: use from a second thread is refused with a coded error (real threads);
a damaged write-ahead log is a coded error naming `ror recover`, which moves the log aside and
reports what was lost; an old-schema store's message names a command that exists.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ror_annotate.errors import StoreError
from ror_annotate.records import Trace
from ror_annotate.store import Store


def _in_thread(fn):
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(60)
    return box


def test_a_store_used_from_a_second_thread_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    a = Store(db)
    a.upsert_traces([Trace(trace_id="t1", text="a. b.")])
    # thread B with its own handle on the same file, inside A's open transaction
    with a.transaction():
        a.upsert_traces([Trace(trace_id="t2", text="c. d.")])
        box = _in_thread(lambda: Store(db).trace_ids())
        assert isinstance(box.get("error"), StoreError) and box["error"].code == "E205"  # type: ignore[union-attr]
        assert "thread" in str(box["error"])
        # and the same handle used from another thread
        box = _in_thread(lambda: a.trace_ids())
        assert isinstance(box.get("error"), StoreError) and box["error"].code == "E205"  # type: ignore[union-attr]
    assert sorted(a.trace_ids()) == ["t1", "t2"]  # A's transaction was not disturbed
    a.close()
    # once every handle is closed, another thread may open the store
    box = _in_thread(lambda: (s := Store(db), sorted(s.trace_ids()), s.close())[1])
    assert box.get("value") == ["t1", "t2"], box


def test_stores_on_different_files_work_from_different_threads(tmp_path: Path) -> None:
    def work(n: int) -> list[str]:
        with Store(tmp_path / f"s{n}.duckdb") as s:
            s.upsert_traces([Trace(trace_id=f"t{n}", text="x. y.")])
            return s.trace_ids()

    boxes = [_in_thread(lambda n=n: work(n)) for n in range(3)]
    assert [b.get("value") for b in boxes] == [["t0"], ["t1"], ["t2"]]


KILLED_WRITER = """
import os, signal, sys
from ror_annotate.store import Store
from ror_annotate.records import Trace
s = Store(sys.argv[1])
s.upsert_traces([Trace(trace_id=f"old{n}", text=f"step {n}. done.") for n in range(5)])
s.checkpoint()
for k in range(4):  # four commits after the checkpoint, each its own WAL entries
    s.upsert_traces([Trace(trace_id=f"new{k}-{n}", text=f"later {k} {n}. done.") for n in range(10)])
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_store(tmp_path: Path) -> Path:
    import os

    db = tmp_path / "k.duckdb"
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=120)
    assert Path(str(db) + ".wal").stat().st_size > 0
    return db


def _ror(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "ror_annotate", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": "200"}, timeout=120)


@pytest.mark.parametrize("damage", ["flipped", "zeroed-tail"])
def test_a_damaged_wal_is_a_coded_error_and_ror_recover_moves_it_aside(tmp_path: Path, damage: str) -> None:
    db = _killed_store(tmp_path)
    wal = Path(str(db) + ".wal")
    data = bytearray(wal.read_bytes())
    n = len(data)
    # damage inside the first commit after the checkpoint: DuckDB refuses the log (damage in a later
    # commit makes DuckDB stop replaying there without a word; see the README's "Recovering from faults")
    if damage == "flipped":
        for i in (150, 157, 301):
            data[i] ^= 0xFF
    else:
        data[150:] = b"\0" * (n - 150)
    wal.write_bytes(bytes(data))
    original = bytes(data)
    for args in (("status",), ("agree",), ("export", "ds")):
        out = _ror(*args, "--db", str(db), cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("error [E206]:") and "ror recover" in out.stderr and out.stderr.count("\n") == 1
    rec = _ror("recover", "--db", str(db), cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("k.duckdb.wal.damaged-")]
    assert len(aside) == 1 and aside[0].read_bytes() == original  # moved, never deleted
    assert str(aside[0].name) in rec.stdout and "lost" in rec.stdout
    with Store(db, read_only=True) as s:
        ids = s.trace_ids()
    # the checkpointed traces are all there; of the later ones, whole commits or nothing
    assert {f"old{n}" for n in range(5)} <= set(ids)
    later = [i for i in ids if i.startswith("new")]
    assert len(later) % 10 == 0 and len(later) < 40
    assert f"{len(later)} traces" in rec.stdout.replace("\n", " ")
    again = _ror("recover", "--db", str(db), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to recover" in again.stdout


def test_old_schema_store_message_names_a_command_that_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ror_annotate.store import core as store_module  # where Store.__init__ reads CORE_MIGRATIONS
    from ror_annotate.store import CORE_MIGRATIONS

    db = tmp_path / "old.duckdb"
    with monkeypatch.context() as m:  # a store written by the previous schema version
        m.setattr(store_module, "CORE_MIGRATIONS", CORE_MIGRATIONS[:-1])
        Store(db).close()
    out = _ror("status", "--db", str(db), cwd=tmp_path)
    assert out.returncode == 2 and "--write" not in out.stderr
    assert "`ror migrate --db" in out.stderr
    mig = _ror("migrate", "--db", str(db), cwd=tmp_path)
    assert mig.returncode == 0, mig.stderr
    assert f"v{len(CORE_MIGRATIONS)}" in mig.stdout
    assert _ror("status", "--db", str(db), cwd=tmp_path).returncode == 0
