"""The one embedded DuckDB file that holds everything: traces, segments, labels, runs.

Every stage reads and writes through :class:`Store`; no stage opens the DuckDB file itself.
Stages that need tables of their own (judge cache, review studies, ...) declare them with
:meth:`Store.migrate`, which keeps one schema version per component in ``schema_versions``.

Concurrency (DuckDB allows one read-write process per file, and even a read-only open is refused
while another process writes; see ``shared/pitfalls/DB-01``): opening retries with exponential
backoff for up to ``lock_timeout`` seconds and then raises :class:`StoreLockedError` naming the file.
Inside one process every :class:`Store` on the same path shares one connection, so a second
"view" never trips DuckDB's "different configuration" error.

Timestamps are stored as naive UTC ``TIMESTAMP`` and come back timezone-aware.
JSON-valued fields are stored as text (no DuckDB extension needed).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, NamedTuple

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from .provenance import scrub_secrets, scrub_text, scrub_url, scrub_value  # noqa: F401  (scrub_url/scrub_secrets: kept importable from here)
from .errors import ConfigError, SchemaVersionError, StoreError, StoreLockedError, StoreReadOnlyError
from .records import SOURCE_KINDS, Annotator, Label, Run, Segment, Trace, utc_now

DEFAULT_DB = "ror.duckdb"

#: Schema version of the core tables; bump and append to ``CORE_MIGRATIONS`` to change them.
CORE_MIGRATIONS: tuple[str, ...] = (
    # v1
    """
    CREATE TABLE traces (
        trace_id VARCHAR PRIMARY KEY,
        text VARCHAR NOT NULL,
        text_sha256 VARCHAR NOT NULL,
        problem VARCHAR, answer VARCHAR, gold_answer VARCHAR, correct BOOLEAN,
        model VARCHAR, source VARCHAR, dataset VARCHAR,
        meta VARCHAR,
        ingested_at TIMESTAMP NOT NULL,
        run_id VARCHAR
    );
    CREATE TABLE segmentations (
        trace_id VARCHAR PRIMARY KEY,
        segmenter VARCHAR NOT NULL,
        token_counter VARCHAR NOT NULL,
        n_segments INTEGER NOT NULL,
        created_at TIMESTAMP NOT NULL,
        run_id VARCHAR
    );
    CREATE TABLE segments (
        trace_id VARCHAR NOT NULL,
        segment_index INTEGER NOT NULL,
        char_start INTEGER NOT NULL,
        char_end INTEGER NOT NULL,
        text VARCHAR NOT NULL,
        n_tokens INTEGER NOT NULL,
        PRIMARY KEY (trace_id, segment_index)
    );
    CREATE TABLE labels (
        label_id VARCHAR PRIMARY KEY,
        trace_id VARCHAR NOT NULL,
        segment_index INTEGER NOT NULL,
        label VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        annotator VARCHAR NOT NULL,
        codebook_version VARCHAR NOT NULL,
        run_id VARCHAR,
        study VARCHAR,
        confidence DOUBLE,
        rationale VARCHAR,
        created_at TIMESTAMP NOT NULL,
        extra VARCHAR
    );
    CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        command VARCHAR NOT NULL,
        parameters VARCHAR,
        package_versions VARCHAR,
        started_at TIMESTAMP NOT NULL,
        ended_at TIMESTAMP,
        status VARCHAR NOT NULL,
        counts VARCHAR
    );
    """,
    # v2: tables of other stages that refer to a trace's segments, and what re-segmenting does to them
    """
    CREATE TABLE trace_dependents (
        table_name VARCHAR PRIMARY KEY,
        policy VARCHAR NOT NULL,
        component VARCHAR NOT NULL
    );
    """,
    # v3: the format adapter that read each trace (ror_annotate.formats); NULL for traces stored before
    "ALTER TABLE traces ADD COLUMN source_format VARCHAR;",
    # v4: labels without a PRIMARY KEY. Its ART index over random 32-hex label ids stays in memory and
    # cannot be evicted (~70 MiB per million labels, counted against DuckDB's memory_limit), and no
    # query uses it; upsert_labels keeps label_id unique (delete then insert, in one transaction).
    """
    CREATE TABLE labels_v4 (
        label_id VARCHAR NOT NULL,
        trace_id VARCHAR NOT NULL,
        segment_index INTEGER NOT NULL,
        label VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        annotator VARCHAR NOT NULL,
        codebook_version VARCHAR NOT NULL,
        run_id VARCHAR,
        study VARCHAR,
        confidence DOUBLE,
        rationale VARCHAR,
        created_at TIMESTAMP NOT NULL,
        extra VARCHAR
    );
    INSERT INTO labels_v4 SELECT * FROM labels;
    DROP TABLE labels;
    ALTER TABLE labels_v4 RENAME TO labels;
    """,
    # v5: declared raters (kind, model, provider, sampling, codebook) and a class distribution per label
    """
    ALTER TABLE labels ADD COLUMN distribution DOUBLE[];
    CREATE TABLE annotators (
        annotator VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        model VARCHAR,
        provider VARCHAR,
        temperature DOUBLE,
        samples INTEGER,
        codebook_version VARCHAR,
        study VARCHAR,
        details VARCHAR,
        declared_at TIMESTAMP NOT NULL
    );
    """,
)

#: Tables owned by this module; anything else with a ``trace_id`` column belongs to a stage.
CORE_TABLES = ("traces", "segmentations", "segments", "labels", "runs", "trace_dependents", "schema_versions", "annotators")

#: What :meth:`Store.replace_segments` does to a stage's rows of a re-segmented trace.
DependentPolicy = Literal["cascade", "refuse"]

#: Filter on a list of trace ids as a hash semi-join (``list_contains`` costs rows x ids).
_IDS_FILTER = "trace_id IN (SELECT unnest(?::VARCHAR[]))"

#: The ``labels`` table's columns, in table order, as Arrow types (:meth:`Store.upsert_label_table`).
LABEL_TABLE_SCHEMA = pa.schema([
    ("label_id", pa.string()), ("trace_id", pa.string()), ("segment_index", pa.int32()), ("label", pa.string()),
    ("source", pa.string()), ("annotator", pa.string()), ("codebook_version", pa.string()), ("run_id", pa.string()),
    ("study", pa.string()), ("confidence", pa.float64()), ("rationale", pa.string()), ("created_at", pa.timestamp("us")),
    ("extra", pa.string()), ("distribution", pa.list_(pa.float64())),
])
#: Rows per unit of the row-id ranges of :meth:`Store.trace_filter` (DuckDB's vector, the finest unit its scan skips).
ROWID_BUCKET = 2048
#: Most row-id ranges one :meth:`Store.trace_filter` condition names; the closest are merged beyond it.
MAX_ROWID_RANGES = 32
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def rowid_ranges(buckets: Sequence[int], max_ranges: int = MAX_ROWID_RANGES) -> list[tuple[int, int]]:
    """Sorted bucket numbers (``rowid // ROWID_BUCKET``) as at most ``max_ranges`` inclusive bucket ranges.

    Runs of consecutive buckets become one range; beyond ``max_ranges`` the ranges with the
    smallest gaps between them are merged (the result then covers some buckets not asked for).
    """
    runs: list[list[int]] = []
    for b in buckets:
        if runs and b <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], b)
        else:
            runs.append([b, b])
    while len(runs) > max(max_ranges, 1):
        i = min(range(len(runs) - 1), key=lambda k: runs[k + 1][0] - runs[k][1])
        runs[i][1] = runs[i + 1][1]
        del runs[i + 1]
    return [(lo, hi) for lo, hi in runs]


#: Code of a store used from a thread other than the one that opened it.
WRONG_THREAD = "E205"


def _wrong_thread(path: str, shared: "_Shared") -> StoreError:
    return StoreError(
        f"the store {path} is open in thread {shared.owner_name!r} of this process and was used from thread "
        f"{threading.current_thread().name!r}: a store's connection belongs to the thread that opened it (DuckDB "
        "transactions of two threads on one connection would mix). Use the store from that thread, close every "
        "handle there first, or use it from another process",
        code=WRONG_THREAD,
    )


class _Shared:
    """One DuckDB connection per resolved path inside this process, shared by every :class:`Store`
    handle on that path: a reference count and the transaction depth live here, not on a handle, so
    two handles on one file join one transaction instead of nesting ``BEGIN`` (a raw
    ``TransactionException`` in DuckDB)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, read_only: bool) -> None:
        self.con = con
        self.read_only = read_only
        #: The thread that opened the connection: the only one that may use it (see :class:`Store`).
        self.owner = threading.get_ident()
        self.owner_name = threading.current_thread().name
        self.refs = 0
        self.tx_depth = 0
        self.lock = threading.RLock()
        self.temp_components: set[str] = set()
        self.memory_limit: str | None = None  # the configured DuckDB memory_limit; None: DuckDB's default
        self.cache_checked_at = float("-inf")  # time.monotonic() of the last Store.release_cache check
        # the commit journal (ror_annotate.journal): None until Store._journal_open, and on ":memory:"
        self.journal: Any = None
        self.journal_state: list[Any] = ["", 0, []]  # store_id, commit counter, notes of the open transaction


_OPEN: dict[str, _Shared] = {}
_OPEN_LOCK = threading.Lock()


def to_naive_utc(value: datetime | None) -> datetime | None:
    """The store's timestamp convention: naive UTC (an aware value is converted; a naive one is taken as UTC)."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _to_aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Could not set lock" in text or "Conflicting lock" in text)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM inside the block (main thread only): a few milliseconds of bookkeeping
    that must complete once begun."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C (or SIGTERM, which the CLI turns into Ctrl-C) in any of its disguises:
    :class:`KeyboardInterrupt`, DuckDB's ``InterruptException``, the plain ``RuntimeError("Query
    interrupted")`` DuckDB raises when the signal lands while a result is being fetched, or the
    ``InvalidInputException`` ("... failed: KeyboardInterrupt") it raises when the signal lands
    while it reads a registered Arrow table (every bulk insert)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    # An interrupt can also surface as a later error it caused (a cleanup query on the transaction
    # the interrupt aborted: "Current transaction is aborted"); walk the chain of causes.
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (KeyboardInterrupt, duckdb.InterruptException)):
            return True
        if isinstance(current, RuntimeError) and "query interrupted" in str(current).lower():
            return True
        # DuckDB re-raises a KeyboardInterrupt thrown inside a Python callback it made (reading a
        # registered Arrow table's schema) as its own error, keeping only the name in the message.
        if isinstance(current, duckdb.Error) and "failed: KeyboardInterrupt" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def translate_duckdb_error(exc: BaseException, path: str, what: str = "") -> BaseException:
    """The project's view of a DuckDB exception: an interrupted query (Ctrl-C inside DuckDB) becomes
    :class:`KeyboardInterrupt`, a write to a read-only store :class:`StoreReadOnlyError`, anything else a
    :class:`StoreError` naming the store file; other exceptions are returned unchanged."""
    if is_interrupt(exc):
        return KeyboardInterrupt()
    if not isinstance(exc, duckdb.Error):
        return exc
    text = " ".join(str(exc).split())
    if "read-only" in text.lower() or "read only" in text.lower():
        return StoreReadOnlyError(f"the store {path} is open read-only{': ' + what if what else ''}; {text}")
    return StoreError(f"store {path}{': ' + what if what else ''}: {text}")


@contextmanager
def duckdb_errors(path: str, what: str = "") -> Iterator[None]:
    """Re-raise DuckDB exceptions inside the block as the project's coded errors (:func:`translate_duckdb_error`)."""
    try:
        yield
    except duckdb.Error as exc:
        raise translate_duckdb_error(exc, path, what) from exc


#: Environment variable bounding DuckDB's memory (its buffer cache of table blocks above all).
MEMORY_LIMIT_ENV = "ROR_DUCKDB_MEMORY_LIMIT"
#: Bytes of cached table blocks :meth:`Store.release_cache` lets DuckDB keep.
CACHE_KEEP_BYTES = 16 * 2**20
#: Seconds between two looks at the cache by :meth:`Store.release_cache` (a look is a ~1 ms query).
CACHE_CHECK_SECONDS = 1.0


