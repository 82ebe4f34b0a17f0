"""Inverse-probability-weighted agreement of machine raters with humans on a designed review study.

A study sampled with known inclusion probabilities ``pi_i`` (``ror review create --strategy
uncertainty`` or ``random``; :func:`ror_annotate.review.studies.sample_uncertainty`) is not a
simple random sample: its uncertainty stratum over-represents the hard segments, so a plain
average over the reviewed items under-states a rater's accuracy on the whole population. Each
reviewed item is weighted by ``w_i = 1 / pi_i``:

- **Horvitz-Thompson** (Horvitz & Thompson 1952, *JASA* 47:663-685): the population total of
  ``y`` is estimated by ``sum_i w_i y_i``; the accuracy by ``sum_i w_i [a_i = r_i] / N`` with ``N``
  the number of candidate segments of the study; the number of rater errors in the population by
  ``sum_i w_i [a_i != r_i]``.
- **Hajek** ratio estimator (Hajek 1971, comment in *Foundations of Statistical Inference*, p. 236;
  Sarndal, Swensson & Wretman 1992, *Model Assisted Survey Sampling*, sec. 5.7):
  ``sum_i w_i y_i / sum_i w_i``. Accuracy, Cohen's kappa and macro-F1 are computed from the
  *weighted* confusion matrix ``C_kl = sum_i w_i [r_i = k][a_i = l]`` (a plug-in of Hajek
  estimates of every cell share), which is what the tables report as the headline figures.
  Reviewed items without a reference (humans disagree, not yet adjudicated) are left out, which
  assumes they are missing at random within their stratum.

Intervals: trace-clustered percentile bootstrap of the reviewed items (whole traces resampled
together across strata, weights kept; :func:`~.bootstrap.trace_bootstrap_counts`); an
approximation that ignores the stratification, so it tends to be conservative. The
Horvitz-Thompson accuracy's interval is much wider than the Hajek one and can leave [0, 1]: a
resample changes how many (heavily weighted) control items it holds while ``N`` stays fixed, the
textbook instability of HT that the ratio form cancels. The Hajek figures are the headline.

"Errors found per 100 reviewed segments" is the plain share of reviewed items in a stratum whose
rater label differs from the reference, times 100: the uncertainty stratum next to the control
stratum (what random sampling finds).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import AgreementError
from ..records import BEHAVIORS, Label
from ..reference import latest, reference_labels_from
from .bootstrap import _boot_estimate, trace_bootstrap_counts
from .estimators import _kappa_from, _pair_confusion, _per_class_from


def _ht_estimate(per_trace: np.ndarray, boot: np.ndarray, denominator: float, n_items: int, confidence_level: float) -> dict[str, Any]:
    vals = np.concatenate([[per_trace.sum()], boot @ per_trace]) / denominator
    return _boot_estimate(vals, np.full(len(vals), None, dtype=object), n_items, confidence_level).to_dict()


def _rater_figures(
    ref: np.ndarray, lab: np.ndarray, w: np.ndarray, g: np.ndarray, G: int, boot: np.ndarray, confidence_level: float
) -> dict[str, Any]:
    """Accuracy, Cohen's kappa and macro-F1 from the ``w``-weighted confusion matrix, with bootstrap intervals."""
    q = len(BEHAVIORS)
    conf = _pair_confusion(ref, lab, q, w, g, G)
    allc = np.concatenate([conf.sum(0)[None], boot @ conf], 0).reshape(-1, q, q)
    scores = _per_class_from(allc)
    kv, kw = _kappa_from(allc)
    n = float((w > 0).sum())
    return {
        "accuracy": _boot_estimate(*scores["accuracy"], n, confidence_level).to_dict(),
        "cohen_kappa": _boot_estimate(kv, kw, n, confidence_level).to_dict(),
        "macro_f1": _boot_estimate(*scores["macro_f1"], n, confidence_level).to_dict(),
    }


