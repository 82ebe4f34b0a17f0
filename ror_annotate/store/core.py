"""The :class:`Store` facade: opening a store (with its migrations) and the mixins of every table.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..errors import StoreError

from .schema import CORE_MIGRATIONS, SchemaMixin
from .connection import _OPEN, _OPEN_LOCK, _Shared, _connect_with_retry, _duckdb_config, _wrong_thread
from .progress import ProgressFile
from .traces import TracesMixin
from .segments import SegmentsMixin
from .labels import LabelsMixin
from .annotators import AnnotatorsMixin
from .runs import RunsMixin


DEFAULT_DB = "ror.duckdb"


class Store(SchemaMixin, TracesMixin, SegmentsMixin, LabelsMixin, AnnotatorsMixin, RunsMixin):
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
    handle of the first is closed. Stores on different files work from different threads. One
    dedicated writer thread can have a handle of its own on the same file, with its own DuckDB
    connection: :meth:`thread_handle` (the LLM judge commits its answers through one, off its event loop).

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
        from ..pool import refuse_in_worker_bootstrap

        refuse_in_worker_bootstrap()  # a worker importing an unguarded script: E141, not 10 s on the lock and E140
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

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ summary
    def counts(self) -> dict[str, int]:
        """Row counts of the core tables."""
        return {
            t: self._count(f"SELECT count(*) FROM {t}")
            for t in ("traces", "segments", "labels", "runs")
        }
