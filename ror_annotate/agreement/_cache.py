"""A read-through view of a store that reads the labels table once (for ``agreement_summary``).

``ror agree`` asks the store for labels several times (the ratings, the reference, calibration,
drift, weighted estimates); each read builds every :class:`~ror_annotate.records.Label` again.
:class:`LabelsOnce` reads them once and filters in memory with the same filters and order as
:meth:`ror_annotate.store.Store.labels`; everything else is delegated to the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Label


class LabelsOnce:
    """Wrap ``store``: :meth:`labels` serves from one full read; other attributes go to the store."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._labels: list[Label] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def labels(
        self,
        *,
        source: str | Sequence[str] | None = None,
        annotator: str | None = None,
        study: str | None = None,
        trace_id: str | None = None,
        trace_ids: Sequence[str] | None = None,
    ) -> list[Label]:
        """As :meth:`ror_annotate.store.Store.labels` (same filters, same order)."""
        if self._labels is None:
            self._labels = self._store.labels()
        sources = None if source is None else ({source} if isinstance(source, str) else set(source))
        traces = None if trace_ids is None else set(trace_ids)
        return [
            lab for lab in self._labels
            if (sources is None or lab.source in sources) and (annotator is None or lab.annotator == annotator)
            and (study is None or lab.study == study) and (trace_id is None or lab.trace_id == trace_id)
            and (traces is None or lab.trace_id in traces)
        ]
