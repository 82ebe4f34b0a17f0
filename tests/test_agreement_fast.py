"""Agreement at corpus speed gives the numbers of the per-item computation it replaced.

The multi-rater sufficient statistics are now summed per distinct count vector
(:func:`~ror_annotate.agreement.estimators._multi_rater_stats`); the per-item sums as first written
are kept as :func:`~ror_annotate.agreement.estimators._multi_rater_stats_items`, the reference here.
Every point estimate and every bootstrap replicate must agree to 1e-12, and a few replicates are
checked against krippendorff / scikit-learn on the resampled rows written out.
"""

from __future__ import annotations

from itertools import combinations

import krippendorff
import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from ror_annotate.agreement import Ratings, agreement, trace_bootstrap_counts
from ror_annotate.agreement import analysis as analysis_mod
from ror_annotate.agreement import estimators
from ror_annotate.agreement.metrics import disagreement_pairs, majority_labels

CATS = ("a", "b", "c", "d")


def _ratings(seed: int, n_items: int = 600, n_raters: int = 5, n_groups: int = 30) -> Ratings:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, len(CATS), n_items)
    codes = np.where(rng.random((n_items, n_raters)) < 0.35, rng.integers(0, len(CATS), (n_items, n_raters)), truth[:, None])
    codes = np.where(rng.random((n_items, n_raters)) < 0.2, -1, codes)
    groups = rng.integers(0, n_groups, n_items).astype(np.int64)
    weights = rng.integers(1, 40, n_items).astype(float)
    return Ratings(codes, CATS, tuple(f"r{j}" for j in range(n_raters)), tuple(f"i{k}" for k in range(n_items)),
                   groups, tuple(f"t{g}" for g in range(n_groups)), weights)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pattern_sums_equal_item_sums(seed: int) -> None:
    r = _ratings(seed)
    counts = r.counts()
    for w in (np.ones(r.n_items), r.weights):
        fast = estimators._multi_rater_stats(counts, w, r.groups, len(r.group_ids))
        slow = estimators._multi_rater_stats_items(counts, w, r.groups, len(r.group_ids))
        np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-12)


def _result_numbers(res) -> dict[str, np.ndarray]:
    out = {k: np.asarray(v, dtype=float) for k, v in res.resamples.items()}
    for weighting, block in res.statistics.items():
        for name, est in block.items():
            if hasattr(est, "value"):
                out[f"{weighting}/{name}/point"] = np.array([est.value, est.ci_low, est.ci_high])
    return out


@pytest.mark.parametrize("seed", [0, 3])
def test_agreement_equals_the_per_item_reference(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    r = _ratings(seed)
    fast = _result_numbers(agreement(r, n_resamples=200, seed=seed, reference="majority"))
    monkeypatch.setattr(analysis_mod, "_multi_rater_stats", estimators._multi_rater_stats_items)
    slow = _result_numbers(agreement(r, n_resamples=200, seed=seed, reference="majority"))
    assert fast.keys() == slow.keys() and len(fast) > 10
    for key in fast:
        np.testing.assert_allclose(fast[key], slow[key], rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=key)


def test_fallback_paths_give_the_same_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    r = _ratings(4)
    counts = r.counts()
    want = estimators._multi_rater_stats_items(counts, r.weights, r.groups, len(r.group_ids))
    monkeypatch.setattr(estimators, "_MAX_PATTERN_CELLS", 1)  # too many groups x patterns: per item
    np.testing.assert_array_equal(estimators._multi_rater_stats(counts, r.weights, r.groups, len(r.group_ids)), want)
    half = counts / 2  # non-integer counts: per item
    np.testing.assert_array_equal(estimators._multi_rater_stats(half, r.weights, r.groups, len(r.group_ids)),
                                  estimators._multi_rater_stats_items(half, r.weights, r.groups, len(r.group_ids)))
    empty = estimators._multi_rater_stats(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), 2)
    assert empty.shape == (2, 3 + 4 + 16) and not empty.any()  # columns 2 + q + 1 + q*q


def test_bootstrap_replicates_match_the_reference_packages() -> None:
    r = _ratings(5, n_items=300, n_raters=4, n_groups=12)
    res = agreement(r, n_resamples=6, seed=7, token_weighted=False)
    draws = trace_bootstrap_counts(len(r.group_ids), n_resamples=6, seed=7)
    members = [np.flatnonzero(r.groups == g) for g in range(len(r.group_ids))]
    for b, counts in enumerate(draws):
        rows = np.concatenate([members[g] for g in range(len(members)) for _ in range(counts[g])])
        data = r.codes[rows].astype(float)
        data[data < 0] = np.nan
        want = krippendorff.alpha(reliability_data=data.T, level_of_measurement="nominal", value_domain=list(range(len(CATS))))
        assert res.resamples["segment/krippendorff_alpha"][b] == pytest.approx(want, abs=1e-12)
        for i, j in combinations(range(r.n_annotators), 2):
            both = ~np.isnan(data[:, i]) & ~np.isnan(data[:, j])
            k = cohen_kappa_score(data[both, i], data[both, j], labels=list(range(len(CATS))))
            assert res.resamples[f"segment/cohen_kappa/r{i}|r{j}"][b] == pytest.approx(k, abs=1e-12)


def test_disagreement_examples_are_the_first_distinct_items() -> None:
    r = _ratings(6)
    q = r.n_categories
    for top in disagreement_pairs(r, top=5, n_examples=3):
        a, b = CATS.index(top["labels"][0]), CATS.index(top["labels"][1])
        items = []
        for i in range(r.n_annotators):
            for j in range(i + 1, r.n_annotators):
                x, y = r.codes[:, i], r.codes[:, j]
                hit = (x >= 0) & (y >= 0) & (np.minimum(x, y) * q + np.maximum(x, y) == a * q + b) & (x != y)
                items += np.nonzero(hit)[0].tolist()
        assert top["examples"] == [r.item_ids[k] for k in list(dict.fromkeys(items))[:3]]
    assert all(p["examples"] == [] for p in disagreement_pairs(r, top=3, n_examples=0))


@pytest.mark.parametrize("pool", [None, ("r0", "r1", "r2"), ("r1",), ("r3", "r4")])
def test_majority_references_from_one_count_table_equal_majority_labels(pool: tuple[str, ...] | None) -> None:
    r = _ratings(8, n_raters=5)
    got = analysis_mod._references(r, list(r.annotators), "majority", pool, None)
    for a in r.annotators:
        members = [m for m in (pool if pool is not None else r.annotators) if m != a]
        want = majority_labels(r, annotators=members) if members else None
        if want is None:
            assert got[a] is None
        else:
            np.testing.assert_array_equal(got[a], want)
