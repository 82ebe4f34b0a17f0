"""Expert association: which routed experts go with which behavior (Routes of Reasoning, "recognize").

- Risk difference (../shared/DESIGN.md):
  ``RD(e, b, d) = P(e selected | behavior b, dataset d) - P(e selected | dataset d)``,
  estimated on labeled tokens, for every layer. A behavior absent from a dataset has RD NaN.
- Top-k expert sets per (dataset, behavior, layer): the k experts with the largest RD.
- Behavior-profile correlation: Pearson correlation of the RD profiles (all layers x experts) of
  every (dataset, behavior) pair; summarised as mean same-behavior correlation across datasets vs
  mean cross-behavior correlation.
- Jaccard of top-k sets of the same behavior and layer across datasets, against a label-permutation
  null (labels shuffled within each dataset, seeded); p-value ``(1 + #null >= observed) / (1 + n)``.
- Transfer AUC: experts selected on a source dataset rank the segments of a target dataset by the
  fraction of their tokens' routed experts that fall in the source set (``sklearn.metrics.roc_auc_score``,
  one behavior vs rest).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import SteerError
from ..records import BEHAVIORS


def selection_onehot(selected: np.ndarray, n_experts: int) -> np.ndarray:
    """Turn selected expert ids into indicators.

    Parameters
    ----------
    selected : ndarray of shape (n_tokens, n_layers, top_k), int
    n_experts : int

    Returns
    -------
    ndarray of shape (n_tokens, n_layers, n_experts), bool
    """
    n, n_layers, _ = selected.shape
    out = np.zeros((n, n_layers, n_experts), dtype=bool)
    np.put_along_axis(out, selected.astype(np.int64), True, axis=2)
    return out


def risk_difference(selected: np.ndarray, labels: np.ndarray, dataset: np.ndarray, *, n_experts: int,
                    n_datasets: int | None = None, n_behaviors: int = len(BEHAVIORS)) -> dict[str, np.ndarray]:
    """Risk difference of every expert for every behavior and dataset, per layer.

    Parameters
    ----------
    selected : ndarray of shape (n_tokens, n_layers, top_k)
        Experts each token was routed to.
    labels : ndarray of shape (n_tokens,)
        Behavior class ids (0 .. n_behaviors-1).
    dataset : ndarray of shape (n_tokens,)
        Dataset ids (0 .. n_datasets-1).
    n_experts : int
    n_datasets : int, optional
        Default ``dataset.max() + 1``.
    n_behaviors : int

    Returns
    -------
    dict with
        ``rd`` : ndarray of shape (n_datasets, n_behaviors, n_layers, n_experts), NaN where the
        behavior has no token in the dataset;
        ``p_behavior`` : same shape, ``P(e selected | b, d)``;
        ``p_dataset`` : ndarray of shape (n_datasets, n_layers, n_experts), ``P(e selected | d)``;
        ``counts`` : ndarray of shape (n_datasets, n_behaviors), tokens per cell.
    """
    n_datasets = int(dataset.max()) + 1 if n_datasets is None else n_datasets
    n_layers = selected.shape[1]
    sums = np.zeros((n_datasets, n_behaviors, n_layers, n_experts), dtype=np.float64)
    counts = np.zeros((n_datasets, n_behaviors), dtype=np.int64)
    cell = dataset.astype(np.int64) * n_behaviors + labels.astype(np.int64)
    np.add.at(counts.reshape(-1), cell, 1)
    flat = sums.reshape(n_datasets * n_behaviors, n_layers, n_experts)
    # chunked so memory stays at chunk x layers x experts
    for lo in range(0, selected.shape[0], 65536):
        onehot = selection_onehot(np.asarray(selected[lo:lo + 65536]), n_experts)
        chunk = cell[lo:lo + 65536]
        for c in np.unique(chunk):
            flat[c] += onehot[chunk == c].sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_b = sums / counts[:, :, None, None]
        p_d = sums.sum(axis=1) / counts.sum(axis=1)[:, None, None]
    rd = p_b - p_d[:, None]
    return {"rd": rd, "p_behavior": p_b, "p_dataset": p_d, "counts": counts}


def top_experts(rd: np.ndarray, k: int) -> np.ndarray:
    """The k experts with the largest risk difference.

    Parameters
    ----------
    rd : ndarray of shape (..., n_experts)
    k : int

    Returns
    -------
    ndarray of shape (..., k), int64
        Expert ids by decreasing RD (ties by lower id); ``-1`` where RD is NaN.
    """
    filled = np.where(np.isnan(rd), -np.inf, rd)
    order = np.argsort(-filled, axis=-1, kind="stable")[..., :k]
    nan_rows = np.isnan(rd).all(axis=-1)
    order[nan_rows] = -1
    return order


def jaccard(a: Sequence[int], b: Sequence[int]) -> float:
    """|A ∩ B| / |A ∪ B| of two expert sets (NaN if both are empty)."""
    sa, sb = set(int(x) for x in a if x >= 0), set(int(x) for x in b if x >= 0)
    union = sa | sb
    return float(len(sa & sb) / len(union)) if union else float("nan")


def mean_cross_dataset_jaccard(top: np.ndarray) -> float:
    """Mean Jaccard of same-behavior, same-layer top-k sets over all dataset pairs.

    Parameters
    ----------
    top : ndarray of shape (n_datasets, n_behaviors, n_layers, k)

    Returns
    -------
    float
        NaN with fewer than two datasets.
    """
    values = [jaccard(top[d1, b, layer], top[d2, b, layer])
              for d1, d2 in itertools.combinations(range(top.shape[0]), 2)
              for b in range(top.shape[1]) for layer in range(top.shape[2])
              if (top[d1, b, layer] >= 0).any() and (top[d2, b, layer] >= 0).any()]
    return float(np.mean(values)) if values else float("nan")


def jaccard_permutation_test(selected: np.ndarray, labels: np.ndarray, dataset: np.ndarray, *, n_experts: int,
                             k: int, n_permutations: int = 20, seed: int = 0) -> dict[str, float]:
    """Cross-dataset top-k Jaccard against a within-dataset label-permutation null.

    Returns
    -------
    dict
        ``observed``, ``null_mean``, ``null_std``, ``p_value`` (NaN with fewer than two datasets).
    """
    n_datasets = int(dataset.max()) + 1
    observed = mean_cross_dataset_jaccard(top_experts(
        risk_difference(selected, labels, dataset, n_experts=n_experts, n_datasets=n_datasets)["rd"], k))
    if n_datasets < 2:
        return {"observed": float("nan"), "null_mean": float("nan"), "null_std": float("nan"), "p_value": float("nan")}
    rng = np.random.default_rng(seed)
    null = []
    for _ in range(n_permutations):
        shuffled = labels.copy()
        for d in range(n_datasets):
            idx = np.flatnonzero(dataset == d)
            shuffled[idx] = rng.permutation(labels[idx])
        rd = risk_difference(selected, shuffled, dataset, n_experts=n_experts, n_datasets=n_datasets)["rd"]
        null.append(mean_cross_dataset_jaccard(top_experts(rd, k)))
    null_arr = np.asarray(null)
    p = (1 + int(np.sum(null_arr >= observed))) / (1 + n_permutations)
    return {"observed": observed, "null_mean": float(null_arr.mean()), "null_std": float(null_arr.std()),
            "p_value": float(p)}


def profile_correlation(rd: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Correlation of behavior RD profiles.

    Parameters
    ----------
    rd : ndarray of shape (n_datasets, n_behaviors, n_layers, n_experts)

    Returns
    -------
    corr : ndarray of shape (n_datasets * n_behaviors, n_datasets * n_behaviors)
        Pearson correlation of the flattened profiles (row ``d * n_behaviors + b``); NaN rows for
        absent behaviors.
    summary : dict
        ``same_behavior`` (same b, different datasets) and ``cross_behavior`` (different b) means.
    """
    n_d, n_b = rd.shape[:2]
    prof = rd.reshape(n_d * n_b, -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.corrcoef(prof)
    corr = np.atleast_2d(corr)
    same, cross = [], []
    for i, j in itertools.combinations(range(n_d * n_b), 2):
        if np.isnan(corr[i, j]):
            continue
        (d1, b1), (d2, b2) = divmod(i, n_b), divmod(j, n_b)
        if b1 == b2 and d1 != d2:
            same.append(corr[i, j])
        elif b1 != b2:
            cross.append(corr[i, j])
    return corr, {"same_behavior": float(np.mean(same)) if same else float("nan"),
                  "cross_behavior": float(np.mean(cross)) if cross else float("nan")}


def transfer_auc(selected: np.ndarray, labels: np.ndarray, dataset: np.ndarray, segment: np.ndarray,
                 top: np.ndarray, *, n_experts: int) -> list[dict[str, Any]]:
    """Rank target-dataset segments by the routing share of source-selected experts.

    Parameters
    ----------
    selected : ndarray of shape (n_tokens, n_layers, top_k)
    labels, dataset, segment : ndarray of shape (n_tokens,)
    top : ndarray of shape (n_datasets, n_behaviors, n_layers, k)
        Source expert sets (:func:`top_experts`).
    n_experts : int

    Returns
    -------
    list of dict
        ``source, target, layer (position), behavior, auc, n_pos, n_neg`` for every source != target
        pair (and source == target, marked in-dataset) where both classes occur.
    """
    from sklearn.metrics import roc_auc_score

    keys, inverse, counts = np.unique(segment, return_inverse=True, return_counts=True)
    seg_label = np.zeros(len(keys), dtype=np.int64)
    seg_label[inverse] = labels
    seg_dataset = np.zeros(len(keys), dtype=np.int64)
    seg_dataset[inverse] = dataset
    onehot_k = selected.shape[2]
    out = []
    n_d, n_b, n_layers = top.shape[:3]
    for layer in range(n_layers):
        onehot = selection_onehot(selected[:, layer:layer + 1], n_experts)[:, 0]  # [n_tokens, n_experts]
        for src, b in itertools.product(range(n_d), range(n_b)):
            experts = top[src, b, layer][top[src, b, layer] >= 0]
            if experts.size == 0:
                continue
            token_share = onehot[:, experts].sum(axis=1) / onehot_k
            seg_score = np.bincount(inverse, weights=token_share, minlength=len(keys)) / counts
            for tgt in range(n_d):
                mask = seg_dataset == tgt
                y = seg_label[mask] == b
                if y.all() or not y.any():
                    continue
                out.append({"source": src, "target": tgt, "layer": layer, "behavior": b,
                            "auc": float(roc_auc_score(y, seg_score[mask])), "n_pos": int(y.sum()),
                            "n_neg": int((~y).sum())})
    return out


@dataclass
class ExpertReport:
    """Everything ``ror experts`` writes."""

    rd: dict[str, np.ndarray]
    top: np.ndarray
    corr: np.ndarray
    corr_summary: dict[str, float]
    jaccard: dict[str, float]
    transfer: list[dict[str, Any]]
    dataset_names: list[str]
    layers: list[int]


def analyze(selected: np.ndarray, labels: np.ndarray, dataset: np.ndarray, segment: np.ndarray, *,
            dataset_names: Sequence[str], layers: Sequence[int], n_experts: int, k: int = 10,
            n_permutations: int = 20, seed: int = 0) -> ExpertReport:
    """Run every association analysis on labeled tokens (shapes as in :func:`risk_difference`)."""
    if k < 1 or k > n_experts:
        raise SteerError(f"top-k must be in 1..{n_experts}, got {k}")
    rd = risk_difference(selected, labels, dataset, n_experts=n_experts, n_datasets=len(dataset_names))
    top = top_experts(rd["rd"], k)
    corr, summary = profile_correlation(rd["rd"])
    jac = jaccard_permutation_test(selected, labels, dataset, n_experts=n_experts, k=k,
                                   n_permutations=n_permutations, seed=seed)
    transfer = transfer_auc(selected, labels, dataset, segment, top, n_experts=n_experts)
    return ExpertReport(rd, top, corr, summary, jac, transfer, list(dataset_names), list(layers))


def resolve_steer_size(steer_size: int | None, *, set_size: int, n_experts: int, router_top_k: int) -> int:
    """Experts per layer in the ``steer_suppress_*.json`` specs.

    Parameters
    ----------
    steer_size : int or None
        Asked for; ``None`` picks the default, ``0`` writes no spec.
    set_size : int
        Size of each behavior's expert set (``--top-k``).
    n_experts, router_top_k : int
        Routed experts per layer and experts the router selects per token.

    Returns
    -------
    int
        ``steer_size``, or by default the expert-set size capped so that ``router_top_k`` experts
        remain selectable (``min(set_size, n_experts - router_top_k)``).

    Raises
    ------
    InputError
        If suppressing ``steer_size`` experts leaves fewer than ``router_top_k`` to select.
    """
    from ..errors import InputError

    limit = n_experts - router_top_k
    if steer_size is None:
        return max(0, min(set_size, limit))
    if steer_size > limit:
        raise InputError(f"--steer-size {steer_size}: suppressing more than {limit} of {n_experts} experts leaves "
                         f"fewer than top-{router_top_k}")
    return steer_size


def set_size_warning(set_size: int, n_experts: int) -> str | None:
    """A warning when every expert is in every top-k set (Jaccard 1 and p = 1 by construction)."""
    if set_size >= n_experts:
        return (f"--top-k {set_size} >= {n_experts} experts per layer: every expert is in every set, so the Jaccard "
                f"overlap is 1 and its permutation p-value 1 by construction; choose --top-k below {n_experts}")
    return None


def write_report(report: ExpertReport, out_dir: str | Path, *, steer_size: int | None = None,  # noqa: C901  (one branch per optional label-noise column)
                 noise: Any = None) -> list[Path]:
    """Write the tables (CSV), plots (PNG) and steering specs (JSON) of an :class:`ExpertReport`.

    Files: ``risk_difference.csv`` (long format), ``top_experts.csv``, ``profile_correlation.csv``,
    ``jaccard.csv``, ``transfer_auc.csv``, ``rd_<dataset>.png`` (behaviors x experts at the layer
    with the largest |RD|), ``profile_correlation.png``, and for each behavior
    ``steer_suppress_<behavior>.json`` suppressing its ``steer_size`` top experts per layer
    (pooled over datasets, positive RD only) for ``ror steer``.

    With ``noise`` (:class:`~ror_annotate.steer.noise.ExpertNoise`): ``top_experts.csv`` adds
    ``label_noise_frequency`` (share of label resamples whose set keeps the expert), ``jaccard.csv``
    ``label_noise_lo`` / ``label_noise_hi`` for the observed Jaccard and the profile correlations, and
    ``transfer_auc.csv`` ``auc_noise_lo`` / ``auc_noise_hi`` / ``n_label_resamples`` (percentile
    intervals over the resamples; label noise only).

    Returns
    -------
    list of Path
        The files written.
    """
    import csv
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    names, layers = report.dataset_names, report.layers
    rd, p_b, p_d, counts = (report.rd[k] for k in ("rd", "p_behavior", "p_dataset", "counts"))

    def table(name: str, header: Sequence[str], rows: Any) -> None:
        path = out / name
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows)
        written.append(path)

    table("risk_difference.csv", ["dataset", "behavior", "layer", "expert", "rd", "p_selected_given_behavior",
                                  "p_selected", "n_tokens_behavior"],
          ((names[d], BEHAVIORS[b], layers[li], e, f"{rd[d, b, li, e]:.6g}", f"{p_b[d, b, li, e]:.6g}",
            f"{p_d[d, li, e]:.6g}", int(counts[d, b]))
           for d in range(rd.shape[0]) for b in range(rd.shape[1]) for li in range(rd.shape[2])
           for e in range(rd.shape[3])))
    freq = None if noise is None else noise.stability["frequency"]
    table("top_experts.csv", ["dataset", "behavior", "layer", "rank", "expert", "rd",
                              *([] if freq is None else ["label_noise_frequency"])],
          ((names[d], BEHAVIORS[b], layers[li], r, int(e), f"{rd[d, b, li, e]:.6g}",
            *([] if freq is None else [f"{freq[d, b, li, e]:.4f}"]))
           for d in range(rd.shape[0]) for b in range(rd.shape[1]) for li in range(rd.shape[2])
           for r, e in enumerate(report.top[d, b, li]) if e >= 0))
    labels = profile_labels(report)
    table("profile_correlation.csv", ["profile", *labels],
          ([labels[i], *(f"{v:.4f}" for v in report.corr[i])] for i in range(len(labels))))
    if noise is None:
        table("jaccard.csv", ["statistic", "value"],
              [*((k, f"{v:.4f}") for k, v in report.jaccard.items()),
               *((f"profile_corr_{k}", f"{v:.4f}") for k, v in report.corr_summary.items())])
        table("transfer_auc.csv", ["source", "target", "layer", "behavior", "auc", "n_pos", "n_neg"],
              ((names[r["source"]], names[r["target"]], layers[r["layer"]], BEHAVIORS[r["behavior"]], f"{r['auc']:.4f}",
                r["n_pos"], r["n_neg"]) for r in report.transfer))
    else:
        from .noise import interval

        lvl = noise.level()
        ivs = {"observed": interval(noise.jaccard_cross_dataset, lvl),
               **{f"profile_corr_{k}": interval(v, lvl) for k, v in noise.profile_corr.items()}}

        def cells(key: str) -> list[str]:
            iv = ivs.get(key)
            return ["", ""] if iv is None else [f"{iv['lo']:.4f}", f"{iv['hi']:.4f}"]

        table("jaccard.csv", ["statistic", "value", "label_noise_lo", "label_noise_hi"],
              [*((k, f"{v:.4f}", *cells(k)) for k, v in report.jaccard.items()),
               *((f"profile_corr_{k}", f"{v:.4f}", *cells(f"profile_corr_{k}")) for k, v in report.corr_summary.items())])
        auc_iv = {key: interval(v, lvl) for key, v in noise.transfer.items()}
        table("transfer_auc.csv", ["source", "target", "layer", "behavior", "auc", "n_pos", "n_neg", "auc_noise_lo",
                                   "auc_noise_hi", "n_label_resamples"],
              ((names[r["source"]], names[r["target"]], layers[r["layer"]], BEHAVIORS[r["behavior"]], f"{r['auc']:.4f}",
                r["n_pos"], r["n_neg"],
                *((f"{iv['lo']:.4f}", f"{iv['hi']:.4f}", iv["n"]) if (iv := auc_iv.get(
                    (r["source"], r["target"], r["layer"], r["behavior"]))) else ("", "", 0)))
               for r in report.transfer))
    written += _plots(report, out)
    if steer_size:
        pooled = risk_difference_pooled(report)
        for b, behavior in enumerate(BEHAVIORS):
            if np.isnan(pooled[b]).all():
                continue
            suppress = {}
            for li, layer in enumerate(layers):
                ids = [int(e) for e in top_experts(pooled[b, li], steer_size) if e >= 0 and pooled[b, li, e] > 0]
                if ids:
                    suppress[str(layer)] = ids
            path = out / f"steer_suppress_{behavior}.json"
            path.write_text(json.dumps({"activate": {}, "suppress": suppress, "eps": 0.01,
                                        "meta": {"behavior": behavior, "from": "risk difference, pooled datasets"}},
                                       indent=1))
            written.append(path)
    return written