def _duckdb_config(memory_limit: str | None) -> dict[str, Any]:
    limit = memory_limit if memory_limit is not None else os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    return {"memory_limit": limit} if limit else {}


#: Code of a store whose write-ahead log (``<db>.wal``) cannot be replayed (``ror recover`` helps).
DAMAGED_WAL = "E206"
#: Code of a store file DuckDB cannot open (not a DuckDB file, damaged, another version's format).
UNREADABLE_STORE = "E207"


def _open_error(path: str, exc: Exception) -> StoreError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "WAL" in str(exc):
        return StoreError(
            f"the store {path} cannot be opened: its write-ahead log {Path(path).name}.wal is damaged (a process killed "
            f"while writing, a disk fault: {text}). Run `ror recover --db {path}`: it moves the log aside (never deletes "
            "it), keeps every commit the log still holds intact, opens the last checkpointed state and reports what was lost",
            code=DAMAGED_WAL,
        )
    return StoreError(f"cannot open the store {path}: {text}", code=UNREADABLE_STORE)


def _process_command(db_path: str, pid: int) -> str:
    """What process ``pid`` runs: the ror command in the store's progress file when that process wrote
    it, else its command line (Linux ``/proc``) up to its first ``--option`` (so no option value, such
    as a key, is ever shown), else ``"command unknown"``."""
    state = ProgressFile.read(db_path) if db_path != ":memory:" else None
    if isinstance(state, dict) and state.get("pid") == pid and state.get("status") == "running" and state.get("command"):
        return str(state["command"])
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "command unknown"
    parts = [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]
    # The program and its leading words only: options (where an --api-key would be) are left out.
    shown = []
    for n, part in enumerate(parts):
        if n and (part.startswith("--") or "=" in part or "://" in part):
            shown.append("...")
            break
        shown.append(Path(part).name if n == 0 else part[:40])
    text = " ".join(shown)
    return (text[:117] + "...") if len(text) > 120 else (text or "command unknown")


def _connect_with_retry(path: str, lock_timeout: float, read_only: bool = False, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + max(lock_timeout, 0.0)
    delay = 0.05
    config = _duckdb_config(memory_limit)
    while True:
        try:
            return duckdb.connect(path, read_only=read_only, config=config)
        except (duckdb.InvalidInputException, duckdb.ParserException) as exc:
            if not config:
                raise StoreError(f"cannot open the store {path}: {exc}") from exc
            given = "memory_limit" if memory_limit is not None else MEMORY_LIMIT_ENV
            raise ConfigError(
                f"{given}={config.get('memory_limit')!r} is not a DuckDB memory size (e.g. '512MB', '2GB'): {exc}"
            ) from exc
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                raise _open_error(path, exc) from exc
            if time.monotonic() >= deadline:
                holder = re.search(r"PID (\d+)", str(exc))
                who = f" (process {holder.group(1)}: {_process_command(path, int(holder.group(1)))})" if holder else ""
                if read_only:
                    raise StoreLockedError(
                        f"the store {path} is locked by another process{who}, which is writing it; DuckDB lets no other "
                        "process open the file while one writes, not even to read. Wait for it to finish (`ror status` shows its "
                        f"progress), or work on a copy made after it ends. (waited {lock_timeout:g} s; raise --lock-timeout "
                        "to wait longer)"
                    ) from exc
                raise StoreLockedError(
                    f"the store {path} is locked by another process{who}: DuckDB allows one writer per file. "
                    f"Wait for that command to finish (`ror status` shows its progress), or pass --db with another path. "
                    f"(waited {lock_timeout:g} s; raise --lock-timeout to wait longer)"
                ) from exc
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)) * (0.5 + random.random() / 2))
            delay = min(delay * 2, 1.0)
        except duckdb.Error as exc:  # a damaged write-ahead log or database file
            raise _open_error(path, exc) from exc


class SegmentLength(NamedTuple):
    """A segment's trace and length in tokens (see :meth:`Store.segment_lengths`)."""

    trace_id: str
    n_tokens: int


class ProgressFile:
    """A small JSON file beside the store (``<db>.progress.json``) that a writing command keeps up to date.

    DuckDB lets no other process open a file, even read-only, while one process writes it (see
    ``shared/pitfalls/DB-01``), so ``ror status`` reads this file to show a running job. It is written
    atomically (temporary file + rename), at most once per ``min_interval`` seconds for progress
    updates, and always at a run's start and end. It holds counts and stage names only: never
    parameters; every string in it passes :func:`~ror_annotate.provenance.scrub_text` before it is
    written (a judge's failure text may repeat an endpoint's echo of the API key).
    """

    def __init__(self, path: Path, min_interval: float | None = None) -> None:
        import os

        self.path = path
        # ROR_PROGRESS_INTERVAL (seconds) lets a watcher (or a test) ask for finer updates.
        self.min_interval = float(os.environ.get("ROR_PROGRESS_INTERVAL", "1.0")) if min_interval is None else min_interval
        self._last = 0.0
        self._state: dict[str, Any] = {}

    @classmethod
    def for_store(cls, db_path: str) -> "ProgressFile | None":
        """The progress file of the store at ``db_path`` (None for in-memory stores)."""
        return None if db_path == ":memory:" else cls(Path(db_path + ".progress.json"))

    def start(self, run: Run) -> None:
        import os

        self._state = {
            "run_id": run.run_id, "command": run.command, "pid": os.getpid(), "status": "running",
            "started_at": run.started_at.isoformat(), "stages": {},
        }
        self._write(force=True)

    def update(self, stage: str, *, done: int, total: int | None, info: str = "") -> None:
        """Record that ``stage`` has done ``done`` of ``total`` units (throttled)."""
        if not self._state:
            return
        first = stage not in self._state["stages"]
        self._state["stages"][stage] = {"done": done, "total": total, "info": info}
        self._write(force=first or (total is not None and done >= total))

    def finish(self, run: Run, status: str) -> None:
        if not self._state:
            return
        self._state["status"] = status
        self._state["counts"] = run.counts
        self._state["ended_at"] = utc_now().isoformat()
        self._write(force=True)

    def _write(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        self._state["updated_at"] = utc_now().isoformat()
        tmp = self.path.with_name(self.path.name + f".{uuid.uuid4().hex[:6]}.tmp")
        try:
            tmp.write_text(json.dumps(scrub_value(self._state), default=str), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # read-only media or a full disk must not fail the job itself

    @staticmethod
    def read(db_path: str | Path) -> dict[str, Any] | None:
        """The last state written beside the store at ``db_path``, or None."""
        path = Path(str(Path(db_path).expanduser().resolve()) + ".progress.json")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None


@dataclass
class RaterLabels:
    """One rater's labels as columns, for :meth:`Store.replace_rater_labels` at a million segments.

    Attributes
    ----------
    trace_id : list of str, length n
    segment_index : ndarray of int, shape (n,)
    label : ndarray of int, shape (n,)
        Index into :data:`~ror_annotate.records.BEHAVIORS`.
    codebook_version : str
    confidence : ndarray of float, shape (n,), optional
    distribution : ndarray of float, shape (n, 6), optional
        Rows in BEHAVIORS order, each summing to 1 (within 1e-6).
    extra : list of dict, length n, optional
    run_id, study : str, optional
    """

    trace_id: list[str]
    segment_index: Any
    label: Any
    codebook_version: str
    confidence: Any = None
    distribution: Any = None
    extra: list[dict[str, Any]] | None = None
    run_id: str | None = None
    study: str | None = None

    def to_table(self, source: str, annotator: str) -> pa.Table:
        """The rows in the labels table's layout, with :attr:`Label.label_id` (same key, same hash).

        Raises
        ------
        StoreError
            A label index, confidence or distribution out of range, or columns of different lengths.
        """
        import numpy as np

        from .records import BEHAVIORS, LABEL_SOURCES

        n = len(self.trace_id)
        index = np.asarray(self.segment_index, dtype=np.int64)
        label = np.asarray(self.label, dtype=np.int64)
        bad = [name for name, col in (("segment_index", index), ("label", label)) if len(col) != n]
        if bad or (self.extra is not None and len(self.extra) != n):
            raise StoreError(f"RaterLabels columns of different lengths ({', '.join(bad) or 'extra'} vs {n} trace ids)")
        if source not in LABEL_SOURCES or not annotator:
            raise StoreError(f"RaterLabels: unknown label source {source!r} or empty annotator")
        if n and (label.min() < 0 or label.max() >= len(BEHAVIORS) or index.min() < 0):
            raise StoreError("RaterLabels: a label index outside BEHAVIORS or a negative segment index")
        conf = None if self.confidence is None else np.asarray(self.confidence, dtype=np.float64)
        if conf is not None and (len(conf) != n or (n and not ((conf >= 0) & (conf <= 1)).all())):
            raise StoreError("RaterLabels: confidence must be n values in [0, 1]")
        dist = None if self.distribution is None else np.asarray(self.distribution, dtype=np.float64)
        if dist is not None and (dist.shape != (n, len(BEHAVIORS)) or (n and (
                (dist < 0).any() or (dist > 1).any() or np.abs(dist.sum(axis=1) - 1).max() > 1e-6))):
            raise StoreError(f"RaterLabels: distribution must be n rows of {len(BEHAVIORS)} probabilities summing to 1")
        # Label.label_id: sha256 of json.dumps([trace_id, segment_index, source, annotator, codebook_version, study])
        tail = json.dumps([source, annotator, self.codebook_version, self.study], ensure_ascii=False)[1:]
        heads: dict[str, str] = {}
        ids = []
        for t, i in zip(self.trace_id, index.tolist()):
            head = heads.get(t)
            if head is None:
                head = heads[t] = json.dumps([t], ensure_ascii=False)[:-1]
            ids.append(hashlib.sha256(f"{head}, {i}, {tail}".encode("utf-8")).hexdigest()[:32])
        dumped: dict[int, str] = {}  # by object: rows sharing one dict are serialised once
        extras = ["{}"] * n if self.extra is None else [
            dumped.get(id(e)) or dumped.setdefault(id(e), json.dumps(e, ensure_ascii=False, default=str)) for e in self.extra
        ]
        dist_col = (pa.nulls(n, type=pa.list_(pa.float64())) if dist is None
                    else pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * len(BEHAVIORS)), pa.array(dist.reshape(-1))))
        return pa.table({
            "label_id": pa.array(ids, type=pa.string()),
            "trace_id": pa.array(self.trace_id, type=pa.string()),
            "segment_index": pa.array(index.astype(np.int32)),
            "label": pa.array(np.asarray(BEHAVIORS, dtype=object)[label], type=pa.string()),
            "source": pa.array([source] * n, type=pa.string()),
            "annotator": pa.array([annotator] * n, type=pa.string()),
            "codebook_version": pa.array([self.codebook_version] * n, type=pa.string()),
            "run_id": pa.array([self.run_id] * n, type=pa.string()),
            "study": pa.array([self.study] * n, type=pa.string()),
            "confidence": pa.nulls(n, type=pa.float64()) if conf is None else pa.array(conf),
            "rationale": pa.nulls(n, type=pa.string()),
            "created_at": pa.array([to_naive_utc(utc_now())] * n, type=pa.timestamp("us")),
            "extra": pa.array(extras, type=pa.string()),
            "distribution": dist_col,
        })


