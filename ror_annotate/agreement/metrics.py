"""Public single statistics: one number (an :class:`~.estimators.Estimate`) per call, any label set.

Each function takes raw labels (a :class:`~.ratings.Ratings` or an array with missing entries)
and a category set: a declared sequence, or ``"auto"`` (the default) for the sorted distinct
labels of the input. No bootstrap here; :func:`~.analysis.agreement` adds trace-level intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AgreementError
from .estimators import (
    Estimate, _alpha_from, _estimate, _fleiss_ac1_from, _item_counts, _kappa_from, _multi_rater_stats, _pair_confusion,
    _per_class_from, _percent_from, _with_ci,
)
from .ratings import AUTO, Ratings, _encode, resolve_categories


def _as_ratings(ratings: Any, categories: Sequence[Any] | str | None) -> Ratings:
    if isinstance(ratings, Ratings):
        declared = categories is not None and not (isinstance(categories, str) and categories == AUTO)
        if declared and resolve_categories(categories) != ratings.categories:
            raise AgreementError(
                f"categories {list(categories)} differ from the Ratings' own {list(ratings.categories)}; "  # type: ignore[arg-type]
                "a Ratings object carries its category set: leave categories out, or rebuild the Ratings"
            )
        return ratings
    return Ratings.from_matrix(ratings, categories=AUTO if categories is None else categories)


def _weights_of(n: int, sample_weight: Any) -> np.ndarray:
    """Frequency weights ``[n]`` (ones when None); refuses a wrong shape, negative or non-finite weights."""
    if sample_weight is None:
        return np.ones(n)
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise AgreementError(f"sample_weight must be finite, non-negative, shape ({n},); got shape {w.shape}")
    return w


def _weights(r: Ratings, sample_weight: Any) -> np.ndarray:
    return _weights_of(r.n_items, sample_weight)


def _paired_codes(y1: Any, y2: Any, categories: Sequence[Any] | str, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Codes of two label vectors in one category set (declared, or inferred from both)."""
    v1, v2 = list(y1), list(y2)
    if len(v1) != len(v2):
        raise AgreementError(f"{names[0]} and {names[1]} must have the same length, got {len(v1)} and {len(v2)}")
    cats = resolve_categories(categories, v1, v2)
    return _encode(v1, cats, where=names[0]), _encode(v2, cats, where=names[1]), cats


def _scalar(value: np.ndarray, reason: np.ndarray, n_items: float) -> Estimate:
    return _estimate(float(value), reason.item() if isinstance(reason, np.ndarray) else reason, n_items)


def percent_agreement(ratings: Any, *, categories: Sequence[Any] | str | None = AUTO, sample_weight: Any = None) -> Estimate:
    """Observed agreement: mean over items with >= 2 labels of the share of agreeing label pairs.

    Parameters
    ----------
    ratings : Ratings, or array-like of shape (n_items, n_annotators)
        Category labels; None/NaN/"" where an annotator gave no label.
    categories : sequence or "auto", default "auto"
        Declared categories when ``ratings`` is an array; ``"auto"`` (or None): the sorted
        distinct labels found. A :class:`Ratings` carries its own set.
    sample_weight : array-like of shape (n_items,), optional
        Frequency weights (token counts).

    Returns
    -------
    Estimate
        nan with reason ``no_pairable_items`` when no item has two labels.
    """
    r = _as_ratings(ratings, categories)
    stats = _multi_rater_stats(r.counts(), _weights(r, sample_weight), np.zeros(r.n_items, np.int64), 1)[0]
    v, why = _percent_from(stats)
    return _scalar(v, why, stats[1])


