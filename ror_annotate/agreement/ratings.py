"""The input model: :class:`Ratings` (items x annotators, missing labels, traces, token weights) and CSV input.

Labels are nominal. A category set is either declared (a sequence) or ``"auto"``: the sorted
distinct labels found in the data (:func:`infer_categories`). Declare it when Gwet's AC1 matters
(its chance agreement depends on the number of categories) or when a label outside the set must
be refused.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AgreementError, InputError
from .estimators import _item_counts

_MISSING_STRINGS = ("",)


#: Missing-value singletons of pandas, recognized by type name so pandas need not be imported.
_MISSING_TYPES = ("NAType", "NaTType")


def _is_missing(x: Any) -> bool:
    if x is None or type(x).__name__ in _MISSING_TYPES:
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


#: ``categories="auto"``: the category set is the sorted distinct labels found in the input.
AUTO = "auto"


def _sort_key(label: str) -> tuple[int, float, str]:
    # numbers first and in numeric order ("2" before "10"), then text in code-point order
    try:
        number = float(label)
    except ValueError:
        return (1, 0.0, label)
    return (0, number, label) if math.isfinite(number) else (1, 0.0, label)


def infer_categories(*label_sequences: Sequence[Any]) -> tuple[str, ...]:
    """The distinct non-missing labels of all ``label_sequences``, sorted (``categories="auto"``).

    Labels are compared by their canonical text (``1``, ``1.0`` and ``"1"`` are one category);
    labels that all read as numbers sort numerically, others in code-point order after the numbers.

    Parameters
    ----------
    *label_sequences : sequences of labels
        Missing labels (None, NaN, empty string) are skipped.

    Returns
    -------
    tuple of str
        Possibly fewer than two categories; :func:`resolve_categories` refuses that.
    """
    found: set[str] = set()
    seen: set[tuple[type, Any]] = set()  # labels repeat: look at each distinct value once
    for values in label_sequences:
        for v in values:
            key = (type(v), v)  # the type keeps True and 1 apart (equal hashes)
            try:
                if key in seen:
                    continue
                seen.add(key)
            except TypeError:  # unhashable: judged every time
                pass
            if not _is_missing(v):
                found.add(_label_key(v))
    return tuple(sorted(found, key=_sort_key))


def resolve_categories(categories: Sequence[Any] | str | None, *label_sequences: Sequence[Any]) -> tuple[str, ...]:
    """The category set to use: ``categories`` as declared, or inferred when it is ``"auto"`` or None.

    Raises
    ------
    AgreementError
        Fewer than two categories (declared or found), repeated categories, or a string other than
        ``"auto"`` (a string is never split into characters).
    """
    if categories is None or (isinstance(categories, str) and categories == AUTO):
        cats = infer_categories(*label_sequences)
        if len(cats) < 2:
            raise AgreementError(
                f"categories='auto' found {len(cats)} distinct label(s) {list(cats)} in the data; agreement needs at "
                "least two categories. Declare the full category set (categories=[...], or --categories a,b,c)"
            )
        return cats
    if isinstance(categories, str):
        raise AgreementError(f"categories must be a sequence of labels or 'auto', got the string {categories!r}")
    return _check_categories(categories)


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
        categories: Sequence[Any] | str = AUTO,
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
        categories : sequence or "auto", default "auto"
            The declared category set; ``"auto"``: the sorted distinct labels (:func:`infer_categories`).
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
        cats = resolve_categories(categories, labels)
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
        flat_codes = np.full(n_items * n_raters, -1, dtype=np.int64)
        flat_codes[cell] = row_codes
        codes = flat_codes.reshape(n_items, n_raters)
        first_row = np.full(n_items, -1, dtype=np.int64)
        first_row[item_of_row[::-1]] = np.arange(n_rows - 1, -1, -1)  # first row of each item
        group_idx: np.ndarray
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
        categories: Sequence[Any] | str = AUTO,
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
        categories : sequence or "auto", default "auto"
            The declared category set; ``"auto"``: the sorted distinct labels of ``matrix``.
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
        n, r = arr.shape
        flat = arr.ravel().tolist()
        cats = resolve_categories(categories, flat)
        codes = _encode(flat, cats, where="labels matrix").reshape(n, r)
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
        categories: Sequence[Any] | str = AUTO,
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


def ratings_from_csv(path: str | Path, *, categories: Sequence[str] | str = AUTO) -> Ratings:
    """Read a long-format CSV: columns ``item_id, annotator, label``; optional ``trace_id`` (or ``group``) and ``weight``.

    Parameters
    ----------
    path : str or Path
    categories : sequence of str, or "auto" (default)
        The declared category set; ``"auto"`` takes the sorted distinct labels found in the file
        (:func:`infer_categories`; then AC1 uses that many categories). ``ror agree --from-csv``
        declares the six behaviors unless ``--categories`` says otherwise.

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
    # Exports that carry segment or trace text exceed csv's default field limit of 131,072
    # characters; the limit is process-wide, so it is raised only while this file is read.
    with _csv_field_limit(len(text) + 1), io.StringIO(text, newline="") as handle:
        # strict: an unterminated quote is an error, not a field that swallows the rest of the file
        reader = _LineTrackingReader(handle, strict=True)
        try:
            return _ratings_from_reader(reader, path, categories)
        except csv.Error as exc:
            # csv's own line_num is not advanced by a record it could not finish: name the line where
            # that record starts (the header's line 1 when the header itself is malformed)
            start = 1 if getattr(reader, "_fieldnames", None) is None else reader.last_line + 1
            raise InputError(
                f"{path}: line {start}: malformed CSV ({exc}) in the record that starts on this line; a field that opens "
                "a quote must close it",
                code=MALFORMED_CSV,
            ) from None


class _LineTrackingReader(csv.DictReader):  # type: ignore[type-arg]
    """A ``csv.DictReader`` that remembers the last line of the last record it returned."""

    last_line = 1  # the header's

    def __next__(self) -> dict[str, Any]:
        row = super().__next__()
        self.last_line = self.line_num
        return row


#: Code of a CSV that the ``csv`` module cannot parse strictly (an unterminated quote ...).
MALFORMED_CSV = "E940"


def _ratings_from_reader(reader: "csv.DictReader[str]", path: Path, categories: Sequence[str] | str) -> Ratings:  # noqa: C901  (one branch per CSV layout check, each naming the line it refuses)
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
        if categories != AUTO:
            raise InputError(f"categories must be a list or 'auto', got {categories!r}")
        cats = infer_categories([r[3] for r in rows])
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
            weights=[r[5] or 0.0 for r in rows] if "weight" in header else None,  # every row's weight was parsed above
            source=str(path),
        )
    except AgreementError as exc:
        raise InputError(f"{path}: {exc.message}") from exc


@contextmanager
def _csv_field_limit(at_least: int) -> Iterator[None]:
    """Raise ``csv.field_size_limit`` to ``at_least`` while the block runs, then restore it."""
    before = csv.field_size_limit()
    csv.field_size_limit(max(before, at_least))
    try:
        yield
    finally:
        csv.field_size_limit(before)
