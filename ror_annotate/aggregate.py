"""Aggregation with a posterior: several raters' labels -> one label per segment with a probability per class.

``ror aggregate`` (and :func:`ror_annotate.pipeline.aggregate`) reads each chosen rater's latest
label of every segment (latest ``created_at``, ties broken by the greatest ``label_id``), fits an
estimator of the crowdsourcing field over the long table of ``(segment, rater, label)`` rows and
stores the result as its own rater ``aggregate:<method>`` (label source ``aggregate``): the chosen
label, ``distribution`` = the posterior over the six behaviors (in
:data:`~ror_annotate.records.BEHAVIORS` order; classes no rater used get 0) and ``confidence`` =
the posterior of the chosen label. The aggregate is declared in the ``annotators`` table with the
method, the raters combined, the human mode, each rater's estimated accuracy and its confusion
matrix estimated from the posteriors (:func:`rater_confusion`).

Methods (the :data:`AGGREGATORS` registry):

* ``majority-vote``: the vote fraction of each class; ties go to the first class in BEHAVIORS order.
* ``dawid-skene``: Dawid & Skene (1979), one confusion matrix per rater, fitted by EM. Run by a
  vectorised numpy EM (:func:`dawid_skene`) that follows crowd-kit 1.4.2's ``DawidSkene`` step by step
  (majority-vote start, the same smoothing, priors and stopping rule), on the distinct response
  patterns instead of the segments; tests check its posteriors against crowd-kit's within 1e-6.
* ``one-coin-dawid-skene``, ``glad``, ``mace``: crowd-kit's ``OneCoinDawidSkene``, ``GLAD``
  (Whitehill et al. 2009) and ``MACE`` (Hovy et al. 2013), called as they are.

Each rater's *estimated accuracy* is the mean posterior probability of the labels it gave,
``acc_w = mean_{t labelled by w} P(z_t = y_wt)``; for Dawid-Skene and a rater that labelled every
segment this equals ``sum_c p_c e_w[c, c]``, the prior-weighted diagonal of its confusion matrix.

Human labels are held out by default (``human="held-out"``), so the aggregate can be calibrated
against them honestly; ``human="anchor"`` makes every human rater one more rater of the estimate.
"""

from __future__ import annotations

import difflib
import hashlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .errors import ConfigError, InputError
from .options import Seed, StageOptions
from .records import BEHAVIORS, Annotator, Run
from .registry import Registry

from .store import RaterLabels

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store

#: crowd-kit's smoothing constant (``crowdkit.aggregation.classification.dawid_skene._EPS``).
EPS = 1e-10
#: Label sources never taken as raters by default: earlier aggregates and verifiers' audits.
DERIVED_SOURCES = ("aggregate", "verify")
#: Labels written per store call (bounded memory at a million segments; one transaction in all).
WRITE_BATCH = 100_000

K = len(BEHAVIORS)


class AggregateOptions(StageOptions):
    """Options of ``ror aggregate`` / :func:`aggregate`.

    Attributes
    ----------
    method : str
        A name of :data:`AGGREGATORS` (``majority-vote``, ``dawid-skene``, ``one-coin-dawid-skene``,
        ``glad``, ``mace``).
    raters : tuple of str, optional
        Annotator ids to combine; default every machine rater with labels except earlier aggregates
        and verifiers.
    human : {"held-out", "anchor"}
        ``held-out`` (default): human labels are not used; ``anchor``: every human rater joins.
    n_iter : int
        Maximum EM iterations (crowd-kit's ``n_iter``; MACE's iterations per restart).
    tol : float
        EM stops when the evidence lower bound per response rises by less than this (crowd-kit's ``tol``).
    seed : int
        Random state of the randomised methods (MACE).
    """

    stage: ClassVar[str] = "the aggregate stage"
    method: str = "dawid-skene"
    raters: tuple[str, ...] | None = None
    human: Literal["held-out", "anchor"] = "held-out"
    n_iter: int = Field(100, ge=1)
    tol: float = Field(1e-5, gt=0)
    seed: Seed = 0


