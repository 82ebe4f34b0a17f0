"""Label noise carried into the probe and expert figures (issue 24, item 7).

Every figure of ``ror probe`` and ``ror experts`` is computed from one label per segment. With
``--label-resamples N`` each of N resamples redraws every segment's label, independently per segment,
from

(a) the segment's ``label_distribution`` in the export's ``segments`` configuration (an aggregate's
    posterior, or the vote fractions of several raters), where it has one; else
(b) the row of a measured confusion matrix ``P(true behavior | judge label)`` for the segment's stored
    label (``--label-confusion FILE``, see :func:`load_confusion`); else
(c) nothing: :class:`~ror_annotate.errors.LabelNoiseError` ``E930`` says how to get one.

Labels are per segment: every token of a segment takes the segment's redrawn label. The features
(router logits, controls) are computed once; only the labels change per resample. A figure's
*label-noise interval* is the percentile interval of that figure over the resamples (``2.5`` and
``97.5`` percentiles at the default level 0.95), next to the figure computed on the stored labels.
It measures how much the figure moves when the labels move as much as their measured uncertainty;
it contains no sampling error of the traces (the probe and expert stages have no bootstrap), so it is
a *label-noise-only* interval.

Draw: resample ``r`` takes ``u = rng.random(n_segments)`` from one ``numpy.random.default_rng(seed)``
stream and gives segment ``i`` the first class whose cumulative probability exceeds ``u[i]`` (inverse
CDF; the rule numpy's ``Generator.choice(6, p=...)`` uses).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
from pydantic import Field

from ..errors import LabelNoiseError
from ..options import Resamples, Seed, StageOptions
from ..records import BEHAVIORS

#: Tolerance on a probability row's sum (the export stores float32).
ROW_TOLERANCE = 1e-3


class LabelNoiseOptions(StageOptions):
    """Options of label resampling (``--label-resamples``, ``--label-confusion``, ``--label-seed``).

    Attributes
    ----------
    resamples : int
        Resamples of the labels; 0 turns label noise off.
    confusion : str or None
        A confusion file (:func:`load_confusion`) for segments without a class distribution.
    confusion_rater : str or None
        With an ``ror agree --json`` file holding several raters: whose confusion matrix to use.
    seed : int
        Seed of the draws.
    confidence_level : float
        Coverage of the percentile intervals.
    """

    stage: ClassVar[str] = "label noise"
    resamples: Resamples = 0
    confusion: str | None = None
    confusion_rater: str | None = None
    seed: Seed = 0
    confidence_level: float = Field(0.95, gt=0, lt=1)


# --------------------------------------------------------------------------- confusion files

def _check_matrix(matrix: np.ndarray, where: str, *, rows: str = "row") -> np.ndarray:
    if matrix.shape != (len(BEHAVIORS), len(BEHAVIORS)):
        raise LabelNoiseError(f"{where}: the confusion matrix is {matrix.shape[0]} x "
                              f"{matrix.shape[1] if matrix.ndim > 1 else 0}, expected 6 x 6 (one {rows} per behavior)",
                              code="E932")
    if not np.isfinite(matrix).all() or (matrix < 0).any():
        raise LabelNoiseError(f"{where}: the confusion matrix has negative or non-finite entries", code="E933")
    sums = matrix.sum(axis=1)
    bad = [f"{BEHAVIORS[i]} sums to {s:.4g}" for i, s in enumerate(sums) if abs(s - 1.0) > ROW_TOLERANCE]
    if bad:
        raise LabelNoiseError(f"{where}: rows of P(true | judge label) must sum to 1; {', '.join(bad)}", code="E933")
    return matrix / sums[:, None]


def _order(names: Sequence[str], where: str) -> list[int]:
    """Positions in BEHAVIORS of ``names`` (all six, each once)."""
    clean = [str(n).strip().lower() for n in names]
    unknown = [n for n in clean if n not in BEHAVIORS]
    if unknown:
        raise LabelNoiseError(f"{where}: unknown behavior(s) {unknown}; the six are {', '.join(BEHAVIORS)}", code="E934")
    if sorted(clean) != sorted(BEHAVIORS):
        missing = [b for b in BEHAVIORS if b not in clean]
        raise LabelNoiseError(f"{where}: names {len(clean)} behaviors ({', '.join(clean)}); it must name each of the six "
                              f"once (missing: {', '.join(missing) or 'none'})", code="E932")
    return [clean.index(b) for b in BEHAVIORS]


def _from_agree(data: dict[str, Any], where: str, rater: str | None) -> tuple[np.ndarray, str]:
    """P(true | rater label) from ``ror agree --json``: the rater's confusion counts (rows: reference,
    columns: the rater), normalised per column and transposed. A label the rater never gave has no
    measured column: it is kept as it is (identity row) and named in the description."""
    per_class = data.get("per_class") or {}
    raters = {name: entry for name, entry in (per_class.get("annotators") or {}).items()
              if isinstance(entry, dict) and entry.get("confusion_matrix") is not None}
    if not raters:
        raise LabelNoiseError(f"{where}: an `ror agree --json` file without per-class confusion matrices; run `ror agree "
                              "--reference human --with-judge --json` on reviewed segments, or write the matrix yourself "
                              "(see `ror probe --help`)", code="E935")
    if rater is None:
        if len(raters) > 1:
            raise LabelNoiseError(f"{where}: confusion matrices of {len(raters)} raters ({', '.join(sorted(raters))}); "
                                  "pick one with --label-confusion-rater", code="E935")
        rater = next(iter(raters))
    elif rater not in raters:
        raise LabelNoiseError(f"{where}: no confusion matrix for rater {rater!r}; it has {', '.join(sorted(raters))}",
                              code="E935")
    counts = np.asarray(raters[rater]["confusion_matrix"], dtype=np.float64)
    categories = data.get("categories") or list(BEHAVIORS)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] != len(categories):
        raise LabelNoiseError(f"{where}: rater {rater!r} has a {counts.shape} confusion matrix for "
                              f"{len(categories)} categories", code="E932")
    idx = _order(categories, where)
    counts = counts[np.ix_(idx, idx)]  # [reference, rater] in BEHAVIORS order
    if not np.isfinite(counts).all() or (counts < 0).any():
        raise LabelNoiseError(f"{where}: rater {rater!r} has negative or non-finite confusion counts", code="E933")
    col = counts.sum(axis=0)
    matrix = np.eye(len(BEHAVIORS))
    seen = col > 0
    matrix[seen] = (counts[:, seen] / col[seen]).T
    unmeasured = [BEHAVIORS[i] for i in np.flatnonzero(~seen)]
    note = f"`ror agree` confusion of {rater} vs {per_class.get('reference', 'the reference')} ({int(counts.sum())} segments)"
    if unmeasured:
        note += f"; never given by the rater, kept as is: {', '.join(unmeasured)}"
    return matrix, note


def load_confusion(path: str | Path, *, rater: str | None = None) -> tuple[np.ndarray, str]:
    """Read ``P(true behavior | judge label)``, a row-normalised 6 x 6 matrix.

    Formats
    -------
    * the JSON ``ror agree --json`` prints (its ``per_class`` confusion counts of a rater against the
      human reference; rows reference, columns rater): normalised per rater label. A label the rater
      never gave has no measurement and is kept as is (an identity row, named in the description).
    * JSON ``{"behaviors": [six names], "matrix": [[...], ...]}``: row ``i`` is the judge label
      ``behaviors[i]``, column ``j`` the true behavior ``behaviors[j]``; rows sum to 1.
    * CSV with a header ``judge_label,<six behavior names>`` and one row per judge label.

    Parameters
    ----------
    path : str or Path
    rater : str, optional
        Whose matrix to take from an ``ror agree`` file with several raters.

    Returns
    -------
    matrix : ndarray of shape (6, 6), float64
        ``matrix[judge, true]`` in :data:`~ror_annotate.records.BEHAVIORS` order, rows summing to 1.
    description : str
        Where it came from, for the report.

    Raises
    ------
    LabelNoiseError
        E931 unreadable or unknown format; E932 not 6 x 6 or not naming the six behaviors; E933 a row
        negative, non-finite or not summing to 1 (tolerance 1e-3); E934 an unknown behavior; E935 an
        ``ror agree`` file without a usable confusion matrix.
    """
    p = Path(path)
    where = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelNoiseError(f"{where}: cannot read the confusion file ({exc.__class__.__name__}: {exc})", code="E931") from None
    if p.suffix.lower() == ".csv":
        rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
        if not rows:
            raise LabelNoiseError(f"{where}: empty confusion CSV; expected a header judge_label,<six behaviors>", code="E931")
        header, body = rows[0], rows[1:]
        try:
            values = np.asarray([[float(c) for c in r[1:]] for r in body], dtype=np.float64)
        except ValueError as exc:
            raise LabelNoiseError(f"{where}: a non-numeric probability ({exc})", code="E931") from None
        if len(header) != len(BEHAVIORS) + 1 or len(body) != len(BEHAVIORS) or any(len(r) != len(header) for r in body):
            raise LabelNoiseError(f"{where}: {len(body)} rows x {len(header) - 1} columns, expected 6 x 6 under a header "
                                  "judge_label,<six behaviors>", code="E932")
        cols = _order(header[1:], where + " (header)")
        rws = _order([r[0] for r in body], where + " (judge_label column)")
        return _check_matrix(values[np.ix_(rws, cols)], where), f"{p.name} (CSV matrix)"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LabelNoiseError(f"{where}: neither a CSV (by suffix) nor JSON ({exc})", code="E931") from None
    if not isinstance(data, dict):
        raise LabelNoiseError(f"{where}: expected a JSON object", code="E931")
    if "matrix" in data:
        names = data.get("behaviors", list(BEHAVIORS))
        try:
            values = np.asarray(data["matrix"], dtype=np.float64)
        except (TypeError, ValueError):
            raise LabelNoiseError(f"{where}: 'matrix' is not a numeric 6 x 6 list of lists", code="E932") from None
        if values.ndim != 2 or len(names) != values.shape[0]:
            raise LabelNoiseError(f"{where}: 'matrix' has shape {values.shape} for {len(names)} behaviors; expected 6 x 6",
                                  code="E932")
        idx = _order(names, where)
        return _check_matrix(values[np.ix_(idx, idx)], where), f"{p.name} (JSON matrix)"
    if "per_class" in data or "statistics" in data:
        matrix, note = _from_agree(data, where, rater)
        return matrix, f"{p.name}: {note}"
    raise LabelNoiseError(f"{where}: neither an `ror agree --json` report nor {{\"behaviors\": [...], \"matrix\": [[...]]}}",
                          code="E931")


# --------------------------------------------------------------------------- the export's segments

def _segments_table(tokens_path: str | Path) -> Any:
    """The ``segments`` configuration next to a tokens dataset, as a pyarrow table (or None)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(tokens_path)
    export = p if (p / "tokens").is_dir() else p.parent
    cols = ["trace_id", "segment_index", "label", "label_distribution"]
    if (export / "segments").is_dir():
        import datasets

        dd = datasets.load_from_disk(str(export / "segments"))
        parts = dd.values() if isinstance(dd, datasets.DatasetDict) else [dd]
        tables = []
        for ds in parts:
            missing = [c for c in cols if c not in ds.column_names]
            if missing:
                return None
            tables.append(ds.select_columns(cols).data.table.select(cols))
        return pa.concat_tables(tables) if tables else None
    files = sorted((export / "data" / "segments").glob("*.parquet"))
    if files:
        tables = [pq.read_table(f) for f in files]
        if any(c not in t.column_names for t in tables for c in cols):
            return None
        return pa.concat_tables([t.select(cols) for t in tables])
    return None


