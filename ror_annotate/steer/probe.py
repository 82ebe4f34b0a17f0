"""Linear probes that read the six behaviors from router logits, with the method's controls.

Features (Routes of Reasoning, ../shared/DESIGN.md "Probe"):

- router logits of one MoE layer, minus their per-token mean over experts, ``[n, n_experts]``;
  a window of consecutive layers is the concatenation ``[n, window * n_experts]``;
- controls: the input embedding of the token, TF-IDF of the segment's tokens (uni- and bigrams of
  token ids: the exported dataset carries the token grid, not the text), and the position in the
  trace (relative position and log(1 + index)).

Probe: L2-regularised multinomial logistic regression (scikit-learn ``LogisticRegression`` with
lbfgs; features standardised on train), ``C`` and the layer / window chosen by macro-F1 on the
validation split, reported on test next to the majority-class baseline (the train split's most
frequent class predicted everywhere). Macro-F1 averages over the classes present in the reference
of that evaluation (the dev labels for choosing C, the test labels for the reported figure), the
same set for probe and baseline (``sklearn.metrics.f1_score(average="macro", labels=...,
zero_division=0)``): a behavior absent from the test split has no F1 to average (counting it as 0
would cap a perfect probe at 4/6 when two behaviors are absent); the absent ones are listed next
to the figure (:attr:`ProbeFit.absent_test`).

Token level: one row per labeled token. Segment level: one row per segment, features averaged
over its tokens, label = its tokens' label.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import SteerError
from ..records import BEHAVIORS
from .capture import Capture
from .table import TokenTable

DEFAULT_CS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
#: lbfgs stopping tolerance of every probe fit (scikit-learn's default ``tol``: the largest absolute
#: component of the projected gradient of the objective, the same for cold and warm-started fits).
PROBE_TOL = 1e-4


def center_logits(logits: np.ndarray) -> np.ndarray:
    """Subtract each token's mean over experts, per layer.

    Parameters
    ----------
    logits : ndarray of shape (n_tokens, n_layers, n_experts)

    Returns
    -------
    ndarray of shape (n_tokens, n_layers, n_experts), float32
    """
    x = np.asarray(logits, dtype=np.float32)
    return x - x.mean(axis=-1, keepdims=True)


def router_features(capture: Capture, rows: np.ndarray, layer_positions: Sequence[int]) -> np.ndarray:
    """Centered router logits of some layers, concatenated.

    Parameters
    ----------
    capture : Capture
    rows : ndarray of shape (n,)
        Capture rows (tokens).
    layer_positions : sequence of int
        Positions along the capture's layer axis (not decoder layer indices).

    Returns
    -------
    ndarray of shape (n, len(layer_positions) * n_experts), float32
    """
    order = np.argsort(rows, kind="stable")
    block = np.empty((rows.shape[0], len(layer_positions), capture.meta.n_experts), dtype=np.float32)
    # sorted reads from the memmap are sequential on disk
    block[order] = center_logits(capture.logits[rows[order]][:, list(layer_positions), :])
    return block.reshape(rows.shape[0], -1)


def position_features(table: TokenTable) -> np.ndarray:
    """``[n, 2]``: relative position in the trace and ``log1p`` of the token index."""
    rel = table.position / np.maximum(table.trace_len, 1)
    return np.stack([rel, np.log1p(table.position)], axis=1).astype(np.float32)


def embedding_features(table: TokenTable, embeddings: np.ndarray) -> np.ndarray:
    """``[n, hidden]``: rows of the input embedding matrix ``[vocab, hidden]`` for each token."""
    if table.token_id.max(initial=0) >= embeddings.shape[0]:
        raise SteerError(f"token id {int(table.token_id.max())} outside the embedding matrix of {embeddings.shape[0]} rows")
    return np.asarray(embeddings[table.token_id], dtype=np.float32)


def segment_documents(table: TokenTable) -> dict[int, list[str]]:
    """Token ids of each segment as strings (TF-IDF documents), keyed by global segment key."""
    docs: dict[int, list[str]] = {}
    order = np.lexsort((table.position, table.segment))
    for seg, tok in zip(table.segment[order], table.token_id[order]):
        docs.setdefault(int(seg), []).append(str(int(tok)))
    return docs


def segment_means(table: TokenTable, features: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """Average token features over segments.

    Returns
    -------
    features : ndarray or sparse matrix of shape (n_segments, n_features)
    labels : ndarray of shape (n_segments,)
    split : ndarray of shape (n_segments,)
        Split of each segment.
    """
    from scipy import sparse

    keys, inverse, counts = np.unique(table.segment, return_inverse=True, return_counts=True)
    avg = sparse.csr_matrix((1.0 / counts[inverse], (inverse, np.arange(len(table)))), shape=(len(keys), len(table)))
    first = np.zeros(len(keys), dtype=np.int64)
    first[inverse[::-1]] = np.arange(len(table))[::-1]
    mixed = np.flatnonzero(np.bincount(inverse, weights=(table.labels != table.labels[first][inverse])) > 0)
    if mixed.size:
        raise SteerError(f"{mixed.size} segment(s) have tokens with different labels; the export is inconsistent")
    out = avg @ features
    return (out.astype(np.float32) if isinstance(out, np.ndarray) else out), table.labels[first], table.split[first]


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, labels: Sequence[int]) -> float:
    """Macro-F1 over ``labels`` (``sklearn.metrics.f1_score``, ``zero_division=0``)."""
    from sklearn.metrics import f1_score

    return float(f1_score(y_true, y_pred, labels=list(labels), average="macro", zero_division=0))


@dataclass
class ProbeFit:
    """Result of :func:`fit_probe`: C chosen on dev, scores on dev and test.

    Attributes
    ----------
    C : float
    dev_f1, test_f1, baseline_f1 : float
        Macro-F1 on validation and test, and the majority baseline's on test.
    dev_by_C : dict of float to float
    absent_test : list of int
        Classes of train or validation absent from the test reference (not averaged into the
        test macro-F1).
    """

    C: float
    dev_f1: float
    test_f1: float
    baseline_f1: float
    dev_by_C: dict[float, float] = field(default_factory=dict)
    absent_test: list[int] = field(default_factory=list)


def fit_probe(x_train: Any, y_train: np.ndarray, x_dev: Any, y_dev: np.ndarray, x_test: Any, y_test: np.ndarray, *,
              Cs: Sequence[float] = DEFAULT_CS, max_iter: int = 500, scale: bool = True, seed: int = 0) -> ProbeFit:
    """Fit the L2 multinomial logistic probe, choosing C by dev macro-F1.

    Parameters
    ----------
    x_train, x_dev, x_test : array-like or sparse matrix of shape (n_*, n_features)
    y_train, y_dev, y_test : ndarray of shape (n_*,)
        Class ids.
    Cs : sequence of float
        Inverse regularisation strengths tried.
    max_iter : int
        lbfgs iterations.
    scale : bool
        Standardise features on train (dense: mean and variance; sparse: variance only).
    seed : int

    Returns
    -------
    ProbeFit

    Raises
    ------
    SteerError
        If train has fewer than two classes or a split is empty.
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    for name, y in (("train", y_train), ("validation", y_dev), ("test", y_test)):
        if len(y) == 0:
            raise SteerError(f"the {name} split has no labeled rows; the probe needs train, validation and test")
    if np.unique(y_train).size < 2:
        raise SteerError("the train split has fewer than two behaviors; a probe cannot be fitted")
    # macro-F1 over the classes present in each reference (scikit-learn's labels=)
    test_labels = sorted(int(c) for c in np.unique(y_test))
    dev_labels = sorted(int(c) for c in np.unique(y_dev))
    absent = sorted(int(c) for c in np.union1d(y_train, y_dev) if int(c) not in test_labels)
    majority = np.bincount(y_train).argmax()
    baseline = macro_f1(y_test, np.full_like(y_test, majority), test_labels)
    sparse_input = hasattr(x_train, "tocsr")
    best: tuple[float, float, Any] | None = None
    dev_by_c: dict[float, float] = {}
    for C in Cs:
        steps = [StandardScaler(with_mean=not sparse_input)] if scale else []
        model = make_pipeline(*steps, LogisticRegression(C=C, l1_ratio=0.0, max_iter=max_iter, tol=PROBE_TOL,
                                                                         random_state=seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(x_train, y_train)
        dev = macro_f1(y_dev, model.predict(x_dev), dev_labels)
        dev_by_c[float(C)] = dev
        if best is None or dev > best[0]:
            best = (dev, float(C), model)
    assert best is not None
    test = macro_f1(y_test, best[2].predict(x_test), test_labels)
    return ProbeFit(C=best[1], dev_f1=best[0], test_f1=test, baseline_f1=baseline, dev_by_C=dev_by_c,
                    absent_test=absent)


def refit_resamples(x_train: Any, y_stored: np.ndarray, x_test: Any, y_train_draws: np.ndarray, y_test_draws: np.ndarray,
                    *, C: float, max_iter: int = 500, scale: bool = True, seed: int = 0,
                    warm_start: bool = False, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Refit one probe row per label resample at a fixed ``C``: test macro-F1 and baseline per resample.

    The figure is the one :func:`fit_probe` gives with ``Cs=(C,)`` on each resample's labels; the
    work shared by the resamples is done once. The features are standardised once (the scaler
    depends on ``x_train`` only, not on the labels); with ``groups``, rows that repeat one another
    are fitted once with a weight; with ``warm_start``, lbfgs starts each
    resample from the fit on the stored labels (``y_stored``) instead of zeros. A resample moves a
    few labels, so its optimum is near the stored one and lbfgs needs fewer iterations; both starts
    stop at the same tolerance (:data:`PROBE_TOL` on the projected gradient, scikit-learn's lbfgs),
    so the coefficients agree within that tolerance and the predictions agree except for test rows
    within that margin of a decision boundary. A resample whose train labels hold classes other
    than the stored fit's (or only two) starts from zeros as before.

    Parameters
    ----------
    x_train, x_test : ndarray or sparse matrix of shape (n_train, n_features), (n_test, n_features)
    y_stored : ndarray of shape (n_train,)
        Stored train labels (the warm start's fit).
    y_train_draws, y_test_draws : ndarray of shape (n_resamples, n_train), (n_resamples, n_test)
        Redrawn labels, class ids.
    C : float
        Inverse regularisation strength (chosen on the stored labels).
    max_iter : int
        lbfgs iterations per fit.
    scale : bool
        Standardise on train as :func:`fit_probe` does (dense: mean and variance; sparse: variance).
    seed : int
    warm_start : bool
        Start lbfgs from the stored-label fit (one extra fit per row). Off by default: on the tiny
        model with 20% of labels redrawn it made the refits slower, not faster
        (``benchmarks/bench_probe_resamples.py``).
    groups : ndarray of shape (n_train,), optional
        Train rows of one group have identical features and, in every resample, one label (the
        TF-IDF control at token level: a segment's tokens). The fit then runs on one row per group
        weighted by its size: the same objective (scikit-learn's weighted loss sums
        ``weight * loss``; the scaler's weighted mean and variance equal those of the repeated rows),
        with far fewer rows.

    Returns
    -------
    test_f1, baseline_f1 : ndarray of shape (n_resamples,)
        Macro-F1 over the classes present in that resample's test labels, of the probe and of the
        majority class of that resample's train labels; NaN where the train labels hold one class.
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    weight = None
    if groups is not None:
        _, first, weight = np.unique(groups, return_index=True, return_counts=True)
        x_train = x_train[first]
        y_stored, y_train_draws = y_stored[first], y_train_draws[:, first]
        weight = weight.astype(np.float64)
    if scale:
        scaler = StandardScaler(with_mean=not hasattr(x_train, "tocsr")).fit(x_train, sample_weight=weight)
        x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)

    def model() -> LogisticRegression:
        return LogisticRegression(C=C, l1_ratio=0.0, max_iter=max_iter, tol=PROBE_TOL, random_state=seed,
                                  warm_start=warm_start)

    start: LogisticRegression | None = None
    if warm_start and np.unique(y_stored).size > 2:
        start = model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            start.fit(x_train, y_stored, sample_weight=weight)
    n = y_train_draws.shape[0]
    test_f1, base_f1 = np.full(n, np.nan), np.full(n, np.nan)
    for r in range(n):
        y_train, y_test = y_train_draws[r], y_test_draws[r]
        classes = np.unique(y_train)
        if classes.size < 2:  # no probe, no figure
            continue
        test_labels = sorted(int(c) for c in np.unique(y_test))
        base_f1[r] = macro_f1(y_test, np.full_like(y_test, np.bincount(y_train, weights=weight).argmax()), test_labels)
        clf = model()
        if start is not None and np.array_equal(classes, start.classes_):
            clf.coef_, clf.intercept_ = start.coef_.copy(), start.intercept_.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(x_train, y_train, sample_weight=weight)
        test_f1[r] = macro_f1(y_test, clf.predict(x_test), test_labels)
    return test_f1, base_f1


@dataclass
class ProbeRow:
    """One line of the probe table (the method's layout).

    ``absent_in_test``: comma-separated behaviors with no row in the test split, which the test
    macro-F1 does not average over. ``label_noise`` (with ``label_draws``, see :func:`run_probes`):
    ``{"test_f1": interval, "baseline_f1": interval, "n_resamples": int}``, intervals as
    :func:`~ror_annotate.steer.noise.interval` over the label resamples.
    """

    features: str
    layers: str
    level: str
    n_features: int
    C: float
    dev_f1: float
    test_f1: float
    baseline_f1: float
    absent_in_test: str = ""
    label_noise: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as CSV columns; with label noise, ``test_f1_noise_lo`` / ``_hi`` / ``_mean``,
        ``baseline_f1_noise_lo`` / ``_hi`` and ``n_label_resamples`` are added."""
        out = asdict(self)
        noise = out.pop("label_noise")
        if noise:
            for key in ("test_f1", "baseline_f1"):
                iv = noise[key]
                out.update({f"{key}_noise_mean": iv["mean"], f"{key}_noise_lo": iv["lo"], f"{key}_noise_hi": iv["hi"]})
            out["n_label_resamples"] = noise["n_resamples"]
        return out


def _split_arrays(feats: Any, labels: np.ndarray, split: np.ndarray, names=("train", "validation", "test")):
    out = []
    for name in names:
        mask = split == name
        out.extend([feats[mask] if not hasattr(feats, "tocsr") else feats.tocsr()[mask], labels[mask]])
    return out


def _subsample(table: TokenTable, max_train: int | None, seed: int) -> TokenTable:
    if max_train is None:
        return table
    train = np.flatnonzero(table.split == "train")
    if train.size <= max_train:
        return table
    rng = np.random.default_rng(seed)
    keep = np.ones(len(table), dtype=bool)
    keep[rng.choice(train, train.size - max_train, replace=False)] = False
    return table.subset(keep)


def run_probes(capture: Capture, table: TokenTable, *, level: str = "token", windows: Sequence[int] = (1,),  # noqa: C901  (one branch per optional table row (windows, residual, controls))
               controls: Sequence[str] = ("position", "tfidf"), embeddings: np.ndarray | None = None,
               Cs: Sequence[float] = DEFAULT_CS, max_train: int | None = 50_000, seed: int = 0,
               progress: Callable[[str], None] | None = None,
               label_draws: Any = None) -> tuple[list[ProbeRow], dict[str, dict[int, float]]]:
    """Run the router-logit probes (per layer and per window) and the controls.

    Parameters
    ----------
    capture : Capture
    table : TokenTable
        Labeled tokens of the train, validation and test splits.
    level : {"token", "segment"}
    windows : sequence of int
        Window sizes in layers; 1 = single layers. For each size the window with the best dev
        macro-F1 is reported.
    controls : sequence of {"position", "tfidf", "embeddings"}
        ``embeddings`` needs the ``embeddings`` matrix ``[vocab, hidden]``.
    embeddings : ndarray, optional
    Cs : sequence of float
    max_train : int or None
        Train rows kept (seeded subsample) at token level; None keeps all.
    seed : int
    progress : callable, optional
        Called with a short description before each candidate.
    label_draws : LabelDraws, optional
        Redrawn segment labels (:func:`ror_annotate.steer.noise.draw_labels` on ``table``). Each
        reported row is then refitted per resample on its fixed features and hyperparameters (the
        layer or window and C chosen on the stored labels: one fit per row and resample) with the
        redrawn train labels, and scored on the redrawn test labels; :attr:`ProbeRow.label_noise`
        holds the percentile intervals. The refits share the row's split and standardisation (the
        TF-IDF control: one weighted row per segment; :func:`refit_resamples`).

    Returns
    -------
    rows : list of ProbeRow
        Best window of each size, then the controls.
    dev_curves : dict of str to dict of int to float
        ``"window=<w>"`` -> first decoder layer of the window -> best dev macro-F1.

    Raises
    ------
    SteerError
        Unknown level or control, or a missing split.
    """
    if level not in ("token", "segment"):
        raise SteerError(f"level must be 'token' or 'segment', got {level!r}")
    unknown = set(controls) - {"position", "tfidf", "embeddings"}
    if unknown:
        raise SteerError(f"unknown controls {sorted(unknown)}; choose from position, tfidf, embeddings")
    for split in ("train", "validation", "test"):
        if not np.any(table.split == split):
            have = sorted(set(table.split.tolist()))
            raise SteerError(f"no labeled tokens in the {split!r} split (have {', '.join(have)}); the probe needs "
                             "train, validation and test. With few traces, re-export with fractions that give each "
                             "split at least one trace (`ror export --split 0.6,0.2,0.2`); the capture is keyed by "
                             "trace id and still fits")
    if level == "token":
        table = _subsample(table, max_train, seed)
    layer_ids = capture.meta.layers

    def evaluate(name: str, layers: str, feats: Any) -> ProbeRow:
        if progress is not None:
            progress(f"{name} {layers}")
        labels, split = table.labels, table.split
        if level == "segment":
            feats, labels, split = segment_means(table, feats)
        fit = fit_probe(*_split_arrays(feats, labels, split), Cs=Cs, seed=seed)
        present = set(np.unique(labels[split == "test"]).tolist())
        absent = ",".join(b for c, b in enumerate(BEHAVIORS) if c not in present)
        return ProbeRow(name, layers, level, int(feats.shape[1]), fit.C, fit.dev_f1, fit.test_f1, fit.baseline_f1,
                        absent)

    def with_noise(row: ProbeRow, feats: Any, per_segment: bool = False) -> ProbeRow:
        if label_draws is None or label_draws.n_resamples == 0:
            return row
        from .noise import interval

        labels, split = table.labels, table.split
        keys = table.segment
        if level == "segment":
            feats, labels, split = segment_means(table, feats)
            keys = np.unique(table.segment)
        drawn = label_draws.for_segments(keys)
        train, test = split == "train", split == "test"
        x_train, x_test = _split_arrays(feats, labels, split, names=("train", "test"))[::2]
        groups = table.segment[train] if per_segment and level == "token" else None
        test_f1, base_f1 = refit_resamples(x_train, labels[train], x_test, drawn[:, train], drawn[:, test], C=row.C,
                                           seed=seed, groups=groups)
        lvl = label_draws.confidence_level
        row.label_noise = {"test_f1": interval(test_f1, lvl), "baseline_f1": interval(base_f1, lvl),
                           "n_resamples": label_draws.n_resamples}
        return row

    rows: list[ProbeRow] = []
    curves: dict[str, dict[int, float]] = {}
    for w in windows:
        if not 1 <= w <= len(layer_ids):
            raise SteerError(f"window {w} outside 1..{len(layer_ids)} captured layers")
        best: ProbeRow | None = None
        best_start = 0
        curve: dict[int, float] = {}
        for start in range(len(layer_ids) - w + 1):
            span = f"L{layer_ids[start]}" if w == 1 else f"L{layer_ids[start]}-L{layer_ids[start + w - 1]}"
            row = evaluate("router logits", span, router_features(capture, table.rows, range(start, start + w)))
            curve[layer_ids[start]] = row.dev_f1
            if best is None or row.dev_f1 > best.dev_f1:
                best, best_start = row, start
        curves[f"window={w}"] = curve
        assert best is not None
        if label_draws is not None:
            best = with_noise(best, router_features(capture, table.rows, range(best_start, best_start + w)))
        rows.append(best)
    if capture.residual is not None and rows:
        rows.extend(_residual_rows(capture, table, evaluate, width=rows[0].n_features, curves=curves, seed=seed,
                                   noise=with_noise if label_draws is not None else None))
    for control in controls:
        if control == "position":
            feats: Any = position_features(table)
            name = "position"
        elif control == "embeddings":
            if embeddings is None:
                raise SteerError("the embeddings control needs the model's input embedding matrix (--model)")
            feats, name = embedding_features(table, embeddings), "input embeddings"
        else:  # tfidf
            feats, name = tfidf_features(table), "TF-IDF"
        rows.append(with_noise(evaluate(name, "-", feats), feats, per_segment=control == "tfidf"))
    return rows, curves


def residual_features(capture: Capture, rows: np.ndarray, position: int) -> np.ndarray:
    """The residual stream after one captured decoder layer, ``[n_rows, hidden_size]`` float32.

    Raises
    ------
    SteerError
        The capture holds no residual stream (``ror capture --residual-layers``).
    """
    if capture.residual is None:
        raise SteerError(f"{capture.path} holds no residual stream; capture with --residual-layers")
    return np.asarray(capture.residual[np.asarray(rows), position], dtype=np.float32)


def _residual_rows(capture: Capture, table: TokenTable, evaluate: Callable[[str, str, Any], "ProbeRow"], *, width: int,
                   curves: dict[str, dict[int, float]], seed: int,
                   noise: Callable[["ProbeRow", Any], "ProbeRow"] | None = None) -> list["ProbeRow"]:
    """The method's residual-stream controls: the best captured layer (chosen on dev), and the same layer
    projected by PCA (fitted on train rows) to ``width``, the router row's number of features."""
    from sklearn.decomposition import PCA

    best: ProbeRow | None = None
    best_pos = 0
    curve: dict[int, float] = {}
    for pos, layer in enumerate(capture.meta.residual_layers):
        row = evaluate("residual stream", f"L{layer}", residual_features(capture, table.rows, pos))
        curve[layer] = row.dev_f1
        if best is None or row.dev_f1 > best.dev_f1:
            best, best_pos = row, pos
    curves["residual"] = curve
    assert best is not None
    feats = residual_features(capture, table.rows, best_pos)
    train = feats[table.split == "train"]
    n_components = int(min(width, feats.shape[1], len(train)))
    if noise is not None:
        best = noise(best, feats)
    if n_components >= feats.shape[1]:
        return [best]  # the router features are as wide as the residual stream: nothing to project
    pca = PCA(n_components=n_components, random_state=seed).fit(train)
    reduced = pca.transform(feats).astype(np.float32)
    projected = evaluate(f"residual stream, PCA to {n_components}", best.layers, reduced)
    if noise is not None:
        projected = noise(projected, reduced)
    return [best, projected]


def tfidf_features(table: TokenTable) -> Any:
    """TF-IDF of each token's segment (uni- and bigrams of token ids), fitted on train segments.

    Returns
    -------
    scipy.sparse matrix of shape (n_tokens, n_terms)
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    docs = segment_documents(table)
    seg_split = dict(zip(table.segment.tolist(), table.split.tolist()))
    vec = TfidfVectorizer(analyzer=_id_ngrams, sublinear_tf=True, min_df=1)
    vec.fit([docs[s] for s in docs if seg_split[s] == "train"])
    keys = list(docs)
    mat = vec.transform([docs[s] for s in keys]).tocsr()
    where = {s: i for i, s in enumerate(keys)}
    return mat[[where[int(s)] for s in table.segment]]


def _id_ngrams(doc: list[str]) -> list[str]:
    return doc + [f"{a}_{b}" for a, b in zip(doc, doc[1:])]


def format_table(rows: Sequence[ProbeRow]) -> list[list[str]]:
    """Rows of strings for printing: features, layers, level, dims, C, dev, test, baseline; with label
    noise the test and baseline cells read ``0.512 [0.480, 0.540]`` (label-noise interval)."""
    from .noise import fmt_interval

    out = []
    for r in rows:
        n = r.label_noise or {}
        out.append([r.features, r.layers, r.level, str(r.n_features), f"{r.C:g}", f"{r.dev_f1:.3f}",
                    fmt_interval(r.test_f1, n.get("test_f1")), fmt_interval(r.baseline_f1, n.get("baseline_f1"))])
    return out


PROBE_COLUMNS = ("features", "layers", "level", "width", "C", "dev macro-F1", "test macro-F1", "majority baseline")

__all__ = [
    "DEFAULT_CS",
    "PROBE_COLUMNS",
    "PROBE_TOL",
    "ProbeFit",
    "ProbeRow",
    "center_logits",
    "embedding_features",
    "fit_probe",
    "format_table",
    "macro_f1",
    "position_features",
    "refit_resamples",
    "residual_features",
    "router_features",
    "run_probes",
    "segment_means",
    "tfidf_features",
]
