"""The store's schema: DDL of the core tables, their migrations and schema versions, the timestamp convention.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Literal

import pyarrow as pa

from ..errors import SchemaVersionError
from ..records import utc_now

from .connection import ConnectionMixin


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


#: The ``labels`` table's columns, in table order, as Arrow types (:meth:`Store.upsert_label_table`).
LABEL_TABLE_SCHEMA = pa.schema([
    ("label_id", pa.string()), ("trace_id", pa.string()), ("segment_index", pa.int32()), ("label", pa.string()),
    ("source", pa.string()), ("annotator", pa.string()), ("codebook_version", pa.string()), ("run_id", pa.string()),
    ("study", pa.string()), ("confidence", pa.float64()), ("rationale", pa.string()), ("created_at", pa.timestamp("us")),
    ("extra", pa.string()), ("distribution", pa.list_(pa.float64())),
])


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


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


class SchemaMixin(ConnectionMixin):
    """Schema versions and migrations of the core tables and of each stage's own tables.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

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

    def _journal_open(self) -> None:
        """Compare the store's commit counter with its journal; raise ``E220`` when commits were lost.

        A journal written by another file (another store, or another copy of this one:
        :func:`~ror_annotate.journal.journal_is_other`) is no loss: on a writable open it is moved
        aside with a one-line ``E222`` warning on standard error when it recorded more than the store
        holds, else rewritten; a read-only open leaves it alone.
        """
        from ..journal import (
            JOURNAL_MIGRATIONS, CommitJournal, journal_enabled, journal_is_other, lost_commits_error, new_store_id, other_journal_warning,
        )

        shared = self._shared
        if self.path == ":memory:" or shared.journal is not None or not journal_enabled():
            return
        if shared.read_only:
            found = self._count("SELECT count(*) FROM information_schema.tables WHERE table_name = 'store_journal'")
            row = self._journal_row() if found else None
        else:
            self.migrate("journal", JOURNAL_MIGRATIONS)
            row = self._journal_row()
            if row is None:
                row = (new_store_id(), 0, None)
                self.con.execute("INSERT INTO store_journal (store_id, seq) VALUES (?, ?)", list(row[:2]))
        if row is None:
            return  # a read-only store written before the journal existed
        journal = CommitJournal(self.path)
        state = journal.read()
        store_id, seq, file_id = str(row[0]), int(row[1]), (str(row[2]) if row[2] else None)
        other = journal_is_other(store_id, seq, file_id, state)
        if not other and state.store_id == store_id and state.seq > seq:
            raise lost_commits_error(self.path, seq, state)
        if not shared.read_only:
            if other or state.store_id != store_id:
                if other and (state.seq > seq or state.records):  # it recorded more than this file holds: keep it
                    sys.stderr.write(other_journal_warning(self.path, store_id, seq, state, journal.set_aside()) + "\n")
                journal.reset(store_id, seq, file_id)
            shared.journal = journal
            shared.journal_state = [store_id, seq, []]
            shared.journal_file_id = file_id

    def _journal_row(self) -> tuple[Any, ...] | None:
        """The store's ``(store_id, seq, file_id)``; ``file_id`` None before the journal's second migration."""
        has_file_id = self._count(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'store_journal' AND column_name = 'file_id'"
        )
        return self.con.execute(f"SELECT store_id, seq, {'file_id' if has_file_id else 'NULL'} FROM store_journal").fetchone()
