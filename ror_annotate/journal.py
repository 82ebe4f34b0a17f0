"""A commit journal beside the store, so that commits a damaged write-ahead log lost are detected.

DuckDB writes each commit to ``<db>.wal`` and folds the log into the database file at a checkpoint.
A log cut short (a ``kill -9`` while writing, a disk fault, a copy taken mid-write) is replayed up to
its end *without a word*: the commits in the lost tail vanish and every command goes on as if they
had never been made (an LLM judge's answers would then be requested, and paid, again). The log itself
cannot tell, so the evidence has to live outside it:

* the store holds a commit counter (table ``store_journal``: ``store_id``, ``seq``), raised by one in
  every transaction :meth:`ror_annotate.store.Store.transaction` commits;
* after the ``COMMIT`` the new value is appended to the journal file ``<db>.commits`` (JSON lines),
  with the notes the transaction attached
  (:meth:`~ror_annotate.store.Store.journal_note`; the LLM judge attaches each paid response's cache
  row, so the response survives the loss of the log);
* a checkpoint (each pipeline stage ends with one; DuckDB makes one when the last connection closes)
  puts everything committed into the database file, so the journal is then rewritten as one line.

On open, a journal whose last ``seq`` is above the store's counter means committed transactions are
missing from the store: :class:`~ror_annotate.errors.StoreError` ``E220`` names how many, the paid
judge responses among them and the recovery (``ror recover``, which restores those responses from the
journal into the judge's response cache; :func:`restore_lost`). A kill between a ``COMMIT`` and its
journal line leaves the journal one behind the store, which is not a loss.

Costs on the undamaged path: one ``UPDATE`` of a one-row table per transaction and one appended
line per commit, flushed to disk (``fsync``) only when it carries a paid judge response
(``benchmarks/bench_journal.py`` measures it). ``ROR_COMMIT_JOURNAL=off`` turns the journal off.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StoreError

__all__ = ["JOURNAL_ENV", "JOURNAL_MIGRATIONS", "JOURNAL_SUFFIX", "LOST_COMMITS", "CommitJournal", "JournalState", "journal_enabled", "lost_commits_error", "restore_lost"]

#: Suffix of the journal file beside the store file.
JOURNAL_SUFFIX = ".commits"
#: Code of a store that lost commits its journal recorded (a write-ahead log cut short).
LOST_COMMITS = "E220"
#: Code of a journal file that cannot be read (not ror's format).
BAD_JOURNAL = "E221"
#: The journal component's table (declared through ``Store.migrate("journal", ...)``).
JOURNAL_MIGRATIONS: tuple[str, ...] = (
    "CREATE TABLE store_journal (store_id VARCHAR NOT NULL, seq BIGINT NOT NULL)",
)
#: Environment variable that turns the journal off (``off``, ``0``, ``false``, ``no``): then a log
#: cut short goes undetected again, as DuckDB alone leaves it (for a store whose folder takes no
#: second file, or where an ``fsync`` per paid response is slow).
JOURNAL_ENV = "ROR_COMMIT_JOURNAL"
#: Note kind of a paid LLM judge response (its ``judge_cache`` row, column -> value).
JUDGE_CACHE_NOTE = "judge_cache"


@dataclass
class JournalState:
    """What a journal file says.

    Attributes
    ----------
    store_id : str or None
        The store the journal belongs to (None: empty or absent journal).
    seq : int
        The last commit number written (0 when none).
    records : list of dict
        The commit records since the last checkpoint: ``{"seq": int, "notes": [[kind, payload], ...]}``.
    """

    store_id: str | None = None
    seq: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    def after(self, seq: int) -> list[dict[str, Any]]:
        """The records of commits numbered above ``seq``."""
        return [r for r in self.records if int(r.get("seq", 0)) > seq]


class CommitJournal:
    """The journal file ``<db>.commits`` of one store.

    Parameters
    ----------
    db_path : str
        The store file (not ``:memory:``).
    """

    def __init__(self, db_path: str) -> None:
        self.path = Path(db_path + JOURNAL_SUFFIX)

    def read(self) -> JournalState:
        """Parse the journal; an absent or empty file is an empty state.

        A last line cut short (the process was killed while appending it) is ignored: its commit
        was made, but a journal one behind the store is not a loss.

        Raises
        ------
        StoreError
            ``E221``: a line before the last is not a journal record.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return JournalState()
        except OSError as exc:
            raise StoreError(f"cannot read the commit journal {self.path}: {exc}", code=BAD_JOURNAL) from None
        state = JournalState()
        lines = raw.split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or not isinstance(rec.get("seq"), int):
                    raise ValueError("not a record")
            except ValueError:
                if i == len(lines) - 1:
                    break  # the unfinished last line (no line end yet) of a process killed while appending it
                raise StoreError(
                    f"the commit journal {self.path} is not in ror's format (line {i + 1}); if the store opens and "
                    "its rows are complete, delete the journal (it is rewritten at the next checkpoint)",
                    code=BAD_JOURNAL,
                ) from None
            if rec.get("store_id"):
                state.store_id = str(rec["store_id"])
            state.seq = max(state.seq, int(rec["seq"]))
            if not rec.get("checkpoint"):
                state.records.append(rec)
        return state

    def append(self, store_id: str, seq: int, notes: list[tuple[str, Any]]) -> None:
        """Append the record of commit ``seq``; one with notes (a paid judge response) is also flushed to disk.

        Every line is written to the file before this returns, so it survives the process being
        killed (the operating system keeps it); a line with notes is also ``fsync``-ed, so a paid
        response survives a power cut too. Lines without notes are not, because an ``fsync`` per
        commit cost up to ~15 ms on a loaded disk (``benchmarks/bench_journal.py``): after a power
        cut such a line may be missing, which leaves the journal behind the store, never ahead.

        Best effort: an error writing the journal (a full disk) is not raised, since the commit
        itself is made; the journal then stays behind the store, which is never reported as a loss.
        """
        line = json.dumps({"store_id": store_id, "seq": seq, "notes": notes}, ensure_ascii=False, default=str, separators=(",", ":"))
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
                if notes:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass

    def reset(self, store_id: str, seq: int) -> None:
        """Rewrite the journal as the single line of a checkpoint at commit ``seq`` (atomic rename).

        Called when everything committed is in the database file (after a checkpoint); best effort
        like :meth:`append`.
        """
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, (json.dumps({"store_id": store_id, "seq": seq, "checkpoint": True}) + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass


def journal_enabled() -> bool:
    """False when :data:`JOURNAL_ENV` turns the journal off."""
    return os.environ.get(JOURNAL_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def new_store_id() -> str:
    """A random id naming one store, so a journal left by a deleted store is not read as this one's."""
    return uuid.uuid4().hex


def lost_commits_error(db_path: str, store_seq: int, state: JournalState) -> StoreError:
    """The ``E220`` error of a store whose counter ``store_seq`` is below the journal's last ``seq``."""
    lost = state.after(store_seq)
    paid = [p for r in lost for kind, p in r.get("notes", []) if kind == JUDGE_CACHE_NOTE]
    runs = sorted({str(p.get("run_id")) for p in paid if isinstance(p, dict) and p.get("run_id")})
    n = state.seq - store_seq
    name = Path(db_path).name
    what = (f"{len(paid)} paid LLM judge responses" + (f" of run {', '.join(runs)}" if runs else "") + " among them") if paid else "no paid LLM judge response among them"
    return StoreError(
        f"the store {db_path} lost its last {n} commit{'s' if n != 1 else ''} (numbers {store_seq + 1}..{state.seq}; {what}): "
        f"its write-ahead log {name}.wal was cut short or damaged (a kill -9 or a disk fault while writing), and DuckDB replays "
        f"such a log up to the damage without a word. Run `ror recover --db {db_path}`: it restores the paid judge responses from the commit "
        f"journal {name}{JOURNAL_SUFFIX}, then re-run the commands that were running (`ror status` lists the runs kept); "
        "`ror label` takes the restored responses from its cache without paying again. (If the store file was replaced "
        f"by an older copy on purpose, delete {name}{JOURNAL_SUFFIX} instead.)",
        code=LOST_COMMITS,
    )


@dataclass
class RestoreReport:
    """What :func:`restore_lost` did: commits lost, judge responses restored (rows) and already present."""

    lost_commits: int = 0
    judge_responses: int = 0
    judge_restored: int = 0


def restore_lost(con: Any, db_path: str) -> RestoreReport:
    """Bring a store that lost journaled commits back in line with its journal.

    Inserts the paid judge responses of the lost commits into ``judge_cache`` (rows already there
    are kept), sets the store's commit counter to the journal's, checkpoints, and rewrites the journal.
    The labels of those responses are not rebuilt here: re-running ``ror label`` takes them from the
    cache without new requests.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
        A writable connection to the store.
    db_path : str
        The store file.

    Returns
    -------
    RestoreReport
        ``lost_commits`` 0 when the store was not behind its journal (nothing done).
    """
    journal = CommitJournal(db_path)
    state = journal.read()
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "store_journal" not in tables or state.store_id is None:
        return RestoreReport()
    row = con.execute("SELECT store_id, seq FROM store_journal").fetchone()
    if row is None or row[0] != state.store_id or int(row[1]) >= state.seq:
        return RestoreReport()
    report = RestoreReport(lost_commits=state.seq - int(row[1]))
    paid = [p for r in state.after(int(row[1])) for kind, p in r.get("notes", []) if kind == JUDGE_CACHE_NOTE and isinstance(p, dict)]
    report.judge_responses = len(paid)
    con.execute("BEGIN TRANSACTION")
    try:
        if paid and "judge_cache" in tables:
            columns = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'judge_cache'").fetchall()}
            before = int(con.execute("SELECT count(*) FROM judge_cache").fetchone()[0])
            for p in paid:
                cols = [c for c in p if c in columns]
                con.execute(
                    f"INSERT INTO judge_cache ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) ON CONFLICT DO NOTHING",
                    [p[c] for c in cols],
                )
            report.judge_restored = int(con.execute("SELECT count(*) FROM judge_cache").fetchone()[0]) - before
        con.execute("UPDATE store_journal SET seq = ?", [state.seq])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("CHECKPOINT")
    journal.reset(state.store_id, state.seq)
    return report
