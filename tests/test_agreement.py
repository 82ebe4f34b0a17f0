"""Agreement statistics against independent references.

References: the ``krippendorff`` package, statsmodels' ``fleiss_kappa``, scikit-learn's
``cohen_kappa_score`` / ``f1_score`` / ``precision_recall_fscore_support`` / ``confusion_matrix``, and
hand calculations written out below for Gwet's AC1 and Fleiss' kappa with missing labels (Gwet 2014,
ch. 2). Pitfall files AGR-01..03 give exact hand-checked values.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import combinations

import krippendorff
import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, f1_score, precision_recall_fscore_support
from sklearn.metrics import confusion_matrix as sk_confusion_matrix
from statsmodels.stats.inter_rater import fleiss_kappa as sm_fleiss_kappa

from ror_annotate import agreement as agr
from ror_annotate.agreement import Ratings
from ror_annotate.errors import AgreementError

from .conftest import load_pitfall as _pitfall  # the tests' own copies of shared/pitfalls/AGR-0*.json

TOL = 1e-9


# ----------------------------------------------------------------------------- random data
def random_ratings(seed: int, *, n_items=80, n_raters=3, q=4, p_missing=0.2, n_groups=12, noise=0.4) -> Ratings:
    """Correlated labels: each item has a true class; each rater keeps it with prob 1-noise."""
    rng = np.random.default_rng(seed)
    cats = [f"c{k}" for k in range(q)]
    truth = rng.integers(0, q, n_items)
    codes = np.where(rng.random((n_items, n_raters)) < noise, rng.integers(0, q, (n_items, n_raters)), truth[:, None])
    codes = np.where(rng.random((n_items, n_raters)) < p_missing, -1, codes)
    labels = np.where(codes >= 0, np.array(cats, dtype=object)[np.maximum(codes, 0)], None)
    groups = [f"t{g}" for g in rng.integers(0, n_groups, n_items)]
    weights = rng.integers(0, 9, n_items).astype(float)
    return Ratings.from_matrix(labels, categories=cats, groups=groups, weights=weights,
                               annotators=[f"r{j}" for j in range(n_raters)])


def labels_of(r: Ratings, j: int) -> list:
    return [r.categories[c] if c >= 0 else None for c in r.codes[:, j]]


# ----------------------------------------------------------------------------- hand references
def hand_gwet(items: list[list[str]], categories: list[str]) -> tuple[float, float, float]:
    """(percent agreement, Fleiss kappa, AC1) by Gwet (2014) ch. 2, written with plain loops.

    ``items``: the labels each item received (missing ones already dropped).
    """
    q = len(categories)
    rated = [labs for labs in items if len(labs) >= 1]
    pairable = [labs for labs in items if len(labs) >= 2]
    pa = sum(
        sum(c * (c - 1) for c in Counter(labs).values()) / (len(labs) * (len(labs) - 1)) for labs in pairable
    ) / len(pairable)
    pi = {k: sum(Counter(labs)[k] / len(labs) for labs in rated) / len(rated) for k in categories}
    pe_fleiss = sum(p * p for p in pi.values())
    pe_ac1 = sum(p * (1 - p) for p in pi.values()) / (q - 1)
    return pa, (pa - pe_fleiss) / (1 - pe_fleiss), (pa - pe_ac1) / (1 - pe_ac1)


def item_lists(r: Ratings) -> list[list[str]]:
    return [[r.categories[c] for c in row if c >= 0] for row in r.codes]


def krippendorff_ref(r: Ratings, weights=None) -> float:
    data = np.where(r.codes >= 0, r.codes, np.nan).astype(float)
    if weights is not None:
        data = np.repeat(data, np.asarray(weights, dtype=int), axis=0)
    return krippendorff.alpha(reliability_data=data.T, level_of_measurement="nominal", value_domain=list(range(r.n_categories)))


# ----------------------------------------------------------------------------- pitfalls
def test_agr01_undefined_and_degenerate_cases():
    case = _pitfall("AGR-01")
    cats = case["input"]["categories"]
    sub = case["input"]["subcases"]
    exp = case["expected"]

    const = Ratings.from_items(sub["constant"]["items"], categories=cats)
    assert agr.percent_agreement(const).value == exp["constant"]["observed_agreement"]
    for stat in (agr.krippendorff_alpha, agr.fleiss_kappa):
        est = stat(const)
        assert math.isnan(est.value) and est.reason == "single_category"
    k = agr.cohen_kappa(labels_of(const, 0), labels_of(const, 1), categories=cats)
    assert math.isnan(k.value) and k.reason == "single_category"
    assert agr.gwet_ac1(const).value == exp["constant"]["gwet_ac1"]

    sanity = Ratings.from_items(sub["sanity"]["items"], categories=cats)
    k = agr.cohen_kappa(labels_of(sanity, 0), labels_of(sanity, 1), categories=cats)
    assert k.value == pytest.approx(exp["sanity"]["cohen_kappa"], abs=TOL)
    assert agr.percent_agreement(sanity).value == pytest.approx(exp["sanity"]["observed_agreement"], abs=TOL)

    one = Ratings.from_items(sub["one_disagreement"]["items"], categories=cats)
    alpha = agr.krippendorff_alpha(one)
    assert alpha.value == pytest.approx(exp["one_disagreement"]["krippendorff_alpha"], abs=TOL)
    assert alpha.n_items == 22  # pairable values, from the hand check

    swapped = Ratings.from_items(sub["swapped"]["items"], categories=cats)
    assert agr.krippendorff_alpha(swapped).value == pytest.approx(exp["swapped"]["krippendorff_alpha"], abs=TOL)
    k = agr.cohen_kappa(labels_of(swapped, 0), labels_of(swapped, 1), categories=cats)
    assert k.value == pytest.approx(exp["swapped"]["cohen_kappa"], abs=TOL)

    single = Ratings.from_items(sub["single_rater"]["items"], categories=cats)
    for stat in (agr.krippendorff_alpha, agr.fleiss_kappa, agr.gwet_ac1, agr.percent_agreement):
        est = stat(single)
        assert math.isnan(est.value) and est.reason == "no_pairable_items"
    with pytest.raises(AgreementError, match="at least two annotators"):
        agr.agreement(single, n_resamples=0)


def test_agr02_krippendorff_published_example_with_missing_data():
    case = _pitfall("AGR-02")
    items = case["input"]["items"]
    cats = case["input"]["categories"]
    r = Ratings.from_items(items, categories=cats)
    est = agr.krippendorff_alpha(r)
    assert est.value == pytest.approx(case["expected"]["krippendorff_alpha_nominal"], abs=TOL)
    assert est.value == pytest.approx(113 / 152, abs=TOL)
    assert est.n_items == case["expected"]["pairable_values"]
    # orientation: coders x units gives the same alpha when told which is which
    coders = ["c1", "c2", "c3", "c4"]
    units = list(items)
    by_coder = [[items[u][c] for u in units] for c in coders]
    transposed = Ratings.from_matrix(by_coder, categories=cats, orient="annotators_x_items")
    assert agr.krippendorff_alpha(transposed).value == pytest.approx(113 / 152, abs=TOL)
    assert agr.krippendorff_alpha(Ratings.from_matrix(np.array(by_coder, dtype=object).T, categories=cats)).value == pytest.approx(113 / 152, abs=TOL)


def test_agr03_fleiss_raw_labels_are_primary_count_table_only_by_name():
    case = _pitfall("AGR-03")
    cats = case["input"]["categories"]
    raw = Ratings.from_items(case["input"]["raw"]["items"], categories=cats)
    assert agr.fleiss_kappa(raw).value == pytest.approx(case["expected"]["raw_fleiss_kappa"], abs=TOL)
    table = case["input"]["count_table_misread"]["table_subjects_x_categories"]
    assert agr.fleiss_kappa(count_table=table).value == pytest.approx(case["expected"]["count_table_fleiss_kappa"], abs=TOL)
    # a count table passed where labels belong is refused, not misread as labels
    with pytest.raises(AgreementError, match="not one of the declared categories"):
        agr.fleiss_kappa(table, categories=case["input"]["count_table_misread"]["categories"])
    with pytest.raises(AgreementError, match="exactly one"):
        agr.fleiss_kappa(raw, count_table=table)
    unanimous = Ratings.from_items(case["input"]["unanimous"]["items"], categories=cats)
    est = agr.fleiss_kappa(unanimous)
    assert math.isnan(est.value) and est.reason == "single_category"
    assert agr.percent_agreement(unanimous).value == 1.0


# ----------------------------------------------------------------------------- references on random data
SEEDS = [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", SEEDS)
def test_krippendorff_matches_package(seed):
    r = random_ratings(seed, n_raters=2 + seed % 3)
    assert agr.krippendorff_alpha(r).value == pytest.approx(krippendorff_ref(r), abs=TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_fleiss_matches_statsmodels_on_complete_data(seed):
    r = random_ratings(seed, p_missing=0.0, n_raters=3 + seed % 3)
    assert agr.fleiss_kappa(r).value == pytest.approx(sm_fleiss_kappa(r.counts(), method="fleiss"), abs=TOL)
    assert agr.fleiss_kappa(count_table=r.counts()).value == pytest.approx(sm_fleiss_kappa(r.counts()), abs=TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_fleiss_ac1_percent_match_hand_calculation_with_missing(seed):
    r = random_ratings(seed, n_raters=4, p_missing=0.35)
    pa, fk, ac1 = hand_gwet(item_lists(r), list(r.categories))
    assert agr.percent_agreement(r).value == pytest.approx(pa, abs=TOL)
    assert agr.fleiss_kappa(r).value == pytest.approx(fk, abs=TOL)
    assert agr.gwet_ac1(r).value == pytest.approx(ac1, abs=TOL)


def test_ac1_two_raters_textbook_formula():
    # Gwet (2008) two-rater form: pe = 2 q^-1... written as (1/(q-1)) sum_k pi_k (1 - pi_k), pi_k = (p_k,A + p_k,B)/2
    a = ["x", "x", "y", "x", "z", "y", "x", "x"]
    b = ["x", "y", "y", "x", "z", "z", "x", "y"]
    q = 3
    pa = sum(u == v for u, v in zip(a, b)) / len(a)
    pi = {k: (a.count(k) + b.count(k)) / (2 * len(a)) for k in "xyz"}
    pe = sum(p * (1 - p) for p in pi.values()) / (q - 1)
    r = Ratings.from_matrix(np.array([a, b], dtype=object).T, categories=["x", "y", "z"])
    assert agr.gwet_ac1(r).value == pytest.approx((pa - pe) / (1 - pe), abs=TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_cohen_kappa_matches_sklearn_per_pair(seed):
    r = random_ratings(seed, n_raters=3)
    for i, j in combinations(range(3), 2):
        a, b = labels_of(r, i), labels_of(r, j)
        both = [k for k in range(r.n_items) if a[k] is not None and b[k] is not None]
        ref = cohen_kappa_score([a[k] for k in both], [b[k] for k in both], labels=list(r.categories))
        assert agr.cohen_kappa(a, b, categories=r.categories).value == pytest.approx(ref, abs=TOL)
        w = r.weights
        ref_w = cohen_kappa_score([a[k] for k in both], [b[k] for k in both], labels=list(r.categories), sample_weight=w[both])
        assert agr.cohen_kappa(a, b, categories=r.categories, sample_weight=w).value == pytest.approx(ref_w, abs=TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_per_class_matches_sklearn(seed):
    r = random_ratings(seed, n_raters=2, q=5, noise=0.6)
    y, p = labels_of(r, 0), labels_of(r, 1)
    both = [k for k in range(r.n_items) if y[k] is not None and p[k] is not None]
    yt, yp = [y[k] for k in both], [p[k] for k in both]
    labels = list(r.categories)
    scores = agr.per_class_scores(y, p, categories=labels)
    prec, rec, f1, support = precision_recall_fscore_support(yt, yp, labels=labels, zero_division=np.nan)
    for k, c in enumerate(labels):
        got = scores["classes"][c]
        for name, ref in (("precision", prec[k]), ("recall", rec[k]), ("f1", f1[k])):
            assert (math.isnan(ref) and not got[name].defined) or got[name].value == pytest.approx(ref, abs=TOL)
        assert got["support"] == support[k]
        ovr = cohen_kappa_score([t == c for t in yt], [s == c for s in yp])
        assert (math.isnan(ovr) and not got["kappa"].defined) or got["kappa"].value == pytest.approx(ovr, abs=TOL)
    assert scores["macro_f1"].value == pytest.approx(f1_score(yt, yp, labels=labels, average="macro", zero_division=np.nan), abs=TOL)
    np.testing.assert_allclose(agr.confusion_matrix(y, p, categories=labels), sk_confusion_matrix(yt, yp, labels=labels), atol=0)


def test_per_class_undefined_reasons():
    # reference never uses "c", annotator never predicts "b", nobody uses "d"
    y = ["a", "a", "b", "b"]
    p = ["a", "a", "a", "c"]
    s = agr.per_class_scores(y, p, categories=["a", "b", "c", "d"])["classes"]
    assert s["b"]["precision"].reason == "no_predictions" and s["b"]["recall"].value == 0.0 and s["b"]["f1"].value == 0.0
    assert s["c"]["recall"].reason == "class_absent_in_reference"
    assert s["d"]["f1"].reason == "class_absent" and s["d"]["kappa"].reason == "class_absent"
    # macro-F1 averages the classes with a defined F1, as sklearn with zero_division=nan
    assert agr.per_class_scores(y, p, categories=["a", "b", "c", "d"])["macro_f1"].value == pytest.approx(
        f1_score(y, p, labels=["a", "b", "c", "d"], average="macro", zero_division=np.nan), abs=TOL
    )


# ----------------------------------------------------------------------------- degenerate inputs
def test_no_overlap_and_annotator_without_labels():
    a = ["x", "y", None, None]
    b = [None, None, "x", "y"]
    est = agr.cohen_kappa(a, b, categories=["x", "y"])
    assert math.isnan(est.value) and est.reason == "no_overlap"
    c = [None] * 4
    r = Ratings.from_matrix(np.array([a, b, c], dtype=object).T, categories=["x", "y"], annotators=["a", "b", "c"])
    assert agr.krippendorff_alpha(r).reason == "no_pairable_items"
    with pytest.raises(AgreementError, match="at least two annotators"):
        agr.agreement(r.subset_annotators(["a", "c"]), n_resamples=0)
    # with a third annotator overlapping both, the empty one only yields nan pairs
    d = ["x", "y", "x", "x"]
    r = Ratings.from_matrix(np.array([a, b, c, d], dtype=object).T, categories=["x", "y"], annotators=["a", "b", "c", "d"])
    res = agr.agreement(r, n_resamples=20).to_dict()
    pairs = {(k["annotator_a"], k["annotator_b"]): k for k in res["cohen_kappa"]}
    assert pairs[("a", "c")]["value"] is None and pairs[("a", "c")]["reason"] == "no_overlap"
    assert pairs[("a", "d")]["value"] == 1.0
    json.dumps(res, allow_nan=False)


def test_one_declared_category_and_unknown_label_raise():
    with pytest.raises(AgreementError, match="at least two declared categories"):
        Ratings.from_matrix([["a", "a"]], categories=["a"])
    with pytest.raises(AgreementError, match=r"label 'z'.*not one of the declared categories"):
        Ratings.from_matrix([["a", "z"]], categories=["a", "b"])
    with pytest.raises(AgreementError, match="labeled item 'i1' twice"):
        Ratings.from_long(["i1", "i1"], ["r", "r"], ["a", "b"], categories=["a", "b"])


# ----------------------------------------------------------------------------- weights = frequency weights
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_token_weighting_equals_repeating_items(seed):
    r = random_ratings(seed, n_raters=3)
    w = r.weights.astype(int)
    rep = Ratings.from_matrix(
        np.repeat(np.where(r.codes >= 0, np.array(r.categories, dtype=object)[np.maximum(r.codes, 0)], None), w, axis=0),
        categories=r.categories,
    )
    assert agr.krippendorff_alpha(r, sample_weight=w).value == pytest.approx(krippendorff_ref(r, w), abs=TOL)
    for stat in (agr.percent_agreement, agr.fleiss_kappa, agr.gwet_ac1):
        assert stat(r, sample_weight=w).value == pytest.approx(stat(rep).value, abs=TOL)
    pa, fk, ac1 = hand_gwet(item_lists(rep), list(r.categories))
    assert agr.gwet_ac1(r, sample_weight=w).value == pytest.approx(ac1, abs=TOL)
    res = agr.agreement(r, n_resamples=0)
    assert res.statistics["token"]["krippendorff_alpha"].value == pytest.approx(krippendorff_ref(r, w), abs=TOL)


# ----------------------------------------------------------------------------- bootstrap
def _resampled(r: Ratings, counts: np.ndarray) -> tuple[Ratings, np.ndarray]:
    """The data of one bootstrap resample, written out: each trace's items repeated counts[g] times."""
    rows = np.concatenate([np.flatnonzero(r.groups == g) for g in range(len(r.group_ids)) for _ in range(counts[g])])
    labels = np.where(r.codes >= 0, np.array(r.categories, dtype=object)[np.maximum(r.codes, 0)], None)[rows]
    return Ratings.from_matrix(labels, categories=r.categories, annotators=r.annotators), r.weights[rows]


