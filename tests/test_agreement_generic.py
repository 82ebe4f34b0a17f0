"""Generic metrics: any label set, with ``categories="auto"`` (the default) or declared.

Reference values come from scikit-learn, statsmodels and the ``krippendorff`` package run on the
same labels, and from hand calculation where noted; none from the code under test.
"""

from __future__ import annotations

import csv

import krippendorff
import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, f1_score, precision_recall_fscore_support
from sklearn.metrics import confusion_matrix as sk_confusion_matrix
from statsmodels.stats.inter_rater import aggregate_raters
from statsmodels.stats.inter_rater import fleiss_kappa as sm_fleiss_kappa

from ror_annotate import agreement as agr
from ror_annotate.agreement import Ratings
from ror_annotate.errors import AgreementError, InputError

TOL = 1e-12

# Three annotators, eight items, pet labels (none of them a behavior), one missing label.
PETS = np.array(
    [
        ["cat", "cat", "cat"],
        ["dog", "dog", "cat"],
        ["bird", "bird", "bird"],
        ["cat", "dog", "dog"],
        ["猫", "猫", "猫"],
        ["dog", "dog", "dog"],
        ["bird", "cat", None],
        ["猫", "dog", "猫"],
    ],
    dtype=object,
)
SORTED_PETS = ("bird", "cat", "dog", "猫")  # code-point order, as sorted() and numpy give


def test_auto_categories_on_a_non_behavior_label_set_match_reference_libraries():
    r = Ratings.from_matrix(PETS)  # categories="auto" by default
    assert r.categories == SORTED_PETS
    assert agr.infer_categories(PETS.ravel()) == SORTED_PETS

    # Krippendorff's alpha: the reference package on the annotators x items value matrix
    value_of = {c: i for i, c in enumerate(SORTED_PETS)}
    data = np.array([[np.nan if v is None else value_of[v] for v in row] for row in PETS.T], dtype=float)
    ref_alpha = krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")
    assert agr.krippendorff_alpha(PETS).value == pytest.approx(ref_alpha, abs=TOL)

    # Fleiss' kappa on the complete items: statsmodels on its count table
    complete = PETS[[i for i in range(len(PETS)) if None not in PETS[i]]]
    table, _ = aggregate_raters(np.vectorize(value_of.get)(complete).astype(int), n_cat=len(SORTED_PETS))
    assert agr.fleiss_kappa(complete).value == pytest.approx(sm_fleiss_kappa(table, method="fleiss"), abs=TOL)

    # Cohen's kappa per pair on the items both labeled: scikit-learn also infers the labels
    for i, j in ((0, 1), (0, 2), (1, 2)):
        both = [k for k in range(len(PETS)) if PETS[k, i] is not None and PETS[k, j] is not None]
        ref = cohen_kappa_score(PETS[both, i].tolist(), PETS[both, j].tolist())
        assert agr.cohen_kappa(PETS[:, i], PETS[:, j]).value == pytest.approx(ref, abs=TOL)


def test_percent_agreement_and_ac1_by_hand_with_auto_categories():
    # Two annotators, labels "yes"/"no"/"maybe" (q = 3 found), 5 items:
    #   agree on items 0, 1, 3 -> p_a = 3/5
    #   pi_k = mean over items of r_ik / r_i: yes (1+0+.5+1+0)/5 = .5, no (0+1+.5+0+.5)/5 = .4, maybe .1
    #   p_e(AC1) = sum pi_k (1 - pi_k) / (q - 1) = (.25 + .24 + .09) / 2 = .29
    #   AC1 = (.6 - .29) / (1 - .29) = .31 / .71
    a = ["yes", "no", "yes", "yes", "maybe"]
    b = ["yes", "no", "no", "yes", "no"]
    m = np.array([a, b], dtype=object).T
    assert agr.percent_agreement(m).value == pytest.approx(3 / 5, abs=TOL)
    assert agr.gwet_ac1(m).value == pytest.approx(0.31 / 0.71, abs=TOL)
    # Declaring a fourth, unused category changes AC1 (q = 4): p_e = .58 / 3
    pe4 = 0.58 / 3
    assert agr.gwet_ac1(m, categories=["yes", "no", "maybe", "unsure"]).value == pytest.approx((0.6 - pe4) / (1 - pe4), abs=TOL)
    # ... and leaves kappa and alpha alone
    assert agr.cohen_kappa(a, b).value == pytest.approx(agr.cohen_kappa(a, b, categories=["yes", "no", "maybe", "unsure"]).value, abs=TOL)
    assert agr.cohen_kappa(a, b).value == pytest.approx(cohen_kappa_score(a, b), abs=TOL)


def test_confusion_matrix_and_per_class_auto_match_sklearn():
    y_true = ["spam", "ham", "ham", "spam", "eggs", "ham", "eggs", "spam", "ham"]
    y_pred = ["spam", "ham", "spam", "spam", "ham", "ham", "eggs", "eggs", "ham"]
    labels = sorted(set(y_true) | set(y_pred))
    np.testing.assert_array_equal(agr.confusion_matrix(y_true, y_pred), sk_confusion_matrix(y_true, y_pred))
    scores = agr.per_class_scores(y_true, y_pred)
    assert list(scores["classes"]) == labels
    p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=np.nan)
    for k, c in enumerate(labels):
        assert scores["classes"][c]["precision"].value == pytest.approx(p[k], abs=TOL)
        assert scores["classes"][c]["recall"].value == pytest.approx(r[k], abs=TOL)
        assert scores["classes"][c]["f1"].value == pytest.approx(f[k], abs=TOL)
        assert scores["classes"][c]["support"] == s[k]
    assert scores["macro_f1"].value == pytest.approx(f1_score(y_true, y_pred, average="macro"), abs=TOL)


