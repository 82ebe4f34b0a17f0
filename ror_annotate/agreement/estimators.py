"""Undefined-result policy, :class:`Estimate`, sufficient statistics and the batched estimators.

Every coefficient is a smooth function of per-trace sufficient statistics (per-item agreement
sums, coincidence matrices, pairwise confusion matrices). The estimators here take those
statistics with any number of leading axes (``[..., k]``), so the point estimate and all
bootstrap resamples are computed in one call. They return ``(value, reason)`` arrays: NaN with a
key of :data:`REASONS` where the statistic is 0/0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Machine-readable reasons for an undefined (NaN) result, with their meaning.
REASONS: dict[str, str] = {
    "no_pairable_items": "no item has labels from at least two annotators, so no label pair can be compared",
    "no_overlap": "the two annotators labeled no item in common",
    "single_category": "every compared label falls in one category, so chance agreement is 1 and the coefficient is 0/0",
    "class_absent": "the class occurs neither in the reference nor in the annotator's labels on the compared items",
    "no_predictions": "the annotator never used this class on the compared items (precision is 0/0)",
    "class_absent_in_reference": "the reference never uses this class on the compared items (recall is 0/0)",
    "no_reference_items": "no item has both a reference label and a label from this annotator",
    "zero_weight": "the items that could be compared all have weight 0",
    "fewer_than_two_raters": "the group has fewer than two raters with labels, so nothing can be compared",
}

#: Relative tolerance under which a chance-disagreement denominator counts as zero.
_TOL = 1e-12


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Estimate:
    """One agreement figure with its undefined-reason and bootstrap interval.

    Attributes
    ----------
    value : float
        The statistic; ``nan`` when undefined on the data.
    reason : str or None
        Key of :data:`REASONS` when ``value`` is nan, else None.
    ci_low, ci_high : float
        Percentile bootstrap interval (nan when not computed or undefined).
    n_items : float
        Number (or total weight) of items the statistic used.
    n_resamples : int
        Bootstrap resamples on which the statistic was defined (0 when no bootstrap ran).
    """

    value: float
    reason: str | None = None
    ci_low: float = math.nan
    ci_high: float = math.nan
    n_items: float = 0
    n_resamples: int = 0

    @property
    def defined(self) -> bool:
        """Whether ``value`` is a number."""
        return not math.isnan(self.value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; NaN becomes ``None`` with the reason next to it."""
        return {
            "value": _num(self.value),
            "reason": self.reason,
            "ci_low": _num(self.ci_low),
            "ci_high": _num(self.ci_high),
            "n_items": _num(self.n_items),
            "n_resamples": self.n_resamples,
        }


def _num(x: Any) -> float | int | None:
    """JSON number: None for NaN/inf, int for whole numbers, else float."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def _estimate(value: float, reason: str | None, n_items: float = 0) -> Estimate:
    value = float(value)
    return Estimate(value, reason if math.isnan(value) else None, n_items=float(n_items))


def _with_ci(est: Estimate, lo: float, hi: float, n_res: int) -> Estimate:
    if not est.defined:
        return est
    return Estimate(est.value, est.reason, float(lo), float(hi), est.n_items, int(n_res))


# ----------------------------------------------------------------------------- sufficient statistics
def _item_counts(codes: np.ndarray, q: int) -> np.ndarray:
    """Counts ``[n_items, q]`` of each category per item (missing labels ignored)."""
    n = codes.shape[0]
    valid = codes >= 0
    flat = (np.arange(n, dtype=np.int64)[:, None] * q + codes)[valid]
    return np.bincount(flat, minlength=n * q).reshape(n, q).astype(np.float64)


def _group_sum(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum ``values [n, k]`` within groups: ``[n_groups, k]``."""
    n, k = values.shape
    index = (groups[:, None] * k + np.arange(k)).ravel()
    return np.bincount(index, weights=values.ravel(), minlength=n_groups * k).reshape(n_groups, k)


#: Largest ``n_groups * n_patterns`` table :func:`_multi_rater_stats` builds (float64: 256 MiB).
_MAX_PATTERN_CELLS = 2**25


