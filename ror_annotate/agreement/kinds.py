"""Agreement split by rater kind (human-human, machine-machine, machine-human, pooled) and over time.

Kinds come from :meth:`ror_annotate.store.Store.rater_kinds` (a declared annotator's kind, else
its label source's). For each group of raters the figure is Krippendorff's nominal alpha
(Krippendorff 2011, any number of raters, missing labels allowed); between kinds it is Cohen's
kappa for every machine-human pair (Cohen 1960). Intervals are the trace-clustered percentile
bootstrap of :mod:`.bootstrap`.

Drift (``ror agree --by``): the same figures per codebook version (``codebook``) or per time window
of the human labels' ``created_at`` (``week``: ISO year-week, ``month``: year-month, UTC); a window
holds the segments with a human label created in it, those human labels, and every machine
rater's latest label on those segments. Adjudications are left out everywhere: they settle
disagreements only, so they are a reference, not an independent rater.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AgreementError
from ..records import BEHAVIORS, Label
from ..reference import latest
from .bootstrap import _boot_estimate, trace_bootstrap_counts
from .estimators import _alpha_from, _kappa_from, _multi_rater_stats, _pair_confusion
from .ratings import Ratings

#: The kind groups reported, in order.
KIND_GROUPS: tuple[str, ...] = ("human-human", "machine-machine", "machine-human", "pooled")
DRIFT_BY: tuple[str, ...] = ("codebook", "week", "month")


def _undefined(reason: str) -> dict[str, Any]:
    return {"value": None, "reason": reason, "ci_low": None, "ci_high": None, "n_items": 0, "n_resamples": 0}


def agreement_by_kind(
    ratings: Ratings,
    kinds: dict[str, str],
    *,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Krippendorff's alpha within human raters, within machine raters and pooled; Cohen's kappa per machine-human pair.

    Parameters
    ----------
    ratings : Ratings
        Labels ``[n_items, n_annotators]`` with traces as groups.
    kinds : dict of str to {"machine", "human"}
        Kind of each annotator (unknown annotators count as machines).
    n_resamples, confidence_level, seed
        Trace bootstrap settings.

    Returns
    -------
    dict
        ``{"human-human": {"annotators", "krippendorff_alpha"}, "machine-machine": {...},
        "pooled": {...}, "machine-human": [{"annotator_a" (machine), "annotator_b" (human),
        value, ci_low, ...}]}``. A group with fewer than two raters has alpha ``None`` with reason
        ``fewer_than_two_raters``.
    """
    G = len(ratings.group_ids)
    boot = trace_bootstrap_counts(G, n_resamples=n_resamples, seed=seed).astype(np.float64) if n_resamples else np.zeros((0, G))
    q = ratings.n_categories
    active = [a for j, a in enumerate(ratings.annotators) if np.any(ratings.codes[:, j] >= 0)]
    humans = [a for a in active if kinds.get(a, "machine") == "human"]
    machines = [a for a in active if kinds.get(a, "machine") != "human"]
    ones = np.ones(ratings.n_items)
    out: dict[str, Any] = {}
    for name, members in (("human-human", humans), ("machine-machine", machines), ("pooled", active)):
        if len(members) < 2:
            out[name] = {"annotators": members, "krippendorff_alpha": _undefined("fewer_than_two_raters")}
            continue
        sub = ratings.subset_annotators(members)
        stats = _multi_rater_stats(sub.counts(), ones, ratings.groups, G)
        both = np.concatenate([stats.sum(0)[None], boot @ stats], 0)
        coinc = both[:, 2 + q + 1 :].reshape(-1, q, q)
        vals, why = _alpha_from(coinc)
        out[name] = {"annotators": members, "krippendorff_alpha": _boot_estimate(vals, why, coinc[0].sum(), confidence_level).to_dict()}
    pairs = []
    for m in machines:
        for h in humans:
            conf = _pair_confusion(ratings.column(m), ratings.column(h), q, ones, ratings.groups, G)
            allc = np.concatenate([conf.sum(0)[None], boot @ conf], 0).reshape(-1, q, q)
            kv, kw = _kappa_from(allc)
            pairs.append({"annotator_a": m, "annotator_b": h, **_boot_estimate(kv, kw, allc[0].sum(), confidence_level).to_dict()})
    out["machine-human"] = pairs
    return {k: out[k] for k in KIND_GROUPS}