def risk_difference_pooled(report: ExpertReport) -> np.ndarray:
    """Token-weighted mean RD over datasets, ``[n_behaviors, n_layers, n_experts]`` (NaN if absent)."""
    rd, counts = report.rd["rd"], report.rd["counts"].astype(np.float64)
    weights = np.where(np.isnan(rd), 0.0, counts[:, :, None, None])
    total = weights.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, np.nansum(np.nan_to_num(rd) * weights, axis=0) / total, np.nan)


def profile_labels(report: ExpertReport) -> list[str]:
    """``"dataset:behavior"`` of each row (and column) of ``report.corr``, in its order (row ``d * n_behaviors + b``)."""
    n_d, n_b = report.rd["rd"].shape[:2]
    return [f"{report.dataset_names[d]}:{BEHAVIORS[b]}" for d in range(n_d) for b in range(n_b)]


def _plots(report: ExpertReport, out: Path) -> list[Path]:
    # figures with their own Agg canvas: no pyplot, no global backend switch (a notebook's stays as it was)
    import matplotlib

    from ..agreement_report import _figure

    paths = []
    rd = report.rd["rd"]
    for d, (name, stem) in enumerate(zip(report.dataset_names, _file_stems(report.dataset_names))):
        with np.errstate(invalid="ignore"):
            strength = np.nanmax(np.abs(rd[d]), axis=(0, 2)) if not np.isnan(rd[d]).all() else np.zeros(rd.shape[2])
        li = int(np.nanargmax(strength)) if not np.isnan(strength).all() else 0
        fig = _figure(max(6, rd.shape[3] * 0.12), 3.2)
        ax = fig.subplots()
        lim = float(np.nanmax(np.abs(rd[d, :, li]))) if not np.isnan(rd[d, :, li]).all() else 1.0
        lim = lim or 1.0  # all zero: a symmetric scale still
        # a behavior absent from the dataset (RD NaN) is grey, never the white of RD = 0
        cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#b0b0b0")
        im = ax.imshow(rd[d, :, li], aspect="auto", cmap=cmap, vmin=-lim, vmax=lim, interpolation="nearest")
        ax.set_yticks(range(len(BEHAVIORS)), BEHAVIORS)
        ax.set_ylabel("behavior")
        absent = [BEHAVIORS[b] for b in range(len(BEHAVIORS)) if np.isnan(rd[d, b, li]).all()]
        ax.set_xlabel("expert" + (f" (grey: {', '.join(absent)} absent from this dataset)" if absent else ""))
        ax.set_title(f"Risk difference per expert, {name}, layer {report.layers[li]} (the layer of largest |RD|)", fontsize=9)
        fig.colorbar(im, ax=ax, label="RD = P(expert | behavior) - P(expert)")
        fig.tight_layout()
        path = out / f"rd_{stem}.png"
        fig.savefig(path, dpi=120)
        paths.append(path)
    labels = profile_labels(report)
    side = max(6.0, 0.32 * len(labels) + 2.5)
    fig = _figure(side + 1.0, side)
    ax = fig.subplots()
    im = ax.imshow(report.corr, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("profile (dataset:behavior)")
    ax.set_ylabel("profile (dataset:behavior)")
    ax.set_title("behavior profile correlation (Pearson r of risk-difference profiles)")
    fig.colorbar(im, ax=ax, label="Pearson r", shrink=0.8)
    fig.tight_layout()
    path = out / "profile_correlation.png"
    fig.savefig(path, dpi=120)
    paths.append(path)
    return paths


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "dataset"


def _file_stems(names: Sequence[str]) -> list[str]:
    """File-safe stems, one per dataset name, distinct even where :func:`_safe` maps two names alike."""
    stems: list[str] = []
    taken: set[str] = set()
    for i, name in enumerate(names):
        base = stem = _safe(name)
        n = i
        while stem.lower() in taken:  # case-insensitive file systems too
            stem, n = f"{base}_{n}", n + 1
        taken.add(stem.lower())
        stems.append(stem)
    return stems


__all__ = [
    "resolve_steer_size",
    "set_size_warning",
    "ExpertReport",
    "analyze",
    "jaccard",
    "jaccard_permutation_test",
    "mean_cross_dataset_jaccard",
    "profile_correlation",
    "risk_difference",
    "risk_difference_pooled",
    "selection_onehot",
    "top_experts",
    "transfer_auc",
    "write_report",
]