def weighted_estimates(
    store: Any,
    study: str,
    *,
    raters: Sequence[str] | None = None,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Horvitz-Thompson / Hajek estimates of each machine rater's agreement with the human reference on ``study``.

    Parameters
    ----------
    store : ror_annotate.store.Store
    study : str
        A study with stored inclusion probabilities and a ``control`` stratum.
    raters : sequence of str, optional
        Machine annotators to score (default: every machine rater with labels on the study's items).
    n_resamples, confidence_level, seed
        Trace bootstrap settings.

    Returns
    -------
    dict
        ``study``, ``strategy``, ``population`` (N), ``n_reviewed``, ``n_reference``, ``strata``
        (items per stratum), ``selection`` (how the uncertainty stratum was chosen), ``method``, and
        ``raters``: per rater ``weighted`` (Hajek accuracy, kappa, macro-F1 from the weighted
        confusion matrix), ``horvitz_thompson`` (accuracy over N, estimated errors in the
        population), ``unweighted`` (the same figures without weights, for comparison) and
        ``errors_per_100`` per stratum (``n``, ``errors``, ``per_100``).

    Raises
    ------
    AgreementError
        E720: the study has items without an inclusion probability (a strategy without a known
        design); E721: no control stratum; E722: no human reference in the study; E729: a rater
        with no labels on the study's reviewed items.
    ReviewError
        No such study.
    """
    from ..review.studies import load_study, study_design

    meta = load_study(store, study)
    design = study_design(store, study)
    missing = [k for k, _, p in design if p is None]
    if missing:
        raise AgreementError(
            f"--weighted: study {study!r} (strategy {meta.strategy}) stores no inclusion probability for {len(missing)} of its "
            f"{len(design)} items (e.g. {missing[0][0]}#{missing[0][1]}); weighted estimates need a study made with "
            "--strategy uncertainty or random", code="E720",
        )
    if not any(s == "control" for _, s, _ in design):
        raise AgreementError(
            f"--weighted: study {study!r} has no control stratum (a random sample of the segments outside the uncertainty "
            "stratum); create it with --control-fraction > 0", code="E721",
        )
    ref = reference_labels_from(store.labels(source=("human", "adjudicated"), study=study), study=study)
    if not ref:
        raise AgreementError(f"--weighted: study {study!r} has no human reference yet (no human labels that agree, no adjudication); pull the study's labels first", code="E722")
    population = int((meta.parameters.get("design") or {}).get("population") or 0)
    if population <= 0:
        population = round(sum(1.0 / p for _, _, p in design if p))  # type: ignore[misc]
    info = {k: (s, p) for k, s, p in design}
    kinds = store.rater_kinds()
    traces = sorted({k[0] for k in info})
    by: dict[tuple[str, str, int], list[Label]] = defaultdict(list)
    for lab in store.labels(trace_ids=traces):
        key = (lab.trace_id, lab.segment_index)
        if key in info and lab.source not in ("human", "adjudicated") and kinds.get(lab.annotator, "machine") == "machine":
            by[(lab.annotator, key[0], key[1])].append(lab)
    per_rater: dict[str, dict[tuple[str, int], str]] = defaultdict(dict)
    for (ann, t, i), labs in by.items():
        per_rater[ann][(t, i)] = latest(labs).label  # type: ignore[union-attr]
    names = list(raters) if raters else sorted(per_rater)
    for name in names:
        if name not in per_rater:
            raise AgreementError(
                f"--weighted: rater {name!r} has no labels on the items of study {study!r}; machine raters with labels there: "
                f"{', '.join(sorted(per_rater)) or 'none'}", code="E729",
            )
    codes = {b: k for k, b in enumerate(BEHAVIORS)}
    gid = {t: j for j, t in enumerate(traces)}
    G = len(traces)
    boot = trace_bootstrap_counts(G, n_resamples=n_resamples, seed=seed).astype(np.float64) if n_resamples else np.zeros((0, G))
    strata_names = sorted({s for s, _ in info.values() if s is not None}, key=lambda s: (s != "uncertainty", s))
    out_raters = []
    for name in names:
        keys = [k for k in sorted(per_rater[name]) if k in ref]
        if not keys:
            out_raters.append({"rater": name, "kind": kinds.get(name, "machine"), "n_items": 0,
                               "note": "no reviewed item with both a reference and this rater's label"})
            continue
        r = np.array([codes[ref[k].label] for k in keys], dtype=np.int64)
        a = np.array([codes[per_rater[name][k]] for k in keys], dtype=np.int64)
        w = np.array([1.0 / info[k][1] for k in keys])  # type: ignore[operator]
        g = np.array([gid[k[0]] for k in keys], dtype=np.int64)
        stratum = np.array([info[k][0] for k in keys], dtype=object)
        y = (a == r).astype(np.float64)
        correct_w = np.bincount(g, weights=w * y, minlength=G)
        errors_w = np.bincount(g, weights=w * (1 - y), minlength=G)
        per_100 = {}
        for s in strata_names:
            sel = stratum == s
            n_s = int(sel.sum())
            err = int((1 - y[sel]).sum())
            e_t = np.bincount(g[sel], weights=1 - y[sel], minlength=G)
            n_t = np.bincount(g[sel], minlength=G).astype(np.float64)
            n_all = np.concatenate([[n_t.sum()], boot @ n_t])
            with np.errstate(invalid="ignore", divide="ignore"):
                vals = np.where(n_all > 0, 100 * np.concatenate([[e_t.sum()], boot @ e_t]) / n_all, np.nan)
            why = np.array(["no_reference_items" if np.isnan(v) else None for v in vals], dtype=object)
            per_100[s] = {"n": n_s, "errors": err, "per_100": _boot_estimate(vals, why, n_s, confidence_level).to_dict()}
        out_raters.append({
            "rater": name,
            "kind": kinds.get(name, "machine"),
            "n_items": len(keys),
            "weighted": _rater_figures(r, a, w, g, G, boot, confidence_level),
            "horvitz_thompson": {
                "accuracy": _ht_estimate(correct_w, boot, population, len(keys), confidence_level),
                "errors_in_population": _ht_estimate(errors_w, boot, 1.0, len(keys), confidence_level),
            },
            "unweighted": _rater_figures(r, a, np.ones(len(keys)), g, G, boot, confidence_level),
            "errors_per_100": per_100,
        })
    strata_counts = {s: sum(1 for st, _ in info.values() if st == s) for s in strata_names}
    return {
        "study": study,
        "strategy": meta.strategy,
        "population": population,
        "n_reviewed": len(design),
        "n_reference": sum(1 for k in info if k in ref),
        "strata": strata_counts,
        "inclusion_probabilities": {s: sorted({p for st, p in info.values() if st == s}) for s in strata_names},
        "selection": meta.parameters.get("design", {}),
        "method": ("weights 1/pi_i; 'weighted' = Hajek ratio estimates from the weighted confusion matrix; "
                   "'horvitz_thompson' = sum w_i y_i / N; trace-clustered percentile bootstrap. The HT interval is wide "
                   "and not bounded by [0, 1] (a trace resample changes how many control items it holds while N stays "
                   "fixed); prefer the Hajek interval"),
        "settings": {"n_resamples": n_resamples, "confidence_level": confidence_level, "seed": seed},
        "raters": out_raters,
    }


__all__ = ["weighted_estimates"]