@dataclass
class SegmentLabels:
    """The stored label and class distribution of every labeled segment of a token table.

    Attributes
    ----------
    keys : ndarray of shape (n_segments,), int64
        Global segment keys (``TokenTable.segment``), sorted.
    stored : ndarray of shape (n_segments,), int64
        The exported label.
    distribution : ndarray of shape (n_segments, 6), float64
        ``label_distribution`` (normalised), NaN rows where the export has none.
    """

    keys: np.ndarray
    stored: np.ndarray
    distribution: np.ndarray

    @property
    def has_distribution(self) -> np.ndarray:
        """``(n_segments,)`` bool: the export gave this segment a distribution."""
        return ~np.isnan(self.distribution).any(axis=1)


def segment_labels(table: Any, tokens_path: str | Path | None = None) -> SegmentLabels:
    """Join a :class:`~ror_annotate.steer.table.TokenTable` with the export's per-segment distributions.

    Parameters
    ----------
    table : TokenTable
        From :func:`~ror_annotate.steer.table.labeled_tokens`.
    tokens_path : str or Path, optional
        The export directory (or its ``tokens/``); its ``segments`` configuration is read. None, or
        an export without one: no distributions (every row NaN).

    Returns
    -------
    SegmentLabels

    Raises
    ------
    LabelNoiseError
        E936 a labeled segment missing from ``segments`` or with another label there; E937 a
        ``label_distribution`` not of 6 non-negative finite values summing to 1.
    """
    keys, first = np.unique(table.segment, return_index=True)
    stored = table.labels[first].astype(np.int64)
    dist = np.full((len(keys), len(BEHAVIORS)), np.nan)
    seg = _segments_table(tokens_path) if tokens_path is not None else None
    if seg is None or len(keys) == 0:
        return SegmentLabels(keys, stored, dist)
    trace, index = table.segment_origin(keys)
    where = {(t, int(i)): n for n, (t, i) in enumerate(zip((table.trace_ids[t] for t in trace), index))}
    found = np.zeros(len(keys), dtype=bool)
    data = seg.to_pydict()
    for tid, si, lab, d in zip(data["trace_id"], data["segment_index"], data["label"], data["label_distribution"]):
        n = where.get((tid, int(si)))
        if n is None:
            continue
        found[n] = True
        if lab is None or int(lab) != stored[n]:
            raise LabelNoiseError(f"segment {tid}#{si}: label {lab!r} in the export's segments configuration, "
                                  f"{BEHAVIORS[stored[n]]!r} in its tokens; the export is inconsistent, re-export it",
                                  code="E936")
        if d is None:
            continue
        row = np.asarray(d, dtype=np.float64)
        if row.shape != (len(BEHAVIORS),) or not np.isfinite(row).all() or (row < 0).any() \
                or abs(row.sum() - 1.0) > ROW_TOLERANCE:
            raise LabelNoiseError(f"segment {tid}#{si}: label_distribution {d!r} is not 6 non-negative probabilities "
                                  "summing to 1", code="E937")
        dist[n] = row / row.sum()
    if not found.all():
        t, i = trace[~found][0], index[~found][0]
        raise LabelNoiseError(f"{int((~found).sum())} labeled segment(s) of the tokens configuration are not in the "
                              f"export's segments configuration (first: {table.trace_ids[t]}#{i}); re-export", code="E936")
    return SegmentLabels(keys, stored, dist)


