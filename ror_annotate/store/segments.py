"""Store methods on the ``segmentations`` and ``segments`` tables, and the stage tables that depend on them.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import StoreError
from ..records import Segment, segments_of_rows, utc_now

from .schema import CORE_TABLES, DependentPolicy, to_naive_utc
from .connection import duckdb_errors
from .access import _IDS_FILTER, AccessMixin


class SegmentLength(NamedTuple):
    """A segment's trace and length in tokens (see :meth:`Store.segment_lengths`)."""

    trace_id: str
    n_tokens: int


class SegmentsMixin(AccessMixin):
    """The ``segmentations`` and ``segments`` tables, and the stage tables that depend on them.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

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
        return self._replace_segment_columns_many(
            [(trace_id, [(seg.segment_index, seg.char_start, seg.char_end, seg.n_tokens) for seg in segs], [seg.text for seg in segs])
             for trace_id, segs in items],
            lambda k: items[k][1], segmenter=segmenter, token_counter=token_counter, run_id=run_id, force=force,
        )

    def replace_segment_spans_many(
        self,
        items: Sequence[tuple[str, str, Sequence[tuple[int, int, int]]]],
        *,
        segmenter: str,
        token_counter: str,
        run_id: str | None = None,
        force: bool = False,
    ) -> list[str]:
        """:meth:`replace_segments_many` from spans: no :class:`~ror_annotate.records.Segment` record per segment.

        Parameters
        ----------
        items : sequence of (str, str, sequence of (int, int, int))
            ``(trace_id, trace text, [(char_start, char_end, n_tokens), ...])`` per trace, spans in
            segment order (``segment_index`` is the position), already checked by the segmenter
            (:func:`ror_annotate.segment.segment_spans_many`); each segment's text is
            ``text[char_start:char_end]``.
        segmenter, token_counter, run_id, force
            As in :meth:`replace_segments`.

        Returns
        -------
        list of str
            Per item, ``"inserted"``, ``"unchanged"`` or ``"replaced"`` (:meth:`replace_segments_many`).

        Raises
        ------
        StoreError
            As :meth:`replace_segments_many`: the batch is rolled back.
        """
        from ..segment import _new_segment

        columns = [(trace_id, [(i, s, e, n) for i, (s, e, n) in enumerate(spans)], [text[s:e] for s, e, _ in spans])
                   for trace_id, text, spans in items]

        def segments_of(k: int) -> list[Segment]:
            trace_id, rows, texts = columns[k]
            return [_new_segment(trace_id, i, s, e, t, n) for (i, s, e, n), t in zip(rows, texts)]

        return self._replace_segment_columns_many(columns, segments_of, segmenter=segmenter, token_counter=token_counter,
                                                  run_id=run_id, force=force)

    def _replace_segment_columns_many(
        self,
        items: Sequence[tuple[str, Sequence[tuple[int, int, int, int]], Sequence[str]]],
        segments_of: Callable[[int], Sequence[Segment]],
        *,
        segmenter: str,
        token_counter: str,
        run_id: str | None,
        force: bool,
    ) -> list[str]:
        """The batch write of :meth:`replace_segments_many`: ``items`` are ``(trace_id, [(segment_index, char_start,
        char_end, n_tokens), ...], [text, ...])``; ``segments_of(k)`` builds item ``k``'s records for a trace that
        already has segments (it goes through :meth:`replace_segments`)."""
        self._require_writable("store segments")
        if not items:
            return []
        ids = [trace_id for trace_id, _, _ in items]
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
                rows = [row for k in fresh for row in items[k][1]]
                index, starts, ends, counts = zip(*rows) if rows else ((), (), (), ())
                table = pa.table(
                    {
                        "trace_id": pa.array([ids[k] for k in fresh for _ in items[k][1]], pa.string()),
                        "segment_index": pa.array(index, type=pa.int32()),
                        "char_start": pa.array(starts, type=pa.int32()),
                        "char_end": pa.array(ends, type=pa.int32()),
                        "text": pa.array([t for k in fresh for t in items[k][2]], pa.string()),
                        "n_tokens": pa.array(counts, type=pa.int32()),
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
                statuses[k] = self.replace_segments(ids[k], segments_of(k), segmenter=segmenter, token_counter=token_counter,
                                                    run_id=run_id, force=force)
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
        return {t: segments_of_rows(rows) for t, rows in self.segment_rows_by_trace(trace_ids).items()}

    def segment_rows_by_trace(self, trace_ids: Sequence[str]) -> dict[str, list[tuple[str, int, int, int, str, int]]]:
        """:meth:`segments_by_trace` as plain rows ``(trace_id, segment_index, char_start, char_end, text,
        n_tokens)``: one query, no record built. A caller that reads many traces at once and only reads
        the fields (the LLM judge's reader thread) makes checked rows of them
        (:func:`~ror_annotate.records.segment_rows_checked`) rather than thousands of records."""
        out: dict[str, list[tuple[str, int, int, int, str, int]]] = {t: [] for t in trace_ids}
        with duckdb_errors(self.path, "read segments"):
            rows = self.rows_of_traces(
                "segments", "trace_id, segment_index, char_start, char_end, text, n_tokens", trace_ids,
                order_by="trace_id, segment_index",
            )
        for r in rows:
            out[r[0]].append(r)
        return out

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

