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

The package (generated from ``store.py`` by ``scripts/split_store.py``):

* ``schema``: The store's schema: DDL of the core tables, their migrations and schema versions, the timestamp convention.
* ``connection``: Opening a store file: one DuckDB connection per file and process, locking and retries, threads, interrupts, DuckDB errors.
* ``progress``: The progress file beside a store (``<db>.progress.json``) that ``ror status`` reads while the store is locked.
* ``access``: Generic access for stages: SQL on a stage's own tables, Arrow inserts, reads of the rows of some traces.
* ``traces``: Store methods on the ``traces`` table.
* ``segments``: Store methods on the ``segmentations`` and ``segments`` tables, and the stage tables that depend on them.
* ``labels``: Store methods on the ``labels`` table, and :class:`RaterLabels` (one rater's labels as columns).
* ``annotators``: Store methods on the ``annotators`` table (declared raters) and the raters seen in ``labels``.
* ``runs``: Store methods on the ``runs`` table: how every command records itself.
* ``core``: The :class:`Store` facade: opening a store (with its migrations) and the mixins of every table.
"""

from __future__ import annotations

from ..pool import interrupts_deferred as _interrupts_deferred

with _interrupts_deferred():
    # DuckDB's extension builds its enums through Python while it initialises: an interrupt that lands
    # then (a SIGTERM in the first seconds of a command) aborted the process ("Critical nanobind
    # error", status -6) or broke the import. Held until the import is complete, it is a plain
    # KeyboardInterrupt (the CLI's one line and 130).
    import duckdb  # noqa: F401

from ..errors import ConfigError, SchemaVersionError, StoreError, StoreLockedError, StoreReadOnlyError
from ..provenance import scrub_secrets, scrub_text, scrub_url, scrub_value
from ..records import SOURCE_KINDS, Annotator, Label, Run, Segment, Trace, utc_now

from .schema import CORE_MIGRATIONS, CORE_TABLES, LABEL_TABLE_SCHEMA, DependentPolicy, to_naive_utc
from .connection import CACHE_CHECK_SECONDS, CACHE_KEEP_BYTES, DAMAGED_WAL, MEMORY_LIMIT_ENV, UNREADABLE_STORE, WRONG_THREAD, duckdb_errors, is_interrupt, translate_duckdb_error
from .progress import ProgressFile
from .access import MAX_ROWID_RANGES, ROWID_BUCKET, rowid_ranges
from .segments import SegmentLength
from .labels import LabelCodes, RaterLabels
from .core import DEFAULT_DB, Store

__all__ = [
    "Annotator",
    "CACHE_CHECK_SECONDS",
    "CACHE_KEEP_BYTES",
    "CORE_MIGRATIONS",
    "CORE_TABLES",
    "ConfigError",
    "DAMAGED_WAL",
    "DEFAULT_DB",
    "DependentPolicy",
    "LABEL_TABLE_SCHEMA",
    "Label",
    "LabelCodes",
    "MAX_ROWID_RANGES",
    "MEMORY_LIMIT_ENV",
    "ProgressFile",
    "ROWID_BUCKET",
    "RaterLabels",
    "Run",
    "SOURCE_KINDS",
    "SchemaVersionError",
    "Segment",
    "SegmentLength",
    "Store",
    "StoreError",
    "StoreLockedError",
    "StoreReadOnlyError",
    "Trace",
    "UNREADABLE_STORE",
    "WRONG_THREAD",
    "duckdb_errors",
    "is_interrupt",
    "rowid_ranges",
    "scrub_secrets",
    "scrub_text",
    "scrub_url",
    "scrub_value",
    "to_naive_utc",
    "translate_duckdb_error",
    "utc_now",
]