# --------------------------------------------------------------------------- draws

@dataclass
class LabelDraws:
    """Redrawn labels of every segment.

    Attributes
    ----------
    keys : ndarray of shape (n_segments,), int64
        Sorted global segment keys.
    stored : ndarray of shape (n_segments,), int64
    labels : ndarray of shape (n_resamples, n_segments), int64
    probabilities : ndarray of shape (n_segments, 6)
        What each segment was drawn from.
    n_from_distribution, n_from_confusion : int
        Segments drawn from the export's distribution / from the confusion matrix.
    confusion_source : str or None
    seed : int
    confidence_level : float
    """

    keys: np.ndarray
    stored: np.ndarray
    labels: np.ndarray
    probabilities: np.ndarray
    n_from_distribution: int
    n_from_confusion: int
    confusion_source: str | None = None
    seed: int = 0
    confidence_level: float = 0.95
    notes: list[str] = field(default_factory=list)

    @property
    def n_resamples(self) -> int:
        return int(self.labels.shape[0])

    def for_segments(self, segment: np.ndarray) -> np.ndarray:
        """Redrawn labels of rows keyed by segment, ``[n_resamples, len(segment)]``.

        Raises
        ------
        LabelNoiseError
            E936 a key with no draw.
        """
        pos = np.searchsorted(self.keys, segment)
        pos = np.minimum(pos, len(self.keys) - 1)
        if len(segment) and not np.array_equal(self.keys[pos], segment):
            raise LabelNoiseError("rows of segments that were not drawn; draw labels from the same token table", code="E936")
        return self.labels[:, pos]

    def source(self) -> str:
        """One line saying what the labels were drawn from."""
        parts = []
        if self.n_from_distribution:
            parts.append(f"{self.n_from_distribution} segments from the export's label_distribution")
        if self.n_from_confusion:
            parts.append(f"{self.n_from_confusion} from P(true | judge label) of {self.confusion_source}")
        return "; ".join(parts)

    def describe(self) -> dict[str, Any]:
        """JSON-ready settings."""
        return {"n_resamples": self.n_resamples, "seed": self.seed, "confidence_level": self.confidence_level,
                "n_segments": int(len(self.keys)), "n_from_distribution": self.n_from_distribution,
                "n_from_confusion": self.n_from_confusion, "confusion_source": self.confusion_source,
                "source": self.source(), "notes": list(self.notes),
                "interval": "percentile interval over label resamples (label noise only; no bootstrap of traces)"}


