"""The dashboard's agreement figures at corpus scale: ``ror agree --json``'s numbers from compact arrays.

:func:`ror_annotate.agreement.agreement_summary` reads every label as a
:class:`~ror_annotate.records.Label` (rationale, extra, timestamps: about a kilobyte each), so a
million-segment store with two raters needs gigabytes. The figures themselves only need, per
segment, each rater's label code, the trace and the token count. :func:`view_agreement` reads
exactly that (:meth:`ror_annotate.store.Store.label_codes`: integer columns from one query), builds
the same :class:`~ror_annotate.agreement.Ratings` (same items, order, groups and weights as
:func:`~ror_annotate.agreement.from_store.ratings_from_store`) and runs the same
:func:`~ror_annotate.agreement.agreement`; calibration is computed trace batch by trace batch with
the same functions as :func:`~ror_annotate.agreement.reliability.calibration_summary`. The result
equals ``ror agree --json`` on the whole store (``tests/test_view.py`` and ``tests/test_view_scale.py``
compare them key for key).

Memory: the codes table (6 int32 per label), the ratings matrix (int64, segments x raters) and
item ids built only for the disagreement examples (:class:`ItemIds`), instead of one Python object
per label.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..errors import AgreementError
from ..records import BEHAVIORS

if TYPE_CHECKING:  # pragma: no cover
    from ..agreement import Ratings
    from ..store import LabelCodes, Store


class ItemIds(Sequence[str]):
    """The item ids ``"<trace_id>#<segment_index>"`` of a :class:`Ratings`, made only when one is read.

    Parameters
    ----------
    trace_ids : sequence of str
        Distinct trace ids (``Ratings.group_ids``).
    groups : ndarray of shape (n_items,), int
        Index into ``trace_ids`` per item.
    segment_index : ndarray of shape (n_items,), int
    """

    def __init__(self, trace_ids: Sequence[str], groups: np.ndarray, segment_index: np.ndarray) -> None:
        self._traces, self._groups, self._index = trace_ids, groups, segment_index

    def __len__(self) -> int:
        return len(self._groups)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = int(i)
        return f"{self._traces[int(self._groups[i])]}#{int(self._index[i])}"


def compact_ratings(codes: "LabelCodes", *, exclude_sources: Sequence[str] = (), origin: str = "the store") -> tuple["Ratings", dict[str, str]]:
    """Stored labels as :class:`Ratings`, from the integer codes of :meth:`Store.label_codes` (no :class:`Label` objects).

    The same ratings as :func:`ror_annotate.agreement.from_store.ratings_from_store` with no filter
    but ``exclude_sources``: items are the labelled segments in (trace id, segment index) order,
    annotators sorted, groups the traces (sorted), weights the segments' token counts (0 for a
    segment no longer stored).

    Parameters
    ----------
    codes : LabelCodes
        ``store.label_codes(BEHAVIORS)``.
    exclude_sources : sequence of str
        Label sources left out (``("adjudicated",)`` when adjudications are the reference).
    origin : str
        The store's path, for messages.

    Returns
    -------
    (Ratings, dict)
        The ratings and ``{annotator: source}`` (the source of the annotator's first label in store order).

    Raises
    ------
    AgreementError
        No labels; one annotator with two labels on one segment (two codebook versions or studies:
        ``ror agree --codebook-version`` / ``--study`` select one, the dashboard compares all labels).
    """
    from ..agreement import Ratings

    t = codes.table
    trace = t.column("trace_code").to_numpy()
    seg = t.column("segment_index").to_numpy()
    ann = t.column("annotator_code").to_numpy()
    src = t.column("source_code").to_numpy()
    lab = t.column("label_code").to_numpy()
    ntok = t.column("n_tokens").to_numpy()
    excluded = [k for k, s in enumerate(codes.sources) if s in exclude_sources]
    if excluded:
        keep = ~np.isin(src, excluded)
        trace, seg, ann, src, lab, ntok = (a[keep] for a in (trace, seg, ann, src, lab, ntok))
    if len(trace) == 0:
        raise AgreementError(
            f"no labels in {origin} match the selection (annotators=any, sources=any, study=None); "
            "see `ror status` / store.annotators() for what is stored"
        )
    if (lab < 0).any():
        raise AgreementError("a stored label is not one of the six behaviors")
    used_traces, trace = np.unique(trace, return_inverse=True)  # sorted codes stay sorted: trace ids in store order
    used_anns, ann = np.unique(ann, return_inverse=True)
    trace_ids = tuple(codes.trace_ids[int(k)] for k in used_traces)
    names = [codes.annotators[int(k)] for k in used_anns]
    annotators = tuple(sorted(names))  # ror agree's column order: Python's sort of the names
    ann = np.asarray([annotators.index(n) for n in names], dtype=np.int64)[ann]
    new_item = np.ones(len(trace), dtype=bool)
    new_item[1:] = (trace[1:] != trace[:-1]) | (seg[1:] != seg[:-1])
    item_of_row = np.cumsum(new_item) - 1
    first_row = np.flatnonzero(new_item)
    n_items, n_raters = len(first_row), len(annotators)
    cell = item_of_row * n_raters + ann
    sorted_cells = np.sort(cell)
    dup = np.flatnonzero(sorted_cells[1:] == sorted_cells[:-1])
    if dup.size:
        i, a = divmod(int(sorted_cells[dup[0]]), n_raters)
        row = int(first_row[i])
        raise AgreementError(
            f"annotator {annotators[a]!r} has two labels on segment {trace_ids[int(trace[row])]}#{int(seg[row])} "
            "(two codebook versions, or two studies); select one with --codebook-version or --study"
        )
    matrix = np.full(n_items * n_raters, -1, dtype=np.int64)
    matrix[cell] = lab
    _, first_of_ann = np.unique(ann, return_index=True)
    source_of = {annotators[a]: codes.sources[int(src[r])] for a, r in enumerate(first_of_ann)}
    groups = trace[first_row].astype(np.int64)
    ratings = Ratings(
        matrix.reshape(n_items, n_raters), tuple(BEHAVIORS), annotators,
        ItemIds(trace_ids, groups, seg[first_row]),  # type: ignore[arg-type]
        groups, trace_ids, ntok[first_row].astype(np.float64),
    )
    return ratings, source_of


def view_agreement(
    store: "Store",
    *,
    reference: str | None = "majority",
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    batch_size: int = 200,
) -> dict[str, Any]:
    """``ror agree --json --reference R --resamples N --seed S`` on the whole store, read compactly.

    Parameters
    ----------
    store : Store
    reference : {"majority", "human", "adjudicated"}, an annotator name, or None
        As :func:`ror_annotate.agreement.agreement_summary`.
    n_resamples, confidence_level, seed
        Trace bootstrap settings.
    batch_size : int
        Traces per read of the calibration's labels.

    Returns
    -------
    dict
        Equal to :func:`ror_annotate.agreement.agreement_summary` with the same settings and no
        selection (``"selection"`` included).

    Raises
    ------
    AgreementError
        As :func:`~ror_annotate.agreement.agreement_summary`: no labels, fewer than two annotators,
        no human/adjudicated labels for that reference, two labels of one annotator on one segment.
    """
    from ..agreement import agreement
    from ..agreement.from_store import adjudicated_reference
    from ..agreement.kinds import agreement_by_kind

    boot: dict[str, Any] = {"n_resamples": n_resamples, "confidence_level": confidence_level, "seed": seed}
    codes = store.label_codes(BEHAVIORS)
    all_traces = codes.trace_ids
    # a rater scored by calibration has a label with a confidence, or is a K-sample judge (``name@sK`` beside ``name``)
    from ..agreement.reliability import _SAMPLE

    names = set(codes.annotators)
    scored = bool(codes.with_confidence) or any((m := _SAMPLE.match(a)) is not None and m["base"] in names for a in names)
    # adjudications are the reference (never an annotator) with reference="adjudicated", as in ror agree
    ratings, source_of = compact_ratings(codes, exclude_sources=("adjudicated",) if reference == "adjudicated" else (), origin=str(store.path))
    del codes  # the ratings hold what is needed
    ref_args: dict[str, Any] = {}
    if reference == "adjudicated":
        by_item = adjudicated_reference(store)
        if not any(r.basis == "adjudicated" for r in by_item.values()):
            raise AgreementError("--reference adjudicated: no adjudicated labels; adjudicate first (ror review adjudicate)")
        ref_args = {"reference_labels": [by_item[i].label if i in by_item else None for i in ratings.item_ids], "reference_name": "adjudicated"}
    elif reference == "human":
        humans = [a for a in ratings.annotators if source_of.get(a) == "human"]
        if not humans:
            raise AgreementError("--reference human: no human labels among the selected annotators; widen --source/--study")
        ref_args = {"reference": "majority", "reference_pool": humans, "reference_name": "human majority" if len(humans) > 1 else humans[0]}
    elif reference is not None:
        ref_args = {"reference": reference}
    out = agreement(ratings, n_resamples=n_resamples, confidence_level=confidence_level, seed=seed, **ref_args).to_dict()
    out["selection"] = {
        "store": str(getattr(store, "path", "")), "study": None, "with_judge": False, "codebook_version": None,
        "annotator_sources": {a: source_of[a] for a in ratings.annotators},
    }
    texts = _segment_texts(store, [i for pair in out["disagreements"] for i in pair["examples"]])
    for pair in out["disagreements"]:
        pair["example_texts"] = [texts.get(i, "") for i in pair["examples"]]
    kinds = store.rater_kinds()
    out["selection"]["rater_kinds"] = {a: kinds.get(a, "machine") for a in ratings.annotators}
    raters = [a for a in ratings.annotators if source_of.get(a) != "adjudicated"]
    out["by_kind"] = agreement_by_kind(ratings.subset_annotators(raters), kinds, **boot)
    out["calibration"] = streamed_calibration(store, all_traces, batch_size=batch_size, machine=scored, **boot)
    return out


def _segment_texts(store: "Store", item_ids: Sequence[str]) -> dict[str, str]:
    """``{item_id: segment text}`` of a few items (the disagreement examples)."""
    traces = sorted({i.rsplit("#", 1)[0] for i in item_ids})
    wanted = set(item_ids)
    out: dict[str, str] = {}
    for segs in store.segments_by_trace(traces).values():
        for s in segs:
            if s.segment_id in wanted:
                out[s.segment_id] = s.text
    return out


def streamed_calibration(
    store: "Store", trace_ids: Sequence[str], *, batch_size: int = 200, n_bins: int = 10,
    n_resamples: int = 1000, confidence_level: float = 0.95, seed: int | None = 0, machine: bool = True,
) -> dict[str, Any]:
    """:func:`ror_annotate.agreement.reliability.calibration_summary` (every study), reading ``batch_size`` traces at a time.

    The human reference and each machine rater's confidences are per segment, so reading them trace
    batch by trace batch (:func:`~ror_annotate.agreement.reliability.rater_confidences` on each
    batch's reference) and concatenating gives the same items; they are put back in the global order
    (sorted item ids) before the same :func:`~ror_annotate.agreement.reliability.calibration_error`.
    Memory: one batch's labels plus, per machine rater with a confidence, its reviewed items. With
    ``machine=False`` (the caller knows no label has a confidence and no K-sample judge exists) only
    the human reference is read, to count it.

    Returns
    -------
    dict
        As ``calibration_summary(store, n_bins=..., n_resamples=..., ...)``.
    """
    from ..agreement.reliability import (NO_CONFIDENT_RATER_NOTE, NO_REFERENCE_NOTE, CalibrationOptions, calibration_error,
                                         rater_confidences)
    from ..reference import reference_labels_from

    opts = CalibrationOptions(n_bins=n_bins, n_resamples=n_resamples, confidence_level=confidence_level, seed=seed)
    n_ref = 0
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for start in range(0, len(trace_ids), batch_size):
        batch = list(trace_ids[start : start + batch_size])
        refs = reference_labels_from(store.labels(source=("human", "adjudicated"), trace_ids=batch))
        if not refs:
            continue
        n_ref += len(refs)
        if not machine:
            continue
        raters, ref = rater_confidences(store, reference=refs)
        for r in raters:
            key = (r.annotator, 1 if r.confidence_kind == "vote" else 0)
            acc = found.setdefault(key, {"name": r.name, "kind": r.confidence_kind, "items": [], "labels": [], "conf": [], "dist": [], "ref": []})
            acc["items"] += r.item_ids
            acc["labels"] += r.labels
            acc["ref"] += [ref[i] for i in r.item_ids]
            acc["conf"].append(r.confidence)
            acc["dist"].append(r.distribution)
    out: dict[str, Any] = {"reference": "adjudicated, else unanimous humans", "n_reference_items": n_ref, "raters": [], "settings": opts.recorded()}
    if not n_ref:
        out["note"] = NO_REFERENCE_NOTE
        return out
    if not found:
        out["note"] = NO_CONFIDENT_RATER_NOTE
        return out
    codes = {b: k for k, b in enumerate(BEHAVIORS)}
    for (annotator, _), acc in sorted(found.items(), key=lambda kv: kv[1]["name"]):  # rater_confidences sorts by name
        order = np.argsort(np.asarray(acc["items"], dtype=object).astype(str), kind="stable")
        items = [acc["items"][k] for k in order]
        labels = [acc["labels"][k] for k in order]
        refs_of = [acc["ref"][k] for k in order]
        conf = np.concatenate(acc["conf"])[order]
        dist = None if any(d is None for d in acc["dist"]) else np.concatenate(acc["dist"])[order]
        res = calibration_error(
            conf, np.array([a == b for a, b in zip(labels, refs_of)]), groups=[i.rsplit("#", 1)[0] for i in items], distribution=dist,
            reference=[codes[r] for r in refs_of] if dist is not None else None,
            n_bins=opts.n_bins, n_resamples=opts.n_resamples, confidence_level=opts.confidence_level, seed=opts.seed,
        )
        out["raters"].append({"name": acc["name"], "annotator": annotator, "confidence_kind": acc["kind"], **res})
    return out
