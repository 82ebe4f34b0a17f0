"""Store methods on the ``annotators`` table (declared raters) and the raters seen in ``labels``.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..provenance import scrub_url
from ..records import SOURCE_KINDS, Annotator

from .schema import _to_aware, to_naive_utc
from .connection import duckdb_errors
from .access import AccessMixin


class AnnotatorsMixin(AccessMixin):
    """The ``annotators`` table and the raters seen in ``labels``.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

    def annotators(self) -> list[tuple[str, str, int]]:
        """``(source, annotator, n_labels)`` for every annotator with labels in the store."""
        return [
            (r[0], r[1], int(r[2]))
            for r in self.con.execute(
                "SELECT source, annotator, count(*) FROM labels GROUP BY source, annotator ORDER BY source, annotator"
            ).fetchall()
        ]

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