def test_bootstrap_resamples_whole_traces_and_match_references():
    r = random_ratings(7, n_items=120, n_raters=3, n_groups=15)
    res = agr.agreement(r, n_resamples=6, seed=11, reference="majority")
    draws = agr.trace_bootstrap_counts(len(r.group_ids), n_resamples=6, seed=11)
    assert draws.shape == (6, 15) and (draws.sum(1) == 15).all()
    for b in range(6):
        rb, wb = _resampled(r, draws[b])
        assert res.resamples["segment/krippendorff_alpha"][b] == pytest.approx(krippendorff_ref(rb), abs=TOL)
        assert res.resamples["token/krippendorff_alpha"][b] == pytest.approx(krippendorff_ref(rb, wb), abs=TOL)
        pa, fk, ac1 = hand_gwet(item_lists(rb), list(r.categories))
        assert res.resamples["segment/fleiss_kappa"][b] == pytest.approx(fk, abs=TOL)  # by hand, not agr.fleiss_kappa
        assert res.resamples["segment/gwet_ac1"][b] == pytest.approx(ac1, abs=TOL)
        assert res.resamples["segment/percent_agreement"][b] == pytest.approx(pa, abs=TOL)
        a, c = labels_of(rb, 0), labels_of(rb, 2)
        both = [k for k in range(rb.n_items) if a[k] is not None and c[k] is not None]
        ref = cohen_kappa_score([a[k] for k in both], [c[k] for k in both], labels=list(r.categories))
        assert res.resamples["segment/cohen_kappa/r0|r2"][b] == pytest.approx(ref, abs=TOL)


