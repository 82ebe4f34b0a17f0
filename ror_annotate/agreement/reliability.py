"""Calibration of machine raters against the human reference: ECE, Brier score, reliability bins.

A rater with a confidence per label is calibrated when, among the labels it gives with confidence
about ``c``, a share of about ``c`` agree with the human reference. Three kinds of confidence are read
from the store:

``posterior``
    An aggregate's ``confidence`` (the posterior probability of the chosen class; ``ror aggregate``),
    with its class ``distribution`` when stored.
``vote``
    An LLM judge sampled K times (annotators ``openai:m``, ``openai:m@s2``, ..., ``openai:m@sK``):
    the rater's label is the first sample's, its confidence the share of the samples present on the
    segment that agree with it. Shown as ``openai:m (3-sample vote)``.
``self-reported``
    A judge's own ``confidence`` field on its labels.

The human reference is :func:`ror_annotate.reference.reference_labels_from` (the latest adjudication,
else the humans' label when they agree); segments without one are left out.

Figures
-------
- Expected calibration error (Guo, Pleiss, Sun & Weinberger 2017, "On Calibration of Modern Neural
  Networks", ICML, eq. 3): ``ECE = sum_b (n_b / n) |acc(B_b) - conf(B_b)|`` over ``M`` equal-width
  bins ``B_b = ((b-1)/M, b/M]`` (confidence 0 goes into the first bin).
- Brier score (Brier 1950, *Monthly Weather Review* 78:1-3): multi-class
  ``mean_i sum_k (p_ik - [k = ref_i])^2`` (range 0..2) when every label of the rater carries a class
  distribution, else one-vs-rest on the chosen label ``mean_i (c_i - [label_i = ref_i])^2``
  (range 0..1). Which one was used is reported as ``brier_kind``.
- Intervals: trace-clustered percentile bootstrap (:func:`~.bootstrap.trace_bootstrap_counts`), from
  per-trace sums of bin counts, confidences, hits and Brier terms.

(The module is not called ``calibration``: the package exports a function of that name.)
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import Field

from ..errors import AgreementError
from ..options import Resamples, Seed, StageOptions
from ..records import BEHAVIORS, Label
from ..reference import latest, reference_labels_from
from .bootstrap import _percentile_ci, trace_bootstrap_counts
from .estimators import Estimate

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

_SAMPLE = re.compile(r"^(?P<base>.+)@s(?P<k>\d+)$")


#: Most confidence bins of the ECE. Ten to twenty are usual (Guo et al. 2017 use 15); past a few
#: hundred each bin holds one item and the "calibration error" is the mean |confidence - hit|.
#: ``--n-bins 1000000000`` asked for a 298 GiB array (MemoryError traceback), ``10**20`` overflowed.
MAX_BINS = 1000


class CalibrationOptions(StageOptions):
    """Options of the calibration figures (``ror agree``)."""

    stage: ClassVar[str] = "calibration"
    n_bins: int = Field(10, ge=1, le=MAX_BINS, description="Equal-width confidence bins of the ECE.")
    n_resamples: Resamples = Field(1000, description="Trace bootstrap resamples (0: no intervals).")
    confidence_level: float = Field(0.95, gt=0.0, lt=1.0)
    seed: Seed | None = 0


@dataclass(frozen=True)
class RaterConfidence:
    """One rater's labels with a confidence each, on segments that have a human reference.

    Attributes
    ----------
    name : str
        Display name (``"openai:m (3-sample vote)"`` for a vote fraction).
    annotator : str
        The annotator id whose labels are scored (the first sample for a vote).
    confidence_kind : {"posterior", "vote", "self-reported"}
    item_ids : list of str
        ``"<trace_id>#<segment_index>"``, length n.
    groups : list of str
        Trace id of each item (the bootstrap unit), length n.
    labels : list of str
        The rater's label per item, length n.
    confidence : ndarray of shape (n,)
        Probability the rater gives its label, in [0, 1].
    distribution : ndarray of shape (n, 6) or None
        Class probabilities in BEHAVIORS order when every label has one.
    """

    name: str
    annotator: str
    confidence_kind: str
    item_ids: list[str]
    groups: list[str]
    labels: list[str]
    confidence: np.ndarray
    distribution: np.ndarray | None = field(default=None)


#: The calibration report's notes when it has nothing to compare (also the viewer's, view/agreement.py).
NO_REFERENCE_NOTE = "no human reference (no human or adjudicated labels): calibration needs reviewed segments"
NO_CONFIDENT_RATER_NOTE = "no machine rater with a confidence (aggregate posterior, K-sample vote or self-reported) on the reviewed segments"

def bin_index(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin of each confidence among ``n_bins`` equal-width bins ``((b-1)/M, b/M]`` (Guo et al. 2017).

    Returns int array of shape (n,), values in ``[0, n_bins)``; a confidence of 0 falls in bin 0.
    ``c * M`` is rounded to 9 decimals first so that e.g. 0.3 with M = 10 lands in bin 2 despite
    floating point (0.3 * 10 = 3.0000000000000004).
    """
    c = np.asarray(confidence, dtype=np.float64)
    return np.clip(np.ceil(np.round(c * n_bins, 9)).astype(np.int64) - 1, 0, n_bins - 1)


