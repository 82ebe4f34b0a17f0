"""Inter-annotator agreement: every standard nominal statistic, with trace-level bootstrap intervals.

Statistics (all nominal, all over a declared category set)
-----------------------------------------------------------
- percent agreement (the mean, over items with at least two labels, of the share of agreeing
  label pairs; for two annotators the share of items on which they agree),
- Cohen's kappa for every pair of annotators,
- Fleiss' kappa and Gwet's AC1 in Gwet's formulation for missing labels,
- Krippendorff's alpha (any number of annotators, missing labels allowed),
- against a reference (an annotator, a majority, adjudicated labels): the confusion matrix,
  per-class precision / recall / F1 / one-vs-rest kappa, macro-F1 and accuracy.

Input model
-----------
Raw per-item labels are the primary input (:class:`Ratings`, built from long-format rows
``(item_id, annotator, label)``, a labels matrix, or ``{item: {annotator: label}}``). A count
table (items x categories) is only accepted by :func:`fleiss_kappa` through its explicitly named
``count_table`` argument (``shared/pitfalls/AGR-03``).

Weights
-------
``sample_weight`` / ``Ratings.weights`` are *frequency* weights: weighting an item by ``w`` gives
exactly the statistic of the data with that item repeated ``w`` times. Token weighting (each segment
weighted by its token count) is therefore "every token is a unit carrying its segment's labels".

Undefined results (policy)
--------------------------
A statistic that is 0/0 on the given data returns ``value = nan`` and a machine-readable
``reason`` (keys of :data:`REASONS`), never a silent 0.0 and never an exception. A question that is
meaningless for the whole input (fewer than two annotators with labels, fewer than two categories,
labels outside the declared categories) raises :class:`~ror_annotate.errors.AgreementError`.
Gwet's AC1 stays defined when only one category is used (it is 1.0 when all labels agree), because its
chance agreement uses the number of *declared* categories.

Uncertainty
-----------
Bootstrap confidence intervals resample whole traces (groups), not segments: segments of one trace
are not independent. Every statistic is a smooth function of per-trace sufficient statistics
(coincidence matrices, pairwise confusion matrices, per-item agreement sums), so all resamples are
computed at once as ``counts [n_resamples, n_traces] @ stats [n_traces, k]``. The interval is the
percentile interval (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13.3) of the
resamples on which the statistic is defined.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import AgreementError, InputError
from .records import BEHAVIORS

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


# ----------------------------------------------------------------------------- input model
_MISSING_STRINGS = ("",)


def _is_missing(x: Any) -> bool:
    if x is None:
        return True
    if isinstance(x, float) and math.isnan(x):
        return True
    if isinstance(x, str) and x.strip() in _MISSING_STRINGS:
        return True
    try:
        return bool(np.isnan(x))  # numpy floating NaN / pandas NA-like floats
    except (TypeError, ValueError):
        return False


def _label_key(x: Any) -> str:
    """Canonical text of a label, so ``1``, ``1.0`` and ``"1"`` name the same category."""
    if isinstance(x, (float, np.floating)) and float(x).is_integer():
        return str(int(x))
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    return str(x).strip() if isinstance(x, str) else str(x)


def _check_categories(categories: Sequence[Any]) -> tuple[str, ...]:
    cats = tuple(_label_key(c) for c in categories)
    if len(cats) < 2:
        raise AgreementError(
            f"agreement needs at least two declared categories, got {list(cats)}: with one category there is "
            "nothing to disagree about. Declare the full category set (e.g. --categories a,b,c)"
        )
    if len(set(cats)) != len(cats):
        dup = sorted({c for c in cats if cats.count(c) > 1})
        raise AgreementError(f"categories must be distinct; repeated: {dup}")
    return cats


def _encode(values: Sequence[Any], categories: tuple[str, ...], *, where: str) -> np.ndarray:
    """Codes ``[n]`` (int64, -1 for missing) of ``values`` in ``categories``."""
    index = {c: i for i, c in enumerate(categories)}
    codes = np.empty(len(values), dtype=np.int64)
    known: dict[Any, int] = {}  # labels repeat: resolve each distinct value once
    for i, v in enumerate(values):
        key = (type(v), v)  # the type keeps True and 1 apart (equal hashes)
        try:
            hit = known.get(key)
        except TypeError:  # unhashable
            hit = None
        if hit is not None:
            codes[i] = hit
            continue
        if _is_missing(v):
            codes[i] = -1
            continue
        code = index.get(_label_key(v))
        if code is not None:
            try:
                known[key] = code
            except TypeError:
                pass
        if code is None:
            raise AgreementError(
                f"{where}: label {v!r} (position {i}) is not one of the declared categories {list(categories)}; "
                "declare it, or fix the label"
            )
        codes[i] = code
    return codes


@dataclass(frozen=True, eq=False)
class Ratings:
    """Nominal labels of ``n_items`` items by ``n_annotators`` annotators, with missing labels.

    Build it with :meth:`from_long`, :meth:`from_matrix`, :meth:`from_items` or :func:`ratings_from_csv`.

    Attributes
    ----------
    codes : ndarray of shape (n_items, n_annotators), int64
        Index into ``categories``; ``-1`` where the annotator gave no label.
    categories : tuple of str, length n_categories (>= 2)
        The declared category set (AC1's chance agreement depends on its size).
    annotators : tuple of str, length n_annotators
    item_ids : tuple of str, length n_items
    groups : ndarray of shape (n_items,), int64
        Index into ``group_ids``: the trace of each item, the unit the bootstrap resamples.
    group_ids : tuple of str, length n_groups
    weights : ndarray of shape (n_items,), float64, or None
        Frequency weights (token counts for token-weighted figures).
    """

    codes: np.ndarray
    categories: tuple[str, ...]
    annotators: tuple[str, ...]
    item_ids: tuple[str, ...]
    groups: np.ndarray
    group_ids: tuple[str, ...]
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        codes = np.asarray(self.codes)
        if codes.ndim != 2:
            raise AgreementError(f"codes must have shape (n_items, n_annotators), got shape {codes.shape}")
        n, r = codes.shape
        if len(self.annotators) != r or len(self.item_ids) != n or len(self.groups) != n:
            raise AgreementError(
                f"Ratings sizes disagree: codes {codes.shape}, {len(self.item_ids)} item ids, "
                f"{len(self.annotators)} annotators, {len(self.groups)} group indices"
            )
        if codes.size and (codes.min() < -1 or codes.max() >= len(self.categories)):
            raise AgreementError("codes must lie in [-1, n_categories)")
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=np.float64)
            if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
                raise AgreementError("weights must be finite, non-negative, one per item")

    # -------------------------------------------------------------- constructors
    @classmethod
    def from_long(
        cls,
        item_ids: Sequence[Any],
        annotators: Sequence[Any],
        labels: Sequence[Any],
        *,
        categories: Sequence[Any] = BEHAVIORS,
        groups: Sequence[Any] | None = None,
        weights: Sequence[float] | None = None,
        annotator_order: Sequence[str] | None = None,
        source: str = "input",
    ) -> "Ratings":
        """Ratings from long-format rows ``(item_id, annotator, label)``, one row per label.

        Parameters
        ----------
        item_ids, annotators, labels : sequences of length n_rows
            A missing label (None, NaN, empty string) is allowed and counts as "not labeled".
        categories : sequence, default the six behaviors
        groups : sequence of length n_rows, optional
            Trace id of each row; must be the same on every row of an item. Default: each item
            is its own group (then the bootstrap resamples items).
        weights : sequence of float of length n_rows, optional
            Frequency weight of each row's item (token count); the same on every row of an item.
        annotator_order : sequence of str, optional
            Column order of the annotators (default: sorted).
        source : str
            Name used in error messages (a file name).

        Raises
        ------
        AgreementError
            A label outside ``categories``; one annotator labeling one item twice; an item with
            two different groups or weights.
        """
        cats = _check_categories(categories)
        n_rows = len(labels)
        if len(item_ids) != n_rows or len(annotators) != n_rows:
            raise AgreementError(f"{source}: item_ids, annotators and labels must have the same length")
        row_codes = _encode(labels, cats, where=source)
        item_of_row, item_order = _factorize(item_ids)
        rater_of_row, raters_seen = _factorize(annotators)
        rater_order = [str(a) for a in annotator_order] if annotator_order is not None else sorted(raters_seen)
        rater_index = {a: j for j, a in enumerate(rater_order)}
        unknown = [a for a in raters_seen if a not in rater_index]
        if unknown:
            raise AgreementError(f"{source}: annotator(s) {unknown} are not in annotator_order {rater_order}")
        rater_of_row = np.asarray([rater_index[a] for a in raters_seen], dtype=np.int64)[rater_of_row]
        n_items, n_raters = len(item_order), len(rater_order)
        cell = item_of_row * n_raters + rater_of_row
        order = np.argsort(cell, kind="stable")
        repeated = np.flatnonzero(cell[order][1:] == cell[order][:-1])
        if repeated.size:
            r0, r1 = int(order[repeated[0]]), int(order[repeated[0] + 1])
            raise AgreementError(
                f"{source}: annotator {rater_order[rater_of_row[r1]]!r} labeled item {item_order[item_of_row[r1]]!r} "
                f"twice (rows {r0} and {r1}); keep one label per annotator and item"
            )
        codes = np.full(n_items * n_raters, -1, dtype=np.int64)
        codes[cell] = row_codes
        codes = codes.reshape(n_items, n_raters)
        first_row = np.full(n_items, -1, dtype=np.int64)
        first_row[item_of_row[::-1]] = np.arange(n_rows - 1, -1, -1)  # first row of each item
        if groups is None:
            group_idx, group_ids = np.arange(n_items, dtype=np.int64), tuple(item_order)
        else:
            if len(groups) != n_rows:
                raise AgreementError(f"{source}: groups must have one entry per row")
            group_of_row, group_list = _factorize(groups)
            _check_per_item(group_of_row, item_of_row, first_row, item_order, group_list, source, "group")
            group_idx, group_ids = group_of_row[first_row], tuple(group_list)
        w = None
        if weights is not None:
            if len(weights) != n_rows:
                raise AgreementError(f"{source}: weights must have one entry per row")
            w_row = np.asarray(weights, dtype=np.float64)
            _check_per_item(w_row, item_of_row, first_row, item_order, None, source, "weight")
            w = w_row[first_row]
        return cls(codes, cats, tuple(rater_order), tuple(item_order), np.asarray(group_idx, dtype=np.int64), group_ids, w)

    @classmethod
    def from_matrix(
        cls,
        matrix: Any,
        *,
        categories: Sequence[Any] = BEHAVIORS,
        orient: str = "items_x_annotators",
        annotators: Sequence[str] | None = None,
        item_ids: Sequence[str] | None = None,
        groups: Sequence[Any] | None = None,
        weights: Sequence[float] | None = None,
    ) -> "Ratings":
        """Ratings from a labels matrix with missing entries (None, NaN or "").

        Parameters
        ----------
        matrix : array-like of shape (n_items, n_annotators), or (n_annotators, n_items)
            Category *labels*, never counts (counts go to ``fleiss_kappa(count_table=...)``).
        orient : {"items_x_annotators", "annotators_x_items"}
            Which axis holds the annotators (the ``krippendorff`` package expects
            ``annotators_x_items``; scikit-learn style is ``items_x_annotators``).
        groups, weights : sequences of length n_items, optional
        """
        arr = np.asarray(matrix, dtype=object)
        if arr.ndim != 2:
            raise AgreementError(f"a labels matrix must be 2-D, got shape {arr.shape}")
        if orient == "annotators_x_items":
            arr = arr.T
        elif orient != "items_x_annotators":
            raise AgreementError(f"orient must be 'items_x_annotators' or 'annotators_x_items', got {orient!r}")
        cats = _check_categories(categories)
        n, r = arr.shape
        codes = _encode(arr.ravel().tolist(), cats, where="labels matrix").reshape(n, r)
        ann = tuple(str(a) for a in annotators) if annotators is not None else tuple(f"annotator_{j}" for j in range(r))
        ids = tuple(str(i) for i in item_ids) if item_ids is not None else tuple(str(i) for i in range(n))
        if groups is None:
            g_idx, g_ids = np.arange(n, dtype=np.int64), ids
        else:
            if len(groups) != n:
                raise AgreementError(f"groups must have one entry per item ({n}), got {len(groups)}")
            uniq, g_idx = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
            g_ids = tuple(uniq.tolist())
        w = None if weights is None else np.asarray(weights, dtype=np.float64)
        return cls(codes, cats, ann, ids, np.asarray(g_idx, dtype=np.int64), g_ids, w)

    @classmethod
    def from_items(
        cls,
        items: Mapping[Any, Mapping[str, Any]],
        *,
        categories: Sequence[Any] = BEHAVIORS,
        groups: Mapping[Any, Any] | None = None,
    ) -> "Ratings":
        """Ratings from ``{item_id: {annotator: label or None}}`` (the pitfall files' format)."""
        rows_i, rows_a, rows_l = [], [], []
        order: list[str] = []
        for item, by_rater in items.items():
            for a, lab in by_rater.items():
                rows_i.append(str(item))
                rows_a.append(str(a))
                rows_l.append(lab)
                if str(a) not in order:
                    order.append(str(a))
        g = None if groups is None else [groups[i] for i in rows_i]
        return cls.from_long(rows_i, rows_a, rows_l, categories=categories, groups=g, annotator_order=order)

    # -------------------------------------------------------------- views
    @property
    def n_items(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_annotators(self) -> int:
        return int(self.codes.shape[1])

    @property
    def n_categories(self) -> int:
        return len(self.categories)

    def counts(self) -> np.ndarray:
        """Count table ``[n_items, n_categories]``: how many annotators put each item in each category."""
        return _item_counts(self.codes, self.n_categories)

    def subset_annotators(self, names: Sequence[str]) -> "Ratings":
        """The same items with only the annotators ``names`` (in that order)."""
        idx = [self.annotators.index(n) for n in names]
        return Ratings(self.codes[:, idx], self.categories, tuple(names), self.item_ids, self.groups, self.group_ids, self.weights)

    def column(self, annotator: str) -> np.ndarray:
        """Codes ``[n_items]`` of one annotator (-1 = no label)."""
        try:
            return self.codes[:, self.annotators.index(annotator)]
        except ValueError:
            raise AgreementError(f"no annotator {annotator!r}; annotators are {list(self.annotators)}") from None


def _factorize(values: Sequence[Any]) -> tuple[np.ndarray, list[str]]:
    """Codes ``[n]`` and distinct values (as str) in order of first appearance."""
    arr = np.asarray([str(v) for v in values], dtype=object) if not isinstance(values, np.ndarray) else values.astype(str).astype(object)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64), []
    uniq, first, inverse = np.unique(arr.astype(str), return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    appearance = np.argsort(first, kind="stable")
    rank[appearance] = np.arange(len(uniq))
    return rank[inverse.ravel()], [str(u) for u in uniq[appearance]]


def _check_per_item(values, item_of_row, first_row, item_order, names, source, what) -> None:
    """Raise if an item's rows carry different ``values`` (groups or weights)."""
    bad = np.flatnonzero(values != values[first_row[item_of_row]])
    if bad.size:
        row = int(bad[0])
        it = int(item_of_row[row])
        show = (lambda v: names[v]) if names is not None else (lambda v: float(v))
        raise AgreementError(
            f"{source}: item {item_order[it]!r} has two different {what}s "
            f"({show(values[first_row[it]])!r} and {show(values[row])!r}, rows {int(first_row[it])} and {row})"
        )


def ratings_from_csv(path: str | Path, *, categories: Sequence[str] | str = BEHAVIORS) -> Ratings:
    """Read a long-format CSV: columns ``item_id, annotator, label``; optional ``trace_id`` (or ``group``) and ``weight``.

    Parameters
    ----------
    path : str or Path
    categories : sequence of str, or "auto"
        The declared category set; ``"auto"`` takes the sorted distinct labels found in the file
        (then AC1 uses that many categories).

    Raises
    ------
    InputError
        Missing columns, an unreadable file, a bad weight, a label outside the categories, or a
        duplicate (item, annotator) row; the message names the file and line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: byte {data[exc.start:exc.start + 1]!r} is not valid UTF-8; save the file as UTF-8") from None
    # Exports that carry segment or trace text exceed csv's default field limit of 131,072 characters.
    csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))
    with io.StringIO(text, newline="") as handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        missing = [c for c in ("item_id", "annotator", "label") if c not in header]
        if missing:
            raise InputError(f"{path}: line 1: missing column(s) {missing}; the header must include item_id, annotator, label (found {header})")
        group_col = "trace_id" if "trace_id" in header else ("group" if "group" in header else None)
        rows: list[tuple[int, str, str, str, str | None, float | None]] = []
        for row in reader:
            line = reader.line_num
            item, ann, lab = (row.get("item_id") or "").strip(), (row.get("annotator") or "").strip(), (row.get("label") or "").strip()
            if not item or not ann:
                raise InputError(f"{path}: line {line}: empty item_id or annotator")
            weight = None
            if "weight" in header:
                raw = (row.get("weight") or "").strip()
                try:
                    weight = float(raw)
                except ValueError:
                    raise InputError(f"{path}: line {line}: weight {raw!r} is not a number") from None
                if not math.isfinite(weight) or weight < 0:
                    raise InputError(f"{path}: line {line}: weight {raw!r} must be finite and >= 0")
            group = (row.get(group_col) or "").strip() if group_col else None
            rows.append((line, item, ann, lab, group, weight))
    if not rows:
        raise InputError(f"{path}: no label rows after the header")
    if isinstance(categories, str):
        if categories != "auto":
            raise InputError(f"categories must be a list or 'auto', got {categories!r}")
        cats = tuple(sorted({r[3] for r in rows if r[3]}))
    else:
        cats = tuple(str(c) for c in categories)
    cat_set = set(cats)
    seen: dict[tuple[str, str], int] = {}
    first: dict[str, tuple[int, str | None, float | None]] = {}
    for line, item, ann, lab, group, weight in rows:
        if lab and lab not in cat_set:
            raise InputError(f"{path}: line {line}: label {lab!r} is not one of the categories {list(cats)}; pass --categories")
        if (item, ann) in seen:
            raise InputError(f"{path}: line {line}: annotator {ann!r} already labeled item {item!r} on line {seen[(item, ann)]}")
        seen[(item, ann)] = line
        if item in first:
            l0, g0, w0 = first[item]
            if group_col and g0 != group:
                raise InputError(f"{path}: line {line}: item {item!r} has {group_col} {group!r} but {g0!r} on line {l0}")
            if weight is not None and w0 != weight:
                raise InputError(f"{path}: line {line}: item {item!r} has weight {weight:g} but {w0:g} on line {l0}")
        else:
            first[item] = (line, group, weight)
    try:
        return Ratings.from_long(
            [r[1] for r in rows], [r[2] for r in rows], [r[3] or None for r in rows],
            categories=cats,
            groups=[r[4] for r in rows] if group_col else None,
            weights=[r[5] for r in rows] if "weight" in [*header] else None,
            source=str(path),
        )
    except AgreementError as exc:
        raise InputError(f"{path}: {exc.message}") from exc


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


def _multi_rater_stats(counts: np.ndarray, w: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group sufficient statistics of the multi-rater coefficients: ``[n_groups, 2 + 2q + q*q]``.

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
    both = (a >= 0) & (b >= 0)
    index = groups[both] * (q * q) + a[both] * q + b[both]
    return np.bincount(index, weights=w[both], minlength=n_groups * q * q).reshape(n_groups, q * q)


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


# ----------------------------------------------------------------------------- public single statistics
def _as_ratings(ratings: Any, categories: Sequence[Any] | None) -> Ratings:
    if isinstance(ratings, Ratings):
        return ratings
    return Ratings.from_matrix(ratings, categories=BEHAVIORS if categories is None else categories)


def _weights(r: Ratings, sample_weight: Any) -> np.ndarray:
    if sample_weight is None:
        return np.ones(r.n_items)
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (r.n_items,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise AgreementError(f"sample_weight must be finite, non-negative, shape ({r.n_items},); got shape {w.shape}")
    return w


def _scalar(value: np.ndarray, reason: np.ndarray, n_items: float) -> Estimate:
    return _estimate(float(value), reason.item() if isinstance(reason, np.ndarray) else reason, n_items)


def percent_agreement(ratings: Any, *, categories: Sequence[Any] | None = None, sample_weight: Any = None) -> Estimate:
    """Observed agreement: mean over items with >= 2 labels of the share of agreeing label pairs.

    Parameters
    ----------
    ratings : Ratings, or array-like of shape (n_items, n_annotators)
        Category labels; None/NaN/"" where an annotator gave no label.
    categories : sequence, optional
        Declared categories when ``ratings`` is an array (default: the six behaviors).
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
    categories: Sequence[Any] | None = None,
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
        n = counts.shape[0]
        w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    else:
        r = _as_ratings(ratings, categories)
        counts, w = r.counts(), _weights(r, sample_weight)
    stats = _multi_rater_stats(counts, w, np.zeros(len(counts), np.int64), 1)[0]
    kappa, why, _, _ = _fleiss_ac1_from(stats, counts.shape[1])
    return _scalar(kappa, why, stats[1])


def gwet_ac1(ratings: Any, *, categories: Sequence[Any] | None = None, sample_weight: Any = None) -> Estimate:
    """Gwet's AC1 (Gwet 2008, eq. 16-18; Gwet 2014 ch. 2 for missing labels).

    Chance agreement uses the number ``q`` of *declared* categories:
    p_e = sum_k pi_k (1 - pi_k) / (q - 1). Defined (1.0) when all labels agree on one category.
    Parameters and return as in :func:`percent_agreement`.
    """
    r = _as_ratings(ratings, categories)
    stats = _multi_rater_stats(r.counts(), _weights(r, sample_weight), np.zeros(r.n_items, np.int64), 1)[0]
    _, _, ac1, why = _fleiss_ac1_from(stats, r.n_categories)
    return _scalar(ac1, why, stats[1])


def krippendorff_alpha(ratings: Any, *, categories: Sequence[Any] | None = None, sample_weight: Any = None) -> Estimate:
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


def cohen_kappa(y1: Any, y2: Any, *, categories: Sequence[Any] = BEHAVIORS, sample_weight: Any = None) -> Estimate:
    """Cohen's kappa of two annotators over the items both labeled (Cohen 1960).

    Parameters
    ----------
    y1, y2 : array-like of shape (n_items,)
        Labels, None/NaN/"" where missing; items missing in either are skipped.
    categories : sequence
    sample_weight : array-like of shape (n_items,), optional

    Returns
    -------
    Estimate
        nan with reason ``no_overlap`` (no item labeled by both) or ``single_category`` (both used
        the same single category: 0/0). Equals scikit-learn's ``cohen_kappa_score``.
    """
    cats = _check_categories(categories)
    a, b = _encode(list(y1), cats, where="y1"), _encode(list(y2), cats, where="y2")
    if len(a) != len(b):
        raise AgreementError(f"y1 and y2 must have the same length, got {len(a)} and {len(b)}")
    w = np.ones(len(a)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    q = len(cats)
    conf = _pair_confusion(a, b, q, w, np.zeros(len(a), np.int64), 1)[0].reshape(q, q)
    v, why = _kappa_from(conf)
    return _scalar(v, why, conf.sum())


def confusion_matrix(y_true: Any, y_pred: Any, *, categories: Sequence[Any] = BEHAVIORS, sample_weight: Any = None) -> np.ndarray:
    """Confusion matrix ``[n_categories, n_categories]``: rows reference (``y_true``), columns annotator.

    Items missing in either input are skipped. Same layout as scikit-learn's ``confusion_matrix``
    with ``labels=categories``.
    """
    cats = _check_categories(categories)
    a, b = _encode(list(y_true), cats, where="y_true"), _encode(list(y_pred), cats, where="y_pred")
    w = np.ones(len(a)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    q = len(cats)
    return _pair_confusion(a, b, q, w, np.zeros(len(a), np.int64), 1)[0].reshape(q, q)


def per_class_scores(
    y_true: Any, y_pred: Any, *, categories: Sequence[Any] = BEHAVIORS, sample_weight: Any = None
) -> dict[str, Any]:
    """Per-class precision, recall, F1, one-vs-rest kappa and support, plus macro-F1 and accuracy.

    Parameters
    ----------
    y_true : array-like of shape (n_items,)
        Reference labels (human, adjudicated, majority).
    y_pred : array-like of shape (n_items,)
        The annotator's labels.

    Returns
    -------
    dict
        ``{"classes": {category: {"precision", "recall", "f1", "kappa": Estimate, "support": float}},
        "macro_f1": Estimate, "accuracy": Estimate}``; undefined entries follow :data:`REASONS`.
    """
    cats = _check_categories(categories)
    conf = confusion_matrix(y_true, y_pred, categories=cats, sample_weight=sample_weight)
    return _per_class_dict(_per_class_from(conf), conf, cats)


def _per_class_dict(scores, conf: np.ndarray, cats: tuple[str, ...], cis: dict | None = None, n_res: dict | None = None) -> dict[str, Any]:
    support = conf.sum(-1)
    n = float(conf.sum())
    classes: dict[str, Any] = {}
    for k, c in enumerate(cats):
        entry: dict[str, Any] = {}
        for metric in ("precision", "recall", "f1", "kappa"):
            vals, why = scores[metric]
            est = _estimate(vals[k], why[k], n)
            if cis is not None:
                est = _with_ci(est, cis[metric][0][k], cis[metric][1][k], n_res[metric][k])
            entry[metric] = est
        entry["support"] = float(support[k])
        classes[c] = entry
    out = {"classes": classes}
    for metric in ("macro_f1", "accuracy"):
        vals, why = scores[metric]
        est = _estimate(vals, why.item() if isinstance(why, np.ndarray) else why, n)
        if cis is not None:
            est = _with_ci(est, cis[metric][0], cis[metric][1], n_res[metric])
        out[metric] = est
    return out


def _with_ci(est: Estimate, lo: float, hi: float, n_res: int) -> Estimate:
    if not est.defined:
        return est
    return Estimate(est.value, est.reason, float(lo), float(hi), est.n_items, int(n_res))


# ----------------------------------------------------------------------------- bootstrap
def trace_bootstrap_counts(n_groups: int, *, n_resamples: int, seed: int | None = 0) -> np.ndarray:
    """How often each trace is drawn in each bootstrap resample: int array ``[n_resamples, n_groups]``.

    Each row is one multinomial draw of ``n_groups`` traces with replacement (equal probabilities),
    from ``numpy.random.default_rng(seed)``.
    """
    if n_resamples < 0 or n_groups < 1:
        raise AgreementError(f"need n_resamples >= 0 and at least one trace, got {n_resamples} and {n_groups}")
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_resamples)


def _percentile_ci(samples: np.ndarray, confidence_level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile interval over axis 0 ignoring NaN resamples: (low, high, n_defined)."""
    finite = ~np.isnan(samples)
    n_ok = finite.sum(0)
    tail = (1 - confidence_level) / 2
    if samples.shape[0] == 0:
        shape = samples.shape[1:]
        return np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=int)
    with warnings.catch_warnings():  # all-NaN columns (undefined everywhere) are expected here
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanquantile(samples, tail, axis=0)
        hi = np.nanquantile(samples, 1 - tail, axis=0)
    return lo, hi, n_ok


# ----------------------------------------------------------------------------- the full analysis
@dataclass
class AgreementResult:
    """Everything :func:`agreement` computed. ``to_dict()`` is the JSON form (``ror agree --json``).

    ``resamples`` keeps the bootstrap replicates (``[n_resamples]`` per scalar statistic, keyed
    ``"<weighting>/<name>"``) for inspection; it is not part of the JSON.
    """

    categories: tuple[str, ...]
    annotators: tuple[str, ...]
    n_items: int
    n_traces: int
    statistics: dict[str, dict[str, Any]]
    per_class: dict[str, Any] | None
    disagreements: list[dict[str, Any]]
    settings: dict[str, Any]
    resamples: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    #: Items labeled by at least two annotators: the only ones the coefficients can use.
    n_pairable_items: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (NaN as null with its reason); the segment-weighted figures are top-level."""
        seg = self.statistics["segment"]
        out: dict[str, Any] = {
            "n_items": self.n_items,
            "n_pairable_items": self.n_pairable_items,
            "n_annotators": len(self.annotators),
            "n_traces": self.n_traces,
            "annotators": list(self.annotators),
            "categories": list(self.categories),
        }
        out.update(_jsonable(seg))
        out["per_class"] = _jsonable(self.per_class)
        out["token_weighted"] = _jsonable(self.statistics.get("token"))
        out["disagreements"] = _jsonable(self.disagreements)
        out["bootstrap"] = dict(self.settings)
        out["reasons"] = dict(REASONS)
        return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Estimate):
        return obj.to_dict()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (float, np.floating)):
        return _num(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _reference_codes(r: Ratings, annotator: str, reference: str | None, pool: Sequence[str] | None, reference_labels: np.ndarray | None) -> np.ndarray | None:
    """Reference codes ``[n_items]`` (-1 = none) against which ``annotator`` is scored."""
    if reference_labels is not None:
        return reference_labels
    if reference is None:
        return None
    if reference != "majority":
        return None if annotator == reference else r.column(reference)
    members = [a for a in (pool if pool is not None else r.annotators) if a != annotator]
    return majority_labels(r, annotators=members) if members else None


def majority_labels(ratings: Ratings, *, annotators: Sequence[str] | None = None) -> np.ndarray:
    """Majority-vote codes ``[n_items]`` over ``annotators`` (default all); -1 where tied or unlabeled."""
    members = list(annotators) if annotators is not None else list(ratings.annotators)
    counts = _item_counts(ratings.subset_annotators(members).codes, ratings.n_categories)
    top = counts.max(1)
    tie = (counts == top[:, None]).sum(1) > 1
    return np.where((top > 0) & ~tie, counts.argmax(1), -1)


def agreement(
    ratings: Ratings,
    *,
    reference: str | None = None,
    reference_pool: Sequence[str] | None = None,
    reference_labels: Sequence[Any] | None = None,
    reference_name: str | None = None,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    token_weighted: bool = True,
    n_disagreements: int = 10,
    n_examples: int = 3,
) -> AgreementResult:
    """Every agreement statistic with trace-level bootstrap intervals, segment- and token-weighted.

    Parameters
    ----------
    ratings : Ratings
        Labels ``[n_items, n_annotators]`` with groups (traces) and optional weights (tokens).
    reference : {"majority"} or str, optional
        What per-class scores and confusion matrices compare each annotator against:
        ``"majority"`` = majority vote of the *other* annotators in ``reference_pool`` (ties give no
        reference for that item), or the name of one annotator. None: no per-class figures unless
        ``reference_labels`` is given.
    reference_pool : sequence of str, optional
        Annotators whose majority is the reference (default: all).
    reference_labels : array-like of shape (n_items,), optional
        Explicit reference labels (adjudicated labels); None/NaN where absent. Overrides ``reference``.
    reference_name : str, optional
        Display name of the reference (default: ``reference`` or ``"reference_labels"``).
    n_resamples : int, default 1000
        Trace-level bootstrap resamples (0: no intervals).
    confidence_level : float, default 0.95
    seed : int or None, default 0
    token_weighted : bool, default True
        Also compute token-weighted figures (needs ``ratings.weights``).
    n_disagreements, n_examples : int
        How many most frequent disagreement pairs to list, with how many example item ids each.

    Returns
    -------
    AgreementResult

    Raises
    ------
    AgreementError
        Fewer than two annotators with at least one label; bad ``confidence_level``; unknown reference.
    """
    if not 0 < confidence_level < 1:
        raise AgreementError(f"confidence_level must be in (0, 1), got {confidence_level}")
    active = [a for j, a in enumerate(ratings.annotators) if np.any(ratings.codes[:, j] >= 0)]
    if len(active) < 2:
        raise AgreementError(
            f"agreement needs labels from at least two annotators; annotators with labels: {active or 'none'} "
            f"(of {list(ratings.annotators)}). Add another annotator's labels or widen the selection"
        )
    if reference is not None and reference != "majority" and reference not in ratings.annotators:
        raise AgreementError(f"unknown reference {reference!r}: use 'majority' or one of {list(ratings.annotators)}")
    q = ratings.n_categories
    ref_labels = None
    if reference_labels is not None:
        ref_labels = _encode(list(reference_labels), ratings.categories, where="reference labels")
        if len(ref_labels) != ratings.n_items:
            raise AgreementError(f"reference_labels must have one entry per item ({ratings.n_items}), got {len(ref_labels)}")
    ref_display = reference_name or (reference if reference_labels is None else "reference_labels")

    weightings = {"segment": np.ones(ratings.n_items)}
    if token_weighted and ratings.weights is not None:
        weightings["token"] = np.asarray(ratings.weights, dtype=np.float64)
    G = len(ratings.group_ids)
    boot = trace_bootstrap_counts(G, n_resamples=n_resamples, seed=seed).astype(np.float64) if n_resamples else np.zeros((0, G))
    pairs = [(i, j) for i in range(ratings.n_annotators) for j in range(i + 1, ratings.n_annotators)]
    if ref_labels is not None or reference == "majority":
        scored = list(ratings.annotators)
    elif reference is not None:
        scored = [a for a in ratings.annotators if a != reference]
    else:
        scored = []

    counts = ratings.counts()
    statistics: dict[str, dict[str, Any]] = {}
    per_class: dict[str, Any] | None = None
    resamples: dict[str, np.ndarray] = {}
    for name, w in weightings.items():
        stats_g = _multi_rater_stats(counts, w, ratings.groups, G)  # [G, K]
        full = stats_g.sum(0)
        reps = boot @ stats_g  # [B, K]
        both = np.concatenate([full[None], reps], 0)
        pa, pa_why = _percent_from(both)
        fk, fk_why, ac1, ac1_why = _fleiss_ac1_from(both, q)
        alpha, al_why = _alpha_from(both[:, 2 + q + 1 :].reshape(-1, q, q))
        n_pairable, n_values = full[1], full[2 + q + 1 :].sum()
        block: dict[str, Any] = {}
        for key, (vals, why, n_it) in {
            "percent_agreement": (pa, pa_why, n_pairable),
            "fleiss_kappa": (fk, fk_why, n_pairable),
            "krippendorff_alpha": (alpha, al_why, n_values),
            "gwet_ac1": (ac1, ac1_why, n_pairable),
        }.items():
            block[key] = _boot_estimate(vals, why, n_it, confidence_level)
            resamples[f"{name}/{key}"] = vals[1:]
        kappas = []
        for i, j in pairs:
            conf_g = _pair_confusion(ratings.codes[:, i], ratings.codes[:, j], q, w, ratings.groups, G)
            allc = np.concatenate([conf_g.sum(0)[None], boot @ conf_g], 0).reshape(-1, q, q)
            kv, kw = _kappa_from(allc)
            a, b = ratings.annotators[i], ratings.annotators[j]
            est = _boot_estimate(kv, kw, allc[0].sum(), confidence_level)
            resamples[f"{name}/cohen_kappa/{a}|{b}"] = kv[1:]
            kappas.append({"annotator_a": a, "annotator_b": b, **est.to_dict()})
        block["cohen_kappa"] = kappas
        statistics[name] = block
        if scored:
            pc_block: dict[str, Any] = {}
            for a in scored:
                ref = _reference_codes(ratings, a, reference, reference_pool, ref_labels)
                if ref is None:
                    continue
                conf_g = _pair_confusion(ref, ratings.column(a), q, w, ratings.groups, G)
                allc = np.concatenate([conf_g.sum(0)[None], boot @ conf_g], 0).reshape(-1, q, q)
                scores = _per_class_from(allc)
                point = {m: (v[0], why[0]) for m, (v, why) in scores.items()}
                cis, n_res = {}, {}
                for m, (v, _) in scores.items():
                    lo, hi, nok = _percentile_ci(v[1:], confidence_level)
                    cis[m], n_res[m] = (lo, hi), nok
                entry = _per_class_dict(point, allc[0], ratings.categories, cis, n_res)
                entry["confusion_matrix"] = allc[0]
                pc_block[a] = entry
            if name == "segment":
                per_class = {"reference": ref_display, "rows": "reference", "columns": "annotator", "annotators": pc_block}
            else:
                statistics[name]["per_class"] = {"reference": ref_display, "annotators": pc_block}

    return AgreementResult(
        categories=ratings.categories,
        annotators=ratings.annotators,
        n_items=ratings.n_items,
        n_traces=G,
        statistics=statistics,
        n_pairable_items=int(((ratings.codes >= 0).sum(axis=1) >= 2).sum()),
        per_class=per_class,
        disagreements=disagreement_pairs(ratings, top=n_disagreements, n_examples=n_examples),
        settings={
            "unit": "trace",
            "method": "percentile",
            "n_resamples": int(n_resamples),
            "confidence_level": float(confidence_level),
            "seed": seed,
            "weightings": list(weightings),
        },
        resamples=resamples,
    )


def _boot_estimate(vals: np.ndarray, why: np.ndarray, n_items: float, confidence_level: float) -> Estimate:
    """Estimate from ``vals [1 + B]`` (point estimate first, then the resamples)."""
    est = _estimate(vals[0], why[0], n_items)
    if vals.shape[0] <= 1:
        return est
    lo, hi, n_ok = _percentile_ci(vals[1:, None], confidence_level)
    return _with_ci(est, lo[0], hi[0], n_ok[0])


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
        ex = list(dict.fromkeys(item[key == k].tolist()))[:n_examples]
        out.append(
            {
                "labels": [ratings.categories[k // q], ratings.categories[k % q]],
                "count": int(freq[k]),
                "examples": [ratings.item_ids[e] for e in ex],
            }
        )
    return out


# ----------------------------------------------------------------------------- over the store
def ratings_from_store(
    store: Any,
    *,
    annotators: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    study: str | None = None,
    with_judge: bool = False,
    codebook_version: str | None = None,
    exclude_sources: Sequence[str] = (),
) -> tuple[Ratings, dict[str, str], dict[str, str]]:
    """Labels from the store as :class:`Ratings` (items = segments, groups = traces, weights = tokens).

    Parameters
    ----------
    store : ror_annotate.store.Store
    annotators : sequence of str, optional
        Keep only these annotators.
    sources : sequence of str, optional
        Keep only labels from these sources (judge, baseline, human, adjudicated).
    study : str, optional
        Labels of this review study; with ``with_judge`` also the judge (and baseline) labels on the same segments.
    codebook_version : str, optional
        Keep only labels under this codebook version.
    exclude_sources : sequence of str
        Sources never used as annotators (e.g. ``("adjudicated",)`` when they are the reference).

    Returns
    -------
    (Ratings, dict, dict)
        The ratings, ``{annotator: source}``, and ``{item_id: segment text}`` for report examples.

    Raises
    ------
    AgreementError
        No labels match; one annotator has two labels on one segment (two codebook versions:
        pass ``codebook_version``).
    """
    labels = list(store.labels(study=study)) if study is not None else list(store.labels())
    if study is not None and with_judge:
        segs = {(lab.trace_id, lab.segment_index) for lab in labels}
        # The study's judge may be the LLM judge or the offline baseline (a review run before any LLM labels).
        labels += [lab for lab in store.labels(source=["judge", "baseline"]) if (lab.trace_id, lab.segment_index) in segs and lab.study != study]
    keep = []
    for lab in labels:
        if sources is not None and lab.source not in sources:
            continue
        if lab.source in exclude_sources:
            continue
        if annotators is not None and lab.annotator not in annotators:
            continue
        if codebook_version is not None and lab.codebook_version != codebook_version:
            continue
        keep.append(lab)
    if not keep:
        raise AgreementError(
            f"no labels in {getattr(store, 'path', 'the store')} match the selection "
            f"(annotators={list(annotators) if annotators else 'any'}, sources={list(sources) if sources else 'any'}, "
            f"study={study!r}); see `ror status` / store.annotators() for what is stored"
        )
    source_of: dict[str, str] = {}
    seen: dict[tuple[str, int, str], str] = {}
    for lab in keep:
        key = (lab.trace_id, lab.segment_index, lab.annotator)
        if key in seen:
            raise AgreementError(
                f"annotator {lab.annotator!r} has two labels on segment {lab.trace_id}#{lab.segment_index} "
                f"(codebook versions {seen[key][:12]} and {lab.codebook_version[:12]}, or two studies); "
                "select one with --codebook-version or --study"
            )
        seen[key] = lab.codebook_version
        source_of.setdefault(lab.annotator, lab.source)
    traces = sorted({lab.trace_id for lab in keep})
    seg_info: dict[str, tuple[int, str]] = {}
    for t in traces:
        for s in store.segments(t):
            seg_info[s.segment_id] = (s.n_tokens, s.text)
    item_ids = [f"{lab.trace_id}#{lab.segment_index}" for lab in keep]
    order = list(annotators) if annotators is not None else sorted(source_of)
    order = [a for a in order if a in source_of]
    ratings = Ratings.from_long(
        item_ids,
        [lab.annotator for lab in keep],
        [lab.label for lab in keep],
        categories=BEHAVIORS,
        groups=[lab.trace_id for lab in keep],
        weights=[float(seg_info.get(i, (0, ""))[0]) for i in item_ids],
        annotator_order=order,
        source=str(getattr(store, "path", "store")),
    )
    texts = {i: seg_info[i][1] for i in ratings.item_ids if i in seg_info}
    return ratings, source_of, texts


def agreement_summary(
    store: Any,
    *,
    annotators: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    study: str | None = None,
    with_judge: bool = False,
    codebook_version: str | None = None,
    reference: str | None = "majority",
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Agreement figures over labels in the store, as a JSON-able dict (for ``--json`` and dataset cards).

    Parameters
    ----------
    store : ror_annotate.store.Store
    annotators, sources, study, with_judge, codebook_version
        Which labels to compare (see :func:`ratings_from_store`).
    reference : {"majority", "human", "adjudicated"} or annotator name, optional
        Reference for per-class figures: majority of the other annotators; majority of the human
        annotators (leave-one-out for a human); the adjudicated reference of
        :func:`ror_annotate.review.reference_labels` (adjudicated where humans disagreed, else their
        unanimous label; adjudicators are then not compared as annotators); or one annotator.
    n_resamples, confidence_level, seed
        Trace-level bootstrap settings.

    Returns
    -------
    dict
        :meth:`AgreementResult.to_dict` plus ``"selection"`` (what was compared) and, for each
        disagreement pair, ``"example_texts"``.

    Raises
    ------
    AgreementError
        No matching labels, fewer than two annotators, no human/adjudicated labels for that reference.
    """
    exclude = ("adjudicated",) if reference == "adjudicated" else ()
    ratings, source_of, texts = ratings_from_store(
        store, annotators=annotators, sources=sources, study=study, with_judge=with_judge,
        codebook_version=codebook_version, exclude_sources=exclude,
    )
    kwargs: dict[str, Any] = {}
    if reference == "adjudicated":
        # The study's reference: adjudicated where annotators disagreed, else their unanimous label
        # (adjudicated rows alone would leave out every segment the annotators agreed on).
        from .review import reference_labels

        refs = reference_labels(store, study)
        if not any(r.basis == "adjudicated" for r in refs):
            raise AgreementError(f"--reference adjudicated: no adjudicated labels{' in study ' + repr(study) if study else ''}; adjudicate first (ror review adjudicate)")
        by_item = {f"{r.trace_id}#{r.segment_index}": r.label for r in refs}
        kwargs = {"reference_labels": [by_item.get(i) for i in ratings.item_ids], "reference_name": "adjudicated"}
    elif reference == "human":
        humans = [a for a in ratings.annotators if source_of.get(a) == "human"]
        if not humans:
            raise AgreementError("--reference human: no human labels among the selected annotators; widen --source/--study")
        kwargs = {"reference": "majority", "reference_pool": humans, "reference_name": "human majority" if len(humans) > 1 else humans[0]}
    elif reference is not None:
        kwargs = {"reference": reference}
    result = agreement(ratings, n_resamples=n_resamples, confidence_level=confidence_level, seed=seed, **kwargs)
    out = result.to_dict()
    out["selection"] = {
        "store": str(getattr(store, "path", "")),
        "study": study,
        "with_judge": with_judge,
        "codebook_version": codebook_version,
        "annotator_sources": {a: source_of[a] for a in ratings.annotators},
    }
    for pair in out["disagreements"]:
        pair["example_texts"] = [texts.get(i, "") for i in pair["examples"]]
    return out