def test_bootstrap_interval_is_seeded_and_brackets_estimate():
    r = random_ratings(3, n_items=400, n_groups=40)
    one = agr.agreement(r, n_resamples=300, seed=5).to_dict()
    two = agr.agreement(r, n_resamples=300, seed=5).to_dict()
    other = agr.agreement(r, n_resamples=300, seed=6).to_dict()
    assert one["krippendorff_alpha"] == two["krippendorff_alpha"]
    assert one["krippendorff_alpha"]["ci_low"] != other["krippendorff_alpha"]["ci_low"]
    for key in ("percent_agreement", "fleiss_kappa", "krippendorff_alpha", "gwet_ac1"):
        e = one[key]
        assert e["ci_low"] < e["value"] < e["ci_high"] and e["n_resamples"] == 300
    # percentile interval by hand from the stored resamples
    res = agr.agreement(r, n_resamples=300, seed=5)
    samples = res.resamples["segment/krippendorff_alpha"]
    assert one["krippendorff_alpha"]["ci_low"] == pytest.approx(np.quantile(samples, 0.025), abs=TOL)
    assert one["krippendorff_alpha"]["ci_high"] == pytest.approx(np.quantile(samples, 0.975), abs=TOL)


def test_trace_bootstrap_wider_than_segment_bootstrap_when_traces_cluster():
    # each trace is internally consistent but traces differ a lot: resampling segments would understate
    rng = np.random.default_rng(0)
    rows, groups = [], []
    for t in range(30):
        noise = rng.choice([0.05, 0.9])
        for _ in range(40):
            truth = rng.integers(0, 3)
            rows.append([truth if rng.random() > noise else rng.integers(0, 3) for _ in range(2)])
            groups.append(f"t{t}")
    labels = np.array(rows).astype(str)
    by_trace = agr.agreement(Ratings.from_matrix(labels, categories=["0", "1", "2"], groups=groups), n_resamples=400).to_dict()
    by_item = agr.agreement(Ratings.from_matrix(labels, categories=["0", "1", "2"]), n_resamples=400).to_dict()
    width = lambda d: d["krippendorff_alpha"]["ci_high"] - d["krippendorff_alpha"]["ci_low"]  # noqa: E731
    assert width(by_trace) > 1.5 * width(by_item)