class Store:
    """A DuckDB-backed store of traces, segments, labels and runs.

    Parameters
    ----------
    path : str or Path, default ``"ror.duckdb"``
        The database file; created (with parents) if missing, unless ``read_only``. ``":memory:"``
        works for tests.
    lock_timeout : float, default 10.0
        Seconds to keep retrying (with backoff) while another process holds the file's lock.
    read_only : bool, default False
        Open without writing anything (no migration, no run record): for commands that only read
        (``status``, ``agree``) and for stores on read-only media. Writes raise
        :class:`StoreReadOnlyError`.
    memory_limit : str, optional
        DuckDB's ``memory_limit`` (``"512MB"``, ``"2GB"``) for this process's connection to the
        file; default the environment variable ``ROR_DUCKDB_MEMORY_LIMIT``, else DuckDB's own
        default (80% of RAM). DuckDB keeps every table block it reads or writes cached until this
        limit, so on a large corpus the cache grows with the store; a limit bounds it (blocks are
        re-read from the file, operators spill to ``<db>.tmp``). Ignored when the file is already
        open in this process.

    Notes
    -----
    Threads: every handle on one file in a process shares one DuckDB connection, and that connection
    belongs to the thread that opened it. Opening or using a store from another thread while it is
    open is refused with a :class:`StoreError` (code ``E205``) instead of mixing the two threads'
    transactions (a run recorded by one thread would be rolled back with the other's, uncommitted rows
    would be read). Use a store from one thread; other threads (or processes) open it after every
    handle of the first is closed. Stores on different files work from different threads.

    Raises
    ------
    ConfigError
        ``memory_limit`` (or the environment variable) is not a size DuckDB understands.
    StoreLockedError
        The file stayed locked by another process for ``lock_timeout`` seconds.
    SchemaVersionError
        The file was written by a newer ror_annotate (or, read-only, by an older one that needs a
        migration first).
    StoreError
        ``read_only`` and there is no store file at ``path``; or DuckDB could not open it.
    """

    def __init__(
        self, path: str | Path = DEFAULT_DB, *, lock_timeout: float = 10.0, read_only: bool = False, memory_limit: str | None = None
    ) -> None:
        self.path = str(path) if str(path) == ":memory:" else str(Path(path).expanduser().resolve())
        self.read_only = read_only and self.path != ":memory:"
        if self.read_only and not Path(self.path).is_file():
            raise StoreError(f"no store at {self.path}; check --db (or ROR_DB), or create one with `ror ingest FILE`")
        if self.path != ":memory:" and not self.read_only:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._closed = False
        self._progress: ProgressFile | None = None
        with _OPEN_LOCK:
            entry = _OPEN.get(self.path) if self.path != ":memory:" else None
            if entry is not None and entry.read_only and not self.read_only:
                raise StoreError(
                    f"the store {self.path} is already open read-only in this process; close that handle before writing"
                )
            if entry is not None and entry.owner != threading.get_ident():
                raise _wrong_thread(self.path, entry)
            if entry is None:
                entry = _Shared(_connect_with_retry(self.path, lock_timeout, self.read_only, memory_limit), self.read_only)
                entry.memory_limit = _duckdb_config(memory_limit).get("memory_limit")
                if self.path != ":memory:":
                    _OPEN[self.path] = entry
            entry.refs += 1
            self._shared = entry
        try:
            if entry.read_only:
                self._check_readable()
            else:
                self._ensure_versions_table()
                self.migrate("core", CORE_MIGRATIONS)
            self._journal_open()
        except BaseException:
            self.close()
            raise

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection of this file in this process; only the thread that opened it may use it.

        Raises
        ------
        StoreError
            ``E205``: called from another thread.
        """
        shared = self._shared
        if shared.owner != threading.get_ident():
            raise _wrong_thread(self.path, shared)
        return shared.con

    def _check_readable(self) -> None:
        found = self._count("SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_versions'")
        version = self.schema_version("core") if found else 0
        if version != len(CORE_MIGRATIONS):
            raise SchemaVersionError(
                f"the store {self.path} has core schema v{version} and this ror_annotate expects v{len(CORE_MIGRATIONS)}; "
                f"it cannot be opened read-only until it is migrated: run `ror migrate --db {self.path}` (or any "
                "writing command, such as `ror ingest`)" if version < len(CORE_MIGRATIONS) else
                f"the store {self.path} has core schema v{version}, newer than this ror_annotate knows "
                f"(v{len(CORE_MIGRATIONS)}): upgrade ror_annotate"
            )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Release this handle; the connection closes when the last handle on the path closes."""
        if self._closed:
            return
        self._closed = True
        with _OPEN_LOCK:
            self._shared.refs -= 1
            if self._shared.refs <= 0:
                self._journal_close()
                self._shared.con.close()
                if _OPEN.get(self.path) is self._shared:
                    _OPEN.pop(self.path, None)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreReadOnlyError(f"cannot {what}: the store {self.path} is open read-only")

    @contextmanager
    def transaction(self) -> Iterator["Store"]:
        """All writes inside the block land together or not at all.

        Nested blocks, and blocks opened through another :class:`Store` handle on the same file in
        this process, join the outermost one. DuckDB errors inside the block roll it back and are
        re-raised as :class:`StoreError` (an interrupted query as :class:`KeyboardInterrupt`).
        """
        shared = self._shared
        with shared.lock:
            if shared.tx_depth == 0:
                with duckdb_errors(self.path, "begin transaction"):
                    self.con.execute("BEGIN TRANSACTION")
                shared.journal_state[2] = []
            shared.tx_depth += 1
            try:
                yield self
            except BaseException as exc:
                shared.tx_depth -= 1
                if shared.tx_depth == 0:
                    try:
                        self.con.execute("ROLLBACK")
                    except duckdb.Error:
                        pass  # the failed statement may already have aborted the transaction
                if isinstance(exc, duckdb.Error):
                    raise translate_duckdb_error(exc, self.path) from exc
                raise
            else:
                shared.tx_depth -= 1
                if shared.tx_depth == 0:
                    with duckdb_errors(self.path, "commit"):
                        self._journal_count_commit()
                        self.con.execute("COMMIT")
                    self._journal_committed()
                    self.release_cache()

    def release_cache(self, *, keep_bytes: int = CACHE_KEEP_BYTES, force: bool = False) -> int:
        """Drop DuckDB's cached table blocks beyond ``keep_bytes``, between transactions; return the bytes dropped.

        DuckDB keeps every block of a table it has read in its buffer pool until ``memory_limit``
        (80% of RAM unless configured) forces it out. A stage that streams the corpus reads each block
        once, so the cache only grows: ~70 MiB per million segments in ``ror run``. Lowering
        ``memory_limit`` makes DuckDB evict unpinned blocks down to it (its buffer pool's ``SetLimit``);
        the configured limit (``Store(memory_limit=)``, ``ROR_DUCKDB_MEMORY_LIMIT``, else DuckDB's
        default) is set back at once, so a ``SET memory_limit`` of your own is replaced by it. Dropped
        blocks are read again from the file (the OS page cache) when next needed.

        Cheap enough to call after every unit of work: it looks at ``duckdb_memory()`` at most once per
        :data:`CACHE_CHECK_SECONDS` (unless ``force``), and does nothing inside a transaction (a lowered
        limit there can fail the commit) or while the cache is under ``keep_bytes``. Not for use while
        another thread runs a query on this store: it could meet the lowered limit.

        Raises
        ------
        StoreError
            DuckDB refused to set the configured memory limit back (the store is left unusable).
        """
        shared = self._shared
        now = time.monotonic()
        if not force and now - shared.cache_checked_at < CACHE_CHECK_SECONDS:
            return 0
        with shared.lock:
            shared.cache_checked_at = now
            if shared.tx_depth:
                return 0
            used = dict(self.con.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall())
            cached = int(used.get("BASE_TABLE", 0))
            if cached <= keep_bytes:
                return 0
            # what this cannot evict (indexes, other buffers) plus what may stay cached
            floor_kib = (sum(int(v) for v in used.values()) - cached + keep_bytes) // 1024 + 1
            with _signals_held():  # a Ctrl-C between the two statements would leave the low limit in place
                try:
                    self.con.execute(f"SET memory_limit = '{floor_kib}KiB'")
                except duckdb.OutOfMemoryException:
                    pass  # DuckDB evicted what it could; the limit is set back below either way
                finally:
                    with duckdb_errors(self.path, "restore memory_limit"):
                        if shared.memory_limit:
                            self.con.execute(f"SET memory_limit = '{shared.memory_limit}'")
                        else:
                            self.con.execute("RESET memory_limit")
            # fetchall: a result read to its end leaves the connection free for DuckDB 2's relational API (con.sql)
            after = self.con.execute("SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = 'BASE_TABLE'").fetchall()
            return max(cached - int(after[0][0] if after else 0), 0)

    def checkpoint(self) -> bool:
        """Write what the write-ahead log holds into the database file now (DuckDB ``CHECKPOINT``).

        DuckDB checkpoints by itself when the WAL passes its ``checkpoint_threshold`` (16 MiB by
        default) and when the store closes. Once a table spans a few row groups (122,880 rows each),
        a checkpoint after appends to it rewrites its last row groups: ~100 MiB for a moment on a
        ``labels`` table of 300k+ rows, on top of whatever the last stage left allocated when it
        happens at close (at 1M segments ``ror run`` peaked there, after the export). The pipeline calls this at the end of each stage
        instead, where that stage's working memory is already released, and drops the blocks the
        checkpoint read (:meth:`release_cache`). It also leaves a store file that holds all its data
        without its ``.wal``.

        Returns False, doing nothing, on a read-only store or inside a transaction (a ``CHECKPOINT``
        there would fail the transaction); True otherwise.

        Raises
        ------
        StoreError
            DuckDB could not write the checkpoint (e.g. the disk is full); the WAL keeps the data.
        """
        shared = self._shared
        with shared.lock:
            if self.read_only or shared.tx_depth:
                return False
            with duckdb_errors(self.path, "checkpoint"):
                self.con.execute("CHECKPOINT").fetchall()
            self._journal_checkpointed()
        self.release_cache(force=True)
        return True

    def _abandon_transaction(self) -> None:
        """Roll back whatever transaction an interrupt left open (e.g. Ctrl-C between ``BEGIN`` and the
        block, or during ``COMMIT``), so the run's final status is not written into it and lost."""
        self._shared.tx_depth = 0
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction was open: the usual case

    def _count(self, sql: str, params: Sequence[Any] | None = None) -> int:
        row = self.con.execute(sql, params).fetchone() if params is not None else self.con.execute(sql).fetchone()
        return int(row[0]) if row else 0

    @property
    def in_transaction(self) -> bool:
        """Whether a :meth:`transaction` block is open on this file in this process."""
        return self._shared.tx_depth > 0

    # ------------------------------------------------------------------ schema
    def _ensure_versions_table(self) -> None:
        self.con.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions (component VARCHAR PRIMARY KEY, version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)"
        )

    def schema_version(self, component: str = "core") -> int:
        """Applied schema version of ``component`` (0 if none)."""
        row = self.con.execute("SELECT version FROM schema_versions WHERE component = ?", [component]).fetchone()
        return int(row[0]) if row else 0

    def migrate(self, component: str, migrations: Sequence[str]) -> int:
        """Apply the pending migrations of ``component`` (each a string of SQL statements), in order.

        ``migrations[i]`` brings the component from version ``i`` to ``i + 1``. Each migration runs in
        its own transaction together with the version bump. Returns the resulting version.

        Raises :class:`SchemaVersionError` when the store is newer than ``migrations``.
        """
        current = self.schema_version(component)
        if self.read_only and current < len(migrations):
            if current == 0:
                # The stage never ran on this store: give its readers empty tables for this
                # connection only (DuckDB allows temporary tables on a read-only file).
                if component in self._shared.temp_components:
                    return 0
                self._shared.temp_components.add(component)
                for version in range(len(migrations)):
                    for statement in _split_sql(migrations[version]):
                        self.con.execute(re.sub(r"\bCREATE\s+TABLE\b", "CREATE TEMP TABLE", statement, count=1, flags=re.IGNORECASE))
                return 0
            raise SchemaVersionError(
                f"the store {self.path} has {component} schema v{current} and this ror_annotate expects "
                f"v{len(migrations)}; run `ror migrate --db {self.path}` (or any writing command) to migrate it"
            )
        if current > len(migrations):
            raise SchemaVersionError(
                f"the store {self.path} has {component} schema v{current}, but this ror_annotate knows only "
                f"v{len(migrations)}: upgrade ror_annotate, or use another --db"
            )
        for version in range(current, len(migrations)):
            with self.transaction():
                for statement in _split_sql(migrations[version]):
                    self.con.execute(statement)
                self.con.execute(
                    "INSERT OR REPLACE INTO schema_versions VALUES (?, ?, ?)",
                    [component, version + 1, to_naive_utc(utc_now())],
                )
        return len(migrations)

    # ------------------------------------------------------------------ generic access
    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Run one SQL statement on the shared connection, for a stage's own tables.

        Core tables (traces, segmentations, segments, labels, runs) are written only through this
        class's methods. DuckDB errors are raised as :class:`StoreError` (see :func:`duckdb_errors`).
        """
        with duckdb_errors(self.path):
            return self.con.execute(sql, params) if params is not None else self.con.execute(sql)

    def _register(self, view: str, rows: pa.Table) -> None:
        # DuckDB 2 refuses register()/unregister() while an earlier execute() has rows left
        # unfetched (e.g. after fetchone()); abort() drops that pending result and nothing else.
        _drop_pending_result(self.con)
        self.con.register(view, rows)

    def _unregister(self, view: str) -> None:
        _drop_pending_result(self.con)
        self.con.unregister(view)

    def insert_arrow(self, table_name: str, rows: pa.Table, *, on_conflict: str = "") -> None:
        """Bulk insert a ``pyarrow.Table`` whose column names match ``table_name``'s columns.

        ``on_conflict`` is appended verbatim (e.g. ``"ON CONFLICT DO NOTHING"``). Much faster than
        ``executemany`` for thousands of rows.
        """
        view = f"_ror_insert_{uuid.uuid4().hex[:8]}"
        self._register(view, rows)
        try:
            cols = ", ".join(f'"{c}"' for c in rows.column_names)
            self.con.execute(f"INSERT INTO {table_name} ({cols}) SELECT {cols} FROM {view} {on_conflict}")
        finally:
            self._unregister(view)

    # ------------------------------------------------------------------ traces
    def upsert_traces(self, traces: Iterable[Trace], *, run_id: str | None = None) -> dict[str, int]:
        """Insert traces; a trace already stored with the same text is left untouched.

        Returns counts ``{"inserted": n, "unchanged": n}``.

        Raises
        ------
        StoreError
            A stored trace has the same id but different text (ids must be stable); nothing is written.
        """
        self._require_writable("store traces")
        traces = list(traces)
        if not traces:
            return {"inserted": 0, "unchanged": 0}
        new = self.check_traces(traces)
        unchanged = len(traces) - len(new)
        if new:
            now = to_naive_utc(utc_now())
            table = pa.table(
                {
                    "trace_id": [t.trace_id for t in new],
                    "text": [t.text for t in new],
                    "text_sha256": [t.text_sha256 for t in new],
                    "problem": [t.problem for t in new],
                    "answer": [t.answer for t in new],
                    "gold_answer": [t.gold_answer for t in new],
                    "correct": pa.array([t.correct for t in new], type=pa.bool_()),
                    "model": [t.model for t in new],
                    "source": [t.source for t in new],
                    "dataset": [t.dataset for t in new],
                    "source_format": pa.array([t.source_format for t in new], type=pa.string()),
                    "meta": [json.dumps(t.meta, ensure_ascii=False, default=str) for t in new],
                    "ingested_at": pa.array([now] * len(new), type=pa.timestamp("us")),
                    "run_id": pa.array([run_id] * len(new), type=pa.string()),
                }
            )
            with self.transaction():
                self.insert_arrow("traces", table)
        return {"inserted": len(new), "unchanged": unchanged}

    def check_traces(self, traces: Sequence[Trace]) -> list[Trace]:
        """The traces of ``traces`` not yet stored, after checking none contradicts the store; writes nothing.

        :meth:`upsert_traces` stores exactly these; an ingest calls this over the whole input first,
        so a conflict anywhere is found before anything is written.

        Raises
        ------
        StoreError
            A stored trace (or an earlier one in ``traces``) has the same id but different text.
        """
        existing = dict(self.con.execute(
            f"SELECT trace_id, text_sha256 FROM traces WHERE {_IDS_FILTER}", [[t.trace_id for t in traces]]
        ).fetchall()) if traces else {}
        new: list[Trace] = []
        seen: dict[str, str] = {}
        for t in traces:
            digest = t.text_sha256
            prior = existing.get(t.trace_id) or seen.get(t.trace_id)
            if prior is not None:
                if prior != digest:
                    raise StoreError(
                        f"trace {t.trace_id!r} is already in {self.path} with different text: trace ids must be stable. "
                        "Give the new trace another id, or use another --db"
                    )
                continue
            seen[t.trace_id] = digest
            new.append(t)
        return new

    def trace_ids(self) -> list[str]:
        """All stored trace ids, in ingestion order then id."""
        return [r[0] for r in self.con.execute("SELECT trace_id FROM traces ORDER BY ingested_at, trace_id").fetchall()]

    def get_trace(self, trace_id: str) -> Trace:
        """The stored trace ``trace_id``; raises :class:`StoreError` if absent."""
        traces = list(self.iter_traces([trace_id]))
        if not traces:
            raise StoreError(f"no trace {trace_id!r} in {self.path}; ingest it first (ror ingest)")
        return traces[0]

    def iter_traces(self, trace_ids: Sequence[str] | None = None) -> Iterator[Trace]:
        """Yield stored traces (all, or those in ``trace_ids``), in ingestion order."""
        cols = "trace_id, text, problem, answer, gold_answer, correct, model, source, dataset, meta, source_format"
        if trace_ids is None:
            rows = self.con.execute(f"SELECT {cols} FROM traces ORDER BY ingested_at, trace_id").fetchall()
        else:
            rows = self.con.execute(
                f"SELECT {cols} FROM traces WHERE {_IDS_FILTER} ORDER BY ingested_at, trace_id", [list(trace_ids)]
            ).fetchall()
        for r in rows:
            yield Trace(
                trace_id=r[0], text=r[1], problem=r[2], answer=r[3], gold_answer=r[4], correct=r[5],
                model=r[6], source=r[7], dataset=r[8], meta=json.loads(r[9]) if r[9] else {}, source_format=r[10],
            )

    # ------------------------------------------------------------------ segments
    def segmentation_of(self, trace_id: str) -> tuple[str, str] | None:
        """``(segmenter, token_counter)`` used for ``trace_id``, or None if not segmented."""
        row = self.con.execute("SELECT segmenter, token_counter FROM segmentations WHERE trace_id = ?", [trace_id]).fetchone()
        return (row[0], row[1]) if row else None

    def segmentations(self) -> dict[str, tuple[str, str, int]]:
        """``{trace_id: (segmenter, token_counter, n_segments)}`` for every segmented trace (one query)."""
        rows = self.con.execute("SELECT trace_id, segmenter, token_counter, n_segments FROM segmentations").fetchall()
        return {r[0]: (r[1], r[2], int(r[3])) for r in rows}

    def register_trace_dependent(self, table: str, policy: DependentPolicy, *, component: str) -> None:
        """Declare that ``table`` (a stage's own table with a ``trace_id`` column) refers to segments.

        ``policy`` says what :meth:`replace_segments` does with that table's rows of a trace whose
        segmentation changes: ``"cascade"`` deletes them in the same transaction (derived data such
        as cached judge responses), ``"refuse"`` makes re-segmenting fail while any exist (review
        items and tasks that a Label Studio server also holds). A table with a ``trace_id`` column
        that nobody registered is treated as ``"refuse"``. Stages call this from their migrations.
        """
        if policy not in ("cascade", "refuse"):
            raise StoreError(f"unknown dependent policy {policy!r} for table {table!r}: use 'cascade' or 'refuse'")
        if self.read_only:
            return
        with duckdb_errors(self.path, f"register {table}"):
            self.con.execute("INSERT OR REPLACE INTO trace_dependents VALUES (?, ?, ?)", [table, policy, component])

    def _trace_dependents(self, trace_id: str) -> dict[str, tuple[str, int]]:
        """``{table: (policy, n_rows)}`` for every stage table holding rows of ``trace_id``."""
        tables = [
            r[0] for r in self.con.execute(
                "SELECT DISTINCT table_name FROM information_schema.columns WHERE column_name = 'trace_id' "
                "AND table_schema = current_schema()"
            ).fetchall()
            if r[0] not in CORE_TABLES
        ]
        policies = dict(self.con.execute("SELECT table_name, policy FROM trace_dependents").fetchall())
        found: dict[str, tuple[str, int]] = {}
        for table in sorted(tables):
            n = self._count(f'SELECT count(*) FROM "{table}" WHERE trace_id = ?', [trace_id])
            if n:
                found[table] = (policies.get(table, "refuse"), n)
        return found

    def replace_segments(
        self,
        trace_id: str,
        segments: Sequence[Segment],
        *,
        segmenter: str,
        token_counter: str,
        run_id: str | None = None,
        force: bool = False,
    ) -> str:
        """Store the segmentation of one trace; idempotent.

        Returns ``"inserted"``, ``"unchanged"`` (same spans already stored) or ``"replaced"``.

        A segment is identified by ``(trace_id, segment_index)``; that identity must never silently
        point at new text. So when the spans change:

        - labels of the trace: without ``force`` re-segmenting is refused; with ``force`` they are
          deleted;
        - rows of other stages (registered with :meth:`register_trace_dependent`): ``cascade``
          tables lose the trace's rows in the same transaction, ``refuse`` tables (and unregistered
          ones) make re-segmenting fail, even with ``force``, while they hold rows of the trace.

        Raises
        ------
        StoreError
            The trace is segmented differently and labels refer to it (without ``force``), or a
            ``refuse`` table refers to it; nothing is written.
        """
        self._require_writable("store segments")
        spans = [(s.char_start, s.char_end, s.n_tokens) for s in segments]
        with duckdb_errors(self.path, f"segments of {trace_id!r}"), self.transaction():
            old = self.con.execute(
                "SELECT char_start, char_end, n_tokens FROM segments WHERE trace_id = ? ORDER BY segment_index", [trace_id]
            ).fetchall()
            if old and [tuple(r) for r in old] == spans:
                # Same spans under another rule-set id: record the new provenance, keep every label.
                self.con.execute(
                    "UPDATE segmentations SET segmenter = ?, token_counter = ? WHERE trace_id = ? AND (segmenter <> ? OR token_counter <> ?)",
                    [segmenter, token_counter, trace_id, segmenter, token_counter],
                )
                return "unchanged"
            if old:
                self._clear_dependents(trace_id, force)
            table = pa.table(
                {
                    "trace_id": [trace_id] * len(segments),
                    "segment_index": pa.array([s.segment_index for s in segments], type=pa.int32()),
                    "char_start": pa.array([s.char_start for s in segments], type=pa.int32()),
                    "char_end": pa.array([s.char_end for s in segments], type=pa.int32()),
                    "text": [s.text for s in segments],
                    "n_tokens": pa.array([s.n_tokens for s in segments], type=pa.int32()),
                }
            )
            if old:
                self.con.execute("DELETE FROM segments WHERE trace_id = ?", [trace_id])
            self.insert_arrow("segments", table)
            self.con.execute(
                "INSERT OR REPLACE INTO segmentations VALUES (?, ?, ?, ?, ?, ?)",
                [trace_id, segmenter, token_counter, len(segments), to_naive_utc(utc_now()), run_id],
            )
        return "replaced" if old else "inserted"

    def replace_segments_many(
        self,
        items: Sequence[tuple[str, Sequence[Segment]]],
        *,
        segmenter: str,
        token_counter: str,
        run_id: str | None = None,
        force: bool = False,
    ) -> list[str]:
        """Store the segmentations of a batch of traces in one transaction; :meth:`replace_segments` for many.

        Traces with no stored segments (the usual case: a first ``ror segment``) are written with
        one Arrow insert into ``segments`` and one into ``segmentations`` for the whole batch, after
        one query that finds which of them have segments already; those go through
        :meth:`replace_segments` one by one (its checks and statuses) inside the same transaction.
        Per-trace costs (a transaction, a full-table lookup of the trace's old spans) become
        per-batch ones: a million short traces no longer do a million scans.

        Parameters
        ----------
        items : sequence of (str, sequence of Segment)
            ``(trace_id, segments)`` per trace; each trace's segments in index order.
        segmenter, token_counter, run_id, force
            As in :meth:`replace_segments`, for every trace of the batch.

        Returns
        -------
        list of str
            Per item, ``"inserted"``, ``"unchanged"`` or ``"replaced"`` as :meth:`replace_segments` returns.

        Raises
        ------
        StoreError
            From the first trace :meth:`replace_segments` refuses (the message names it), or a write
            that fails (named by the batch's first trace): the whole batch is rolled back, batches
            committed before it stay.
        """
        self._require_writable("store segments")
        if not items:
            return []
        ids = [trace_id for trace_id, _ in items]
        first = ids[0]
        statuses: list[str] = ["inserted"] * len(items)
        with duckdb_errors(self.path, f"segments of the batch from {first!r} ({len(items)} traces)"), self.transaction():
            found = self.trace_filter("segments", ids)
            stored: set[str] = set()
            if found is not None:
                condition, values = found
                stored = {r[0] for r in self.con.execute(f"SELECT DISTINCT trace_id FROM segments WHERE {condition}", values).fetchall()}
            seen: set[str] = set()
            fresh: list[int] = []
            later: list[int] = []
            for k, trace_id in enumerate(ids):
                (later if trace_id in stored or trace_id in seen else fresh).append(k)
                seen.add(trace_id)
            if fresh:
                segs = [seg for k in fresh for seg in items[k][1]]
                table = pa.table(
                    {
                        "trace_id": pa.array([ids[k] for k in fresh for _ in items[k][1]], pa.string()),
                        "segment_index": pa.array([seg.segment_index for seg in segs], type=pa.int32()),
                        "char_start": pa.array([seg.char_start for seg in segs], type=pa.int32()),
                        "char_end": pa.array([seg.char_end for seg in segs], type=pa.int32()),
                        "text": pa.array([seg.text for seg in segs], pa.string()),
                        "n_tokens": pa.array([seg.n_tokens for seg in segs], type=pa.int32()),
                    }
                )
                n = len(fresh)
                marks = pa.table(
                    {
                        "trace_id": pa.array([ids[k] for k in fresh], pa.string()),
                        "segmenter": pa.repeat(pa.scalar(segmenter, pa.string()), n),
                        "token_counter": pa.repeat(pa.scalar(token_counter, pa.string()), n),
                        "n_segments": pa.array([len(items[k][1]) for k in fresh], pa.int32()),
                        "created_at": pa.repeat(pa.scalar(to_naive_utc(utc_now()), pa.timestamp("us")), n),
                        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), n),
                    }
                )
                if table.num_rows:
                    self.insert_arrow("segments", table)
                self.insert_arrow("segmentations", marks, on_conflict="ON CONFLICT DO UPDATE SET segmenter = excluded.segmenter, "
                                  "token_counter = excluded.token_counter, n_segments = excluded.n_segments, "
                                  "created_at = excluded.created_at, run_id = excluded.run_id")
            for k in later:
                statuses[k] = self.replace_segments(ids[k], items[k][1], segmenter=segmenter, token_counter=token_counter, run_id=run_id, force=force)
        return statuses

    def _clear_dependents(self, trace_id: str, force: bool) -> None:
        """Refuse, or delete what refers to the old segments of ``trace_id`` (see :meth:`replace_segments`)."""
        n_labels = self._count("SELECT count(*) FROM labels WHERE trace_id = ?", [trace_id])
        if n_labels and not force:
            raise StoreError(
                f"trace {trace_id!r} is already segmented differently in {self.path} and {n_labels} labels refer to "
                "those segments; re-segmenting would orphan them. Use another --db, or --force to drop those labels"
            )
        dependents = self._trace_dependents(trace_id)
        refusing = {t: n for t, (policy, n) in dependents.items() if policy == "refuse"}
        if refusing:
            listed = ", ".join(f"{t} ({n} rows)" for t, n in refusing.items())
            raise StoreError(
                f"trace {trace_id!r} cannot be re-segmented in {self.path}: other stages refer to its segments "
                f"({listed}), e.g. a review study whose tasks a Label Studio server holds. Re-segmenting would make "
                "those rows point at new text. Use another --db for the new segmentation"
            )
        self.con.execute("DELETE FROM labels WHERE trace_id = ?", [trace_id])
        for table in dependents:
            self.con.execute(f'DELETE FROM "{table}" WHERE trace_id = ?', [trace_id])

    def segments(self, trace_id: str | None = None) -> list[Segment]:
        """Stored segments of one trace (or of all traces), ordered by trace then index.

        Parameters
        ----------
        trace_id : str, optional
            Only this trace's segments; all traces when None.

        Returns
        -------
        list of Segment
            ``char_start``/``char_end`` are code-point offsets into the trace text; ``n_tokens``
            is in the tokens of the counter recorded by :meth:`segmentation_of`. An unknown or
            unsegmented ``trace_id`` gives an empty list (no error).
        """
        sql = "SELECT trace_id, segment_index, char_start, char_end, text, n_tokens FROM segments"
        params: list[Any] = []
        if trace_id is not None:
            sql += " WHERE trace_id = ?"
            params.append(trace_id)
        rows = self.con.execute(sql + " ORDER BY trace_id, segment_index", params).fetchall()
        return [
            Segment(trace_id=r[0], segment_index=r[1], char_start=r[2], char_end=r[3], text=r[4], n_tokens=r[5])
            for r in rows
        ]

    def segments_by_trace(self, trace_ids: Sequence[str]) -> dict[str, list[Segment]]:
        """The stored segments of several traces in one query: ``{trace_id: [Segment, ...]}`` in
        segment order; a trace without segments maps to ``[]``. For stages that work in batches
        (it reads only the table's row groups that hold these traces: :meth:`rows_of_traces`)."""
        out: dict[str, list[Segment]] = {t: [] for t in trace_ids}
        with duckdb_errors(self.path, "read segments"):
            rows = self.rows_of_traces(
                "segments", "trace_id, segment_index, char_start, char_end, text, n_tokens", trace_ids,
                order_by="trace_id, segment_index",
            )
        for r in rows:
            out[r[0]].append(Segment(trace_id=r[0], segment_index=r[1], char_start=r[2], char_end=r[3], text=r[4], n_tokens=r[5]))
        return out

    def trace_filter(self, table: str, trace_ids: Sequence[str]) -> tuple[str, list[Any]] | None:
        """A ``WHERE`` condition for the rows of ``trace_ids`` in ``table`` that lets DuckDB skip the
        rest of the table, with its parameters; None when no row of ``table`` belongs to them.

        ``trace_id IN (SELECT unnest(?))`` alone is a semi-join that DuckDB applies after its scan, so
        a query reads every column it returns over the whole table: each batch of a stage read the
        whole corpus (and its blocks stayed in DuckDB's cache). Here one query first reads the
        ``trace_id`` column alone to find where those rows are, as ranges of row ids rounded to
        :data:`ROWID_BUCKET` rows (at most :data:`MAX_ROWID_RANGES`, see :func:`rowid_ranges`); the
        condition is ``(rowid BETWEEN ? AND ? OR ...) AND trace_id IN (...)``, which DuckDB pushes into
        its scan, and it selects exactly the rows the semi-join does. Measured on a 1M-segment store
        (DuckDB 2.0): a 20k-segment batch's text read 1 MiB of blocks in 4 ms instead of 18 MiB in 22 ms.

        Row ids hold within one snapshot: run this and the query using it in one transaction
        (:meth:`rows_of_traces` does).

        Raises
        ------
        ValueError
            ``table`` is not a plain identifier.
        """
        if not _IDENTIFIER.fullmatch(table):
            raise ValueError(f"not a table name: {table!r}")
        ids = list(trace_ids)
        if not ids:
            return None
        buckets = self.con.execute(
            f'SELECT DISTINCT rowid // {ROWID_BUCKET} AS b FROM "{table}" WHERE {_IDS_FILTER} ORDER BY b', [ids]
        ).fetchall()
        if not buckets:
            return None
        ranges = rowid_ranges([int(b[0]) for b in buckets])
        params: list[Any] = [v for lo, hi in ranges for v in (lo * ROWID_BUCKET, (hi + 1) * ROWID_BUCKET - 1)]
        clause = " OR ".join(["rowid BETWEEN ? AND ?"] * len(ranges))
        return f"({clause}) AND {_IDS_FILTER}", [*params, ids]

    def rows_of_traces(
        self, table: str, columns: str, trace_ids: Sequence[str], *, where: str = "", params: Sequence[Any] = (), order_by: str = ""
    ) -> list[tuple[Any, ...]]:
        """``SELECT columns FROM table`` over the rows of ``trace_ids`` (and ``where``, with ``params``),
        reading only the parts of the table that hold them (:meth:`trace_filter`), in one snapshot.

        Parameters
        ----------
        table, columns : str
            A table with a ``trace_id`` column, and the SQL list of columns to return.
        trace_ids : sequence of str
            The traces; none gives ``[]``.
        where, params : str and sequence, optional
            A further condition ANDed to the traces' one, and its parameters.
        order_by : str, optional
            SQL ``ORDER BY`` list.

        Returns
        -------
        list of tuple
            The rows, as DuckDB returns them.
        """
        with self.transaction():
            found = self.trace_filter(table, trace_ids)
            if found is None:
                return []
            condition, values = found
            sql = f'SELECT {columns} FROM "{table}" WHERE {condition}' + (f" AND ({where})" if where else "")
            sql += f" ORDER BY {order_by}" if order_by else ""
            return self.con.execute(sql, [*values, *params]).fetchall()

    def arrow_of_traces(
        self, table: str, columns: str, trace_ids: Sequence[str], *, where: str = "", params: Sequence[Any] = (), order_by: str = ""
    ) -> pa.Table:
        """:meth:`rows_of_traces` as one Arrow table: for batch stages that work on columns, not rows.

        The same query (reading only the parts of ``table`` that hold ``trace_ids``, in one
        snapshot), returned by DuckDB as Arrow without a Python object per value. No matching row
        (or no ``trace_ids``) gives a table with the columns and no rows.

        Returns
        -------
        pyarrow.Table
            ``[n_rows]`` with the ``columns`` named in the query, in ``order_by`` order.
        """
        with self.transaction():
            found = self.trace_filter(table, trace_ids)
            condition, values = found if found is not None else ("false", [])
            sql = f'SELECT {columns} FROM "{table}" WHERE {condition}' + (f" AND ({where})" if where else "")
            sql += f" ORDER BY {order_by}" if order_by else ""
            # a relation (con.sql) gives Arrow without the extra copy a DB-API result makes (DuckDB 2)
            relation = self.con.sql(sql, params=[*values, *params])
            return _arrow_of(relation)

    # ------------------------------------------------------------------ labels
    def upsert_labels(self, labels: Iterable[Label]) -> int:
        """Insert or replace labels by :attr:`Label.label_id`, in one transaction. Returns the count
        of distinct label ids (of labels repeating an id in ``labels``, the last one is stored).

        Raises :class:`StoreError` if a label names a segment that is not stored.
        """
        self._require_writable("store labels")
        # one row per label_id, the last given winning (the table has no unique index to refuse a repeat)
        by_id = {lab.label_id: lab for lab in labels}
        labels = list(by_id.values())
        if not labels:
            return 0
        # A judge's labels of one answer share one ``extra`` dict: its JSON is written once per dict.
        extra_json: dict[int, str] = {}
        for lab in labels:
            if id(lab.extra) not in extra_json:
                extra_json[id(lab.extra)] = json.dumps(lab.extra, ensure_ascii=False, default=str)
        table = pa.table(
            {
                "label_id": list(by_id),
                "trace_id": [lab.trace_id for lab in labels],
                "segment_index": pa.array([lab.segment_index for lab in labels], type=pa.int32()),
                "label": [lab.label for lab in labels],
                "source": [lab.source for lab in labels],
                "annotator": [lab.annotator for lab in labels],
                "codebook_version": [lab.codebook_version for lab in labels],
                "run_id": pa.array([lab.run_id for lab in labels], type=pa.string()),
                "study": pa.array([lab.study for lab in labels], type=pa.string()),
                "confidence": pa.array([lab.confidence for lab in labels], type=pa.float64()),
                "rationale": pa.array([lab.rationale for lab in labels], type=pa.string()),
                "created_at": pa.array([to_naive_utc(lab.created_at) for lab in labels], type=pa.timestamp("us")),
                "extra": [extra_json[id(lab.extra)] for lab in labels],
                "distribution": pa.array([lab.distribution for lab in labels], type=pa.list_(pa.float64())),
            }
        )
        trace_ids = list(dict.fromkeys(lab.trace_id for lab in labels))
        self._write_label_table(table, trace_ids)
        return len(labels)

    def upsert_label_table(self, table: pa.Table) -> int:
        """Insert or replace labels given as one Arrow table (the bulk form of :meth:`upsert_labels`).

        For stages that make labels by the thousand (the baseline judge): no :class:`Label` object
        per row. The table is checked as a whole at this edge, with Arrow compute and SQL, for what
        :class:`Label` checks one by one: its columns, non-empty ids, a known label and source, a
        ``segment_index >= 0``, ``confidence`` in [0, 1] and unique ``label_id``; then it is written
        in one transaction exactly as :meth:`upsert_labels` writes (labels of segments that are not
        stored are refused, stored labels with the same id are replaced).

        Parameters
        ----------
        table : pyarrow.Table
            ``[n_labels]`` with the columns of :data:`LABEL_TABLE_SCHEMA` (any order; extra columns
            are refused). ``label_id`` must be :func:`ror_annotate.records.label_ids` of the row.

        Returns
        -------
        int
            Rows written (``table.num_rows``).

        Raises
        ------
        StoreError
            A column is missing, unknown or of the wrong type; a row breaks a check above (the
            message names the first such row's segment); a label names a segment that is not stored.
        """
        import pyarrow.compute as pc

        from .records import BEHAVIORS

        self._require_writable("store labels")
        names = set(table.column_names)
        expected = set(LABEL_TABLE_SCHEMA.names)
        if names != expected:
            raise StoreError(
                f"label table columns differ from the labels table: missing {sorted(expected - names)}, unknown {sorted(names - expected)}",
                code="E960",
            )
        if table.num_rows == 0:
            return 0
        try:
            table = table.select(LABEL_TABLE_SCHEMA.names).cast(LABEL_TABLE_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise StoreError(f"label table columns have the wrong types: {exc}", code="E960") from exc
        bad = pc.invert(pc.fill_null(pc.and_(
            pc.and_(pc.is_in(table["label"], pa.array(BEHAVIORS)), pc.is_in(table["source"], pa.array(list(SOURCE_KINDS)))),
            pc.and_(pc.greater_equal(table["segment_index"], 0), pc.and_(
                pc.and_(pc.greater(pc.utf8_length(table["trace_id"]), 0), pc.greater(pc.utf8_length(table["annotator"]), 0)),
                pc.and_(pc.greater(pc.utf8_length(table["codebook_version"]), 0), pc.greater(pc.utf8_length(table["label_id"]), 0)),
            )),
        ), False))
        bad = pc.or_(bad, pc.fill_null(pc.or_(pc.less(table["confidence"], 0.0), pc.greater(table["confidence"], 1.0)), False))
        if pc.any(bad).as_py():
            row = table.filter(bad).slice(0, 1).to_pylist()[0]
            raise StoreError(
                f"label for segment {row['trace_id']}#{row['segment_index']} is not a valid label "
                f"(label {row['label']!r}, source {row['source']!r}, annotator {row['annotator']!r}, confidence {row['confidence']!r})",
                code="E961",
            )
        if pc.count_distinct(table["label_id"]).as_py() != table.num_rows:
            raise StoreError("label table repeats a label_id: give each segment's label once", code="E962")
        self._write_label_table(table, pc.unique(table["trace_id"]).to_pylist())
        return table.num_rows

    def _write_label_table(self, table: pa.Table, trace_ids: list[str]) -> int:
        """Write checked label rows (``LABEL_TABLE_SCHEMA`` order) in one transaction; see :meth:`upsert_labels`.
        Returns the number of rows written."""
        view = f"_ror_labels_{uuid.uuid4().hex[:8]}"
        self._register(view, table)
        try:
            with self.transaction():
                # both lookups read only the parts of segments and labels that hold these traces (trace_filter):
                # label_id is derived from the trace id, so a stored label with the same id is among them
                stored = self.trace_filter("segments", trace_ids)
                condition, values = stored if stored is not None else ("false", [])
                missing = self.con.execute(
                    f"SELECT v.trace_id, v.segment_index FROM {view} v ANTI JOIN "
                    f"(SELECT trace_id, segment_index FROM segments WHERE {condition}) s "
                    "ON v.trace_id = s.trace_id AND v.segment_index = s.segment_index LIMIT 1", values,
                ).fetchall()  # fetchall: DuckDB 2 refuses unregister() while a result is unfinished
                if missing:
                    trace_id, index = missing[0]
                    raise StoreError(
                        f"label for segment {trace_id}#{index} names a segment that is not in {self.path}; "
                        "segment the trace first (ror segment)"
                    )
                existing = self.trace_filter("labels", trace_ids)
                if existing is not None:
                    condition, values = existing
                    self.con.execute(f"DELETE FROM labels WHERE {condition} AND label_id IN (SELECT label_id FROM {view})", values)
                self.con.execute(f"INSERT INTO labels SELECT * FROM {view}")
        finally:
            self._unregister(view)
        return len(table)

    def delete_labels(self, label_ids: Iterable[str]) -> int:
        """Delete the labels with these :attr:`Label.label_id` values, in one transaction.

        Returns how many were stored (and are now deleted); unknown ids are ignored.
        """
        self._require_writable("delete labels")
        ids = list(label_ids)
        if not ids:
            return 0
        with duckdb_errors(self.path, "delete labels"), self.transaction():
            n = self._count("SELECT count(*) FROM labels WHERE list_contains(?, label_id)", [ids])
            self.con.execute("DELETE FROM labels WHERE list_contains(?, label_id)", [ids])
        return n

    def labels(
        self,
        *,
        source: str | Sequence[str] | None = None,
        annotator: str | None = None,
        study: str | None = None,
        trace_id: str | None = None,
        trace_ids: Sequence[str] | None = None,
    ) -> list[Label]:
        """Stored labels matching every given filter, ordered by trace, segment, source, annotator.

        Parameters
        ----------
        source : str or sequence of str, optional
            One or several of ``judge``, ``baseline``, ``human``, ``adjudicated``.
        annotator : str, optional
            Exact annotator id (e.g. ``openai:gpt-4.1-mini``, a reviewer's pseudonym).
        study : str, optional
            Review study name; judge and baseline labels have no study.
        trace_id : str, optional
            Only this trace's labels.
        trace_ids : sequence of str, optional
            Only these traces' labels (one query for a batch of traces).

        Returns
        -------
        list of Label
            Empty when nothing matches (no error); one segment may carry several labels.
        """
        where: list[str] = []
        params: list[Any] = []
        if source is not None:
            sources = [source] if isinstance(source, str) else list(source)
            where.append("list_contains(?, source)")
            params.append(sources)
        for col, val in (("annotator", annotator), ("study", study), ("trace_id", trace_id)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        columns = (
            "trace_id, segment_index, label, source, annotator, codebook_version, run_id, study, confidence, rationale, created_at, extra, "
            "distribution"
        )
        order_by = "trace_id, segment_index, source, annotator"
        if trace_ids is not None:
            rows = self.rows_of_traces("labels", columns, trace_ids, where=" AND ".join(where), params=params, order_by=order_by)
        else:
            sql = f"SELECT {columns} FROM labels" + (" WHERE " + " AND ".join(where) if where else "")
            rows = self.con.execute(f"{sql} ORDER BY {order_by}", params).fetchall()
        return [
            Label(
                trace_id=r[0], segment_index=r[1], label=r[2], source=r[3], annotator=r[4], codebook_version=r[5],
                run_id=r[6], study=r[7], confidence=r[8], rationale=r[9], created_at=_to_aware(r[10]),
                extra=json.loads(r[11]) if r[11] else {}, distribution=list(r[12]) if r[12] is not None else None,
            )
            for r in rows
        ]

    def segmented_trace_overview(self, trace_ids: Sequence[str] | None = None) -> list[tuple[str, str | None, str | None, str | None, int, str | None]]:
        """``(trace_id, model, dataset, source, n_segments, token_counter)`` of every segmented trace (or of
        ``trace_ids``), in ingestion order then id; traces without segments are left out."""
        sql = (
            "SELECT t.trace_id, t.model, t.dataset, t.source, s.n, g.token_counter FROM traces t "
            "JOIN (SELECT trace_id, count(*) AS n FROM segments GROUP BY trace_id) s USING (trace_id) "
            "LEFT JOIN segmentations g USING (trace_id)"
        )
        params: list[Any] = []
        if trace_ids is not None:
            sql += " WHERE t.trace_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(trace_ids))
        with duckdb_errors(self.path, "read traces"):
            rows = self.con.execute(sql + " ORDER BY t.ingested_at, t.trace_id", params).fetchall()
        return [(r[0], r[1], r[2], r[3], int(r[4]), r[5]) for r in rows]

    def label_sources(self, trace_ids: Sequence[str]) -> set[str]:
        """Distinct label sources stored for these traces."""
        with duckdb_errors(self.path, "read labels"):
            rows = self.con.execute(f"SELECT DISTINCT source FROM labels WHERE {_IDS_FILTER}", [list(trace_ids)]).fetchall()
        return {r[0] for r in rows}

    def labelled_segment_indices(self, trace_id: str, *, annotator: str, codebook_version: str, source: str) -> set[int]:
        """Segment indices of ``trace_id`` that ``annotator`` labelled under ``codebook_version`` as ``source``."""
        with duckdb_errors(self.path, "read labels"):
            rows = self.con.execute(
                "SELECT segment_index FROM labels WHERE trace_id = ? AND annotator = ? AND codebook_version = ? AND source = ?",
                [trace_id, annotator, codebook_version, source],
            ).fetchall()
        return {int(r[0]) for r in rows}

    def count_unlabelled_segments(self, trace_ids: Sequence[str], *, annotator: str, codebook_version: str, source: str,
                                  exclude: tuple[str, Sequence[Any]] | None = None) -> int:
        """Segments of ``trace_ids`` without a label of ``annotator`` under ``codebook_version`` as ``source``.

        ``exclude`` is ``(condition, params)``: an SQL condition on the segment row ``s`` of a stage's own
        table (e.g. ``EXISTS (SELECT 1 FROM judge_failures f WHERE f.trace_id = s.trace_id ...)``) whose
        segments are not counted; the stage owns that table, the store the core ones.
        """
        sql = ("SELECT count(*) FROM segments s WHERE list_contains(?, s.trace_id) AND NOT EXISTS ("
               "SELECT 1 FROM labels l WHERE l.trace_id = s.trace_id AND l.segment_index = s.segment_index "
               "AND l.annotator = ? AND l.codebook_version = ? AND l.source = ?)")
        params: list[Any] = [list(trace_ids), annotator, codebook_version, source]
        if exclude is not None:
            sql += f" AND NOT ({exclude[0]})"
            params.extend(exclude[1])
        with duckdb_errors(self.path, "count segments"):
            row = self.con.execute(sql, params).fetchone()
        return int(row[0]) if row else 0

    def run_ids_with_status(self, statuses: Sequence[str]) -> list[str]:
        """Ids of the runs whose status is one of ``statuses`` (``running``, ``interrupted``, ``failed``, ``ok``)."""
        with duckdb_errors(self.path, "read runs"):
            rows = self.con.execute("SELECT run_id FROM runs WHERE list_contains(?, status) ORDER BY started_at", [list(statuses)]).fetchall()
        return [r[0] for r in rows]

    def label_counts(self, trace_ids: Sequence[str] | None = None) -> dict[tuple[str, str], dict[str, int]]:
        """``{(source, annotator): {label: n_labels}}`` over all traces or ``trace_ids`` (counted in SQL)."""
        sql = "SELECT source, annotator, label, count(*) FROM labels"
        params: list[Any] = []
        if trace_ids is not None:
            sql += f" WHERE {_IDS_FILTER}"
            params.append(list(trace_ids))
        out: dict[tuple[str, str], dict[str, int]] = {}
        with duckdb_errors(self.path, "count labels"):
            for source, annotator, name, n in self.con.execute(sql + " GROUP BY ALL ORDER BY ALL", params).fetchall():
                out.setdefault((source, annotator), {})[name] = int(n)
        return out

    def segment_lengths(self, trace_ids: Sequence[str] | None = None) -> list[SegmentLength]:
        """``(trace_id, n_tokens)`` of every stored segment (of ``trace_ids``), without loading texts.

        Accepted by :func:`ror_annotate.segment.segment_stats` like full segments.
        """
        sql = "SELECT trace_id, n_tokens FROM segments"
        params: list[Any] = []
        if trace_ids is not None:
            sql += f" WHERE {_IDS_FILTER}"
            params.append(list(trace_ids))
        with duckdb_errors(self.path, "read segments"):
            return [SegmentLength(r[0], int(r[1])) for r in self.con.execute(sql + " ORDER BY trace_id, segment_index", params).fetchall()]

    def annotators(self) -> list[tuple[str, str, int]]:
        """``(source, annotator, n_labels)`` for every annotator with labels in the store."""
        return [
            (r[0], r[1], int(r[2]))
            for r in self.con.execute(
                "SELECT source, annotator, count(*) FROM labels GROUP BY source, annotator ORDER BY source, annotator"
            ).fetchall()
        ]

    def latest_label_times(self, *, source: str | None = None) -> dict[str, datetime]:
        """``{annotator: created_at of its latest label}`` (UTC, aware) for every annotator with labels
        (of ``source`` only, when given); e.g. the latest ``aggregate:*`` rater for ``ror verify``."""
        sql = "SELECT annotator, max(created_at) FROM labels" + (" WHERE source = ?" if source is not None else "")
        with duckdb_errors(self.path, "read labels"):
            rows = self.con.execute(sql + " GROUP BY annotator ORDER BY annotator", [] if source is None else [source]).fetchall()
        return {r[0]: _to_aware(r[1]) for r in rows}  # type: ignore[misc]

    def upsert_annotators(self, annotators: Iterable[Annotator]) -> int:
        """Declare raters (insert or replace by :attr:`Annotator.annotator`), in one transaction.

        The provider is scrubbed of secrets (:func:`scrub_url`) before it is written. Returns the
        number of distinct annotators written.
        """
        self._require_writable("declare annotators")
        rows = list({a.annotator: a for a in annotators}.values())
        if not rows:
            return 0
        with duckdb_errors(self.path, "declare annotators"), self.transaction():
            for a in rows:
                self.con.execute("DELETE FROM annotators WHERE annotator = ?", [a.annotator])
                self.con.execute(
                    "INSERT INTO annotators VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        a.annotator, a.kind, a.source, a.model, scrub_url(a.provider) if a.provider else None, a.temperature,
                        a.samples, a.codebook_version, a.study, json.dumps(a.details, ensure_ascii=False, default=str),
                        to_naive_utc(a.declared_at),
                    ],
                )
        return len(rows)

    def declared_annotators(self) -> dict[str, Annotator]:
        """Every declared rater, by annotator id (empty on a store with none)."""
        with duckdb_errors(self.path, "read annotators"):
            rows = self.con.execute(
                "SELECT annotator, kind, source, model, provider, temperature, samples, codebook_version, study, details, declared_at "
                "FROM annotators ORDER BY annotator"
            ).fetchall()
        return {
            r[0]: Annotator(
                annotator=r[0], kind=r[1], source=r[2], model=r[3], provider=r[4], temperature=r[5], samples=r[6],
                codebook_version=r[7], study=r[8], details=json.loads(r[9]) if r[9] else {}, declared_at=_to_aware(r[10]),
            )
            for r in rows
        }

    def rater_kinds(self) -> dict[str, str]:
        """``{annotator: "machine" | "human"}`` for every annotator with labels: its declared kind, else
        the kind of its label source (:data:`~ror_annotate.records.SOURCE_KINDS`)."""
        declared = {a: d.kind for a, d in self.declared_annotators().items()}
        return {annotator: declared.get(annotator, SOURCE_KINDS.get(source, "machine")) for source, annotator, _ in self.annotators()}

    def latest_rater_labels(self, annotators: Sequence[str]) -> pa.Table:
        """Each rater's latest label of every segment it labelled, as one long table.

        One rule picks the label when a rater has several for a segment (other codebook versions,
        other studies): the latest ``created_at``, ties broken by the greatest ``label_id``.

        Parameters
        ----------
        annotators : sequence of str
            Annotator ids (``Label.annotator``).

        Returns
        -------
        pyarrow.Table
            Columns ``trace_id``, ``segment_index``, ``annotator``, ``label``; one row per
            (annotator, segment), ordered by trace id, segment index, annotator.
        """
        sql = ("SELECT trace_id, segment_index, annotator, label FROM labels WHERE list_contains(?, annotator) "
               "QUALIFY row_number() OVER (PARTITION BY annotator, trace_id, segment_index ORDER BY created_at DESC, label_id DESC) = 1 "
               "ORDER BY trace_id, segment_index, annotator")
        with duckdb_errors(self.path, "read labels"):
            _drop_pending_result(self.con)
            relation = self.con.sql(sql, params=[list(annotators)])  # a relation hands Arrow over without a copy
            fetch = next(getattr(relation, n) for n in ("to_arrow_table", "fetch_arrow_table", "arrow") if hasattr(relation, n))
            table = fetch()
        return table if isinstance(table, pa.Table) else table.read_all()

    def rater_codebook_versions(self, annotators: Sequence[str]) -> list[str]:
        """The distinct ``codebook_version`` values on these raters' labels, sorted."""
        with duckdb_errors(self.path, "read labels"):
            rows = self.con.execute(
                "SELECT DISTINCT codebook_version FROM labels WHERE list_contains(?, annotator) ORDER BY 1", [list(annotators)]
            ).fetchall()
        return [r[0] for r in rows]

    def replace_rater_labels(self, source: str, annotator: str, labels: "Iterable[Label] | RaterLabels", *, batch: int = 100_000) -> int:
        """Replace every stored label of one rater (``source``, ``annotator``) by ``labels``, in one transaction.

        For raters that are recomputed as a whole (an aggregate): segments no longer in ``labels``
        lose their old label, and a re-run with the same inputs writes the same label ids.
        ``labels`` may be a generator of :class:`Label` (written ``batch`` at a time, bounded memory)
        or a columnar :class:`RaterLabels` (a million labels without a million Python objects; the
        same checks as :class:`Label`, and the same ``label_id``).

        Returns
        -------
        int
            Labels written.

        Raises
        ------
        StoreError
            A label of another source or annotator, or naming a segment that is not stored; nothing
            is changed.
        """
        self._require_writable("store labels")
        written = 0
        table = labels.to_table(source, annotator) if isinstance(labels, RaterLabels) else None  # checked before any write
        with self.transaction():
            with duckdb_errors(self.path, "replace labels"):
                self.con.execute("DELETE FROM labels WHERE source = ? AND annotator = ?", [source, annotator])
            if table is not None:
                for start in range(0, len(table), batch):
                    part = table.slice(start, batch)
                    written += self._write_label_table(part, pc.unique(part.column("trace_id")).to_pylist())
                return written
            assert not isinstance(labels, RaterLabels)
            chunk: list[Label] = []
            for lab in labels:
                if lab.source != source or lab.annotator != annotator:
                    raise StoreError(
                        f"replace_rater_labels({source!r}, {annotator!r}) got a label of {lab.source!r}/{lab.annotator!r} "
                        f"for {lab.trace_id}#{lab.segment_index}; nothing was changed"
                    )
                chunk.append(lab)
                if len(chunk) >= batch:
                    written += self.upsert_labels(chunk)
                    chunk = []
            written += self.upsert_labels(chunk)
        return written

    # ------------------------------------------------------------------ runs
    def start_run(self, command: str, parameters: dict[str, Any] | None = None) -> Run:
        """Record the start of a command; secrets in ``parameters`` are scrubbed before writing.

        Prefer :meth:`run`, which also records how the command ended.
        """
        self._require_writable("record a run")
        run = self.detached_run(command, parameters)
        with duckdb_errors(self.path, "record a run"):
            self.con.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    run.run_id, run.command, json.dumps(run.parameters, default=str), json.dumps(run.package_versions),
                    to_naive_utc(run.started_at), None, run.status, json.dumps(run.counts),
                ],
            )
        return run

    def detached_run(self, command: str, parameters: dict[str, Any] | None = None) -> Run:
        """A new :class:`Run` (id, scrubbed parameters, package versions) that is not written to the store.

        :meth:`start_run` records it; a command reading a read-only store keeps it elsewhere (``ror
        export`` writes it into the export's manifest).
        """
        from .provenance import package_versions

        return Run(
            run_id=f"run-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}",
            command=command,
            parameters=scrub_secrets(parameters or {}),
            package_versions=package_versions(),
        )

    def finish_run(self, run_id: str, *, status: str = "ok", counts: dict[str, Any] | None = None) -> None:
        """Record the end of a run with its final status and counts (merged into any stored counts;
        every string scrubbed of secrets, :func:`~ror_annotate.provenance.scrub_value`)."""
        with duckdb_errors(self.path, "record a run"):
            row = self.con.execute("SELECT counts FROM runs WHERE run_id = ?", [run_id]).fetchone()
            merged = json.loads(row[0]) if row and row[0] else {}
            merged.update(counts or {})
            self.con.execute(
                "UPDATE runs SET ended_at = ?, status = ?, counts = ? WHERE run_id = ?",
                [to_naive_utc(utc_now()), status, json.dumps(scrub_value(merged), default=str), run_id],
            )

    def update_run_counts(self, run_id: str, counts: dict[str, Any]) -> None:
        """Merge ``counts`` into a running run's counts (e.g. live usage accounting; secrets scrubbed)."""
        with duckdb_errors(self.path, "record a run"):
            row = self.con.execute("SELECT counts FROM runs WHERE run_id = ?", [run_id]).fetchone()
            merged = json.loads(row[0]) if row and row[0] else {}
            merged.update(counts)
            self.con.execute("UPDATE runs SET counts = ? WHERE run_id = ?", [json.dumps(scrub_value(merged), default=str), run_id])

    @contextmanager
    def run(self, command: str, parameters: dict[str, Any] | None = None) -> Iterator[Run]:
        """Track one command as a run: the one way every command records itself.

        Yields the :class:`Run` (fill ``run.counts`` as the work goes). On exit the run is recorded
        ``ok``, ``interrupted`` (KeyboardInterrupt, which SIGTERM also becomes in the CLI) or
        ``failed`` (any other exception, whose type and message are kept in ``counts["error"]``,
        secrets scrubbed), and the exception propagates. Secrets in ``parameters`` are scrubbed
        once, by :meth:`start_run`. The progress file beside the store (:class:`ProgressFile`)
        records the same outcome, so ``ror status`` can show it while the store is locked.
        """
        run = self.start_run(command, parameters)
        progress = ProgressFile.for_store(self.path)
        outer, self._progress = self._progress, progress
        outside_transaction = self._shared.tx_depth == 0
        if progress is not None:
            progress.start(run)
        status = "failed"
        try:
            yield run
            status = "ok"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except SystemExit as exc:
            status = "ok" if exc.code in (0, None) else "failed"
            raise
        except BaseException as exc:
            if is_interrupt(exc):  # Ctrl-C while DuckDB ran or fetched a query
                status = "interrupted"
                raise KeyboardInterrupt() from exc
            run.counts["error"] = scrub_text(f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:500]
            raise
        finally:
            self._progress = outer
            with _signals_held():  # a second Ctrl-C must not leave the run recorded as "running"
                if status != "ok" and outside_transaction:
                    self._abandon_transaction()
                try:
                    self.finish_run(run.run_id, status=status, counts=run.counts)
                finally:
                    if progress is not None:
                        progress.finish(run, status)

    def report_progress(self, stage: str, *, done: int, total: int | None, info: str = "") -> None:
        """Note a running stage's progress in the progress file (no-op outside :meth:`run`)."""
        if self._progress is not None:
            self._progress.update(stage, done=done, total=total, info=info)

    def runs(self) -> list[Run]:
        """All recorded runs, oldest first."""
        rows = self.con.execute(
            "SELECT run_id, command, parameters, package_versions, started_at, ended_at, status, counts FROM runs ORDER BY started_at"
        ).fetchall()
        return [
            Run(
                run_id=r[0], command=r[1], parameters=json.loads(r[2] or "{}"), package_versions=json.loads(r[3] or "{}"),
                started_at=_to_aware(r[4]), ended_at=_to_aware(r[5]), status=r[6], counts=json.loads(r[7] or "{}"),
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ summary
    def counts(self) -> dict[str, int]:
        """Row counts of the core tables."""
        return {
            t: self._count(f"SELECT count(*) FROM {t}")
            for t in ("traces", "segments", "labels", "runs")
        }

    # ------------------------------------------------------------------ commit journal (ror_annotate.journal)
    def journal_note(self, kind: str, payload: dict[str, Any]) -> None:
        """Attach a note to the open transaction's record in the commit journal (``<db>.commits``).

        The note is written (and ``fsync``-ed) after the ``COMMIT``, and kept until the next checkpoint,
        so it survives a write-ahead log cut short. The LLM judge notes each paid response's cache row
        (kind ``"judge_cache"``: column -> value), which ``ror recover`` restores. Outside a
        transaction, on ``:memory:`` or read-only stores, it does nothing.

        Parameters
        ----------
        kind : str
            What the payload is (``"judge_cache"``).
        payload : dict
            JSON-serializable values (datetimes are written as text).
        """
        shared = self._shared
        if shared.journal is not None and shared.tx_depth > 0:
            shared.journal_state[2].append((kind, payload))

    def _journal_open(self) -> None:
        """Compare the store's commit counter with its journal; raise ``E220`` when commits were lost."""
        from .journal import JOURNAL_MIGRATIONS, CommitJournal, journal_enabled, lost_commits_error, new_store_id

        shared = self._shared
        if self.path == ":memory:" or shared.journal is not None or not journal_enabled():
            return
        if shared.read_only:
            found = self._count("SELECT count(*) FROM information_schema.tables WHERE table_name = 'store_journal'")
            row = self.con.execute("SELECT store_id, seq FROM store_journal").fetchone() if found else None
        else:
            self.migrate("journal", JOURNAL_MIGRATIONS)
            row = self.con.execute("SELECT store_id, seq FROM store_journal").fetchone()
            if row is None:
                row = (new_store_id(), 0)
                self.con.execute("INSERT INTO store_journal VALUES (?, ?)", list(row))
        if row is None:
            return  # a read-only store written before the journal existed
        journal = CommitJournal(self.path)
        state = journal.read()
        store_id, seq = str(row[0]), int(row[1])
        if state.store_id == store_id and state.seq > seq:
            raise lost_commits_error(self.path, seq, state)
        if not shared.read_only:
            if state.store_id != store_id:
                journal.reset(store_id, seq)  # the journal of a store deleted since: not this one's
            shared.journal = journal
            shared.journal_state = [store_id, seq, []]

    def _journal_count_commit(self) -> None:
        """Raise the store's commit counter inside the transaction about to commit (rolled back on failure)."""
        shared = self._shared
        if shared.journal is not None:
            try:
                self.con.execute("UPDATE store_journal SET seq = ?", [shared.journal_state[1] + 1])
            except duckdb.Error:
                try:
                    self.con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise

    def _journal_committed(self) -> None:
        shared = self._shared
        if shared.journal is not None:
            state = shared.journal_state
            state[1] += 1
            shared.journal.append(state[0], state[1], state[2])
            state[2] = []

    def _journal_checkpointed(self) -> None:
        shared = self._shared
        if shared.journal is not None:
            shared.journal.reset(shared.journal_state[0], shared.journal_state[1])

    def _journal_close(self) -> None:
        """Checkpoint before the last handle closes (DuckDB would at close anyway), then shorten the journal."""
        shared = self._shared
        if shared.journal is None or shared.tx_depth:
            return
        try:
            shared.con.execute("CHECKPOINT").fetchall()
        except duckdb.Error:
            return  # the log keeps the data; the journal keeps its records
        self._journal_checkpointed()
    def labelled_indices_by_trace(self, trace_ids: Sequence[str], *, annotator: str, codebook_version: str,
                                  source: str) -> dict[str, set[int]]:
        """:meth:`labelled_segment_indices` of many traces in one query: ``{trace_id: {segment_index}}``
        (a trace without such labels is absent)."""
        out: dict[str, set[int]] = {}
        if not trace_ids:
            return out
        with duckdb_errors(self.path, "read labels"):
            rows = self.con.execute(
                f"SELECT trace_id, segment_index FROM labels WHERE {_IDS_FILTER} AND annotator = ? AND codebook_version = ? "
                "AND source = ?",
                [list(trace_ids), annotator, codebook_version, source],
            ).fetchall()
        for tid, index in rows:
            out.setdefault(tid, set()).add(int(index))
        return out
    # ------------------------------------------------------------------ compact label reads (viewer at corpus scale)
    def label_codes(self, categories: Sequence[str]) -> "LabelCodes":
        """Every stored label as integer codes, for agreement over a million labels without Label objects.

        Rows are ordered as :meth:`labels` orders them (trace id, segment index, source, annotator);
        each row holds small integers only, so 2,000,000 labels take about 50 MB. The codes come from
        joins with the (small) tables of distinct names, and rows are put in order in NumPy, so DuckDB
        neither sorts nor hashes the labels table.

        Parameters
        ----------
        categories : sequence of str
            The label set; ``label_code`` is the index of the label in it (-1 for a label not in it).

        Returns
        -------
        LabelCodes
            ``table`` with columns ``trace_code`` (int32, index into ``trace_ids``), ``segment_index``
            (int32), ``annotator_code`` (int32, index into ``annotators``), ``source_code`` (int32, index
            into ``sources``), ``label_code`` (int32) and ``n_tokens`` (int32, the segment's token count,
            0 when the segment is no longer stored); the sorted distinct ``trace_ids``, ``annotators``
            and ``sources`` of the labels; and ``with_confidence``, the annotators with at least one
            label that has a confidence.
        """
        import numpy as np

        with duckdb_errors(self.path, "read labels"):
            names = {
                col: [r[0] for r in self.con.execute(f"SELECT DISTINCT {col} FROM labels ORDER BY 1").fetchall()]
                for col in ("trace_id", "annotator", "source")
            }
            confident = [r[0] for r in self.con.execute(
                "SELECT DISTINCT annotator FROM labels WHERE confidence IS NOT NULL ORDER BY 1").fetchall()]
            codes = {}

            def arrow(sql: str, params: list[Any] | None = None) -> pa.Table:
                relation = self.con.sql(sql, params=params)  # a relation hands Arrow over without a copy
                fetch = next(getattr(relation, n) for n in ("to_arrow_table", "fetch_arrow_table", "arrow") if hasattr(relation, n))
                got = fetch()
                return got if isinstance(got, pa.Table) else got.read_all()

            for col in names:
                view = f"_ror_codes_{col}"
                self._register(view, pa.table({col: pa.array(names[col], pa.string()), "code": pa.array(range(len(names[col])), pa.int32())}))
            try:
                labels = arrow(
                    "SELECT t.code AS trace_code, l.segment_index::INTEGER AS segment_index, a.code AS annotator_code, s.code AS source_code, "
                    "(coalesce(list_position(?, l.label), 0) - 1)::INTEGER AS label_code "
                    "FROM labels l JOIN _ror_codes_trace_id t ON t.trace_id = l.trace_id JOIN _ror_codes_annotator a ON a.annotator = l.annotator "
                    "JOIN _ror_codes_source s ON s.source = l.source", [list(categories)])
                segs = arrow(
                    "SELECT t.code AS trace_code, s.segment_index::INTEGER AS segment_index, s.n_tokens::INTEGER AS n_tokens "
                    "FROM segments s JOIN _ror_codes_trace_id t ON t.trace_id = s.trace_id")
            finally:
                for col in names:
                    self._unregister(f"_ror_codes_{col}")
        for col in labels.column_names:
            codes[col] = labels.column(col).to_numpy()
        del labels
        order = np.lexsort((codes["annotator_code"], codes["source_code"], codes["segment_index"], codes["trace_code"]))
        codes = {k: v[order] for k, v in codes.items()}
        # each label's segment token count: look its (trace, segment) key up among the segments' sorted keys
        width = int(max(codes["segment_index"].max(initial=0), segs.column("segment_index").to_numpy().max(initial=0))) + 1
        seg_key = segs.column("trace_code").to_numpy().astype(np.int64) * width + segs.column("segment_index").to_numpy()
        seg_tokens = segs.column("n_tokens").to_numpy()
        del segs
        by_key = np.argsort(seg_key)
        seg_key, seg_tokens = seg_key[by_key], seg_tokens[by_key]
        lab_key = codes["trace_code"].astype(np.int64) * width + codes["segment_index"]
        at = np.clip(np.searchsorted(seg_key, lab_key), 0, max(len(seg_key) - 1, 0))
        found = (seg_key[at] == lab_key) if len(seg_key) else np.zeros(len(lab_key), dtype=bool)
        codes["n_tokens"] = np.where(found, seg_tokens[at] if len(seg_key) else 0, 0).astype(np.int32)
        table = pa.table({k: pa.array(codes[k], pa.int32()) for k in ("trace_code", "segment_index", "annotator_code", "source_code", "label_code", "n_tokens")})
        return LabelCodes(table, names["trace_id"], names["annotator"], names["source"], confident)


class LabelCodes(NamedTuple):
    """What :meth:`Store.label_codes` returns: the labels as integer columns and the names the codes index."""

    table: pa.Table
    trace_ids: list[str]
    annotators: list[str]
    sources: list[str]
    with_confidence: list[str]


def _arrow_of(result: Any) -> pa.Table:
    """A DuckDB result as one ``pyarrow.Table`` (``to_arrow_table`` in DuckDB 2, ``fetch_arrow_table`` before)."""
    for name in ("to_arrow_table", "fetch_arrow_table"):
        method = getattr(result, name, None)
        if method is not None:
            got = method()
            return got if isinstance(got, pa.Table) else got.read_all()
    return result.arrow()


def _drop_pending_result(con: duckdb.DuckDBPyConnection) -> None:
    # DuckDB 2 refuses register()/unregister() while an earlier execute() has rows left unfetched;
    # abort() (absent before DuckDB 2, which did not refuse) drops that pending result only.
    abort = getattr(con, "abort", None)
    if abort is not None:
        abort()


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
