"""Opening a store file: one DuckDB connection per file and process, locking and retries, threads, interrupts, DuckDB errors.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import math
import os
import random
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from ..errors import ConfigError, StoreError, StoreLockedError, StoreReadOnlyError

from .progress import ProgressFile


#: Code of a store used from a thread other than the one that opened it.
WRONG_THREAD = "E205"

#: Code of :meth:`ConnectionMixin.thread_handle` asked for on a closed store or inside a transaction.
NO_THREAD_HANDLE = "E211"

#: Code of a write transaction opened inside :meth:`ConnectionMixin.read_snapshot` (its writes would be rolled back).
WRITE_IN_SNAPSHOT = "E212"

#: Code of a stage that commits on threads of its own (the LLM judge) asked to run inside an open
#: transaction or snapshot of the store (its threads cannot see what the transaction has not committed).
IN_TRANSACTION = "E213"


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
        self.journal_file_id: str | None = None  # the store file's line of descent (ror_annotate.journal)
        self.journal_session = False  # whether this process has drawn a new file id (at its first commit)
        #: Inside :meth:`ConnectionMixin.read_snapshot` (its transaction is rolled back, so no write may join it).
        self.snapshot = False
        #: Set on a thread handle's entry (:meth:`ConnectionMixin.thread_handle`): the store's own entry.
        self.parent: _Shared | None = None


_OPEN: dict[str, _Shared] = {}


#: :attr:`_Shared.owner` of a thread handle no thread has used yet (thread idents are never 0 here).
_UNCLAIMED = 0


_OPEN_LOCK = threading.Lock()


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Could not set lock" in text or "Conflicting lock" in text)


@contextmanager
def _signals_held(*, deliver: bool = True) -> Iterator[None]:
    """Hold SIGINT/SIGTERM inside the block (main thread only): a few milliseconds of bookkeeping
    that must complete once begun.

    ``deliver`` (default): the first signal held is acted on once the block is done
    (:func:`ror_annotate.pool.interrupts_deferred`), so an interrupt that lands here still stops the
    command (it was ignored: a SIGTERM arriving while a stage recorded its finished run was lost,
    and ``ror run`` went on through every later stage to exit 0). ``deliver=False``: dropped, for the
    block that records an interruption or a failure already under way (a second Ctrl-C must not
    replace it).
    """
    import signal

    from ..pool import interrupts_deferred

    if deliver:
        with interrupts_deferred():
            yield
        return
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
#: DuckDB before 2.0 leaves its buffer pool at a lowered ``memory_limit`` after ``RESET memory_limit``.
_RESET_KEEPS_LOW_LIMIT = int(duckdb.__version__.split(".")[0]) < 2


def _as_kib(setting: str) -> str:
    """DuckDB's displayed ``memory_limit`` ("18.7 GiB", "1638.3 PiB") as a value ``SET`` accepts ("...KiB")."""
    number, unit = setting.split()
    power = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB").index(unit)
    return f"{math.ceil(float(number) * 1024 ** power / 1024)}KiB"


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


_S = TypeVar("_S", bound="ConnectionMixin")


