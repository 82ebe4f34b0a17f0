"""Trace-level bootstrap: resample whole traces, then read percentile intervals.

Segments of one trace are not independent, so the resampling unit is the trace (group). A resample
is a vector of draw counts per trace; statistics of all resamples are ``counts @ per-trace stats``.
The interval is the percentile interval (Efron & Tibshirani 1993, *An Introduction to the
Bootstrap*, ch. 13.3) over the resamples on which the statistic is defined.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import AgreementError, ConfigError
from ..options import RESAMPLES_MAX, SEED_MAX
from .estimators import Estimate, _estimate, _with_ci


def trace_bootstrap_counts(n_groups: int, *, n_resamples: int, seed: int | None = 0) -> np.ndarray:
    """How often each trace is drawn in each bootstrap resample: int array ``[n_resamples, n_groups]``.

    Each row is one multinomial draw of ``n_groups`` traces with replacement (equal probabilities),
    from ``numpy.random.default_rng(seed)``.

    Raises
    ------
    AgreementError
        ``n_resamples < 0`` or no trace.
    ConfigError
        ``n_resamples`` above :data:`~ror_annotate.options.RESAMPLES_MAX` or ``seed`` outside
        ``0 .. SEED_MAX`` (a negative seed is refused by NumPy with a bare ``ValueError``).
    """
    if n_resamples < 0 or n_groups < 1:
        raise AgreementError(f"need n_resamples >= 0 and at least one trace, got {n_resamples} and {n_groups}")
    if n_resamples > RESAMPLES_MAX:
        raise ConfigError(f"--resamples must be <= {RESAMPLES_MAX:,}, got {n_resamples:,}")
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"--seed must be a whole number in 0..{SEED_MAX}, got {seed}")
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_resamples)


def _percentile_ci(samples: np.ndarray, confidence_level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile interval over axis 0 ignoring NaN resamples: (low, high, n_defined)."""
    finite = ~np.isnan(samples)
    n_ok = finite.sum(0)
    tail = (1 - confidence_level) / 2
    if samples.shape[0] == 0:
        shape = samples.shape[1:]
        return np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=int)
    with warnings.catch_warnings():  # all-NaN columns (undefined everywhere) are expected here
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanquantile(samples, tail, axis=0)
        hi = np.nanquantile(samples, 1 - tail, axis=0)
    return lo, hi, n_ok


def _boot_estimate(vals: np.ndarray, why: np.ndarray, n_items: float, confidence_level: float) -> Estimate:
    """Estimate from ``vals [1 + B]`` (point estimate first, then the resamples)."""
    est = _estimate(vals[0], why[0], n_items)
    if vals.shape[0] <= 1:
        return est
    lo, hi, n_ok = _percentile_ci(vals[1:, None], confidence_level)
    return _with_ci(est, lo[0], hi[0], n_ok[0])
