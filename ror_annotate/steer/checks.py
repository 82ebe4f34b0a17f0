"""Self-checks run on every captured batch before it is written, so a capture cannot be silently wrong.

Upstream defects these guard against are real and current: transformers drops ``router_logits``
for several MoE families and returns softmax values under that name for others; an inference
engine has returned all-zero expert ids under one kernel; a hook that never fires leaves a layer
empty. Each check works on host arrays (numpy), independent of the engine that produced them:

================  ==================================================================================
E910 ``logits``   values are finite, no row is all zeros, and no layer looks like probabilities
                  (rows of non-negative values summing to one), log-probabilities (rows whose
                  log-sum-exp is zero) or sigmoid scores (every value in [0, 1])
E911 ``layers``   every MoE layer of the model (counted from its expert parameters, independently
                  of router discovery) has a router site, and every captured layer was written
E912 ``top-k``    the selected experts are ``k`` distinct ids in ``[0, n_experts)`` per token and
                  layer, and each scores at least the ``k``-th largest logit (ties within the
                  storage precision accepted): the family's top-k of the logits. For sigmoid,
                  grouped routers (:class:`GroupedSelection`) the family's rule instead: each
                  selected expert lies in one of the ``topk_group`` best groups of
                  ``sigmoid(logits) + bias`` and scores at least the ``k``-th best inside them
E913 ``forward``  the first rows of the first captured trace equal a plain, unbatched forward of
                  the same tokens within the storage precision
================  ==================================================================================
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CaptureCheckError

#: Rows of the first trace compared with a plain unbatched forward (E913).
FORWARD_CHECK_ROWS = 16
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?experts(?:\.|$)")


@dataclass(frozen=True)
class GroupedSelection:
    """The selection rule of a sigmoid, grouped top-k router family (DeepSeek-V3 style), for E912.

    Attributes
    ----------
    bias : numpy.ndarray ``[n_layers, n_experts]``, float32
        Each captured layer's score-correction bias (selection only).
    n_group, topk_group : int
        Expert groups (contiguous, ``n_experts // n_group`` each) and groups kept per token.
    """

    bias: np.ndarray
    n_group: int
    topk_group: int

    @classmethod
    def from_sites(cls, sites: Sequence[Any]) -> "GroupedSelection | None":
        """The rule of captured router sites (:class:`~ror_annotate.steer.families.RouterSite`, one per
        layer, in capture order), or ``None`` when their family selects by plain top-k of the logits."""
        if not sites or not sites[0].family.grouped:
            return None
        bias = np.stack([s.bias.detach().float().cpu().numpy() for s in sites]).astype(np.float32)
        return cls(bias, int(sites[0].n_group), int(sites[0].topk_group))


def _eps(dtype: Any) -> float:
    name = str(dtype).replace("torch.", "")
    return {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52}.get(name, 2.0 ** -10)


def tolerance(logits: np.ndarray, *, model_dtype: Any, storage_dtype: Any) -> np.ndarray:
    """Per-row absolute tolerance ``[n_tokens, n_layers]``: 4 ulps of the coarser of the model's and the
    storage's precision at the row's largest magnitude (at least 1)."""
    scale = np.maximum(1.0, np.abs(logits.astype(np.float32)).max(axis=-1))
    return 4.0 * max(_eps(model_dtype), _eps(storage_dtype)) * scale


def moe_layers_of(model: Any) -> list[int]:
    """Decoder layer indices that hold expert parameters (``layers.<i>. ... experts``), from the
    model's parameter names: an independent count of its MoE layers."""
    found = {int(m.group(1)) for name, _ in model.named_parameters() if (m := _LAYER_RE.search(name))}
    return sorted(found)


def check_layers_found(expected: Sequence[int], found: Sequence[int], *, family: str) -> None:
    """E911 when a layer with experts has no router site.

    Raises
    ------
    CaptureCheckError
        ``E911`` naming the layers without a router.
    """
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CaptureCheckError(
            f"capture check 'layers' failed for family {family}: decoder layer(s) {missing} hold experts but no router "
            f"of the family was found there (routers found at {sorted(found)}); nothing was written",
            code="E911",
        )


def check_batch(logits: np.ndarray, selected: np.ndarray, *, family: str, layers: Sequence[int], top_k: int,
                model_dtype: Any, storage_dtype: Any, grouped: GroupedSelection | None = None) -> None:
    """Run checks E910-E912 on one batch of captured rows.

    Parameters
    ----------
    logits : numpy.ndarray ``[n_tokens, n_layers, n_experts]``
        Captured router logits of real (unpadded) tokens, in the storage dtype; a layer whose hook
        never fired is NaN (the capture buffer is NaN-filled).
    selected : numpy.ndarray ``[n_tokens, n_layers, top_k]``
        Selected expert ids (``-1`` where never written).
    family : str
        Family name for the messages.
    layers : sequence of int
        Decoder layer index of each axis-1 position, for the messages.
    top_k : int
    model_dtype, storage_dtype : dtype or str
        Precision of the forward and of the stored logits (tolerances).
    grouped : GroupedSelection, optional
        The family's grouped rule when it routes by sigmoid, grouped top-k; ``None`` (softmax
        families): the selection is the top-k of the logits.

    Raises
    ------
    CaptureCheckError
        ``E911`` a layer never written; ``E910`` values that are not logits; ``E912`` selections that
        are not the family's top-k of the logits.
    """
    if logits.shape[0] == 0:
        return
    x = logits.astype(np.float32)
    n_experts = x.shape[-1]
    for j, layer in enumerate(layers):
        where = f"family {family}, layer {layer}"
        lx = x[:, j]
        if (selected[:, j] < 0).all():  # the NaN-filled buffer was never written for this layer
            raise CaptureCheckError(f"capture check 'layers' failed ({where}): the router hook never fired for this layer; "
                                    "nothing was written", code="E911")
        _check_values(lx, where)
        tol = tolerance(lx[:, None, :], model_dtype=model_dtype, storage_dtype=storage_dtype)[:, 0]
        sel = selected[:, j].astype(np.int64)
        if grouped is None:
            _check_selection(lx, sel, top_k, n_experts, where, tol)
        else:
            _check_grouped_selection(lx, sel, top_k, n_experts, where, tol, grouped, j)


def _check_values(lx: np.ndarray, where: str) -> None:
    """E910 on one layer's rows ``[n_tokens, n_experts]``."""
    def fail(why: str) -> None:
        raise CaptureCheckError(f"capture check 'logits' failed ({where}): {why}; nothing was written", code="E910")

    if not np.isfinite(lx).all():
        bad = int((~np.isfinite(lx)).any(axis=-1).sum())
        fail(f"{bad} of {len(lx)} rows hold NaN or infinite values")
    if (lx == 0).all(axis=-1).any():
        fail(f"{int((lx == 0).all(axis=-1).sum())} rows are all zeros (a router that returned nothing)")
    in_unit = bool(((lx >= 0) & (lx <= 1)).all())
    if in_unit and np.allclose(lx.sum(axis=-1), 1.0, atol=1e-2):
        fail("every row is non-negative and sums to 1: these are softmax probabilities, not logits")
    if (lx <= 1e-6).all():
        m = lx.max(axis=-1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(lx - m).sum(axis=-1))
        if np.allclose(lse, 0.0, atol=1e-2):
            fail("every row's log-sum-exp is 0: these are log-probabilities (log-softmax), not logits")
    if in_unit and lx.shape[0] > 1 and lx.shape[-1] > 2:
        fail("every value lies in [0, 1]: these look like sigmoid scores, not logits")


def _check_selection(lx: np.ndarray, sel: np.ndarray, top_k: int, n_experts: int, where: str, tol: np.ndarray) -> None:
    """E912 on one layer: ``sel`` ``[n_tokens, top_k]`` against the logits ``lx`` ``[n_tokens, n_experts]``."""
    def fail(why: str) -> None:
        raise CaptureCheckError(f"capture check 'top-k' failed ({where}): {why}; nothing was written", code="E912")

    _check_distinct(sel, top_k, n_experts, fail)
    kth = np.partition(lx, n_experts - top_k, axis=-1)[:, n_experts - top_k]
    chosen = np.take_along_axis(lx, sel, axis=-1)
    below = (chosen < (kth - tol)[:, None]).any(axis=-1)
    if below.any():
        row = int(np.flatnonzero(below)[0])
        top = np.argsort(-lx[row])[:top_k].tolist()
        fail(f"token {row} selects experts {sorted(sel[row].tolist())} but the top-{top_k} of its logits are {sorted(top)}")


def _check_distinct(sel: np.ndarray, top_k: int, n_experts: int, fail: Any) -> None:
    if sel.shape[-1] != top_k:
        fail(f"{sel.shape[-1]} experts selected per token, the family selects {top_k}")
    if (sel < 0).any() or (sel >= n_experts).any():
        fail(f"expert ids outside [0, {n_experts}): {sorted(set(sel[(sel < 0) | (sel >= n_experts)].tolist()))[:5]}")
    ordered = np.sort(sel, axis=-1)
    if (np.diff(ordered, axis=-1) == 0).any():
        row = int(np.flatnonzero((np.diff(ordered, axis=-1) == 0).any(axis=-1))[0])
        fail(f"token {row} selects the same expert twice: {sel[row].tolist()}")


def _check_grouped_selection(lx: np.ndarray, sel: np.ndarray, top_k: int, n_experts: int, where: str, tol: np.ndarray,
                             rule: GroupedSelection, j: int) -> None:
    """E912 on one layer of a sigmoid, grouped router (DeepSeek-V3 rule, ``modeling_deepseek_v3.py``).

    ``c = sigmoid(logits) + bias``; a group's score is the sum of its two largest ``c``; the
    ``topk_group`` best groups are kept; the selection is the top-k of ``c`` inside them. The
    sigmoid is 1/4-Lipschitz, so a logit tolerance bounds the error of ``c`` (twice that of a group
    score): near-ties within it are accepted either way.
    """
    def fail(why: str) -> None:
        raise CaptureCheckError(f"capture check 'top-k' failed ({where}): {why}; nothing was written", code="E912")

    _check_distinct(sel, top_k, n_experts, fail)
    n_group, size = rule.n_group, n_experts // rule.n_group
    choice = 1.0 / (1.0 + np.exp(-lx.astype(np.float64))) + rule.bias[j].astype(np.float64)
    groups = choice.reshape(len(lx), n_group, size)
    group_scores = np.sort(groups, axis=-1)[..., -2:].sum(axis=-1)
    kth_group = np.partition(group_scores, n_group - rule.topk_group, axis=-1)[:, n_group - rule.topk_group]
    kept = group_scores >= (kth_group - 2 * tol)[:, None]
    sel_groups = sel // size
    outside = ~np.take_along_axis(kept, sel_groups, axis=-1)
    if outside.any():
        row = int(np.flatnonzero(outside.any(axis=-1))[0])
        best = np.argsort(-group_scores[row])[: rule.topk_group].tolist()
        fail(f"token {row} selects experts {sorted(sel[row].tolist())} in groups {sorted(set(sel_groups[row].tolist()))} "
             f"but the top-{rule.topk_group} groups of sigmoid(logits)+bias are {sorted(best)}")
    # the k-th best choice score inside the kept groups, on rows where the kept groups are unambiguous
    # (a near-tie between groups may go either way; those rows get the group check above only)
    inside = np.where(np.repeat(kept, size, axis=-1), choice, -np.inf)
    kth = np.partition(inside, n_experts - top_k, axis=-1)[:, n_experts - top_k]
    chosen = np.take_along_axis(choice, sel, axis=-1)
    below = (chosen < (kth - 2 * tol)[:, None]).any(axis=-1) & (kept.sum(axis=-1) == rule.topk_group)
    if below.any():
        row = int(np.flatnonzero(below)[0])
        top = np.argsort(-inside[row])[:top_k].tolist()
        fail(f"token {row} selects experts {sorted(sel[row].tolist())} but the grouped top-{top_k} of "
             f"sigmoid(logits)+bias is {sorted(top)}")


def check_forward(captured: np.ndarray, reference: np.ndarray, *, family: str, layers: Sequence[int], trace_id: str,
                  model_dtype: Any, storage_dtype: Any, rtol: float = 0.0) -> None:
    """E913: the first captured rows of a trace against a plain unbatched forward of its first tokens.

    Parameters
    ----------
    captured, reference : numpy.ndarray ``[n_rows, n_layers, n_experts]``
        The captured rows (storage dtype) and the plain forward's rows (float32), same tokens.
    rtol : float
        A floor on the tolerance relative to the row's largest magnitude, for a reference computed by
        another engine (other GEMM kernels: vLLM vs transformers differ by about 2e-5 in float32).

    Raises
    ------
    CaptureCheckError
        ``E913`` naming the layer and the largest difference.
    """
    n = min(len(captured), len(reference))
    c, r = captured[:n].astype(np.float32), reference[:n].astype(np.float32)
    tol = tolerance(r, model_dtype=model_dtype, storage_dtype=storage_dtype)
    if rtol:
        tol = np.maximum(tol, rtol * np.maximum(1.0, np.abs(r).max(axis=-1)))
    diff = np.abs(c - r).max(axis=-1)
    bad = diff > tol
    if bad.any():
        row, j = (int(v) for v in np.argwhere(bad)[0])
        raise CaptureCheckError(
            f"capture check 'forward' failed (family {family}, layer {layers[j]}): trace {trace_id} row {row} differs from a "
            f"plain unbatched forward by {float(diff[row, j]):.3g} (tolerance {float(tol[row, j]):.3g}); batching or padding "
            "changed the logits; nothing was written",
            code="E913",
        )


__all__ = ["FORWARD_CHECK_ROWS", "GroupedSelection", "check_batch", "check_forward", "check_layers_found", "moe_layers_of", "tolerance"]