def fleiss_kappa(
    ratings: Any = None,
    *,
    count_table: Any = None,
    categories: Sequence[Any] | str | None = AUTO,
    sample_weight: Any = None,
) -> Estimate:
    """Fleiss' kappa (Fleiss 1971) in Gwet's formulation for missing labels.

    Parameters
    ----------
    ratings : Ratings, or array-like of shape (n_items, n_annotators)
        Raw category labels per item: the primary input.
    count_table : array-like of shape (n_items, n_categories), keyword only
        Alternatively, how many annotators chose each category for each item (statsmodels'
        input format). Only accepted under this explicit name, so a labels matrix is never
        misread as counts (``shared/pitfalls/AGR-03``).
    categories, sample_weight
        As in :func:`percent_agreement`.

    Returns
    -------
    Estimate
        nan with reason ``single_category`` when chance agreement is 1, ``no_pairable_items`` when
        no item has two labels. Equal to ``statsmodels.stats.inter_rater.fleiss_kappa`` when every
        item has the same number of labels.

    Raises
    ------
    AgreementError
        Both or neither of ``ratings`` and ``count_table`` given; a count table that is not a 2-D
        array of non-negative integers.
    """
    if (ratings is None) == (count_table is None):
        raise AgreementError("give exactly one of ratings (labels per item) or count_table= (items x categories counts)")
    if count_table is not None:
        counts = np.asarray(count_table, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[1] < 2 or np.any(counts < 0) or np.any(counts != np.round(counts)):
            raise AgreementError(f"count_table must be a 2-D table of non-negative integer counts with >= 2 categories, got shape {counts.shape}")
        w = _weights_of(counts.shape[0], sample_weight)
    else:
        r = _as_ratings(ratings, categories)
        counts, w = r.counts(), _weights(r, sample_weight)
    stats = _multi_rater_stats(counts, w, np.zeros(len(counts), np.int64), 1)[0]
    kappa, why, _, _ = _fleiss_ac1_from(stats, counts.shape[1])
    return _scalar(kappa, why, stats[1])


def gwet_ac1(ratings: Any, *, categories: Sequence[Any] | str | None = AUTO, sample_weight: Any = None) -> Estimate:
    """Gwet's AC1 (Gwet 2008, eq. 16-18; Gwet 2014 ch. 2 for missing labels).

    Chance agreement uses the number ``q`` of categories in the set:
    p_e = sum_k pi_k (1 - pi_k) / (q - 1). Defined (1.0) when all labels agree on one category.
    With ``categories="auto"`` q is the number of distinct labels *used*; declare the full set
    (e.g. the codebook's categories) to report AC1 against it. Parameters and return as in
    :func:`percent_agreement`.
    """
    r = _as_ratings(ratings, categories)
    stats = _multi_rater_stats(r.counts(), _weights(r, sample_weight), np.zeros(r.n_items, np.int64), 1)[0]
    _, _, ac1, why = _fleiss_ac1_from(stats, r.n_categories)
    return _scalar(ac1, why, stats[1])


def krippendorff_alpha(ratings: Any, *, categories: Sequence[Any] | str | None = AUTO, sample_weight: Any = None) -> Estimate:
    """Krippendorff's alpha for nominal data, any number of annotators, missing labels allowed.

    Items with fewer than two labels are unpairable and dropped (Krippendorff 2011). Parameters
    as in :func:`percent_agreement`; ``n_items`` of the result is the number of pairable values.

    Returns
    -------
    Estimate
        nan with reason ``single_category`` when all pairable values are one category (the
        ``krippendorff`` package raises there), ``no_pairable_items`` when nothing is pairable.
    """
    r = _as_ratings(ratings, categories)
    q = r.n_categories
    stats = _multi_rater_stats(r.counts(), _weights(r, sample_weight), np.zeros(r.n_items, np.int64), 1)[0]
    coinc = stats[2 + q + 1 :].reshape(q, q)
    v, why = _alpha_from(coinc)
    return _scalar(v, why, coinc.sum())


def cohen_kappa(y1: Any, y2: Any, *, categories: Sequence[Any] | str = AUTO, sample_weight: Any = None) -> Estimate:
    """Cohen's kappa of two annotators over the items both labeled (Cohen 1960).

    Parameters
    ----------
    y1, y2 : array-like of shape (n_items,)
        Labels, None/NaN/"" where missing; items missing in either are skipped.
    categories : sequence or "auto", default "auto"
        Declared categories, or the sorted distinct labels of ``y1`` and ``y2`` together.
        Kappa does not depend on unused categories, so both give the same value.
    sample_weight : array-like of shape (n_items,), optional

    Returns
    -------
    Estimate
        nan with reason ``no_overlap`` (no item labeled by both) or ``single_category`` (both used
        the same single category: 0/0). Equals scikit-learn's ``cohen_kappa_score``.
    """
    a, b, cats = _paired_codes(y1, y2, categories, ("y1", "y2"))
    w = _weights_of(len(a), sample_weight)
    q = len(cats)
    conf = _pair_confusion(a, b, q, w, np.zeros(len(a), np.int64), 1)[0].reshape(q, q)
    v, why = _kappa_from(conf)
    return _scalar(v, why, conf.sum())


def confusion_matrix(y_true: Any, y_pred: Any, *, categories: Sequence[Any] | str = AUTO, sample_weight: Any = None) -> np.ndarray:
    """Confusion matrix ``[n_categories, n_categories]``: rows reference (``y_true``), columns annotator.

    Items missing in either input are skipped. Same layout as scikit-learn's ``confusion_matrix``
    with ``labels=categories``; with ``categories="auto"`` the rows and columns follow
    :func:`~.ratings.infer_categories` over both inputs (scikit-learn's default sorts the same
    labels by value, which differs only for numbers written as text, e.g. "10" vs "9").
    """
    a, b, cats = _paired_codes(y_true, y_pred, categories, ("y_true", "y_pred"))
    w = _weights_of(len(a), sample_weight)
    q = len(cats)
    return _pair_confusion(a, b, q, w, np.zeros(len(a), np.int64), 1)[0].reshape(q, q)


def per_class_scores(
    y_true: Any, y_pred: Any, *, categories: Sequence[Any] | str = AUTO, sample_weight: Any = None
) -> dict[str, Any]:
    """Per-class precision, recall, F1, one-vs-rest kappa and support, plus macro-F1 and accuracy.

    Parameters
    ----------
    y_true : array-like of shape (n_items,)
        Reference labels (human, adjudicated, majority).
    y_pred : array-like of shape (n_items,)
        The annotator's labels.
    categories : sequence or "auto", default "auto"
        The classes reported (declared, or the sorted distinct labels of both inputs). Macro-F1
        averages over classes with a defined F1, so a declared class that neither input uses does
        not change it.
    sample_weight : array-like of shape (n_items,), optional

    Returns
    -------
    dict
        ``{"classes": {category: {"precision", "recall", "f1", "kappa": Estimate, "support": float}},
        "macro_f1": Estimate, "accuracy": Estimate}``; undefined entries follow :data:`REASONS`.
    """
    y_true, y_pred = list(y_true), list(y_pred)
    cats = resolve_categories(categories, y_true, y_pred)
    conf = confusion_matrix(y_true, y_pred, categories=cats, sample_weight=sample_weight)
    return _per_class_dict(_per_class_from(conf), conf, cats)


def _per_class_dict(scores, conf: np.ndarray, cats: tuple[str, ...], cis: dict | None = None, n_res: dict | None = None) -> dict[str, Any]:
    """Estimates per class and summary metric (with intervals when ``cis`` and ``n_res`` are given)."""
    support = conf.sum(-1)
    n = float(conf.sum())
    classes: dict[str, Any] = {}
    for k, c in enumerate(cats):
        entry: dict[str, Any] = {}
        for metric in ("precision", "recall", "f1", "kappa"):
            vals, why = scores[metric]
            est = _estimate(vals[k], why[k], n)
            if cis is not None and n_res is not None:
                est = _with_ci(est, cis[metric][0][k], cis[metric][1][k], n_res[metric][k])
            entry[metric] = est
        entry["support"] = float(support[k])
        classes[c] = entry
    out: dict[str, Any] = {"classes": classes}
    for metric in ("macro_f1", "accuracy"):
        vals, why = scores[metric]
        est = _estimate(vals, why.item() if isinstance(why, np.ndarray) else why, n)
        if cis is not None and n_res is not None:
            est = _with_ci(est, cis[metric][0], cis[metric][1], n_res[metric])
        out[metric] = est
    return out


def majority_labels(ratings: Ratings, *, annotators: Sequence[str] | None = None) -> np.ndarray:
    """Majority-vote codes ``[n_items]`` over ``annotators`` (default all); -1 where tied or unlabeled."""
    members = list(annotators) if annotators is not None else list(ratings.annotators)
    counts = _item_counts(ratings.subset_annotators(members).codes, ratings.n_categories)
    top = counts.max(1)
    tie = (counts == top[:, None]).sum(1) > 1
    return np.where((top > 0) & ~tie, counts.argmax(1), -1)


def _first_distinct(values: np.ndarray, n: int) -> list[int]:
    """The first ``n`` distinct values of ``values`` in order of first occurrence (as ``dict.fromkeys``),
    reading only as far as needed: the whole array went through Python before (1M items: a second)."""
    out: dict[int, None] = {}
    if n <= 0:
        return []
    step = max(64, 4 * n)
    for start in range(0, len(values), step):
        for v in values[start:start + step].tolist():
            out.setdefault(v)
            if len(out) >= n:
                return list(out)
    return list(out)


def disagreement_pairs(ratings: Ratings, *, top: int = 10, n_examples: int = 3) -> list[dict[str, Any]]:
    """The most frequent unordered pairs of different labels given to the same item by two annotators.

    Returns
    -------
    list of dict
        ``{"labels": [c1, c2], "count": n (annotator pairs x items), "examples": [item_id, ...]}``,
        most frequent first (ties by category order).
    """
    q = ratings.n_categories
    keys, items = [], []
    for i in range(ratings.n_annotators):
        for j in range(i + 1, ratings.n_annotators):
            a, b = ratings.codes[:, i], ratings.codes[:, j]
            diff = (a >= 0) & (b >= 0) & (a != b)
            keys.append(np.minimum(a, b)[diff] * q + np.maximum(a, b)[diff])
            items.append(np.nonzero(diff)[0])
    if not keys:
        return []
    key = np.concatenate(keys)
    item = np.concatenate(items)
    freq = np.bincount(key, minlength=q * q)
    order = np.argsort(-freq, kind="stable")
    out = []
    for k in order[:top]:
        if freq[k] == 0:
            break
        ex = _first_distinct(item[key == k], n_examples)
        out.append(
            {
                "labels": [ratings.categories[k // q], ratings.categories[k % q]],
                "count": int(freq[k]),
                "examples": [ratings.item_ids[e] for e in ex],
            }
        )
    return out
