"""Store methods on the ``traces`` table.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

from ..errors import StoreError
from ..records import Trace, utc_now

from .schema import to_naive_utc
from .access import _IDS_FILTER, AccessMixin


class TracesMixin(AccessMixin):
    """The ``traces`` table.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

    # ------------------------------------------------------------------ traces
    def upsert_traces(
        self, traces: Iterable[Trace], *, run_id: str | None = None, checked: Sequence[Trace] | None = None
    ) -> dict[str, int]:
        """Insert traces; a trace already stored with the same text is left untouched.

        Returns counts ``{"inserted": n, "unchanged": n}``. ``checked``: what :meth:`check_traces`
        returned for ``traces`` when nothing written since can change it (an ingest's read-once
        input, whose ids are distinct): those are inserted without querying the store again.

        Raises
        ------
        StoreError
            A stored trace has the same id but different text (ids must be stable); nothing is written.
        """
        self._require_writable("store traces")
        traces = list(traces)
        if not traces:
            return {"inserted": 0, "unchanged": 0}
        new = list(checked) if checked is not None else self.check_traces(traces)
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
        # an empty table (a first ingest) answers without the id list: passing it costs more than the check
        stored = bool(traces) and (self.con.execute("SELECT EXISTS (SELECT 1 FROM traces)").fetchone() or (False,))[0]
        existing = dict(self.con.execute(
            f"SELECT trace_id, text_sha256 FROM traces WHERE {_IDS_FILTER}", [[t.trace_id for t in traces]]
        ).fetchall()) if stored else {}
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