def ratings_from_labels(labels: Sequence[Label], *, source: str = "store") -> Ratings:
    """Labels as :class:`Ratings` over the six behaviors (items = segments, groups = traces).

    An annotator with several labels on one segment (codebook versions, studies) counts with its
    latest (:func:`ror_annotate.reference.latest`).

    Raises
    ------
    AgreementError
        No labels.
    """
    by_key: dict[tuple[str, str, int], list[Label]] = defaultdict(list)
    for lab in labels:
        by_key[(lab.annotator, lab.trace_id, lab.segment_index)].append(lab)
    if not by_key:
        raise AgreementError("no labels to compare", code="E727")
    keep = [latest(v) for _, v in sorted(by_key.items())]
    return Ratings.from_long(
        [f"{lab.trace_id}#{lab.segment_index}" for lab in keep],  # type: ignore[union-attr]
        [lab.annotator for lab in keep],  # type: ignore[union-attr]
        [lab.label for lab in keep],  # type: ignore[union-attr]
        categories=BEHAVIORS,
        groups=[lab.trace_id for lab in keep],  # type: ignore[union-attr]
        source=source,
    )


def _window(lab: Label, by: str) -> str:
    if by == "week":
        year, week, _ = lab.created_at.isocalendar()
        return f"{year}-W{week:02d}"
    return lab.created_at.strftime("%Y-%m")


def agreement_drift(
    store: Any,
    by: str,
    *,
    study: str | None = None,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Agreement by kind per codebook version or per time window of the human labels (drift).

    Parameters
    ----------
    store : ror_annotate.store.Store
    by : {"codebook", "week", "month"}
    study : str, optional
        Only this study's human labels (and the machine labels on its segments).
    n_resamples, confidence_level, seed
        Trace bootstrap settings.

    Returns
    -------
    dict
        ``{"by": by, "windows": [{"window", "n_items", "n_traces", "annotators", **agreement_by_kind}]}``
        in window order; a window with fewer than two raters reports undefined figures.

    Raises
    ------
    AgreementError
        E727: ``by`` unknown, or (``week``/``month``) no human labels to window by.
    """
    if by not in DRIFT_BY:
        raise AgreementError(f"--by must be one of {', '.join(DRIFT_BY)}, got {by!r}", code="E727")
    kinds = store.rater_kinds()
    humans_src = ("human", "adjudicated")
    all_labels = [lab for lab in store.labels() if lab.source != "adjudicated"]  # a reference, not a rater
    if study is not None:
        mine = [lab for lab in all_labels if lab.study == study]
        segs = {(lab.trace_id, lab.segment_index) for lab in mine}
        all_labels = mine + [lab for lab in all_labels if lab.study is None and (lab.trace_id, lab.segment_index) in segs]
    groups: dict[str, list[Label]] = defaultdict(list)
    if by == "codebook":
        for lab in all_labels:
            groups[lab.codebook_version].append(lab)
    else:
        human = [lab for lab in all_labels if lab.source == "human"]
        if not human:
            raise AgreementError(f"--by {by}: no human labels{' in study ' + repr(study) if study else ''} to window by their created_at", code="E727")
        machine = [lab for lab in all_labels if lab.source not in humans_src]
        for lab in human:
            groups[_window(lab, by)].append(lab)
        for w, labs in list(groups.items()):
            segs = {(lab.trace_id, lab.segment_index) for lab in labs}
            groups[w] = labs + [lab for lab in machine if (lab.trace_id, lab.segment_index) in segs]
    windows = []
    for w in sorted(groups):
        ratings = ratings_from_labels(groups[w], source=str(getattr(store, "path", "store")))
        windows.append({
            "window": w, "n_items": ratings.n_items, "n_traces": len(ratings.group_ids), "annotators": list(ratings.annotators),
            **agreement_by_kind(ratings, kinds, n_resamples=n_resamples, confidence_level=confidence_level, seed=seed),
        })
    return {"by": by, "windows": windows}


__all__ = ["DRIFT_BY", "KIND_GROUPS", "agreement_by_kind", "agreement_drift", "ratings_from_labels"]