# ----------------------------------------------------------------------------- invariances over every statistic
def _multi(stat):
    return lambda r: np.array([stat(r).value])


def _pairwise(r: Ratings) -> dict:
    res = agr.agreement(r, n_resamples=0)
    return {frozenset((k["annotator_a"], k["annotator_b"])): k["value"] for k in res.to_dict()["cohen_kappa"]}


def _per_class(r: Ratings) -> dict:
    res = agr.agreement(r, n_resamples=0, reference="majority").to_dict()["per_class"]["annotators"]
    return {(a, c, m): v["classes"][c][m]["value"] for a, v in res.items() for c in v["classes"] for m in ("precision", "recall", "f1", "kappa")} | {
        (a, "macro_f1"): v["macro_f1"]["value"] for a, v in res.items()
    }


STATISTICS = {
    "percent_agreement": _multi(agr.percent_agreement),
    "fleiss_kappa": _multi(agr.fleiss_kappa),
    "krippendorff_alpha": _multi(agr.krippendorff_alpha),
    "gwet_ac1": _multi(agr.gwet_ac1),
    "cohen_kappa_pairs": _pairwise,
    "per_class_vs_majority": _per_class,
}


def _permute_raters(r: Ratings, perm) -> Ratings:
    return Ratings(r.codes[:, perm], r.categories, tuple(r.annotators[p] for p in perm), r.item_ids, r.groups, r.group_ids, r.weights)


