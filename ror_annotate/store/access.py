"""Generic access for stages: SQL on a stage's own tables, Arrow inserts, reads of the rows of some traces.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from .connection import ConnectionMixin, duckdb_errors


#: Filter on a list of trace ids as a hash semi-join (``list_contains`` costs rows x ids).
_IDS_FILTER = "trace_id IN (SELECT unnest(?::VARCHAR[]))"


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


class AccessMixin(ConnectionMixin):
    """SQL for a stage's own tables, Arrow inserts, and reads of the rows of some traces.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

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
        with self.read_snapshot():
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
        with self.read_snapshot():
            found = self.trace_filter(table, trace_ids)
            condition, values = found if found is not None else ("false", [])
            sql = f'SELECT {columns} FROM "{table}" WHERE {condition}' + (f" AND ({where})" if where else "")
            sql += f" ORDER BY {order_by}" if order_by else ""
            # a relation (con.sql) gives Arrow without the extra copy a DB-API result makes (DuckDB 2)
            relation = self.con.sql(sql, params=[*values, *params])
            return _arrow_of(relation)