@dataclass
class Responses:
    """The long table of ``(segment, rater, label)`` rows, encoded as integer arrays.

    Attributes
    ----------
    tasks : ndarray of int64, shape (n_rows,)
        Segment index into ``segments``.
    workers : ndarray of int32, shape (n_rows,)
        Rater index into ``raters``.
    labels : ndarray of int8, shape (n_rows,)
        Class index into :data:`BEHAVIORS`.
    segments : list of (str, int)
        ``(trace_id, segment_index)`` of each task, length n_tasks.
    raters : list of str
        Annotator id of each worker, length n_workers.
    """

    tasks: np.ndarray
    workers: np.ndarray
    labels: np.ndarray
    segments: list[tuple[str, int]]
    raters: list[str]

    @property
    def n_tasks(self) -> int:
        return len(self.segments)

    @property
    def n_workers(self) -> int:
        return len(self.raters)


@dataclass
class Fit:
    """An aggregator's result: ``probas`` of shape (n_tasks, 6) in BEHAVIORS order, rows summing to 1."""

    probas: np.ndarray
    iterations: int | None = None


Aggregator = Callable[[Responses, AggregateOptions], Fit]
#: Aggregation methods by name; each takes (:class:`Responses`, :class:`AggregateOptions`) and returns a :class:`Fit`.
AGGREGATORS: Registry[Aggregator] = Registry("aggregators", what="aggregation method")


# ----------------------------------------------------------------------------- estimators
@AGGREGATORS.register("majority-vote")
def majority_vote(data: Responses, options: AggregateOptions) -> Fit:
    """Vote fractions: ``P[t, c] = #{raters of t saying c} / #{raters of t}``."""
    counts = np.bincount(data.tasks * K + data.labels, minlength=data.n_tasks * K).reshape(data.n_tasks, K).astype(np.float64)
    return Fit(counts / counts.sum(axis=1, keepdims=True))


