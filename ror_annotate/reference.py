"""The reference label of a reviewed segment: one rule for exports, ``ror agree`` and review.

A study's reference ("adjudicated" in ``ror export --label-source`` and ``ror agree --reference``)
is decided here and nowhere else, per segment ``(trace_id, segment_index)``:

1. **Adjudicated** -- if the segment has any ``source="adjudicated"`` label, the *latest* one wins,
   whoever adjudicated and in whichever study. "Latest" is the largest ``created_at``; labels with
   the same ``created_at`` are ordered by ``(annotator, study, codebook_version, label)`` in string
   order and the largest wins, so the result never depends on the order the labels arrive in.
2. **Unanimous / single** -- else every human annotator's *latest* ``source="human"`` label (same
   order as above; a re-annotation, in a later study or under a later codebook, replaces the
   earlier one). If those latest labels all agree, that label is the reference (``basis``
   ``"unanimous"`` for two or more annotators, ``"single"`` for one).
3. **None** -- humans disagree and nobody adjudicated yet, or no human labeled the segment: the
   segment has no reference and is left out of the result.

Judge and baseline labels never take part. Adjudication only sees disagreements, so reading
``source="adjudicated"`` labels alone would drop every segment the annotators agreed on; that is
why rule 2 exists.

The functions here are pure (no store, no I/O): :func:`ror_annotate.review.reference_labels`
feeds them the store's labels of one study, the export feeds them each segment's labels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from .records import Label

SegmentKey = tuple[str, int]
ReferenceBasis = Literal["adjudicated", "unanimous", "single"]


@dataclass(frozen=True)
class ReferenceLabel:
    """The reference behavior of one reviewed segment and what it rests on.

    Attributes
    ----------
    trace_id, segment_index
        The segment.
    label : str
        The reference behavior.
    basis : {"adjudicated", "unanimous", "single"}
        Which rule decided it (see the module docstring).
    n_annotators : int
        Number of distinct human annotators who labeled the segment (in the labels considered).
    labels : tuple of Label
        The labels the reference rests on: the winning adjudication alone, or every human
        annotator's latest label (sorted by annotator). Not part of equality or hashing.
    """

    trace_id: str
    segment_index: int
    label: str
    basis: ReferenceBasis
    n_annotators: int
    labels: tuple[Label, ...] = field(default=(), compare=False, repr=False)


def _recency(lab: Label) -> tuple:
    # created_at first; the rest only breaks exact-time ties, independently of input order.
    return (lab.created_at, lab.annotator, lab.study or "", lab.codebook_version, lab.label)


def latest(labels: Iterable[Label]) -> Label | None:
    """The latest of ``labels`` by ``created_at`` (ties: largest ``(annotator, study, codebook_version, label)``); None if empty."""
    return max(labels, key=_recency, default=None)


def latest_per_annotator(labels: Iterable[Label]) -> list[Label]:
    """Each annotator's latest label (same order as :func:`latest`), sorted by annotator."""
    by_annotator: dict[str, list[Label]] = defaultdict(list)
    for lab in labels:
        by_annotator[lab.annotator].append(lab)
    return [latest(by_annotator[a]) for a in sorted(by_annotator)]  # type: ignore[misc]


def reference_label(labels: Iterable[Label], *, study: str | None = None) -> ReferenceLabel | None:
    """The reference label of ONE segment from its labels (any sources), or None.

    Parameters
    ----------
    labels : iterable of Label
        Labels of a single segment; judge and baseline labels are ignored.
    study : str, optional
        Only labels whose ``study`` equals this count; None: labels of every study.

    Raises
    ------
    ValueError
        The labels belong to more than one segment.
    """
    refs = reference_labels_from(labels, study=study)
    if len(refs) > 1:
        raise ValueError(f"reference_label: labels of {len(refs)} segments given, expected one: {sorted(refs)}")
    return next(iter(refs.values()), None)


def reference_labels_from(labels: Iterable[Label], *, study: str | None = None) -> dict[SegmentKey, ReferenceLabel]:
    """The reference label of every segment that has one (the rule of the module docstring).

    Parameters
    ----------
    labels : iterable of Label
        Labels of any sources and segments (e.g. ``store.labels()``); only ``human`` and
        ``adjudicated`` ones are read.
    study : str, optional
        Only labels whose ``study`` equals this count; None: labels of every study together (a
        human's latest label across studies, the latest adjudication across studies).

    Returns
    -------
    dict
        ``(trace_id, segment_index) -> ReferenceLabel``, keys in sorted order; segments without a
        reference (humans disagree and no adjudication, or no human/adjudicated label) are absent.
    """
    humans: dict[SegmentKey, list[Label]] = defaultdict(list)
    adjudications: dict[SegmentKey, list[Label]] = defaultdict(list)
    for lab in labels:
        if study is not None and lab.study != study:
            continue
        if lab.source == "human":
            humans[(lab.trace_id, lab.segment_index)].append(lab)
        elif lab.source == "adjudicated":
            adjudications[(lab.trace_id, lab.segment_index)].append(lab)
    out: dict[SegmentKey, ReferenceLabel] = {}
    for key in sorted(set(humans) | set(adjudications)):
        votes = latest_per_annotator(humans.get(key, ()))
        adjudication = latest(adjudications.get(key, ()))
        if adjudication is not None:
            out[key] = ReferenceLabel(key[0], key[1], adjudication.label, "adjudicated", len(votes), (adjudication,))
        elif votes and len({v.label for v in votes}) == 1:
            basis: ReferenceBasis = "unanimous" if len(votes) > 1 else "single"
            out[key] = ReferenceLabel(key[0], key[1], votes[0].label, basis, len(votes), tuple(votes))
    return out
