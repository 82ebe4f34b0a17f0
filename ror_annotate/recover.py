"""Recovering a store whose write-ahead log was damaged (``ror recover``).

DuckDB writes every commit to ``<db>.wal`` and folds the log into the database file at a
checkpoint (every pipeline stage ends with one, see :meth:`ror_annotate.store.Store.checkpoint`).
A process killed with SIGKILL, or a disk fault, can leave a log that no longer replays (flipped
bytes, a zeroed tail): DuckDB then refuses to open the file at all (``E206``).

:func:`recover_store` moves the damaged log aside (it is never deleted), replays the part of the log
before the first damaged entry (DuckDB names its byte position; commits are replayed whole or not
at all), checkpoints the result, and reports what the last checkpointed state held, what the log
gave back and how many of its bytes could not be read. A log cut short replays without an error; the
commit journal (:mod:`ror_annotate.journal`) tells, and the paid LLM judge responses of the lost
commits are restored from it into the judge's response cache (for a log that does not replay too).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .errors import StoreError
from .pool import interrupts_deferred

with interrupts_deferred():  # an interrupt inside its initialisation aborts (see ror_annotate.store)
    import duckdb

#: Core tables whose rows the report counts.
COUNTED_TABLES = ("traces", "segments", "labels", "runs")


@dataclass
class RecoveryReport:
    """What :func:`recover_store` did.

    Attributes
    ----------
    path : str
        The store file.
    recovered : bool
        False when there was nothing to recover (no log, or a log that replays).
    wal_aside : str or None
        Where the damaged log was moved (``<db>.wal.damaged-<UTC time>``).
    wal_bytes, replayed_bytes : int
        Size of the damaged log, and how many of its leading bytes were replayed (bytes).
    checkpoint_counts, recovered_counts : dict of str to int
        Rows per core table in the last checkpointed state, and after replaying the readable part.
    error : str
        DuckDB's message about the damaged log ("" when the log replayed but was cut short).
    lost_commits : int
        Commits the commit journal (``<db>.commits``, :mod:`ror_annotate.journal`) recorded that the
        store no longer held.
    judge_responses, judge_restored : int
        Paid LLM judge responses among those commits, and how many of them were put back into the
        judge's response cache from the journal (the others were already there).
    """

    path: str
    recovered: bool
    wal_aside: str | None = None
    wal_bytes: int = 0
    replayed_bytes: int = 0
    checkpoint_counts: dict[str, int] = field(default_factory=dict)
    recovered_counts: dict[str, int] = field(default_factory=dict)
    error: str = ""
    lost_commits: int = 0
    judge_responses: int = 0
    judge_restored: int = 0

    @property
    def lost_bytes(self) -> int:
        """Bytes of the log that could not be replayed."""
        return self.wal_bytes - self.replayed_bytes


def _connect(path: str, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection; a store held by another process is a :class:`StoreError`, not a traceback."""
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.Error as exc:
        if "lock" in str(exc).lower() and "WAL" not in str(exc):
            raise StoreError(f"the store {path} is in use by another process; recover it after that process ends: {exc}") from None
        raise


#: Code of a store whose database file (not its log) cannot be read (:func:`recover_store`).
UNREADABLE_STORE = "E771"


def _unreadable(db: Path, exc: BaseException) -> StoreError:
    """The coded error of a database file that DuckDB cannot read even without its log."""
    reason = " ".join(str(exc).split())[:300]
    return StoreError(
        f"the store {db} cannot be opened even without its log ({reason}): its database file is damaged, cut short "
        "or not a DuckDB file. ror recover repairs a damaged write-ahead log, not the database file: restore the file "
        "from a backup or build the store again (ror run / ror ingest); nothing was changed",
        code=UNREADABLE_STORE,
    )


def _counts(path: str) -> dict[str, int]:
    con = _connect(path, read_only=True)
    try:
        present = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        counts = {}
        for t in COUNTED_TABLES:
            row = con.execute(f"SELECT count(*) FROM {t}").fetchone() if t in present else None
            counts[t] = int(row[0]) if row else 0
        return counts
    finally:
        con.close()


def _replays(path: str) -> str | None:
    """None when the store opens (replaying and checkpointing its log), else DuckDB's message."""
    try:
        con = duckdb.connect(path)
    except duckdb.Error as exc:
        if "lock" in str(exc).lower() and "WAL" not in str(exc):
            raise StoreError(f"the store {path} is in use by another process; recover it after that process ends: {exc}") from None
        return str(exc)
    try:
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return None


def recover_store(path: str | Path) -> RecoveryReport:
    """Open a store whose write-ahead log is damaged, keeping everything the log still holds intact.

    Parameters
    ----------
    path : str or Path
        The store file (``--db``).

    Returns
    -------
    RecoveryReport

    Raises
    ------
    StoreError
        No store file at ``path``; the store is in use by another process; or the database file itself
        (not only its log) cannot be opened.
    """
    db = Path(path).expanduser().resolve()
    if not db.is_file():
        raise StoreError(f"no store at {db}; check --db (or ROR_DB)")
    wal = Path(str(db) + ".wal")
    if not wal.is_file() or wal.stat().st_size == 0 or (error := _replays(str(db))) is None:
        # the log replays (or there is none); it may still have been cut short: ask the journal
        try:
            before = _counts(str(db))
        except duckdb.Error as exc:  # the database file itself is damaged, cut short, or no DuckDB file
            raise _unreadable(db, exc) from None
        report = RecoveryReport(path=str(db), recovered=False, checkpoint_counts=before)
        _restore_from_journal(report)
        if report.lost_commits:
            report.recovered = True
            report.recovered_counts = _counts(str(db))
        return report
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = wal.with_name(f"{wal.name}.damaged-{stamp}")
    os.rename(wal, aside)
    size = aside.stat().st_size
    try:
        before = _counts(str(db))
    except duckdb.Error as exc:
        os.rename(aside, wal)  # the database file itself is unreadable: leave everything as it was
        raise _unreadable(db, exc) from None
    found = re.search(r"byte position (\d+)", error)
    replayed = 0
    if found and int(found.group(1)) > 0:
        replayed = int(found.group(1))
        with aside.open("rb") as src, wal.open("wb") as dst:  # a copy of the readable part; the original stays aside
            shutil.copyfileobj(_Limited(src, replayed), dst)
        if _replays(str(db)) is not None:
            wal.unlink(missing_ok=True)  # our own partial copy; the damaged original is untouched
            replayed = 0
    report = RecoveryReport(
        path=str(db), recovered=True, wal_aside=str(aside), wal_bytes=size, replayed_bytes=replayed,
        checkpoint_counts=before, error=error.splitlines()[0],
    )
    _restore_from_journal(report)  # the paid judge responses of the commits the log lost
    report.recovered_counts = _counts(str(db))
    return report


def _restore_from_journal(report: RecoveryReport) -> None:
    """Fill ``report``'s journal fields by :func:`ror_annotate.journal.restore_lost` on the store."""
    from .journal import restore_lost

    con = _connect(report.path, read_only=False)
    try:
        done = restore_lost(con, report.path)
    finally:
        con.close()
    report.lost_commits, report.judge_responses, report.judge_restored = done.lost_commits, done.judge_responses, done.judge_restored


class _Limited:
    """The first ``limit`` bytes of a binary file object (for ``shutil.copyfileobj``)."""

    def __init__(self, fh, limit: int) -> None:  # type: ignore[no-untyped-def]
        self.fh, self.left = fh, limit

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.fh.read(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        return data