class ConnectionMixin:
    """A store handle's connection: lifecycle, transactions, DuckDB's cache, checkpoints.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

    # set by Store.__init__
    path: str
    read_only: bool
    _closed: bool
    _progress: ProgressFile | None
    _shared: _Shared

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
            if shared.owner != _UNCLAIMED or shared.parent is None or shared.parent.owner == threading.get_ident():
                raise _wrong_thread(self.path, shared)
            shared.owner = threading.get_ident()  # a thread handle's first use claims it for this thread
            shared.owner_name = threading.current_thread().name
        return shared.con

    # ------------------------------------------------------------------ lifecycle
    def thread_handle(self: _S) -> _S:
        """A handle on this store for ONE other thread (a dedicated writer), with its own DuckDB connection.

        Call it from the thread that owns the store; the first thread other than that one to use the
        returned handle owns it from then on (any other thread, the store's own included, gets
        ``E205``). The handle holds a DuckDB cursor: a second connection to the same database in this
        process, which DuckDB documents as the way to use one database from several threads. Its
        transactions are its own (snapshot isolation): the store's thread keeps reading while the
        handle writes, and sees the handle's rows once they are committed.

        What stays shared, so that the file keeps one history:

        - transactions of the store and of its thread handles are serialized by one lock: a
          :meth:`transaction` of one waits while another is open (DuckDB would otherwise abort one
          of two transactions that both raise the commit counter of the commit journal);
        - the commit journal (``<db>.commits``) and its counter: a handle's commits are journaled
          like the store's own;
        - the components migrated so far.

        A handle does not drop DuckDB's cache (:meth:`release_cache` does nothing: a lowered memory
        limit is global to the database and could fail a query of the other thread) and does not
        checkpoint (:meth:`checkpoint` returns False). Autocommit statements of the store's thread
        (outside :meth:`transaction`) are not serialized with the handle's transactions; DuckDB
        runs them side by side unless they write the same rows (then one fails with a conflict).

        Close the handle (from any thread, once its thread has stopped using it) before closing the
        store; closing the store does not close it.

        Returns
        -------
        Store
            A handle of the same class, on the same file.

        Raises
        ------
        StoreError
            ``E205``: called from a thread that does not own the store, or on a thread handle.
            ``E211``: on a closed store, or inside a transaction before the store's first commit
            (the commit journal's file id is drawn first, by a checkpoint).
        StoreReadOnlyError
            The store is open read-only (a writer thread has nothing to do there).
        """
        shared = self._shared
        if self._closed:
            raise StoreError(f"the store {self.path} is closed", code=NO_THREAD_HANDLE)
        if shared.parent is not None:
            raise StoreError(f"a thread handle on {self.path} cannot make another; call thread_handle() on the store",
                             code=WRONG_THREAD)
        self._require_writable("give a writer thread a handle")
        with shared.lock:
            con = self.con  # E205 from a thread that does not own the store
            if shared.journal is not None and not shared.journal_session:
                if shared.tx_depth:
                    raise StoreError(f"thread_handle() on {self.path} inside a transaction: call it between transactions",
                                     code=NO_THREAD_HANDLE)
                self._journal_start_session()  # the file id is drawn once, by the store's thread, before any handle commits
            child = _Shared(con.cursor(), shared.read_only)
        child.owner, child.owner_name = _UNCLAIMED, "(unclaimed)"
        child.parent = shared
        child.lock = shared.lock
        child.temp_components = shared.temp_components
        child.memory_limit = shared.memory_limit
        child.journal = shared.journal
        child.journal_state = shared.journal_state
        child.journal_file_id = shared.journal_file_id
        child.journal_session = True
        handle = object.__new__(type(self))
        handle.__dict__.update(self.__dict__)
        handle._closed = False
        handle._progress = None
        handle._shared = child
        return handle

    def close(self) -> None:
        """Release this handle; the connection closes when the last handle on the path closes."""
        if self._closed:
            return
        self._closed = True
        if self._shared.parent is not None:  # a thread handle: its own cursor only
            self._shared.con.close()
            return
        with _OPEN_LOCK:
            self._shared.refs -= 1
            if self._shared.refs <= 0:
                self._journal_close()
                self._shared.con.close()
                if _OPEN.get(self.path) is self._shared:
                    _OPEN.pop(self.path, None)

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreReadOnlyError(f"cannot {what}: the store {self.path} is open read-only")

    @contextmanager
    def transaction(self: _S) -> Iterator[_S]:
        """All writes inside the block land together or not at all.

        Nested blocks, and blocks opened through another :class:`Store` handle on the same file in
        this process, join the outermost one. DuckDB errors inside the block roll it back and are
        re-raised as :class:`StoreError` (an interrupted query as :class:`KeyboardInterrupt`).
        """
        shared = self._shared
        if shared.snapshot:
            raise StoreError(f"a write transaction inside read_snapshot() on {self.path}: its writes would be rolled back",
                             code=WRITE_IN_SNAPSHOT)
        with shared.lock:
            if shared.tx_depth == 0:
                if shared.journal is not None and not shared.journal_session:
                    self._journal_start_session()
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

    @contextmanager
    def read_snapshot(self: _S) -> Iterator[_S]:
        """Reads inside the block see one snapshot of the store (a DuckDB transaction that is rolled
        back, never committed).

        Unlike :meth:`transaction` it writes nothing: no commit, no record in the commit journal, and
        it does not wait for a transaction of a thread handle (:meth:`thread_handle`) to end. Inside
        an open transaction it joins it. A :meth:`transaction` opened inside it is refused with
        ``E212`` (its writes would be rolled back).

        Raises
        ------
        StoreError
            DuckDB refused a query (an interrupted query is raised as :class:`KeyboardInterrupt`).
        """
        shared = self._shared
        if shared.tx_depth:
            yield self
            return
        with duckdb_errors(self.path, "begin snapshot"):
            self.con.execute("BEGIN TRANSACTION")
        shared.tx_depth += 1
        shared.snapshot = True
        try:
            yield self
        except duckdb.Error as exc:
            raise translate_duckdb_error(exc, self.path) from exc
        finally:
            shared.tx_depth -= 1
            shared.snapshot = False
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # a failed statement may already have aborted it

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
        if shared.parent is not None:
            return 0  # a thread handle (thread_handle): the memory limit is the whole database's
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
            previous = str(self.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
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
                            if _RESET_KEEPS_LOW_LIMIT:
                                # DuckDB 1.x reports the default after RESET but its buffer pool keeps the
                                # lowered limit: set the value read before (rounded to 0.1 of its unit) instead
                                self.con.execute(f"SET memory_limit = '{_as_kib(previous)}'")
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

        Returns False, doing nothing, on a read-only store, on a thread handle (:meth:`thread_handle`) or inside a transaction (a ``CHECKPOINT``
        there would fail the transaction); True otherwise.

        Raises
        ------
        StoreError
            DuckDB could not write the checkpoint (e.g. the disk is full); the WAL keeps the data.
        """
        shared = self._shared
        with shared.lock:
            if self.read_only or shared.tx_depth or shared.parent is not None:
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
            shared.journal.reset(shared.journal_state[0], shared.journal_state[1], shared.journal_file_id)

    def _journal_start_session(self) -> None:
        """Before this process's first commit: draw a new file id, checkpoint it into the database file, rewrite the journal.

        A copy of the store file taken before this point keeps the old id, so a journal this process
        writes is recognised as another file's if that copy is later put in its place
        (:func:`ror_annotate.journal.journal_is_other`). The id must be in the database file, not
        only in the log, or a damaged log would undo it and a real loss would read as another file's:
        if the checkpoint fails (a full disk), the store's id is cleared instead and files are then
        compared as before file ids existed.
        """
        from ..journal import new_store_id

        shared = self._shared
        shared.journal_session = True
        file_id = new_store_id()
        try:
            self.con.execute("UPDATE store_journal SET file_id = ?", [file_id])
            self.con.execute("CHECKPOINT").fetchall()
        except duckdb.Error:
            shared.journal_file_id = None
            try:
                self.con.execute("UPDATE store_journal SET file_id = NULL")
            except duckdb.Error:
                pass
            return
        shared.journal_file_id = file_id
        shared.journal.reset(shared.journal_state[0], shared.journal_state[1], file_id)

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
