"""Inter-annotator agreement: every standard nominal statistic, with trace-level bootstrap intervals.

Statistics (all nominal, over a declared or inferred category set)
-------------------------------------------------------------------
- percent agreement (the mean, over items with at least two labels, of the share of agreeing
  label pairs; for two annotators the share of items on which they agree),
- Cohen's kappa for every pair of annotators,
- Fleiss' kappa and Gwet's AC1 in Gwet's formulation for missing labels,
- Krippendorff's alpha (any number of annotators, missing labels allowed),
- against a reference (an annotator, a majority, adjudicated labels): the confusion matrix,
  per-class precision / recall / F1 / one-vs-rest kappa, macro-F1 and accuracy.

Categories
----------
Any label set works: the public functions take ``categories=`` as a sequence (the declared set) or
``"auto"`` (the default: the sorted distinct labels found in the input; numbers sort numerically).
The store glue and ``ror agree`` declare the six behaviors. Declare the set whenever Gwet's AC1 is
reported (its chance agreement depends on the number of categories) or an unexpected label must
be refused.

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

Modules
-------
:mod:`.ratings` (input model, CSV) -> :mod:`.estimators` (sufficient statistics, batched
estimators, the undefined-result policy) -> :mod:`.metrics` (one statistic per call) ->
:mod:`.bootstrap` (trace resampling, percentile intervals) -> :mod:`.analysis` (everything at
once) -> :mod:`.from_store` (labels in the store, ``ror agree``); :mod:`.reliability` (calibration
of machine raters against humans: ECE, Brier, reliability diagram), :mod:`.kinds` (agreement by
rater kind, drift by codebook / time window), :mod:`.weighted` (Horvitz-Thompson / Hajek estimates
on a designed review study). Every public name is importable
from ``ror_annotate.agreement``.
"""

from __future__ import annotations

from .analysis import AgreementResult, agreement
from .bootstrap import trace_bootstrap_counts
from .estimators import REASONS, Estimate
from .from_store import adjudicated_reference, agreement_summary, ratings_from_store
from .kinds import agreement_by_kind, agreement_drift
from .metrics import (
    cohen_kappa, confusion_matrix, disagreement_pairs, fleiss_kappa, gwet_ac1, krippendorff_alpha, majority_labels,
    per_class_scores, percent_agreement,
)
from .ratings import AUTO, Ratings, infer_categories, ratings_from_csv, resolve_categories
from .reliability import CalibrationOptions, calibration_error, calibration_summary, reliability_figure, write_reliability_png
from .weighted import weighted_estimates

__all__ = [
    "AUTO", "REASONS", "AgreementResult", "Estimate", "Ratings", "adjudicated_reference", "agreement",
    "agreement_summary", "cohen_kappa", "confusion_matrix", "disagreement_pairs", "fleiss_kappa", "gwet_ac1",
    "infer_categories", "krippendorff_alpha", "majority_labels", "per_class_scores", "percent_agreement",
    "ratings_from_csv", "ratings_from_store", "resolve_categories", "trace_bootstrap_counts",
    "CalibrationOptions", "agreement_by_kind", "agreement_drift", "calibration_error", "calibration_summary",
    "reliability_figure", "weighted_estimates", "write_reliability_png",
]
