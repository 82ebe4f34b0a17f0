"""Label choice: which of a segment's stored labels the export publishes (``label_source``).

* ``adjudicated`` -- the study reference (:func:`adjudicated_reference`, the rule of
  :mod:`ror_annotate.reference`): the latest adjudicated label, else the humans' label when every
  human annotator's latest label agrees (adjudication only sees disagreements, so adjudicated rows
  alone would drop every agreed segment);
* ``human`` / ``judge`` / ``baseline`` -- plurality vote over that source's annotators (one vote
  per annotator, their latest label); a tie leaves the segment unlabeled;
* ``majority`` -- plurality over every human and judge annotator; a tie leaves it unlabeled;
* ``aggregate`` -- the label of one aggregate rater (``ror aggregate``, annotator ``aggregate:<method>``):
  the export passes the rater whose newest label is the newest in the store, so a dataset never mixes
  two aggregation runs; its ``confidence`` (the posterior of the chosen class) and ``distribution``
  travel with it;
* ``import`` -- plurality over the raters imported from other projects (``ror labels import``);
* ``auto`` -- adjudicated, else human plurality, else aggregate, else judge, else baseline.

Each choice carries the label's **confidence** (:attr:`ChosenLabel.confidence`): an aggregate's
posterior; else the vote share when two or more raters voted; else the single rater's own
confidence (None when it gave none); and a **distribution** over :data:`~ror_annotate.records.BEHAVIORS`:
the aggregate's posterior, the vote fractions when two or more raters voted, else the single
label's stored distribution (None when it has none).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..records import BEHAVIORS, Label

LABEL_CHOICES: tuple[str, ...] = ("auto", "adjudicated", "human", "judge", "baseline", "majority", "aggregate", "import")

#: Label sources each ``label_source`` choice draws on.
SOURCES_USED: dict[str, tuple[str, ...]] = {
    "adjudicated": ("adjudicated", "human"), "human": ("human",), "judge": ("judge",),
    "baseline": ("baseline",), "majority": ("human", "judge"), "aggregate": ("aggregate",), "import": ("import",),
}

#: Sources a lone label may come from and be chosen by ``auto`` without a vote.
_AUTO_SINGLE = ("human", "aggregate", "judge", "baseline")


@dataclass(frozen=True)
class ChosenLabel:
    """The label exported for one segment, with its provenance (``label`` None: unlabeled)."""

    label: str | None
    source: str | None
    annotator: str | None
    n_votes: int
    vote_share: float | None
    codebook_version: str | None
    judge_model: str | None
    prompt_template_hash: str | None
    confidence: float | None = None
    distribution: tuple[float, ...] | None = None


UNLABELED = ChosenLabel(None, None, None, 0, None, None, None, None)


def judge_model(lab: Label) -> str | None:
    """The model behind a judge label (``extra["model"]``, else the annotator id's model part)."""
    if lab.source != "judge":
        return None
    model = lab.extra.get("model")
    if model:
        return str(model)
    name = lab.annotator.split("@", 1)[0]
    return name.split(":", 1)[1] if ":" in name else name


def joined(values: Sequence[str | None]) -> str | None:
    """Sorted distinct non-empty values joined by commas, or None."""
    uniq = sorted({v for v in values if v})
    return ",".join(uniq) if uniq else None


def _latest_per_annotator(labels: Sequence[Label]) -> list[Label]:
    # the one recency rule (ror_annotate.reference): exact-time ties never depend on arrival order
    from ..reference import latest_per_annotator

    return latest_per_annotator(labels)


def _own_distribution(lab: Label) -> tuple[float, ...] | None:
    return tuple(float(p) for p in lab.distribution) if lab.distribution is not None else None


def _single(lab: Label, source_name: str | None = None) -> ChosenLabel:
    return ChosenLabel(
        label=lab.label, source=source_name or lab.source, annotator=lab.annotator, n_votes=1, vote_share=1.0,
        codebook_version=lab.codebook_version, judge_model=judge_model(lab),
        prompt_template_hash=str(lab.extra.get("prompt_template_hash") or "") or None,
        confidence=lab.confidence, distribution=_own_distribution(lab),
    )


def _plurality(labels: Sequence[Label], source_name: str) -> ChosenLabel | None:
    """Plurality vote, one vote per annotator; None on a tie or without votes."""
    votes = _latest_per_annotator(labels)
    if not votes:
        return None
    counts = Counter(v.label for v in votes).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    winner = counts[0][0]
    winners = [v for v in votes if v.label == winner]
    if len(votes) == 1:
        return _single(votes[0], source_name)
    return ChosenLabel(
        label=winner,
        source=source_name,
        annotator=",".join(v.annotator for v in votes),
        n_votes=len(votes),
        vote_share=counts[0][1] / len(votes),
        codebook_version=joined([v.codebook_version for v in winners]),
        judge_model=joined([judge_model(v) for v in winners]),
        prompt_template_hash=joined([str(v.extra.get("prompt_template_hash") or "") for v in winners]),
        confidence=counts[0][1] / len(votes),
        distribution=tuple(sum(v.label == b for v in votes) / len(votes) for b in BEHAVIORS),
    )


def _aggregate(labels: Sequence[Label], aggregate: str | None) -> ChosenLabel | None:
    """The label of the aggregate rater ``aggregate`` (None: the segment's latest aggregate label)."""
    from ..reference import latest

    pool = [lab for lab in labels if lab.source == "aggregate" and (aggregate is None or lab.annotator == aggregate)]
    lab = latest(pool)
    return None if lab is None else _single(lab)


def adjudicated_reference(labels: Sequence[Label], *, or_unanimous: bool = True) -> ChosenLabel | None:
    """The study reference of one segment, by the project's one rule (:mod:`ror_annotate.reference`).

    The latest adjudicated label, else (with ``or_unanimous``) the humans' label when every human
    annotator's latest label agrees; the same reference ``ror agree --reference adjudicated`` and
    review use, so the published dataset and the agreement figures describe one reference.

    Parameters
    ----------
    labels : sequence of Label
        Every stored label of the segment (judge and baseline labels are ignored).
    or_unanimous : bool, default True
        Fall back to the humans' unanimous (or single) label when nobody adjudicated.

    Returns
    -------
    ChosenLabel or None
        None when the segment has no reference under these rules.
    """
    if not any(lab.source == "adjudicated" for lab in labels) and not (or_unanimous and any(lab.source == "human" for lab in labels)):
        return None  # most segments: judge and baseline labels only
    from ..reference import reference_label

    ref = reference_label(labels)
    if ref is None or (ref.basis != "adjudicated" and not or_unanimous):
        return None
    if ref.basis != "adjudicated":
        return _plurality(ref.labels, "human")
    lab = ref.labels[0]
    return ChosenLabel(lab.label, "adjudicated", lab.annotator, 1, 1.0, lab.codebook_version, None, None,
                       lab.confidence, _own_distribution(lab))


def choose_label(labels: Sequence[Label], label_source: str, *, aggregate: str | None = None) -> tuple[ChosenLabel, bool]:
    """Pick the exported label of one segment from all its stored labels.

    Parameters
    ----------
    labels : sequence of Label
        Every stored label of the segment (any source).
    label_source : {"auto", "adjudicated", "human", "judge", "baseline", "majority", "aggregate", "import"}
        See the module docstring.
    aggregate : str, optional
        The aggregate rater ``aggregate`` and ``auto`` read (None: each segment's latest aggregate label).

    Returns
    -------
    (ChosenLabel, bool)
        The choice (:data:`UNLABELED` when none), and whether a tie prevented one.

    Raises
    ------
    ConfigError
        Unknown ``label_source``.
    """
    if len(labels) == 1 and labels[0].source not in ("adjudicated", "aggregate") and (
        label_source == labels[0].source or (label_source == "auto" and labels[0].source in _AUTO_SINGLE)
    ):
        return _single(labels[0]), False  # the common case at scale: one judge or baseline label per segment
    by_source: dict[str, list[Label]] = defaultdict(list)
    for lab in labels:
        by_source[lab.source].append(lab)
    tied = False

    def vote(sources: Sequence[str], name: str) -> ChosenLabel | None:
        nonlocal tied
        pool = [lab for s in sources for lab in by_source.get(s, [])]
        if not pool:
            return None
        chosen = _plurality(pool, name)
        if chosen is None:
            tied = True
        return chosen

    chosen: ChosenLabel | None
    if label_source == "adjudicated":
        chosen = adjudicated_reference(labels)
    elif label_source in ("human", "judge", "baseline", "import"):
        chosen = vote([label_source], label_source)
    elif label_source == "aggregate":
        chosen = _aggregate(labels, aggregate)
    elif label_source == "majority":
        chosen = vote(["human", "judge"], "majority")
    elif label_source == "auto":
        chosen = adjudicated_reference(labels, or_unanimous=False)
        for src in ("human", "aggregate", "judge", "baseline"):
            if chosen is not None:
                break
            chosen = _aggregate(labels, aggregate) if src == "aggregate" else vote([src], src)
        tied = tied and chosen is None
    else:
        raise ConfigError(f"unknown label source {label_source!r}; choose one of {', '.join(LABEL_CHOICES)}")
    return (chosen or UNLABELED), (tied and chosen is None)