def draw_from(probabilities: np.ndarray, *, resamples: int, seed: int = 0) -> np.ndarray:
    """Draw one class per row of ``probabilities``, ``resamples`` times.

    Parameters
    ----------
    probabilities : ndarray of shape (n, q)
        Rows sum to 1.
    resamples : int
    seed : int

    Returns
    -------
    ndarray of shape (resamples, n), int64
        Resample ``r`` uses ``u = rng.random(n)`` (one ``default_rng(seed)`` stream, resample after
        resample) and takes the first class whose cumulative probability exceeds ``u`` (numpy's own
        ``Generator.choice`` rule).
    """
    p = np.asarray(probabilities, dtype=np.float64)
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, p.shape[0]), dtype=np.int64)
    for r in range(resamples):
        u = rng.random(p.shape[0])
        out[r] = (cdf <= u[:, None]).sum(axis=1)
    return out


def draw_labels(table: Any, tokens_path: str | Path | None, options: LabelNoiseOptions | None = None,
                **keywords: Any) -> LabelDraws:
    """Redraw every segment's label ``options.resamples`` times (module docstring: sources (a)-(c)).

    Parameters
    ----------
    table : TokenTable
    tokens_path : str or Path or None
        The export directory whose ``segments`` configuration holds ``label_distribution``.
    options : LabelNoiseOptions, optional
        Or the same as keywords (``resamples=``, ``confusion=``, ``seed=``...).

    Returns
    -------
    LabelDraws

    Raises
    ------
    LabelNoiseError
        E930 segments with neither a distribution nor a confusion matrix; E931-E935 a bad confusion
        file; E936/E937 an inconsistent export (E938: the CLI refuses a confusion file without resamples).
    """
    opts = LabelNoiseOptions.resolve(options, keywords)
    no_segments = tokens_path is None or _segments_table(tokens_path) is None
    return draws_for(segment_labels(table, tokens_path), opts,
                     where=" (no segments configuration with label_distribution next to tokens/)" if no_segments else "")


def draws_for(seg: SegmentLabels, options: LabelNoiseOptions, *, where: str = "") -> LabelDraws:
    """:func:`draw_labels` from :class:`SegmentLabels` already read.

    Raises
    ------
    LabelNoiseError
        E930 segments with neither a distribution nor ``options.confusion``; E931-E935 a bad
        confusion file.
    """
    opts = options
    has = seg.has_distribution
    probs = seg.distribution.copy()
    source = None
    notes: list[str] = []
    if (~has).any():
        if opts.confusion is None:
            raise LabelNoiseError(
                f"{int((~has).sum())} of {len(has)} labeled segments have no label_distribution in the export{where}"
                "; label resampling needs one: aggregate several raters (`ror label --judge A --judge B` or "
                "`ror labels import`, then `ror aggregate`) and `ror export --labels aggregate`, or pass "
                "--label-confusion FILE (P(true | judge label), e.g. the `ror agree --json` output)", code="E930")
        matrix, source = load_confusion(opts.confusion, rater=opts.confusion_rater)
        probs[~has] = matrix[seg.stored[~has]]
        if "kept as is" in source:
            notes.append(source.split("; ", 1)[1])
    labels = draw_from(probs, resamples=opts.resamples, seed=opts.seed) if len(probs) else np.zeros((opts.resamples, 0), np.int64)
    return LabelDraws(seg.keys, seg.stored, labels, probs, int(has.sum()), int((~has).sum()), source, opts.seed,
                      opts.confidence_level, notes)


# --------------------------------------------------------------------------- summaries

def interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> dict[str, Any]:
    """Mean and percentile interval of a figure over resamples (NaN resamples left out).

    Returns
    -------
    dict
        ``mean``, ``lo``, ``hi`` (``numpy.percentile`` at ``(1 - level) / 2`` and ``(1 + level) / 2``,
        linear interpolation), ``n`` (resamples where the figure is defined); NaN figures when none is.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    lo, hi = np.percentile(v, [50 * (1 - level), 50 * (1 + level)])
    return {"mean": float(v.mean()), "lo": float(lo), "hi": float(hi), "n": int(v.size)}


def fmt_interval(point: float, iv: dict[str, Any] | None, digits: int = 3) -> str:
    """``0.512 [0.480, 0.540]`` (point figure, label-noise interval)."""
    if point is None or (isinstance(point, float) and math.isnan(point)):
        text = "n/a"
    else:
        text = f"{point:.{digits}f}"
    if iv is None:
        return text
    if iv["n"] == 0:
        return text + " [n/a]"
    return f"{text} [{iv['lo']:.{digits}f}, {iv['hi']:.{digits}f}]"


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if math.isnan(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


# --------------------------------------------------------------------------- experts

def risk_difference_draws(selected: np.ndarray, dataset: np.ndarray, segment: np.ndarray, draws: LabelDraws, *,
                          n_experts: int, n_datasets: int, n_behaviors: int = len(BEHAVIORS),
                          chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Risk difference under every resample, summing each segment's expert selections once.

    Same estimator as :func:`~ror_annotate.steer.experts.risk_difference` (``P(e | b, d) - P(e | d)``)
    with the token labels of resample ``r`` (the segment's draw): per chunk of tokens the selection
    indicators are summed per segment, and each resample adds those segment sums to its
    (dataset, behavior) cells, so a resample costs segments x layers x experts, not tokens.

    Parameters
    ----------
    selected : ndarray of shape (n_tokens, n_layers, top_k)
    dataset, segment : ndarray of shape (n_tokens,)
    draws : LabelDraws

    Returns
    -------
    rd : ndarray of shape (n_resamples, n_datasets, n_behaviors, n_layers, n_experts)
        NaN where a behavior has no token in a dataset in that resample.
    counts : ndarray of shape (n_resamples, n_datasets, n_behaviors)
        Tokens per cell.
    """
    from scipy import sparse

    from .experts import selection_onehot

    R = draws.n_resamples
    n_layers = selected.shape[1]
    width = n_layers * n_experts
    cells = n_datasets * n_behaviors
    sums = np.zeros((R, cells, width), dtype=np.float64)
    counts = np.zeros((R, cells), dtype=np.float64)
    for lo in range(0, selected.shape[0], chunk):
        onehot = selection_onehot(np.asarray(selected[lo:lo + chunk]), n_experts).reshape(-1, width)
        segs = segment[lo:lo + chunk]
        ukeys, inv = np.unique(segs, return_inverse=True)
        agg = sparse.csr_matrix((np.ones(len(segs)), (inv, np.arange(len(segs)))), shape=(len(ukeys), len(segs)))
        seg_sum = np.asarray(agg @ onehot.astype(np.float32), dtype=np.float64)  # [u, width]
        seg_tok = np.bincount(inv, minlength=len(ukeys)).astype(np.float64)
        seg_d = np.zeros(len(ukeys), dtype=np.int64)
        seg_d[inv] = dataset[lo:lo + chunk]
        labels = draws.for_segments(ukeys)  # [R, u]
        for r in range(R):
            cell = seg_d * n_behaviors + labels[r]
            onto = sparse.csr_matrix((np.ones(len(ukeys)), (cell, np.arange(len(ukeys)))), shape=(cells, len(ukeys)))
            sums[r] += onto @ seg_sum
            counts[r] += np.bincount(cell, weights=seg_tok, minlength=cells)
    by_cell = sums.reshape(R, n_datasets, n_behaviors, n_layers, n_experts)
    n_cell = counts.reshape(R, n_datasets, n_behaviors)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_b = by_cell / n_cell[..., None, None]
        p_d = by_cell.sum(axis=2) / n_cell.sum(axis=2)[..., None, None]
    return p_b - p_d[:, :, None], n_cell.astype(np.int64)


def _membership(top: np.ndarray, n_experts: int) -> np.ndarray:
    """``[..., k]`` expert ids (``-1`` none) -> ``[..., n_experts]`` bool."""
    out = np.zeros((*top.shape[:-1], n_experts + 1), dtype=bool)
    np.put_along_axis(out, np.where(top < 0, n_experts, top), True, axis=-1)
    return out[..., :n_experts]


