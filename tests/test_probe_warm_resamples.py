"""Label-noise refits of a probe row (``refit_resamples``): warm-started from the stored-label fit, with
the features standardised once, they give the figures of a cold scikit-learn fit per resample.

Expected values come from scikit-learn directly (a fresh ``StandardScaler`` + ``LogisticRegression``
pipeline fitted from zeros on each resample's labels, scored with ``f1_score``), not from the code
under test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ror_annotate.steer.probe import PROBE_TOL, refit_resamples

N_CLASSES = 6


def _data(rng, n_train=600, n_test=300, n_features=12):
    y = rng.integers(0, N_CLASSES, n_train + n_test)
    x = rng.normal(size=(len(y), n_features))
    x[np.arange(len(y)), y % n_features] += 1.5
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _redraw(y, rng, n_resamples, flip=0.15):
    """Each resample moves ~``flip`` of the labels to a uniform class (a label-noise resample)."""
    out = np.repeat(y[None], n_resamples, 0)
    moved = rng.random(out.shape) < flip
    out[moved] = rng.integers(0, N_CLASSES, moved.sum())
    return out


def _cold(x_train, y_train, x_test, y_test, C, *, with_mean=True, tol=PROBE_TOL, max_iter=500):
    model = make_pipeline(StandardScaler(with_mean=with_mean),
                          LogisticRegression(C=C, max_iter=max_iter, tol=tol, random_state=0))
    model.fit(x_train, y_train)
    labels = sorted(np.unique(y_test).tolist())
    f1 = f1_score(y_test, model.predict(x_test), labels=labels, average="macro", zero_division=0)
    majority = np.bincount(y_train).argmax()
    base = f1_score(y_test, np.full_like(y_test, majority), labels=labels, average="macro", zero_division=0)
    return f1, base


@pytest.mark.parametrize("C", [0.1, 1.0])
def test_warm_start_equals_cold_sklearn_fit_per_resample_dense(C):
    rng = np.random.default_rng(3)
    x_train, y_train, x_test, y_test = _data(rng)
    tr, te = _redraw(y_train, rng, 8), _redraw(y_test, rng, 8)
    f1, base = refit_resamples(x_train, y_train, x_test, tr, te, C=C, warm_start=True)
    for r in range(8):
        want_f1, want_base = _cold(x_train, tr[r], x_test, te[r], C)
        assert f1[r] == pytest.approx(want_f1, abs=1e-3)
        assert base[r] == pytest.approx(want_base, abs=1e-12)  # no fit: exact


def test_warm_start_equals_cold_sklearn_fit_sparse_features():
    """Sparse features (the TF-IDF control): scaled without centering, as in ``fit_probe``."""
    rng = np.random.default_rng(4)
    x_train, y_train, x_test, y_test = _data(rng, n_features=40)
    x_train, x_test = (sparse.csr_matrix(np.where(np.abs(x) > 1.0, x, 0.0)) for x in (x_train, x_test))
    tr, te = _redraw(y_train, rng, 5), _redraw(y_test, rng, 5)
    f1, _ = refit_resamples(x_train, y_train, x_test, tr, te, C=1.0, warm_start=True)
    for r in range(5):
        want, _ = _cold(x_train, tr[r], x_test, te[r], 1.0, with_mean=False)
        assert f1[r] == pytest.approx(want, abs=1e-3)


def test_converged_fits_give_identical_figures():
    """With a tight tolerance both starts reach the same optimum: the figures are equal exactly."""
    rng = np.random.default_rng(5)
    x_train, y_train, x_test, y_test = _data(rng, n_train=400, n_test=200, n_features=6)
    tr, te = _redraw(y_train, rng, 6), _redraw(y_test, rng, 6)
    warm, _ = refit_resamples(x_train, y_train, x_test, tr, te, C=1.0, warm_start=True)
    for r in range(6):
        want, _ = _cold(x_train, tr[r], x_test, te[r], 1.0, tol=1e-10, max_iter=5000)
        assert warm[r] == want


def test_a_resample_without_some_class_or_with_one_class():
    """A resample whose train labels lack a stored class is fitted from zeros (same figure as cold); a resample
    with one train class has no probe and no baseline (NaN)."""
    rng = np.random.default_rng(6)
    x_train, y_train, x_test, y_test = _data(rng)
    tr, te = _redraw(y_train, rng, 3), _redraw(y_test, rng, 3)
    tr[1][tr[1] == 5] = 4  # class 5 absent from train in resample 1
    tr[2][:] = 2  # one class only
    f1, base = refit_resamples(x_train, y_train, x_test, tr, te, C=1.0, warm_start=True)
    want, want_base = _cold(x_train, tr[1], x_test, te[1], 1.0)
    assert f1[1] == pytest.approx(want, abs=1e-3) and base[1] == pytest.approx(want_base)
    assert np.isnan(f1[2]) and np.isnan(base[2])
    assert np.isfinite(f1[0])


@pytest.mark.parametrize("sparse_input", [False, True])
def test_one_weighted_row_per_segment_equals_the_cold_fit_on_every_token(sparse_input):
    """``groups``: segments whose tokens share features and label (the TF-IDF control) are fitted once, weighted by
    their token count; expected: scikit-learn fitted on every token row (the rows repeated)."""
    rng = np.random.default_rng(7)
    x_seg, y_seg, x_test, y_test = _data(rng, n_train=150, n_test=300, n_features=10)
    sizes = rng.integers(1, 9, len(y_seg))
    groups = np.repeat(np.arange(len(y_seg)), sizes)
    x_train = x_seg[groups]
    if sparse_input:
        x_train, x_test = (sparse.csr_matrix(np.where(np.abs(x) > 1.0, x, 0.0)) for x in (x_train, x_test))
    draws_seg = _redraw(y_seg, rng, 4)
    tr, te = draws_seg[:, groups], _redraw(y_test, rng, 4)
    f1, base = refit_resamples(x_train, y_seg[groups], x_test, tr, te, C=1.0, groups=groups)
    for r in range(4):
        want, want_base = _cold(x_train, tr[r], x_test, te[r], 1.0, with_mean=not sparse_input, tol=1e-10, max_iter=5000)
        assert f1[r] == pytest.approx(want, abs=1e-3)
        assert base[r] == pytest.approx(want_base, abs=1e-12)