def _permute_labels(r: Ratings, perm) -> Ratings:
    # category k is renamed to the name of category perm[k], and the declared order is shuffled too
    new_names = [r.categories[p] for p in perm]
    labels = np.where(r.codes >= 0, np.array(new_names, dtype=object)[np.maximum(r.codes, 0)], None)
    return Ratings.from_matrix(labels, categories=list(reversed(r.categories)), annotators=r.annotators,
                               item_ids=r.item_ids, groups=[r.group_ids[g] for g in r.groups])


def _same(x, y):
    if isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            _same(x[k], y[k])
        return
    np.testing.assert_allclose(np.asarray(x, dtype=float), np.asarray(y, dtype=float), atol=TOL, equal_nan=True)


@pytest.mark.parametrize("name", list(STATISTICS))
@pytest.mark.parametrize("seed", [0, 1])
def test_invariances(name, seed):
    stat = STATISTICS[name]
    r = random_ratings(seed, n_raters=4, q=4, noise=0.5)
    base = stat(r)
    # rater permutation: unchanged (pairwise keyed by unordered pair: symmetry)
    _same(base, stat(_permute_raters(r, [2, 0, 3, 1])))
    # label permutation: unchanged, per-class entries move with their class
    perm = [1, 3, 0, 2]
    relabeled = stat(_permute_labels(r, perm))
    if name == "per_class_vs_majority":
        renamed = {}
        for key, v in base.items():
            if len(key) == 3:
                a, c, m = key
                renamed[(a, r.categories[perm[r.categories.index(c)]], m)] = v
            else:
                renamed[key] = v
        _same(renamed, relabeled)
    else:
        _same(base, relabeled)
    if name == "cohen_kappa_pairs":
        a, b = labels_of(r, 0), labels_of(r, 1)
        _same(agr.cohen_kappa(a, b, categories=r.categories).value, agr.cohen_kappa(b, a, categories=r.categories).value)


