"""Store methods on the ``labels`` table, and :class:`RaterLabels` (one rater's labels as columns).

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import StoreError
from ..records import SOURCE_KINDS, Label, utc_now

from .schema import LABEL_TABLE_SCHEMA, _to_aware, to_naive_utc
from .connection import duckdb_errors
from .access import _IDS_FILTER, AccessMixin, _drop_pending_result


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

        from ..records import BEHAVIORS, LABEL_SOURCES

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


class LabelCodes(NamedTuple):
    """What :meth:`Store.label_codes` returns: the labels as integer columns and the names the codes index."""

    table: pa.Table
    trace_ids: list[str]
    annotators: list[str]
    sources: list[str]
    with_confidence: list[str]


class LabelsMixin(AccessMixin):
    """The ``labels`` table.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

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

        from ..records import BEHAVIORS

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

    def latest_label_times(self, *, source: str | None = None) -> dict[str, datetime]:
        """``{annotator: created_at of its latest label}`` (UTC, aware) for every annotator with labels
        (of ``source`` only, when given); e.g. the latest ``aggregate:*`` rater for ``ror verify``."""
        sql = "SELECT annotator, max(created_at) FROM labels" + (" WHERE source = ?" if source is not None else "")
        with duckdb_errors(self.path, "read labels"):
            rows = self.con.execute(sql + " GROUP BY annotator ORDER BY annotator", [] if source is None else [source]).fetchall()
        return {r[0]: _to_aware(r[1]) for r in rows}  # type: ignore[misc]

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
