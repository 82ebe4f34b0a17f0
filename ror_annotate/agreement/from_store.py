"""Store glue: the store's labels as :class:`~.ratings.Ratings`, and the summary ``ror agree`` prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import AgreementError
from ..options import Resamples, Seed, StageOptions
from ..records import BEHAVIORS
from ..reference import ReferenceLabel, reference_labels_from
from .analysis import agreement
from .ratings import Ratings


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
        Labels of this review study; with ``with_judge`` also the machine labels (judge, baseline, aggregate,
        verify, import) on the same segments.
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
        labels += [lab for lab in store.labels(source=["judge", "baseline", "aggregate", "verify", "import"])
                   if (lab.trace_id, lab.segment_index) in segs and lab.study != study]
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


def adjudicated_reference(store: Any, *, study: str | None = None) -> dict[str, ReferenceLabel]:
    """The study's reference label per segment, keyed by item id ``"<trace_id>#<segment_index>"``.

    The rule is :func:`ror_annotate.reference.reference_labels_from` (the one the export's
    ``--label-source adjudicated`` and :func:`ror_annotate.review.reference_labels` use): the latest
    adjudication, else the humans' label when each human's latest label agrees. ``study=None``
    pools every study.
    """
    refs = reference_labels_from(store.labels(source=("human", "adjudicated"), study=study), study=study)
    return {f"{trace_id}#{index}": ref for (trace_id, index), ref in refs.items()}


class AgreementOptions(StageOptions):
    """Options of ``ror agree`` (on a store) / :func:`agreement_summary` (each documented there)."""

    stage: ClassVar[str] = "the agreement stage"
    annotators: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    study: str | None = None
    with_judge: bool = False
    codebook_version: str | None = None
    reference: str | None = "majority"
    n_resamples: Resamples = 1000
    confidence_level: float = 0.95
    seed: Seed | None = 0
    calibration: bool = True
    n_bins: int = 10
    by: str | None = None
    weighted: bool = False


def agreement_summary(store: Any, options: AgreementOptions | None = None, **kwargs: Any) -> dict[str, Any]:
    """Agreement figures over labels in the store, as a JSON-able dict (for ``--json`` and dataset cards).

    Parameters
    ----------
    store : ror_annotate.store.Store
    options : AgreementOptions, optional
        The settings below as one model; else they are given as keywords (``**kwargs``), validated
        by :meth:`AgreementOptions.from_options` (an unknown name: ConfigError with the closest one).
    annotators, sources, study, with_judge, codebook_version
        Which labels to compare (see :func:`ratings_from_store`).
    reference : {"majority", "human", "adjudicated"} or annotator name, optional
        Reference for per-class figures: majority of the other annotators; majority of the human
        annotators (leave-one-out for a human); the adjudicated reference of
        :func:`adjudicated_reference` (the latest adjudication where humans disagreed, else their
        unanimous label; adjudicators are then not compared as annotators); or one annotator.
    n_resamples, confidence_level, seed
        Trace-level bootstrap settings.
    calibration : bool
        Add ``"calibration"``: every machine rater with a confidence against the human reference
        (:func:`.reliability.calibration_summary`, ``n_bins`` equal-width bins).
    by : {"codebook", "week", "month"}, optional
        Add ``"drift"``: agreement by rater kind per codebook version or time window
        (:func:`.kinds.agreement_drift`).
    weighted : bool
        With ``study``: add ``"weighted"``, the inverse-probability-weighted estimates of
        :func:`.weighted.weighted_estimates`.

    Returns
    -------
    dict
        :meth:`AgreementResult.to_dict` plus ``"selection"`` (what was compared), ``"by_kind"``
        (:func:`.kinds.agreement_by_kind`), the optional blocks above and, for each disagreement
        pair, ``"example_texts"``.

    Raises
    ------
    AgreementError
        No matching labels, fewer than two annotators, no human/adjudicated labels for that
        reference; ``weighted`` without ``study`` (E720) or on a study without a design (E720, E721).
    ConfigError
        An unknown option or a value of the wrong type.
    """
    options = AgreementOptions.resolve(options, kwargs)
    o = options
    annotators, sources, study, with_judge, codebook_version = o.annotators, o.sources, o.study, o.with_judge, o.codebook_version
    reference, n_resamples, confidence_level, seed = o.reference, o.n_resamples, o.confidence_level, o.seed
    calibration, n_bins, by, weighted = o.calibration, o.n_bins, o.by, o.weighted
    if weighted and study is None:
        raise AgreementError("--weighted needs --study NAME (a study with inclusion probabilities)", code="E720")
    from ._cache import LabelsOnce

    store = LabelsOnce(store)  # the figures below read the labels several times: read them once
    boot: dict[str, Any] = {"n_resamples": n_resamples, "confidence_level": confidence_level, "seed": seed}
    if weighted:  # first: a study without a design is refused before anything else is computed
        from .weighted import weighted_estimates

        weighted_block = weighted_estimates(store, study, **boot)  # type: ignore[arg-type]
    exclude = ("adjudicated",) if reference == "adjudicated" else ()
    ratings, source_of, texts = ratings_from_store(
        store, annotators=annotators, sources=sources, study=study, with_judge=with_judge,
        codebook_version=codebook_version, exclude_sources=exclude,
    )
    ref_args: dict[str, Any] = {}
    if reference == "adjudicated":
        by_item = adjudicated_reference(store, study=study)
        if not any(r.basis == "adjudicated" for r in by_item.values()):
            raise AgreementError(f"--reference adjudicated: no adjudicated labels{' in study ' + repr(study) if study else ''}; adjudicate first (ror review adjudicate)")
        ref_args = {"reference_labels": [by_item[i].label if i in by_item else None for i in ratings.item_ids], "reference_name": "adjudicated"}
    elif reference == "human":
        humans = [a for a in ratings.annotators if source_of.get(a) == "human"]
        if not humans:
            imported = [a for a in ratings.annotators if store.rater_kinds().get(a) == "human"]
            hint = (f"; imported human raters ({', '.join(imported)}) are not a review reference: name one with --reference NAME"
                    if imported else "")
            raise AgreementError(f"--reference human: no human labels (Label Studio review labels) among the selected annotators; widen --source/--study{hint}")
        ref_args = {"reference": "majority", "reference_pool": humans, "reference_name": "human majority" if len(humans) > 1 else humans[0]}
    elif reference is not None:
        ref_args = {"reference": reference}
    result = agreement(ratings, n_resamples=n_resamples, confidence_level=confidence_level, seed=seed, **ref_args)
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
    from .kinds import agreement_by_kind, agreement_drift
    from .reliability import calibration_summary

    kinds = store.rater_kinds()
    out["selection"]["rater_kinds"] = {a: kinds.get(a, "machine") for a in ratings.annotators}
    # adjudications settle disagreements only: a reference, not an independent rater
    raters = [a for a in ratings.annotators if source_of.get(a) != "adjudicated"]
    out["by_kind"] = agreement_by_kind(ratings.subset_annotators(raters), kinds, **boot)
    if calibration:
        out["calibration"] = calibration_summary(store, study=study, n_bins=n_bins, **boot)
    if by is not None:
        out["drift"] = agreement_drift(store, by, study=study, **boot)
    if weighted:
        out["weighted"] = weighted_block
    return out