def _multi_rater_stats(counts: np.ndarray, w: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group sufficient statistics of the multi-rater coefficients: ``[n_groups, 2 + 2q + q*q]``.

    The columns of :func:`_multi_rater_stats_items`, computed per distinct count vector instead
    of per item: every column is ``w_i * f(counts_i)``, so a group's sums are
    ``sum_p W[g, p] * f(pattern_p)`` with ``W[g, p]`` the summed weight of the group's items whose
    count vector is pattern ``p``. With r raters and q categories there are at most
    C(r + q, q) patterns (462 for 5 raters, 6 categories) however many items there are, so the
    ``[n_items, q, q]`` coincidence array is never built. Same values as the per-item sums up to
    floating-point summation order (about 1e-15 relative). Falls back to the per-item path for
    non-integer counts or when ``n_groups * n_patterns`` exceeds :data:`_MAX_PATTERN_CELLS`.
    """
    n, q = counts.shape
    if n == 0:
        return _multi_rater_stats_items(counts, w, groups, n_groups)
    top = float(counts.max())
    base = int(top) + 1
    if counts.min() < 0 or base ** q >= 2**62 or not np.array_equal(counts, np.floor(counts)):
        return _multi_rater_stats_items(counts, w, groups, n_groups)
    code = counts.astype(np.int64) @ (base ** np.arange(q, dtype=np.int64))
    uniq, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    n_patterns = len(uniq)
    if n_groups * n_patterns > _MAX_PATTERN_CELLS:
        return _multi_rater_stats_items(counts, w, groups, n_groups)
    weight = np.bincount(groups * n_patterns + inverse.ravel(), weights=w, minlength=n_groups * n_patterns)
    per_pattern = _multi_rater_stats_items(counts[first], np.ones(n_patterns), np.arange(n_patterns, dtype=np.int64), n_patterns)
    return weight.reshape(n_groups, n_patterns) @ per_pattern


def _multi_rater_stats_items(counts: np.ndarray, w: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group sufficient statistics of the multi-rater coefficients, item by item: ``[n_groups, 2 + 2q + q*q]``.

    Columns: [0] sum of w*P_i and [1] sum of w over pairable items (percent agreement, Fleiss,
    AC1); [2:2+q] sum of w*r_ik/r_i and [2+q] sum of w over rated items (Gwet's pi_k);
    [3+q:] Krippendorff's coincidence matrix (q*q, row-major), each pairable item's pairs
    weighted by w/(m_i - 1).
    """
    q = counts.shape[1]
    m = counts.sum(1)
    pairable = m >= 2
    rated = m >= 1
    safe_pairs = np.where(pairable, m * (m - 1), 1.0)
    p_i = np.where(pairable, (counts * (counts - 1)).sum(1) / safe_pairs, 0.0)
    share = counts / np.where(rated, m, 1.0)[:, None]
    scale = np.where(pairable, w / np.where(pairable, m - 1, 1.0), 0.0)
    coinc = counts[:, :, None] * counts[:, None, :]
    coinc[:, np.arange(q), np.arange(q)] -= counts
    cols = np.concatenate(
        [
            (w * p_i)[:, None],
            (w * pairable)[:, None],
            share * (w * rated)[:, None],
            (w * rated)[:, None],
            (coinc * scale[:, None, None]).reshape(len(m), q * q),
        ],
        axis=1,
    )
    return _group_sum(cols, groups, n_groups)


def _pair_confusion(a: np.ndarray, b: np.ndarray, q: int, w: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Confusion counts ``[n_groups, q*q]`` (rows: ``a``'s code, cols: ``b``'s) over items both labeled."""
    return _pair_confusion_of(_pair_cells(a, b, q, groups), w, q, n_groups)


def _pair_cells(a: np.ndarray, b: np.ndarray, q: int, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(both, cell)``: the items both labeled and their ``group * q*q + a * q + b`` cell (reused per weighting)."""
    both = (a >= 0) & (b >= 0)
    return both, groups[both] * (q * q) + a[both] * q + b[both]


def _pair_confusion_of(cells: tuple[np.ndarray, np.ndarray], w: np.ndarray, q: int, n_groups: int) -> np.ndarray:
    """:func:`_pair_confusion` from :func:`_pair_cells`; unit weights are counted as integers (exact, faster)."""
    both, index = cells
    ww = w[both]
    if ww.size and ww[0] == 1.0 and np.all(ww == 1.0):
        return np.bincount(index, minlength=n_groups * q * q).astype(np.float64).reshape(n_groups, q * q)
    return np.bincount(index, weights=ww, minlength=n_groups * q * q).reshape(n_groups, q * q)


# ----------------------------------------------------------------------------- estimators (batched over leading axes)
def _reason_array(shape, *conds: tuple[np.ndarray, str]) -> np.ndarray:
    out = np.full(shape, None, dtype=object)
    for cond, reason in reversed(conds):
        out[np.broadcast_to(cond, shape)] = reason
    return out


def _percent_from(stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s_pa, n_pa = stats[..., 0], stats[..., 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(n_pa > 0, s_pa / n_pa, np.nan)
    return value, _reason_array(value.shape, (n_pa <= 0, "no_pairable_items"))


def _fleiss_ac1_from(stats: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fleiss' kappa and Gwet's AC1 from multi-rater sufficient statistics.

    Gwet (2014), *Handbook of Inter-Rater Reliability*, 4th ed., ch. 2 (Fleiss' kappa and AC1 with
    missing ratings): p_a = mean over items rated >= 2 times of sum_k r_ik(r_ik-1)/(r_i(r_i-1));
    pi_k = mean over rated items of r_ik/r_i; Fleiss p_e = sum_k pi_k^2; AC1 p_e =
    sum_k pi_k(1-pi_k)/(q-1) (Gwet 2008, Br. J. Math. Stat. Psychol. 61:29-48, eq. 16-18).
    With every item rated by the same raters this is statsmodels' ``fleiss_kappa``.
    """
    pa, _ = _percent_from(stats)
    s_pi, n_pi = stats[..., 2 : 2 + q], stats[..., 2 + q]
    with np.errstate(invalid="ignore", divide="ignore"):
        pi = s_pi / n_pi[..., None]
        pe_f = (pi * pi).sum(-1)
        pe_g = (pi * (1 - pi)).sum(-1) / (q - 1)
        kappa = (pa - pe_f) / (1 - pe_f)
        ac1 = (pa - pe_g) / (1 - pe_g)
    no_pairs = stats[..., 1] <= 0
    single = (1 - pe_f) <= _TOL
    kappa = np.where(no_pairs | single, np.nan, kappa)
    ac1 = np.where(no_pairs, np.nan, ac1)
    return (
        kappa,
        _reason_array(kappa.shape, (no_pairs, "no_pairable_items"), (single, "single_category")),
        ac1,
        _reason_array(ac1.shape, (no_pairs, "no_pairable_items")),
    )


def _alpha_from(coinc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Krippendorff's nominal alpha from coincidence matrices ``[..., q, q]``.

    Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C (nominal data):
    alpha = 1 - (n - 1) * sum_{c != k} o_ck / sum_{c != k} n_c n_k.
    """
    n_c = coinc.sum(-1)
    n = n_c.sum(-1)
    observed = n - np.trace(coinc, axis1=-2, axis2=-1)
    expected = n * n - (n_c * n_c).sum(-1)
    empty = n <= 0
    single = ~empty & (expected <= _TOL * n * n)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = 1 - (n - 1) * observed / expected
    value = np.where(empty | single, np.nan, value)
    return value, _reason_array(value.shape, (empty, "no_pairable_items"), (single, "single_category"))


def _kappa_from(conf: np.ndarray, *, empty_reason: str = "no_overlap") -> tuple[np.ndarray, np.ndarray]:
    """Cohen's kappa from confusion matrices ``[..., q, q]`` (Cohen 1960, eq. 1; as sklearn's cohen_kappa_score)."""
    n = conf.sum((-2, -1))
    chance = (conf.sum(-1) * conf.sum(-2)).sum(-1)
    agree = np.trace(conf, axis1=-2, axis2=-1)
    den = n * n - chance
    empty = n <= 0
    single = ~empty & (den <= _TOL * n * n)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = (n * agree - chance) / den
    value = np.where(empty | single, np.nan, value)
    return value, _reason_array(value.shape, (empty, empty_reason), (single, "single_category"))


def _per_class_from(conf: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-class and summary scores from confusion ``[..., q, q]`` (rows: reference, cols: annotator).

    Precision, recall and F1 as scikit-learn's ``precision_recall_fscore_support`` with
    ``zero_division=nan`` (F1 = 2tp / (2tp + fp + fn)); macro-F1 is the mean over classes with a
    defined F1 (as sklearn's ``f1_score(average="macro", zero_division=nan)``); one-vs-rest kappa is
    Cohen's kappa of the 2x2 table "class k vs the rest".
    """
    n = conf.sum((-2, -1))[..., None]
    tp = np.diagonal(conf, axis1=-2, axis2=-1)
    support = conf.sum(-1)
    predicted = conf.sum(-2)
    no_items = n[..., 0] <= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(predicted > 0, tp / predicted, np.nan)
        recall = np.where(support > 0, tp / support, np.nan)
        f1 = np.where(support + predicted > 0, 2 * tp / (support + predicted), np.nan)
        agree = n * n - n * (support + predicted) + 2 * n * tp  # n * (tp + tn)
        chance = support * predicted + (n - support) * (n - predicted)
        den = n * n - chance
        single = den <= _TOL * n * n
        kappa = np.where(single, np.nan, (agree - chance) / den)
        accuracy = np.where(no_items, np.nan, tp.sum(-1) / n[..., 0])
        f1_defined = ~np.isnan(f1)
        macro = np.where(f1_defined.any(-1), np.where(f1_defined, f1, 0).sum(-1) / f1_defined.sum(-1), np.nan)
    absent = (support + predicted) <= 0
    noi = no_items[..., None]
    return {
        "precision": (precision, _reason_array(precision.shape, (noi, "no_reference_items"), (predicted <= 0, "no_predictions"))),
        "recall": (recall, _reason_array(recall.shape, (noi, "no_reference_items"), (support <= 0, "class_absent_in_reference"))),
        "f1": (f1, _reason_array(f1.shape, (noi, "no_reference_items"), (absent, "class_absent"))),
        "kappa": (kappa, _reason_array(kappa.shape, (noi, "no_reference_items"), (absent, "class_absent"), (single, "single_category"))),
        "macro_f1": (macro, _reason_array(macro.shape, (no_items, "no_reference_items"), (~f1_defined.any(-1), "class_absent"))),
        "accuracy": (accuracy, _reason_array(accuracy.shape, (no_items, "no_reference_items"))),
    }