def set_stability(top_draws: np.ndarray, top_stored: np.ndarray, n_experts: int) -> dict[str, np.ndarray]:
    """Stability of top-k expert sets over label resamples.

    Parameters
    ----------
    top_draws : ndarray of shape (n_resamples, ..., k)
        Top-k sets of every resample (``-1`` = undefined).
    top_stored : ndarray of shape (..., k)
        Top-k sets on the stored labels.
    n_experts : int

    Returns
    -------
    dict
        ``jaccard_vs_stored`` ``[n_resamples, ...]``: Jaccard of each resample's set with the stored
        set (NaN where both are empty); ``cross_resample`` ``[...]``: mean Jaccard over all pairs of
        resamples (NaN with fewer than two defined); ``frequency`` ``[..., n_experts]``: share of
        resamples whose set holds each expert.
    """
    m = _membership(top_draws, n_experts)
    m0 = _membership(top_stored, n_experts)[None]
    inter = (m & m0).sum(-1)
    union = (m | m0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        vs = np.where(union > 0, inter / np.maximum(union, 1), np.nan)
    R = m.shape[0]
    flat = m.reshape(R, -1, n_experts).transpose(1, 0, 2).astype(np.float32)  # [S, R, E]
    inter_rr = flat @ flat.transpose(0, 2, 1)  # [S, R, R]
    size = flat.sum(-1)
    union_rr = size[:, :, None] + size[:, None, :] - inter_rr
    iu = np.triu_indices(R, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        jac = np.where(union_rr > 0, inter_rr / np.maximum(union_rr, 1), np.nan)[:, iu[0], iu[1]]  # [S, pairs]
        cross = np.full(flat.shape[0], np.nan)
        ok = (~np.isnan(jac)).any(axis=1) if jac.shape[1] else np.zeros(flat.shape[0], dtype=bool)
        cross[ok] = np.nanmean(jac[ok], axis=1)
    return {"jaccard_vs_stored": vs, "cross_resample": cross.reshape(m.shape[1:-1]),
            "frequency": m.mean(axis=0)}


def auc_from_ranks(ranks: np.ndarray, y: np.ndarray) -> float:
    """ROC AUC from average ranks of the scores (Mann-Whitney U / (n_pos n_neg)); NaN if one class is absent."""
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return math.nan
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def transfer_auc_draws(selected: np.ndarray, dataset: np.ndarray, segment: np.ndarray, draws: LabelDraws,
                       top_draws: np.ndarray, *, n_experts: int) -> dict[tuple[int, int, int, int], np.ndarray]:
    """Transfer AUC (:func:`~ror_annotate.steer.experts.transfer_auc`) under every resample.

    Each resample's source sets (its own top-k) rank the target segments; the positives are the
    segments whose redrawn label is the behavior. Segment scores are read from per-layer expert
    counts per segment computed once; ranks are cached per (layer, set, target).

    Returns
    -------
    dict
        ``(source, target, layer position, behavior)`` -> ndarray of shape (n_resamples,), NaN where
        the target has one class only in that resample or the source set is undefined.
    """
    from scipy import sparse
    from scipy.stats import rankdata

    from .experts import selection_onehot

    R, n_d, n_b, n_layers = top_draws.shape[:4]
    keys, inverse, counts = np.unique(segment, return_inverse=True, return_counts=True)
    seg_dataset = np.zeros(len(keys), dtype=np.int64)
    seg_dataset[inverse] = dataset
    seg_labels = draws.for_segments(keys)  # [R, n_seg]
    agg = sparse.csr_matrix((np.ones(len(segment)), (inverse, np.arange(len(segment)))), shape=(len(keys), len(segment)))
    router_k = selected.shape[2]
    masks = [np.flatnonzero(seg_dataset == t) for t in range(n_d)]
    out: dict[tuple[int, int, int, int], np.ndarray] = {}
    for layer in range(n_layers):
        onehot = selection_onehot(selected[:, layer:layer + 1], n_experts)[:, 0]
        seg_count = np.asarray(agg @ onehot.astype(np.float64))  # exact integer counts [n_seg, n_experts]
        cache: dict[tuple[Any, ...], np.ndarray] = {}
        for r in range(R):
            for src, b in itertools.product(range(n_d), range(n_b)):
                experts = top_draws[r, src, b, layer]
                experts = experts[experts >= 0]
                for tgt in range(n_d):
                    key = (src, tgt, layer, b)
                    arr = out.setdefault(key, np.full(R, np.nan))
                    if experts.size == 0:
                        continue
                    ck = (tuple(sorted(int(e) for e in experts)), tgt)
                    ranks = cache.get(ck)
                    if ranks is None:
                        # share of the segment's routed slots that fall in the set: one correctly rounded division,
                        # so equal shares tie exactly
                        score = seg_count[masks[tgt]][:, experts].sum(axis=1) / (router_k * counts[masks[tgt]])
                        ranks = cache[ck] = rankdata(score)
                    arr[r] = auc_from_ranks(ranks, seg_labels[r, masks[tgt]] == b)
    return out


@dataclass
class ExpertNoise:
    """``ror experts`` figures under label resampling (all intervals are label-noise-only).

    Attributes
    ----------
    draws : LabelDraws
    jaccard_cross_dataset : ndarray of shape (n_resamples,)
        Mean cross-dataset top-k Jaccard per resample.
    profile_corr : dict of str to ndarray of shape (n_resamples,)
        ``same_behavior`` / ``cross_behavior`` per resample.
    stability : dict
        :func:`set_stability` of the (dataset, behavior, layer) top-k sets.
    transfer : dict
        :func:`transfer_auc_draws`.
    transfer_mean : dict of str to ndarray of shape (n_resamples,)
        Mean transfer AUC per resample over ``cross`` (source != target) and ``in`` rows.
    """

    draws: LabelDraws
    jaccard_cross_dataset: np.ndarray
    profile_corr: dict[str, np.ndarray]
    stability: dict[str, np.ndarray]
    transfer: dict[tuple[int, int, int, int], np.ndarray]
    transfer_mean: dict[str, np.ndarray]

    def level(self) -> float:
        return self.draws.confidence_level

    def headline(self, report: Any) -> list[dict[str, Any]]:
        """Rows ``statistic, value (stored labels), interval`` of the summary table.

        Parameters
        ----------
        report : ExpertReport
            The figures on the stored labels.
        """
        lvl = self.level()
        rows = [{"statistic": "cross-dataset top-k Jaccard", "value": report.jaccard.get("observed", math.nan),
                 "interval": interval(self.jaccard_cross_dataset, lvl)}]
        for k in ("same_behavior", "cross_behavior"):
            rows.append({"statistic": f"profile corr {k.replace('_', ' ')}", "value": report.corr_summary.get(k, math.nan),
                         "interval": interval(self.profile_corr[k], lvl)})
        vs = self.stability["jaccard_vs_stored"]
        flat = vs.reshape(vs.shape[0], -1)
        defined = ~np.isnan(flat)
        per_resample = np.where(defined.any(axis=1), np.nansum(flat, axis=1) / np.maximum(defined.sum(axis=1), 1), np.nan)
        rows.append({"statistic": "top-k set Jaccard vs stored labels (mean over sets)", "value": 1.0,
                     "interval": interval(per_resample, lvl)})
        cross = float(np.nanmean(self.stability["cross_resample"])) if np.isfinite(self.stability["cross_resample"]).any() else math.nan
        rows.append({"statistic": "top-k set Jaccard across resamples (mean over sets)", "value": cross, "interval": None})
        for kind, label in (("cross", "transfer AUC (mean, cross-dataset)"), ("in", "transfer AUC (mean, in-dataset)")):
            stored = [r["auc"] for r in report.transfer if (r["source"] != r["target"]) == (kind == "cross")]
            if stored:
                rows.append({"statistic": label, "value": float(np.mean(stored)),
                             "interval": interval(self.transfer_mean[kind], lvl)})
        return rows


def expert_label_noise(selected: np.ndarray, table: Any, draws: LabelDraws, report: Any, *, n_experts: int,
                       k: int) -> ExpertNoise:
    """Recompute the expert figures under every label resample.

    Parameters
    ----------
    selected : ndarray of shape (n_tokens, n_layers, top_k)
        ``capture.selected[table.rows]``.
    table : TokenTable
    draws : LabelDraws
        From :func:`draw_labels` on the same table.
    report : ExpertReport
        The figures on the stored labels (:func:`~ror_annotate.steer.experts.analyze`).
    n_experts, k : int
        Routed experts per layer; size of the top-k sets.

    Returns
    -------
    ExpertNoise
        Per resample: risk differences -> top-k sets, their Jaccard with the stored sets and across
        resamples, the cross-dataset Jaccard, profile correlations and transfer AUCs. The permutation
        null of the Jaccard is not recomputed per resample.
    """
    from .experts import mean_cross_dataset_jaccard, profile_correlation, top_experts

    n_d = len(report.dataset_names)
    rd, _ = risk_difference_draws(selected, table.dataset, table.segment, draws, n_experts=n_experts, n_datasets=n_d)
    top = top_experts(rd, k)  # [R, D, B, L, k]
    R = draws.n_resamples
    jac = np.array([mean_cross_dataset_jaccard(top[r]) for r in range(R)]) if n_d >= 2 else np.full(R, np.nan)
    same, crossb = np.full(R, np.nan), np.full(R, np.nan)
    for r in range(R):
        _, summ = profile_correlation(rd[r])
        same[r], crossb[r] = summ["same_behavior"], summ["cross_behavior"]
    stab = set_stability(top, report.top, n_experts)
    transfer = transfer_auc_draws(selected, table.dataset, table.segment, draws, top, n_experts=n_experts)
    means = {}
    for kind in ("cross", "in"):
        rows = [v for (s, t, _, _), v in transfer.items() if (s != t) == (kind == "cross")]
        with np.errstate(invalid="ignore"):
            means[kind] = np.array([np.nanmean([v[r] for v in rows]) if any(np.isfinite(v[r]) for v in rows) else np.nan
                                    for r in range(R)]) if rows else np.full(R, np.nan)
    return ExpertNoise(draws, jac, {"same_behavior": same, "cross_behavior": crossb}, stab, transfer, means)


def write_expert_noise(noise: ExpertNoise, report: Any, out_dir: str | Path) -> list[Path]:
    """Write ``label_noise_sets.csv``, ``label_noise.json`` and ``report.md`` into ``out_dir``.

    ``label_noise_sets.csv``: per dataset, behavior and layer, the top-k set's Jaccard with the stored
    set (mean and percentile interval over resamples) and its mean pairwise Jaccard across resamples.
    ``label_noise.json``: settings, the headline figures with intervals, per-row transfer AUC intervals.
    ``report.md``: data, resamples, source of the noise, the figures with intervals.

    Returns
    -------
    list of Path
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lvl = noise.level()
    names, layers = report.dataset_names, report.layers
    vs, cross = noise.stability["jaccard_vs_stored"], noise.stability["cross_resample"]
    sets = []
    for d, b, li in itertools.product(range(len(names)), range(len(BEHAVIORS)), range(len(layers))):
        if (report.top[d, b, li] < 0).all():
            continue
        iv = interval(vs[:, d, b, li], lvl)
        sets.append({"dataset": names[d], "behavior": BEHAVIORS[b], "layer": layers[li], "jaccard_vs_stored_mean": iv["mean"],
                     "jaccard_vs_stored_lo": iv["lo"], "jaccard_vs_stored_hi": iv["hi"],
                     "jaccard_across_resamples": float(cross[d, b, li]), "n_resamples": iv["n"]})
    path_sets = out / "label_noise_sets.csv"
    with path_sets.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["dataset", "behavior", "layer", "jaccard_vs_stored_mean", "jaccard_vs_stored_lo",
                                                "jaccard_vs_stored_hi", "jaccard_across_resamples", "n_resamples"])
        writer.writeheader()
        writer.writerows({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()} for row in sets)
    headline = noise.headline(report)
    transfer_rows = []
    stored = {(r["source"], r["target"], r["layer"], r["behavior"]): r["auc"] for r in report.transfer}
    for key, values in noise.transfer.items():
        s, t, li, b = key
        transfer_rows.append({"source": names[s], "target": names[t], "layer": layers[li], "behavior": BEHAVIORS[b],
                              "auc": stored.get(key, math.nan), "label_noise": interval(values, lvl)})
    doc = {"settings": noise.draws.describe(), "headline": headline, "transfer_auc": transfer_rows}
    path_json = out / "label_noise.json"
    path_json.write_text(json.dumps(_json_safe(doc), indent=1, allow_nan=False), encoding="utf-8")
    path_md = out / "report.md"
    path_md.write_text(_markdown("Expert association under label noise", noise.draws, [
        (r["statistic"], fmt_interval(r["value"], r["interval"])) for r in headline],
        extra=("The permutation null of the cross-dataset Jaccard (`jaccard.csv`) is computed on the stored labels "
               "only. Per-set stability: `label_noise_sets.csv`; per-row transfer AUC intervals: the "
               "`auc_noise_lo`/`auc_noise_hi` columns of `transfer_auc.csv`; each top expert's share of resamples "
               "whose set keeps it: `label_noise_frequency` in `top_experts.csv`."), data=_data_line(report)),
        encoding="utf-8")
    return [path_sets, path_json, path_md]


def _data_line(report: Any) -> str:
    counts = report.rd["counts"]
    return (f"{int(counts.sum()):,} labeled tokens of {len(report.dataset_names)} dataset(s) "
            f"({', '.join(report.dataset_names)}), layers {report.layers[0]}-{report.layers[-1]}")


def _markdown(title: str, draws: LabelDraws, figures: Sequence[tuple[str, str]], *, extra: str = "", data: str = "") -> str:
    pct = f"{100 * draws.confidence_level:g}%"
    lines = [f"# {title}", "",
             f"- Data: {data}" if data else "- Data: the export's labeled tokens",
             f"- Resamples: {draws.n_resamples} (seed {draws.seed}), {len(draws.keys):,} segments",
             f"- Source of the noise: {draws.source() or 'none'}",
             *(f"- Note: {n}" for n in draws.notes),
             f"- Intervals: {pct} percentile intervals of each figure over the label resamples, next to the figure on "
             "the stored labels. They hold label noise only (segments' labels redrawn, every token of a segment "
             "taking its segment's draw); the traces are not resampled.", "",
             "| figure | stored labels [label-noise interval] |", "|---|---|",
             *(f"| {name} | {value} |" for name, value in figures), ""]
    if extra:
        lines += [extra, ""]
    return "\n".join(lines)


def write_probe_noise(rows: Sequence[Any], draws: LabelDraws, out_dir: str | Path, *, data: str = "") -> list[Path]:
    """Write ``probe_label_noise.json`` and ``report.md`` for probe rows that carry ``label_noise``.

    Returns
    -------
    list of Path
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"settings": draws.describe(),
           "rows": [{"features": r.features, "layers": r.layers, "level": r.level, "test_f1": r.test_f1,
                     "baseline_f1": r.baseline_f1, **(r.label_noise or {})} for r in rows]}
    path_json = out / "probe_label_noise.json"
    path_json.write_text(json.dumps(_json_safe(doc), indent=1, allow_nan=False), encoding="utf-8")
    figures = []
    for r in rows:
        n = r.label_noise or {}
        figures.append((f"test macro-F1, {r.features} {r.layers} ({r.level})", fmt_interval(r.test_f1, n.get("test_f1"))))
        figures.append((f"majority baseline, {r.features} {r.layers}", fmt_interval(r.baseline_f1, n.get("baseline_f1"))))
    path_md = out / "report.md"
    path_md.write_text(_markdown("Behavior probes under label noise", draws, figures, data=data, extra=(
        "Per resample every row keeps its features and hyperparameters (the layer or window and C chosen on the "
        "stored labels); the probe is refitted on the redrawn train labels (lbfgs from zeros, "
        "stopping tolerance 1e-4 as every probe fit) and scored on the redrawn test labels (macro-F1 over the "
        "behaviors present in that resample's test labels).")), encoding="utf-8")
    return [path_json, path_md]


__all__ = [
    "ExpertNoise",
    "LabelDraws",
    "LabelNoiseOptions",
    "SegmentLabels",
    "auc_from_ranks",
    "draw_from",
    "draw_labels",
    "draws_for",
    "expert_label_noise",
    "fmt_interval",
    "interval",
    "load_confusion",
    "risk_difference_draws",
    "segment_labels",
    "set_stability",
    "transfer_auc_draws",
    "write_expert_noise",
    "write_probe_noise",
]
