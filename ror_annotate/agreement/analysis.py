"""The full analysis: every statistic, pairwise and per class, segment- and token-weighted, with intervals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AgreementError
from .bootstrap import _boot_estimate, _percentile_ci, trace_bootstrap_counts
from .estimators import (
    REASONS, Estimate, _alpha_from, _fleiss_ac1_from, _kappa_from, _multi_rater_stats, _num, _pair_cells, _pair_confusion_of,
    _per_class_from, _percent_from,
)
from .metrics import _per_class_dict, disagreement_pairs, majority_labels
from .ratings import Ratings, _encode


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


class _Resampler:
    """``boot @ per_group`` (the statistics of every bootstrap resample), in float32 where that is exact.

    Counts (segment weighting) are integers: when every entry of the product is an integer below
    2**24 (bounded by ``max(boot) * column sum``), every partial sum is one too and float32 holds
    it exactly, whatever order BLAS adds in, so the result is the float64 one bit for bit at twice
    the speed. Anything else (token weights, larger sums) is multiplied in float64.
    """

    def __init__(self, boot: np.ndarray) -> None:
        self.boot = boot
        self.boot32 = boot.astype(np.float32)
        self.top = float(boot.max()) if boot.size else 0.0

    def __call__(self, per_group: np.ndarray) -> np.ndarray:
        if per_group.size and self.boot.size and per_group.min() >= 0 and np.array_equal(per_group, np.floor(per_group)) \
                and self.top * float(per_group.sum(0).max()) < 2**24:
            return (self.boot32 @ per_group.astype(np.float32)).astype(np.float64)
        return self.boot @ per_group


def _references(
    r: Ratings, scored: Sequence[str], reference: str | None, pool: Sequence[str] | None, reference_labels: np.ndarray | None
) -> dict[str, np.ndarray | None]:
    """:func:`_reference_codes` of every scored annotator, the majority of the others from one count table.

    ``majority_labels(r, annotators=pool - {a})`` counts the pool's labels per item once per
    annotator; here the pool is counted once and each annotator's own label taken off its item
    (integer counts: the same votes, ties and -1s exactly).
    """
    if reference != "majority" or reference_labels is not None:
        return {a: _reference_codes(r, a, reference, pool, reference_labels) for a in scored}
    members = list(pool if pool is not None else r.annotators)
    pool_counts = r.subset_annotators(members).counts() if members else None
    rows = np.arange(r.n_items)
    out: dict[str, np.ndarray | None] = {}
    for a in scored:
        others = [m for m in members if m != a]
        if not others or pool_counts is None:
            out[a] = None
            continue
        counts = pool_counts
        if a in members:
            own = r.column(a)
            labelled = own >= 0
            counts = pool_counts.copy()
            counts[rows[labelled], own[labelled]] -= members.count(a)
        top = counts.max(1)
        tie = (counts == top[:, None]).sum(1) > 1
        out[a] = np.where((top > 0) & ~tie, counts.argmax(1), -1)
    return out


def agreement(  # noqa: C901  (one branch per statistic family and per reference choice, each a line)
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
        who = f"only {active[0]} has labels" if active else "no annotator has labels"
        raise AgreementError(
            f"agreement needs labels from at least two annotators, and {who} "
            f"(selected: {', '.join(ratings.annotators) or 'none'}): there is nothing to compare. Add a second annotator's labels "
            "(another judge: `ror label --judge openai:MODEL`; human labels: `ror review pull`) or widen the selection"
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

    weightings: dict[str, np.ndarray] = {"segment": np.ones(ratings.n_items)}
    if token_weighted and ratings.weights is not None:
        weightings["token"] = np.asarray(ratings.weights, dtype=np.float64)
    G = len(ratings.group_ids)
    boot = trace_bootstrap_counts(G, n_resamples=n_resamples, seed=seed).astype(np.float64) if n_resamples else np.zeros((0, G))
    resample = _Resampler(boot)
    pairs = [(i, j) for i in range(ratings.n_annotators) for j in range(i + 1, ratings.n_annotators)]
    if ref_labels is not None or reference == "majority":
        scored = list(ratings.annotators)
    elif reference is not None:
        scored = [a for a in ratings.annotators if a != reference]
    else:
        scored = []

    counts = ratings.counts()
    # each scored annotator's reference (a majority vote is a pass over all items): once, for every weighting
    references = _references(ratings, scored, reference, reference_pool, ref_labels)
    # the confusion cells of each pair, shared by both weightings
    cells: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    ref_cells: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    statistics: dict[str, dict[str, Any]] = {}
    per_class: dict[str, Any] | None = None
    resamples: dict[str, np.ndarray] = {}
    for name, w in weightings.items():
        stats_g = _multi_rater_stats(counts, w, ratings.groups, G)  # [G, K]
        full = stats_g.sum(0)
        reps = resample(stats_g)  # [B, K]
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
            if (i, j) not in cells:
                cells[(i, j)] = _pair_cells(ratings.codes[:, i], ratings.codes[:, j], q, ratings.groups)
            conf_g = _pair_confusion_of(cells[(i, j)], w, q, G)
            allc = np.concatenate([conf_g.sum(0)[None], resample(conf_g)], 0).reshape(-1, q, q)
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
                ref = references[a]
                if ref is None:
                    continue
                if a not in ref_cells:
                    ref_cells[a] = _pair_cells(ref, ratings.column(a), q, ratings.groups)
                conf_g = _pair_confusion_of(ref_cells[a], w, q, G)
                allc = np.concatenate([conf_g.sum(0)[None], resample(conf_g)], 0).reshape(-1, q, q)
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