def dawid_skene(
    tasks: np.ndarray, workers: np.ndarray, labels: np.ndarray, n_tasks: int, n_workers: int, n_classes: int,
    *, n_iter: int = 100, tol: float = 1e-5,
) -> tuple[np.ndarray, int]:
    """Dawid-Skene posteriors by EM, step for step as crowd-kit 1.4.2's ``DawidSkene.fit``.

    Dawid, A. P. and Skene, A. M. (1979), "Maximum likelihood estimation of observer error-rates using
    the EM algorithm", Applied Statistics 28(1), 20-28. As in crowd-kit: start from majority-vote
    fractions; priors ``p = mean_t P[t]``; M-step ``e_w[l, c] ∝ max(sum_{t: w said l} P[t, c], 1e-10)``
    over the labels ``w`` used; E-step ``P[t, c] ∝ p_c prod_w e_w[y_wt, c]``; stop when the evidence lower
    bound per response (crowd-kit's, with the prior term counted once per response) rises by less than
    ``tol``. Tasks with the same responses have the same posterior, so EM runs once per distinct
    response pattern, weighted by its count (exact; the speed-up at a million segments and 5 raters).

    Parameters
    ----------
    tasks, workers, labels : ndarray of int, shape (n_rows,)
        One response per row; ``labels`` in ``0 .. n_classes - 1``; at most one row per (task, worker).
    n_tasks, n_workers, n_classes : int
    n_iter : int
        Maximum EM iterations.
    tol : float
        Stopping threshold on the change of the bound per response.

    Returns
    -------
    probas : ndarray of float64, shape (n_tasks, n_classes)
        Posteriors; a class no rater used gets 0.
    iterations : int
        EM iterations run.
    """
    used = np.unique(labels)
    k = len(used)
    lab = np.searchsorted(used, labels).astype(np.int64)
    # distinct response patterns (missing = k), as one integer code each when it fits in 62 bits
    if n_workers * np.log2(k + 1) < 62:
        dense = np.full((n_tasks, n_workers), k, dtype=np.int64)
        dense[tasks, workers] = lab
        code: np.ndarray = np.zeros(n_tasks, dtype=np.int64)
        for w in range(n_workers):
            code = code * (k + 1) + dense[:, w]
        _, first, inverse, weight = np.unique(code, return_index=True, return_inverse=True, return_counts=True)
        pat = dense[first]  # (n_patterns, n_workers)
        del dense
        pu, pw = np.nonzero(pat != k)
        rows_u, rows_w, rows_l = pu.astype(np.int64), pw.astype(np.int64), pat[pu, pw]
        n_units = len(first)
    else:  # too many raters for a code: one unit per task
        inverse = np.arange(n_tasks)
        weight = np.ones(n_tasks, dtype=np.int64)
        rows_u, rows_w, rows_l = tasks.astype(np.int64), workers.astype(np.int64), lab
        n_units = n_tasks
    weight_f = weight.astype(np.float64)
    n_data = float(weight_f[rows_u].sum())  # = number of responses
    wl = rows_w * k + rows_l
    present = np.bincount(wl, minlength=n_workers * k) > 0
    row_weight = weight_f[rows_u]

    def m_step(probas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sums = np.empty((n_workers * k, k))
        for c in range(k):
            sums[:, c] = np.bincount(wl, weights=row_weight * probas[rows_u, c], minlength=n_workers * k)
        errors = np.where(present[:, None], np.maximum(sums, EPS), 0.0).reshape(n_workers, k, k)
        errors /= errors.sum(axis=1, keepdims=True)
        return sums, errors.reshape(n_workers * k, k)

    def e_step(priors: np.ndarray, errors: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            log_e = np.log(errors)
        log_lik = np.empty((n_units, k))
        for c in range(k):
            log_lik[:, c] = np.bincount(rows_u, weights=log_e[wl, c], minlength=n_units)
        log_lik += np.log(np.maximum(priors, EPS))
        log_lik -= log_lik.max(axis=1, keepdims=True)
        lik = np.exp(log_lik)
        return lik / lik.sum(axis=1, keepdims=True)

    votes = np.bincount(rows_u * k + rows_l, minlength=n_units * k).reshape(n_units, k).astype(np.float64)
    probas = votes / votes.sum(axis=1, keepdims=True)
    priors = weight_f @ probas / n_tasks
    _, errors = m_step(probas)
    loss = -np.inf
    iterations = 0
    for _ in range(n_iter):
        iterations += 1
        probas = e_step(priors, errors)
        priors = weight_f @ probas / n_tasks
        sums, errors = m_step(probas)
        with np.errstate(divide="ignore", invalid="ignore"):
            joint = float(np.sum(np.where(sums > 0, sums * np.log(np.where(errors > 0, errors, 1.0)), 0.0)))
        joint += float(np.log(np.maximum(priors, EPS)) @ sums.sum(axis=0))
        clipped = np.maximum(probas, EPS)
        entropy = -float(weight_f @ (clipped * np.log(clipped)).sum(axis=1))
        new_loss = (joint + entropy) / n_data
        if new_loss - loss < tol:
            break
        loss = new_loss
    out = np.zeros((n_tasks, n_classes))
    out[:, used] = probas[inverse]
    return out, iterations


@AGGREGATORS.register("dawid-skene")
def _dawid_skene(data: Responses, options: AggregateOptions) -> Fit:
    probas, iterations = dawid_skene(
        data.tasks, data.workers, data.labels, data.n_tasks, data.n_workers, K, n_iter=options.n_iter, tol=options.tol,
    )
    return Fit(probas, iterations)


def crowdkit_probas(estimator: Any, data: Responses) -> np.ndarray:
    """``estimator.fit_predict_proba`` on the long table, as an array of shape (n_tasks, 6) in BEHAVIORS order."""
    import pandas as pd

    frame = pd.DataFrame({
        "task": data.tasks, "worker": data.workers, "label": np.asarray(BEHAVIORS, dtype=object)[data.labels],
    })
    with warnings.catch_warnings():  # crowd-kit 1.4.2 uses pandas' inplace= (deprecated in pandas 3.1): not the user's concern
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        proba = estimator.fit_predict_proba(frame)
    proba = proba.reindex(index=range(data.n_tasks), columns=list(BEHAVIORS), fill_value=0.0).fillna(0.0)
    out = np.clip(proba.to_numpy(dtype=np.float64), 0.0, None)
    return out / out.sum(axis=1, keepdims=True)


@AGGREGATORS.register("one-coin-dawid-skene")
def _one_coin(data: Responses, options: AggregateOptions) -> Fit:
    from crowdkit.aggregation import OneCoinDawidSkene

    return Fit(crowdkit_probas(OneCoinDawidSkene(n_iter=options.n_iter, tol=options.tol), data))


@AGGREGATORS.register("glad")
def _glad(data: Responses, options: AggregateOptions) -> Fit:
    from crowdkit.aggregation import GLAD

    return Fit(crowdkit_probas(GLAD(n_iter=options.n_iter, tol=options.tol, silent=True), data))


@AGGREGATORS.register("mace")
def _mace(data: Responses, options: AggregateOptions) -> Fit:
    from crowdkit.aggregation import MACE

    return Fit(crowdkit_probas(MACE(n_iter=min(options.n_iter, 50), random_state=options.seed, verbose=0), data))


def rater_confusion(data: Responses, probas: np.ndarray) -> np.ndarray:
    """Each rater's confusion matrix from the posteriors, shape (n_workers, 6, 6).

    ``C[w, c, l] = sum_{t: w said l} P[t, c] / sum_{t labelled by w} P[t, c]``: the estimated probability
    that rater ``w`` says ``l`` when the truth is ``c`` (Dawid-Skene's M-step, without its smoothing);
    rows of classes with no posterior mass among the rater's segments are 0.
    """
    sums = np.empty((data.n_workers * K, K))
    key = data.workers.astype(np.int64) * K + data.labels
    for c in range(K):
        sums[:, c] = np.bincount(key, weights=probas[data.tasks, c], minlength=data.n_workers * K)
    conf = sums.reshape(data.n_workers, K, K).transpose(0, 2, 1)  # (worker, true, given)
    total = conf.sum(axis=2, keepdims=True)
    return np.divide(conf, total, out=np.zeros_like(conf), where=total > 0)


def rater_accuracy(data: Responses, probas: np.ndarray) -> np.ndarray:
    """Each rater's estimated accuracy: the mean posterior probability of the labels it gave, shape (n_workers,)."""
    agree = probas[data.tasks, data.labels]
    n = np.bincount(data.workers, minlength=data.n_workers)
    return np.bincount(data.workers, weights=agree, minlength=data.n_workers) / np.maximum(n, 1)


# ----------------------------------------------------------------------------- the stage
class AggregateSummary(BaseModel):
    """What :func:`aggregate` stored."""

    model_config = ConfigDict(extra="forbid")

    method: str
    annotator: str = Field(description="The aggregate's rater id, aggregate:<method>.")
    human: str
    raters: list[str]
    held_out_humans: list[str] = Field(default_factory=list, description="Human raters with labels that were left out (held-out mode).")
    segments: int
    responses: int = Field(description="Rater labels combined (rows of the long table).")
    labels_written: int
    mean_confidence: float
    share_below_half: float = Field(description="Share of segments whose chosen label has posterior < 0.5.")
    rater_accuracy: dict[str, float]
    rater_segments: dict[str, int]
    class_counts: dict[str, int]
    iterations: int | None = None
    codebook_version: str
    run_id: str | None = None

    def counts(self) -> dict[str, Any]:
        """The counts recorded with the run."""
        return self.model_dump(exclude={"run_id"})


def select_raters(store: "Store", options: AggregateOptions) -> tuple[list[str], list[str]]:
    """The raters to combine and the human raters held out, per ``options``.

    Raises
    ------
    InputError
        E711: a named rater has no labels; E714: a named rater is an aggregate or a verifier;
        E715: a named rater is human while humans are held out; E754: ``human="anchor"`` with no
        human rater in the store.
    """
    sources: dict[str, set[str]] = {}
    for source, annotator, _ in store.annotators():
        sources.setdefault(annotator, set()).add(source)
    kinds = store.rater_kinds()
    humans = sorted(a for a, kind in kinds.items() if kind == "human")
    derived = {a for a, s in sources.items() if s & set(DERIVED_SOURCES)}
    if options.raters is None:
        chosen = sorted(a for a, kind in kinds.items() if kind == "machine" and a not in derived)
    else:
        chosen = list(dict.fromkeys(options.raters))
        for name in chosen:
            if name not in sources:
                close = difflib.get_close_matches(name, list(sources), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                known = ", ".join(sorted(sources)) or "none"
                raise InputError(f"rater {name!r} has no labels in {store.path}{hint}; raters with labels: {known}", code="E711")
            if name in derived:
                raise InputError(
                    f"rater {name!r} is itself an aggregate or a verifier's audit: combining it again counts its raters twice; "
                    "name the raters it combined instead", code="E714",
                )
            if kinds.get(name) == "human" and options.human == "held-out":
                raise InputError(
                    f"rater {name!r} is human, and humans are held out (the default, so calibration against them stays honest); "
                    "pass --human anchor to let human labels join the estimate", code="E715",
                )
    if options.human == "anchor":
        if not humans:
            # the aggregate would be declared (and the export card would say) "human labels joined the estimate"
            raise InputError(
                f"--human anchor: no human rater in {store.path}, so no human label can anchor the estimate; pull reviewed "
                "labels first (ror review pull) or import them (ror labels import --kind human), or leave --human at held-out",
                code="E754",
            )
        chosen += [h for h in humans if h not in chosen]
        return chosen, []
    return chosen, humans


def load_responses(store: "Store", raters: Sequence[str]) -> Responses:
    """Each rater's latest label per segment (:meth:`Store.latest_rater_labels`), encoded as arrays."""
    import pyarrow.compute as pc

    table = store.latest_rater_labels(raters)
    traces = pc.dictionary_encode(table.column("trace_id")).combine_chunks()
    trace_code = traces.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    seg = table.column("segment_index").to_numpy().astype(np.int64)
    # rows come ordered by (trace_id, segment_index), so first appearance = sorted order of the key
    key = trace_code * (int(seg.max(initial=0)) + 1) + seg
    uniq, first, tasks = np.unique(key, return_index=True, return_inverse=True)
    names = traces.dictionary.to_pylist()
    segments = [(names[trace_code[i]], int(seg[i])) for i in first]
    rater_index = {r: i for i, r in enumerate(raters)}
    workers = np.array([rater_index[a] for a in table.column("annotator").to_pylist()], dtype=np.int32) if len(table) else np.zeros(0, np.int32)
    label_index = {b: i for i, b in enumerate(BEHAVIORS)}
    labels_enc = pc.dictionary_encode(table.column("label")).combine_chunks()
    lookup = np.array([label_index[b] for b in labels_enc.dictionary.to_pylist()], dtype=np.int8)
    labels = lookup[labels_enc.indices.to_numpy(zero_copy_only=False)] if len(table) else np.zeros(0, np.int8)
    return Responses(tasks=tasks.astype(np.int64).reshape(-1), workers=workers, labels=labels.astype(np.int64),
                     segments=segments, raters=list(raters))


def _codebook_version(store: "Store", raters: Sequence[str]) -> str:
    versions = store.rater_codebook_versions(raters)
    if len(versions) == 1:
        return versions[0]
    return "mixed-" + hashlib.sha256("\n".join(sorted(versions)).encode()).hexdigest()[:16]


def aggregate(store: "Store", options: AggregateOptions | None = None, *, run: Run | None = None) -> AggregateSummary:
    """Combine raters into one label per segment with a posterior, stored as rater ``aggregate:<method>``.

    Parameters
    ----------
    store : Store
        Open writable store holding the raters' labels.
    options : AggregateOptions, optional
        Method, raters, human mode, EM settings (defaults: Dawid-Skene over every machine rater).
    run : Run, optional
        The run the labels are attributed to (``Label.run_id``).

    Returns
    -------
    AggregateSummary
        Segments, raters, mean confidence, share of segments below 0.5, per-rater estimated accuracy.

    Raises
    ------
    ConfigError
        E710: unknown method (the message lists the registered ones).
    InputError
        E711-E715 (see :func:`select_raters`); E712: fewer than 2 raters (an aggregate of one rater
        has confidence 1 everywhere, which says nothing); E713: the raters have no labels to combine;
        E751: ``aggregate:<method>`` already names a rater of another source (an import);
        E752: no segment is labelled by two of the raters (no overlap: nothing to estimate).
        Nothing is stored on any error.
    """
    options = options or AggregateOptions()
    method = AGGREGATORS.find(options.method)
    if method is None:
        close = difflib.get_close_matches(options.method, AGGREGATORS.names(), n=1)
        raise ConfigError(
            f"unknown aggregation method {options.method!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
            f"available: {', '.join(AGGREGATORS.names())}", code="E710",
        )
    raters, held_out = select_raters(store, options)
    if len(raters) < 2:
        have = ", ".join(raters) if raters else "none"
        raise InputError(
            f"{options.method} needs at least 2 raters, got {len(raters)} ({have}): an aggregate of one rater has confidence 1 "
            "everywhere and says nothing. Label with a second judge (ror label --judge A --judge B), or --samples 2+, "
            "or --human anchor to add reviewed human labels", code="E712",
        )
    annotator = f"aggregate:{options.method}"
    owner = store.declared_annotators().get(annotator)
    other = sorted({src for src, name, _ in store.annotators() if name == annotator and src != "aggregate"})
    if other or (owner is not None and owner.source != "aggregate"):
        raise InputError(
            f"rater id {annotator!r} already names a rater of source {(other or [owner.source if owner else '?'])[0]!r} in {store.path}; "
            "the aggregate would replace its declaration and mix with its labels. Rename that rater (re-import it under another "
            "--annotator) before aggregating", code="E751",
        )
    data = load_responses(store, raters)
    if data.n_tasks == 0:
        raise InputError(f"raters {', '.join(raters)} have no labels to combine in {store.path}", code="E713")
    if data.n_tasks == len(data.tasks):
        raise InputError(
            f"raters {', '.join(raters)} never label the same segment: with no overlap no rater's accuracy can be estimated, and "
            "every segment would get confidence 1 from its one rater. Label a shared set of segments with at least two raters",
            code="E752",
        )
    fit = method(data, options)
    probas = np.asarray(fit.probas, dtype=np.float64)
    chosen = probas.argmax(axis=1)  # ties: the first class in BEHAVIORS order
    confidence = probas[np.arange(data.n_tasks), chosen]
    accuracy = rater_accuracy(data, probas)
    confusion = rater_confusion(data, probas)
    per_rater = np.bincount(data.workers, minlength=data.n_workers)
    n_raters = np.bincount(data.tasks, minlength=data.n_tasks)
    codebook_version = _codebook_version(store, raters)
    run_id = run.run_id if run is not None else None

    shared_extra = {k: {"n_raters": k} for k in np.unique(n_raters).tolist()}
    columns = RaterLabels(
        trace_id=[t for t, _ in data.segments], segment_index=[i for _, i in data.segments], label=chosen,
        codebook_version=codebook_version, confidence=confidence, distribution=probas,
        extra=[shared_extra[k] for k in n_raters.tolist()], run_id=run_id,
    )
    summary = AggregateSummary(
        method=options.method, annotator=annotator, human=options.human, raters=list(raters), held_out_humans=held_out,
        segments=data.n_tasks, responses=len(data.tasks), labels_written=0,
        mean_confidence=float(confidence.mean()), share_below_half=float((confidence < 0.5).mean()),
        rater_accuracy={r: round(float(a), 6) for r, a in zip(raters, accuracy)},
        rater_segments={r: int(n) for r, n in zip(raters, per_rater)},
        class_counts={b: int(n) for b, n in zip(BEHAVIORS, np.bincount(chosen, minlength=K))},
        iterations=fit.iterations, codebook_version=codebook_version, run_id=run_id,
    )
    declared = Annotator(
        annotator=annotator, kind="machine", source="aggregate", model=options.method, codebook_version=codebook_version,
        details={"raters": list(raters), "human": options.human, "held_out_humans": held_out, "rater_accuracy": summary.rater_accuracy,
                 "rater_segments": summary.rater_segments, "options": options.recorded(), "run_id": run_id,
                 "rater_confusion": {r: np.round(m, 6).tolist() for r, m in zip(raters, confusion)},
                 "confusion_axes": "rater_confusion[rater][true class][given label], classes in BEHAVIORS order"},
    )
    with store.transaction():
        written = store.replace_rater_labels("aggregate", annotator, columns, batch=WRITE_BATCH)
        store.upsert_annotators([declared])
    summary.labels_written = written
    return summary


__all__ = [
    "AGGREGATORS", "AggregateOptions", "AggregateSummary", "Fit", "Responses", "aggregate", "crowdkit_probas", "dawid_skene",
    "load_responses", "majority_vote", "rater_accuracy", "rater_confusion", "select_raters",
]