def test_missing_values_never_become_categories():
    pd = pytest.importorskip("pandas")
    labels = pd.Series(["a", None, "b", float("nan"), ""], dtype=object).tolist() + [pd.NA, pd.NaT, np.nan]
    assert agr.infer_categories(labels) == ("a", "b")
    r = Ratings.from_long(["i1", "i1", "i2", "i2"], ["x", "y", "x", "y"], ["a", pd.NA, "b", "a"])
    assert r.categories == ("a", "b") and r.codes.tolist() == [[0, -1], [1, 0]]


def test_numeric_labels_sort_numerically_and_spellings_merge():
    assert agr.infer_categories([10, 2, 1, None], ["2", 1.0, float("nan"), ""]) == ("1", "2", "10")
    assert agr.infer_categories(["b", 3, "a", 20]) == ("3", "20", "a", "b")  # numbers first
    r = Ratings.from_long(["i1", "i1", "i2", "i2"], ["x", "y", "x", "y"], [1, "1", 10, 2.0])
    assert r.categories == ("1", "2", "10")
    assert r.codes.tolist() == [[0, 0], [2, 1]]


def test_auto_categories_refusals():
    with pytest.raises(AgreementError, match=r"found 1 distinct label\(s\) \['a'\].*Declare the full category set"):
        agr.cohen_kappa(["a", "a"], ["a", None])
    with pytest.raises(AgreementError, match="sequence of labels or 'auto'"):
        agr.percent_agreement([["a", "b"]], categories="ab")
    with pytest.raises(AgreementError, match="same length"):
        agr.cohen_kappa(["a", "b"], ["a"])
    with pytest.raises(AgreementError, match="sample_weight"):
        agr.cohen_kappa(["a", "b"], ["a", "b"], sample_weight=[1.0, -1.0])
    r = Ratings.from_matrix(PETS)
    with pytest.raises(AgreementError, match="differ from the Ratings' own"):
        agr.fleiss_kappa(r, categories=["cat", "dog"])
    assert agr.fleiss_kappa(r, categories=list(SORTED_PETS)).value == agr.fleiss_kappa(r).value
    # declared categories still refuse an unexpected label
    with pytest.raises(AgreementError, match="not one of the declared categories"):
        agr.cohen_kappa(["cat", "emu"], ["cat", "cat"], categories=["cat", "dog"])


def test_full_analysis_on_a_non_behavior_label_set():
    r = Ratings.from_matrix(PETS, annotators=["ann", "bob", "cy"], groups=["t1", "t1", "t2", "t2", "t3", "t3", "t4", "t4"])
    d = agr.agreement(r, reference="ann", n_resamples=50).to_dict()
    assert d["categories"] == list(SORTED_PETS)
    bob = d["per_class"]["annotators"]["bob"]
    assert list(bob["classes"]) == list(SORTED_PETS)
    ann, bb = PETS[:, 0].tolist(), PETS[:, 1].tolist()
    np.testing.assert_array_equal(np.array(bob["confusion_matrix"]), sk_confusion_matrix(ann, bb, labels=list(SORTED_PETS)))


def test_csv_auto_categories_and_field_size_limit_restored(tmp_path):
    long_text = "x" * 200_000  # over csv's default field limit of 131,072 characters
    p = tmp_path / "r.csv"
    p.write_text(
        "item_id,annotator,label,text\n"
        f"i1,a,10,{long_text}\ni1,b,9,short\ni2,a,9,\ni2,b,9,\n",
        encoding="utf-8",
    )
    before = csv.field_size_limit()
    r = agr.ratings_from_csv(p)
    assert csv.field_size_limit() == before  # raised only while reading
    assert r.categories == ("9", "10")
    assert r.codes.tolist() == [[1, 0], [0, 0]]
    one = tmp_path / "one.csv"
    one.write_text("item_id,annotator,label\ni1,a,x\ni1,b,x\n", encoding="utf-8")
    with pytest.raises(InputError, match="one.csv"):
        agr.ratings_from_csv(one)
    assert csv.field_size_limit() == before


def test_public_names_survive_the_package_split():
    """Every public name of the former single-module ror_annotate.agreement is still importable from it."""
    import importlib

    mod = importlib.import_module("ror_annotate.agreement")
    for name in (
        "REASONS", "Estimate", "Ratings", "ratings_from_csv", "percent_agreement", "fleiss_kappa", "gwet_ac1",
        "krippendorff_alpha", "cohen_kappa", "confusion_matrix", "per_class_scores", "trace_bootstrap_counts",
        "AgreementResult", "majority_labels", "agreement", "disagreement_pairs", "ratings_from_store",
        "agreement_summary",
    ):
        assert callable(getattr(mod, name)) or name == "REASONS", name
    assert set(mod.__all__) <= set(dir(mod))
