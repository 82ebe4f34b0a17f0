"""Splits by trace: every trace goes to exactly one of train / validation / test, decided from
trace ids (and the stratification field) alone, before any row is written."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError

SPLITS: tuple[str, ...] = ("train", "validation", "test")
STRATIFY_KEYS: tuple[str, ...] = ("dataset", "model", "source")


def _allocate(n: int, fractions: Sequence[float]) -> list[int]:
    """Split ``n`` items into counts proportional to ``fractions`` (largest remainder, ties to earlier splits)."""
    raw = [n * f for f in fractions]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def check_fractions(fractions: Sequence[float]) -> list[float]:
    """Validate ``(train, validation, test)`` fractions; raises :class:`ConfigError`."""
    fr = [float(f) for f in fractions]
    if len(fr) != 3 or any(f < 0 or not math.isfinite(f) for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
        raise ConfigError(f"split fractions {tuple(fractions)} must be three non-negative numbers (train, validation, test) summing to 1")
    return fr


def split_traces(
    traces: Sequence[Any],
    *,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    stratify_by: str | None = None,
) -> dict[str, str]:
    """Assign every trace to one split (a trace is never split across splits).

    Parameters
    ----------
    traces : sequence of Trace (or any objects with ``trace_id`` and the ``stratify_by`` attribute)
    fractions : (train, validation, test), non-negative, summing to 1
    seed : int
        Seed of the ``numpy.random.default_rng`` shuffle; same store + seed = same splits.
    stratify_by : {"dataset", "model", "source"}, optional
        Allocate the fractions within each value of this trace field (None counts as one value).

    Returns
    -------
    dict
        ``trace_id -> split name``.

    Raises
    ------
    ConfigError
        Bad fractions or an unknown stratification key.
    """
    fr = check_fractions(fractions)
    if stratify_by is not None and stratify_by not in STRATIFY_KEYS:
        raise ConfigError(f"cannot stratify by {stratify_by!r}; choose one of {', '.join(STRATIFY_KEYS)}")
    groups: dict[str, list[str]] = defaultdict(list)
    for t in traces:
        key = str(getattr(t, stratify_by) or "") if stratify_by else ""
        groups[key].append(t.trace_id)
    rng = np.random.default_rng(seed)
    out: dict[str, str] = {}
    for key in sorted(groups):
        ids = sorted(groups[key])
        order = rng.permutation(len(ids))
        counts = _allocate(len(ids), fr)
        pos = 0
        for split, c in zip(SPLITS, counts):
            for i in order[pos : pos + c]:
                out[ids[i]] = split
            pos += c
    return out