def calibration_error(
    confidence: Any,
    correct: Any,
    *,
    groups: Any = None,
    distribution: Any = None,
    reference: Any = None,
    n_bins: int = 10,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict[str, Any]:
    """ECE, Brier score and reliability bins of one rater, with trace-clustered bootstrap intervals.

    Parameters
    ----------
    confidence : array-like of shape (n,)
        The rater's probability for the label it gave, in [0, 1].
    correct : array-like of shape (n,), bool
        Whether that label equals the reference.
    groups : array-like of shape (n,), optional
        Trace of each item (bootstrap unit); default: every item its own group.
    distribution : array-like of shape (n, q), optional
        Class probabilities per item; with ``reference`` gives the multi-class Brier score.
    reference : array-like of shape (n,), int, optional
        Reference class index per item (needed with ``distribution``).
    n_bins : int
        Equal-width bins (Guo et al. 2017 use 15; 10 is the common default).
    n_resamples, confidence_level, seed
        Trace bootstrap settings (0 resamples: no intervals).

    Returns
    -------
    dict
        ``n_items``, ``accuracy``, ``mean_confidence``, ``ece`` and ``brier`` (each an
        :class:`Estimate` dict), ``brier_kind`` (``"multiclass"`` or ``"one-vs-rest"``), and ``bins``:
        one ``{"low", "high", "n", "mean_confidence", "accuracy"}`` per bin (None where empty).

    Raises
    ------
    AgreementError
        E726: no items, sizes disagree, a confidence outside [0, 1]. E777: ``n_bins`` outside
        ``[1, MAX_BINS]``.
    """
    if not isinstance(n_bins, int) or not 1 <= n_bins <= MAX_BINS:
        raise AgreementError(f"--n-bins {n_bins}: give a number of confidence bins from 1 to {MAX_BINS} (10 or 15 are usual)",
                             code="E777")
    c = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(correct, dtype=bool)
    n = len(c)
    if n == 0 or y.shape != c.shape:
        raise AgreementError(f"calibration needs one correctness flag per confidence and at least one item, got {n} and {y.shape[0]}", code="E726")
    if np.any(~np.isfinite(c)) or c.min() < 0 or c.max() > 1:
        raise AgreementError("calibration: every confidence must lie in [0, 1]", code="E726")
    if groups is None:
        g = np.arange(n)
        n_groups = n
    else:
        _, g = np.unique(np.asarray(groups), return_inverse=True)
        n_groups = int(g.max()) + 1
    if distribution is not None:
        if reference is None:
            raise AgreementError("calibration: a distribution needs the reference class of each item", code="E726")
        p = np.asarray(distribution, dtype=np.float64)
        onehot = np.zeros_like(p)
        onehot[np.arange(n), np.asarray(reference, dtype=np.int64)] = 1.0
        brier_terms = ((p - onehot) ** 2).sum(1)
        brier_kind = "multiclass"
    else:
        brier_terms = (c - y) ** 2
        brier_kind = "one-vs-rest"
    b = bin_index(c, n_bins)
    cell = g * n_bins + b  # per-trace sums of count, confidence and hits per bin, Brier terms, items
    per_trace = np.concatenate([
        np.bincount(cell, minlength=n_groups * n_bins).reshape(n_groups, n_bins).astype(np.float64),
        np.bincount(cell, weights=c, minlength=n_groups * n_bins).reshape(n_groups, n_bins),
        np.bincount(cell, weights=y.astype(np.float64), minlength=n_groups * n_bins).reshape(n_groups, n_bins),
        np.bincount(g, weights=brier_terms, minlength=n_groups)[:, None],
        np.bincount(g, minlength=n_groups).astype(np.float64)[:, None],
    ], axis=1)
    boot = trace_bootstrap_counts(n_groups, n_resamples=n_resamples, seed=seed).astype(np.float64) if n_resamples else np.zeros((0, n_groups))
    allstats = np.concatenate([per_trace.sum(0)[None], boot @ per_trace], 0)
    cnt, sconf, shit = allstats[:, :n_bins], allstats[:, n_bins : 2 * n_bins], allstats[:, 2 * n_bins : 3 * n_bins]
    total = allstats[:, 3 * n_bins + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        ece = np.abs(shit - sconf).sum(1) / total  # sum_b n_b/n |acc_b - conf_b| = sum_b |hits_b - conf_b| / n
        brier = allstats[:, 3 * n_bins] / total

    def est(vals: np.ndarray) -> Estimate:
        if vals.shape[0] > 1:
            lo, hi, n_ok = _percentile_ci(vals[1:, None], confidence_level)
            return Estimate(float(vals[0]), None, float(lo[0]), float(hi[0]), float(n), int(n_ok[0]))
        return Estimate(float(vals[0]), None, n_items=float(n))

    bins = []
    for k in range(n_bins):
        nk = cnt[0, k]
        bins.append({
            "low": k / n_bins, "high": (k + 1) / n_bins, "n": int(nk),
            "mean_confidence": float(sconf[0, k] / nk) if nk else None,
            "accuracy": float(shit[0, k] / nk) if nk else None,
        })
    return {
        "n_items": n,
        "n_traces": n_groups,
        "accuracy": float(y.mean()),
        "mean_confidence": float(c.mean()),
        "ece": est(ece).to_dict(),
        "brier": est(brier).to_dict(),
        "brier_kind": brier_kind,
        "n_bins": n_bins,
        "bins": bins,
    }


# ------------------------------------------------------------------------------------ store glue
def _latest_by(labels: list[Label]) -> dict[tuple[str, str, int], Label]:
    """The latest label per (annotator, trace, segment) (several codebook versions or studies)."""
    groups: dict[tuple[str, str, int], list[Label]] = defaultdict(list)
    for lab in labels:
        groups[(lab.annotator, lab.trace_id, lab.segment_index)].append(lab)
    return {k: latest(v) for k, v in groups.items()}  # type: ignore[misc]


def rater_confidences(store: Any, *, study: str | None = None, reference: dict | None = None) -> tuple[list[RaterConfidence], dict[str, str]]:
    """Every machine rater with a confidence, restricted to segments with a human reference.

    Parameters
    ----------
    store : ror_annotate.store.Store
    study : str, optional
        The reference comes from this study's human / adjudicated labels (None: every study).
    reference : dict, optional
        ``{(trace_id, segment_index): ReferenceLabel}`` to use instead of reading it.

    Returns
    -------
    (list of RaterConfidence, dict)
        The raters (sorted by name) and the reference as ``{item_id: label}``.
    """
    if reference is None:
        reference = reference_labels_from(store.labels(source=("human", "adjudicated"), study=study), study=study)
    ref = {f"{t}#{i}": r.label for (t, i), r in reference.items()}
    if not ref:
        return [], ref
    kinds = store.rater_kinds()
    traces = sorted({t for t, _ in reference})
    machine = [lab for lab in store.labels(trace_ids=traces) if kinds.get(lab.annotator, "machine") == "machine"
               and lab.source not in ("human", "adjudicated") and f"{lab.trace_id}#{lab.segment_index}" in ref]
    by_key = _latest_by(machine)
    per_ann: dict[str, dict[str, Label]] = defaultdict(dict)
    for (ann, t, i), lab in by_key.items():
        per_ann[ann][f"{t}#{i}"] = lab
    out: list[RaterConfidence] = []
    samples: dict[str, list[str]] = defaultdict(list)
    for ann in per_ann:
        m = _SAMPLE.match(ann)
        if m and m["base"] in per_ann:
            samples[m["base"]].append(ann)
    for ann in sorted(per_ann):
        labs = per_ann[ann]
        if _SAMPLE.match(ann) and _SAMPLE.match(ann)["base"] in per_ann:  # type: ignore[index]
            continue
        items = sorted(labs)
        with_conf = [i for i in items if labs[i].confidence is not None]
        if with_conf:
            src = labs[with_conf[0]].source
            kind = "posterior" if src == "aggregate" else "self-reported"
            dists = [labs[i].distribution for i in with_conf]
            out.append(RaterConfidence(
                name=ann if kind == "posterior" else f"{ann} (self-reported)", annotator=ann, confidence_kind=kind,
                item_ids=with_conf, groups=[i.rsplit("#", 1)[0] for i in with_conf], labels=[labs[i].label for i in with_conf],
                confidence=np.array([labs[i].confidence for i in with_conf], dtype=np.float64),
                distribution=np.array(dists, dtype=np.float64) if all(d is not None for d in dists) else None,
            ))
        if ann in samples:
            sibs = [per_ann[s] for s in samples[ann]]
            n_samples = 1 + len(sibs)
            conf = []
            for item in items:
                votes = [labs[item].label] + [s[item].label for s in sibs if item in s]
                conf.append(sum(v == labs[item].label for v in votes) / len(votes))
            out.append(RaterConfidence(
                name=f"{ann} ({n_samples}-sample vote)", annotator=ann, confidence_kind="vote", item_ids=items,
                groups=[i.rsplit("#", 1)[0] for i in items], labels=[labs[i].label for i in items],
                confidence=np.array(conf, dtype=np.float64),
            ))
    return sorted(out, key=lambda r: r.name), ref


def calibration_summary(store: Any, *, study: str | None = None, options: CalibrationOptions | None = None, **kwargs: Any) -> dict[str, Any]:
    """Calibration of every machine rater with a confidence against the human reference (JSON-able).

    Parameters
    ----------
    store : ror_annotate.store.Store
    study : str, optional
        Reference from this study only (None: every study's human labels).
    options : CalibrationOptions, optional
        Or the same as keywords (``n_bins``, ``n_resamples``, ``confidence_level``, ``seed``).

    Returns
    -------
    dict
        ``{"reference": ..., "n_reference_items": int, "raters": [...]}``; each rater is
        :func:`calibration_error`'s dict plus ``name``, ``annotator``, ``confidence_kind``. Empty
        ``raters`` with a ``note`` when there is no human reference or no rater with a confidence.
    """
    opts = options or CalibrationOptions.from_options(kwargs, what="calibration")
    raters, ref = rater_confidences(store, study=study)
    out: dict[str, Any] = {
        "reference": "adjudicated, else unanimous humans" + (f" (study {study})" if study else ""),
        "n_reference_items": len(ref), "raters": [],
        "settings": opts.recorded(),
    }
    if not ref:
        out["note"] = NO_REFERENCE_NOTE
        return out
    if not raters:
        out["note"] = NO_CONFIDENT_RATER_NOTE
        return out
    codes = {b: k for k, b in enumerate(BEHAVIORS)}
    for r in raters:
        correct = np.array([lab == ref[i] for lab, i in zip(r.labels, r.item_ids)])
        res = calibration_error(
            r.confidence, correct, groups=r.groups, distribution=r.distribution,
            reference=[codes[ref[i]] for i in r.item_ids] if r.distribution is not None else None,
            n_bins=opts.n_bins, n_resamples=opts.n_resamples, confidence_level=opts.confidence_level, seed=opts.seed,
        )
        out["raters"].append({"name": r.name, "annotator": r.annotator, "confidence_kind": r.confidence_kind, **res})
    return out


def reliability_figure(summary: dict[str, Any]) -> "Figure | None":
    """Reliability diagram: per rater, accuracy vs mean confidence per bin, with the diagonal; None without raters.

    Top panel: one line per rater through its non-empty bins (marker area ~ bin size), the
    diagonal of perfect calibration dashed. Bottom panel: labels per bin and rater.
    """
    raters = summary.get("raters") or []
    if not raters:
        return None
    from ..agreement_report import _figure

    # the legend stands right of the diagram: inside it, any corner can hold a bin's point
    fig = _figure(9.6, 7.0)
    top = fig.add_axes((0.08, 0.36, 0.56, 0.58))
    bottom = fig.add_axes((0.08, 0.07, 0.56, 0.2))
    top.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    n_bins = raters[0]["n_bins"]
    width = 1.0 / n_bins / (len(raters) + 1)
    for j, r in enumerate(raters):
        pts = [(b["mean_confidence"], b["accuracy"], b["n"]) for b in r["bins"] if b["n"]]
        ece = r["ece"]["value"]
        top.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linewidth=1.5,
                 label=f"{r['name']}  ECE {ece:.3f}, n={r['n_items']}")
        sizes = [20 + 200 * p[2] / max(1, r["n_items"]) for p in pts]
        top.scatter([p[0] for p in pts], [p[1] for p in pts], s=sizes, alpha=0.3)
        bottom.bar([b["low"] + (j + 0.5) * width for b in r["bins"]], [b["n"] for b in r["bins"]], width=width, label=r["name"])
    top.set_xlim(0, 1)
    top.set_ylim(0, 1.02)
    top.set_xlabel("mean confidence in bin")
    top.set_ylabel("accuracy vs human reference")
    top.set_title(f"Reliability diagram ({n_bins} equal-width bins; {summary.get('reference', '')})", fontsize=9)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    bottom.set_xlim(0, 1)
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("labels per bin")
    return fig


def write_reliability_png(summary: dict[str, Any], out_dir: str | Path) -> Path | None:
    """Write ``reliability.png`` into ``out_dir`` (created); None (nothing written) without raters."""
    fig = reliability_figure(summary)
    if fig is None:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "reliability.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend beside the diagram sets the width
    return path


__all__ = [
    "CalibrationOptions", "RaterConfidence", "bin_index", "calibration_error", "calibration_summary", "rater_confidences",
    "reliability_figure", "write_reliability_png",
]