# ----------------------------------------------------------------------------- result shape
def test_result_json_keys_and_nan_as_null():
    r = random_ratings(2, n_raters=3)
    out = agr.agreement(r, n_resamples=50, reference="r0").to_dict()
    for key in ("percent_agreement", "cohen_kappa", "fleiss_kappa", "krippendorff_alpha", "gwet_ac1", "per_class", "n_items", "n_annotators"):
        assert key in out
    assert out["n_annotators"] == 3 and out["n_items"] == r.n_items
    assert len(out["cohen_kappa"]) == 3
    assert set(out["per_class"]["annotators"]) == {"r1", "r2"}
    text = json.dumps(out, allow_nan=False)
    assert "NaN" not in text
    const = Ratings.from_matrix([["a", "a"], ["a", "a"], ["a", "a"]], categories=["a", "b"], groups=["t1", "t1", "t2"])
    d = agr.agreement(const, n_resamples=10).to_dict()
    assert d["krippendorff_alpha"]["value"] is None and d["krippendorff_alpha"]["reason"] == "single_category"
    assert d["gwet_ac1"]["value"] == 1.0
    json.dumps(d, allow_nan=False)


def test_disagreement_pairs_counts():
    m = [["a", "b", "a"], ["b", "a", "b"], ["a", "c", "c"], ["a", "a", "a"]]
    r = Ratings.from_matrix(m, categories=["a", "b", "c"], item_ids=["i0", "i1", "i2", "i3"])
    pairs = agr.disagreement_pairs(r)
    # item i0: (a,b) x2 ; i1: (a,b) x2 ; i2: (a,c) x2, (c,c) agree
    assert pairs[0] == {"labels": ["a", "b"], "count": 4, "examples": ["i0", "i1"]}
    assert pairs[1] == {"labels": ["a", "c"], "count": 2, "examples": ["i2"]}
    assert len(pairs) == 2


def test_pairable_items_are_counted_apart_from_single_ratings():
    """An item one annotator rated alone counts as an item but cannot enter any coefficient."""
    from ror_annotate.agreement import Ratings, agreement

    ratings = Ratings.from_items({"i1": {"A": "x", "B": "x"}, "i2": {"A": "y", "B": "x"}, "i3": {"A": "y"}}, categories=["x", "y"])
    d = agreement(ratings, n_resamples=10, seed=0).to_dict()
    assert (d["n_items"], d["n_pairable_items"]) == (3, 2)
    assert d["percent_agreement"]["value"] == 0.5  # i1 agrees, i2 does not; i3 is not pairable
