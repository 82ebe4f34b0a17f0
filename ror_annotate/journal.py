"""A commit journal beside the store, so that commits a damaged write-ahead log lost are detected.

DuckDB writes each commit to ``<db>.wal`` and folds the log into the database file at a checkpoint.
A log cut short (a ``kill -9`` while writing, a disk fault, a copy taken mid-write) is replayed up to
its end *without a word*: the commits in the lost tail vanish and every command goes on as if they
had never been made (an LLM judge's answers would then be requested, and paid, again). The log itself
cannot tell, so the evidence has to live outside it:

* the store holds a commit counter (table ``store_journal``: ``store_id``, ``seq``, ``file_id``), raised
  by one in every transaction :meth:`ror_annotate.store.Store.transaction` commits;
* after the ``COMMIT`` the new value is appended to the journal file ``<db>.commits`` (JSON lines),
  with the notes the transaction attached
  (:meth:`~ror_annotate.store.Store.journal_note`; the LLM judge attaches each paid response's cache
  row, so the response survives the loss of the log);
* a checkpoint (each pipeline stage ends with one; DuckDB makes one when the last connection closes)
  puts everything committed into the database file, so the journal is then rewritten as one line.

**Whose journal it is.** ``store_id`` names a store from its creation; every copy of the file keeps it.
``file_id`` names one line of descent of the file: the first transaction a process commits draws a new
one, writes it to the store, checkpoints (so it is in the database file, where no log damage can undo
it) and rewrites the journal with it in its first line. A journal whose store or file id differs from
the store's, or whose last checkpoint is past the store's counter (a checkpointed commit cannot be lost
with the log), was written by another file: an older copy copied over this one, or a store deleted
since. It is moved aside (``<db>.commits.other-<time>``) with a one-line warning
(:data:`OTHER_JOURNAL`, ``E222``) when it recorded more than the store holds, else rewritten; never
an error, since nothing of *this* file was lost. A journal written before file ids existed is
compared by store id and checkpoint as before.

On open, a journal of this file whose last ``seq`` is above the store's counter means committed transactions are
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import StoreError

__all__ = [
    "JOURNAL_ENV", "JOURNAL_MIGRATIONS", "JOURNAL_SUFFIX", "LOST_COMMITS", "OTHER_JOURNAL", "CommitJournal", "JournalState",
    "journal_enabled", "journal_is_other", "lost_commits_error", "other_journal_warning", "restore_lost",
]

#: Suffix of the journal file beside the store file.
JOURNAL_SUFFIX = ".commits"
#: Code of a store that lost commits its journal recorded (a write-ahead log cut short).
LOST_COMMITS = "E220"
#: Code of a journal file that cannot be read (not ror's format).
BAD_JOURNAL = "E221"
#: Code of the warning printed when the journal beside the store was written by another copy of it.
OTHER_JOURNAL = "E222"
#: The journal component's table (declared through ``Store.migrate("journal", ...)``); version 2 adds
#: ``file_id`` (NULL until the first commit of a process that knows it).
JOURNAL_MIGRATIONS: tuple[str, ...] = (
    "CREATE TABLE store_journal (store_id VARCHAR NOT NULL, seq BIGINT NOT NULL)",
    "ALTER TABLE store_journal ADD COLUMN file_id VARCHAR",
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
    file_id : str or None
        The line of descent of the store file that wrote it (None: a journal written before file ids).
    checkpoint_seq : int
        The commit number of its last checkpoint line (0 when none): every commit up to it was in the
        database file, which a damaged log cannot undo.
    records : list of dict
        The commit records since the last checkpoint: ``{"seq": int, "notes": [[kind, payload], ...]}``.
    """

    store_id: str | None = None
    seq: int = 0
    file_id: str | None = None
    checkpoint_seq: int = 0
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
            if rec.get("file_id"):
                state.file_id = str(rec["file_id"])
            state.seq = max(state.seq, int(rec["seq"]))
            if rec.get("checkpoint"):
                state.checkpoint_seq = max(state.checkpoint_seq, int(rec["seq"]))
            else:
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

    def reset(self, store_id: str, seq: int, file_id: str | None = None) -> None:
        """Rewrite the journal as the single line of a checkpoint at commit ``seq`` (atomic rename).

        Called when everything committed is in the database file (after a checkpoint); best effort
        like :meth:`append`. ``file_id`` (the store file's line of descent) goes into that line.
        """
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        head: dict[str, Any] = {"store_id": store_id, "seq": seq, "checkpoint": True}
        if file_id:
            head["file_id"] = file_id
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, (json.dumps(head) + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass


    def set_aside(self) -> Path | None:
        """Rename the journal to ``<db>.commits.other-<UTC time>`` (kept, not read again); its new path, or None if it failed."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        aside = self.path.with_name(f"{self.path.name}.other-{stamp}")
        try:
            os.rename(self.path, aside)
        except OSError:
            return None
        return aside


def journal_is_other(store_id: str, seq: int, file_id: str | None, state: JournalState) -> bool:
    """Whether ``state`` (a journal read beside the store) was written by another file than this store's.

    Parameters
    ----------
    store_id, seq, file_id
        The store's row of ``store_journal`` (``file_id`` None in a store that has none yet).
    state : JournalState
        The journal; an empty one (no ``store_id``) is never another's.

    Returns
    -------
    bool
        True when the store ids differ; or both file ids are known and differ; or the journal's last
        checkpoint is past the store's counter (a checkpointed commit is in the database file, so only
        an older copy of the file can be behind it, never a damaged log).
    """
    if state.store_id is None:
        return False
    if state.store_id != store_id:
        return True
    if file_id and state.file_id and file_id != state.file_id:
        return True
    return seq < state.checkpoint_seq


def other_journal_warning(db_path: str, store_id: str, seq: int, state: JournalState, aside: Path | None) -> str:
    """The one-line ``E222`` warning for a journal of another file (store ``store_id`` at commit ``seq``), moved to ``aside``."""
    name = Path(db_path).name
    where = f"moved aside to {aside.name}" if aside is not None else f"could not be moved aside: delete {name}{JOURNAL_SUFFIX} if this copy is the one you want"
    whose = "another store" if state.store_id != store_id else "another copy of this store file"
    return (
        f"warning [{OTHER_JOURNAL}]: the commit journal {name}{JOURNAL_SUFFIX} (last commit {state.seq}) was written by {whose}, "
        f"not by the file now at {name} (commit {seq}), which was put in its place: nothing of this file was lost; the journal was {where}"
    )


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
    has_file_id = con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'store_journal' AND column_name = 'file_id'"
    ).fetchone()[0]
    row = con.execute(f"SELECT store_id, seq, {'file_id' if has_file_id else 'NULL'} FROM store_journal").fetchone()
    if row is None or int(row[1]) >= state.seq or journal_is_other(str(row[0]), int(row[1]), row[2], state):
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
    journal.reset(state.store_id, state.seq, row[2] or state.file_id)
    return report
