"""Routing-score steering (SteerMoE operator) as a context manager over a loaded model.

The operator (Fayyaz et al., "Steering MoE LLMs via Expert (De)Activation", arXiv:2509.09660,
Sec. 3; used by "Routes of Reasoning", ../shared/DESIGN.md): take ``log p = log_softmax(logits)``,
set every expert of the activate set to ``max(log p) + eps`` and every expert of the suppress set
to ``min(log p) - eps`` (max and min of the token's unedited log-probabilities), recompute the
softmax and the top-k with the family's own rules (:func:`~ror_annotate.steer.families.route`).
The edit runs in fp32 whatever the model dtype: in bf16 ``min - eps`` rounds back onto ``min``.
Shared experts are separate modules beside the router and are never touched.

Sigmoid, grouped top-k routers (DeepSeek-V3/R1, GLM-4-MoE; ``scoring="sigmoid_grouped"``) get the
same logit edit (``max + eps`` / ``min - eps``, so an activated expert's weight is the row's largest
sigmoid score), and the edit also acts inside the grouped selection, where a logit edit alone could
be overruled by the score-correction bias or by the group ranking: an activated expert's group is
always kept and the expert always selected; a suppressed expert is never selected nor counted in its
group's score. The bias selects only; the weights are the unbiased sigmoid scores, renormalised per
``norm_topk_prob``, times ``routed_scaling_factor`` (:func:`~ror_annotate.steer.families.route`).
Edits the groups cannot honour for every token are refused before generation (``E952``-``E954``).

Schedules decide, per sequence of the batch, whether the edit applies at a forward:
:class:`AlwaysOn`, or :class:`AfterFirstAnswer` (only once the generated text contains a first
answer, where the method found almost all of the token savings).
"""

from __future__ import annotations

import random
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from ..errors import SteerError
from . import require_torch
from .families import RouterSite, find_router_sites, route
from .hooks import RouterHooks

ExpertSets = Mapping[int, Sequence[int]]


@dataclass(frozen=True)
class RoutingEdit:
    """Experts to activate and suppress, per decoder layer index.

    Attributes
    ----------
    activate, suppress : dict of int to tuple of int
        Decoder layer index -> routed expert ids.
    eps : float
        Margin above the max / below the min log-probability (nats).
    """

    activate: dict[int, tuple[int, ...]] = field(default_factory=dict)
    suppress: dict[int, tuple[int, ...]] = field(default_factory=dict)
    eps: float = 1e-2

    @classmethod
    def from_sets(cls, activate: ExpertSets | None = None, suppress: ExpertSets | None = None, *,
                  eps: float = 1e-2) -> "RoutingEdit":
        """Build from any mapping of layer -> iterable of expert ids (JSON keys may be strings)."""
        def norm(sets: ExpertSets | None) -> dict[int, tuple[int, ...]]:
            return {int(k): tuple(sorted({int(e) for e in v})) for k, v in (sets or {}).items() if len(v)}
        return cls(norm(activate), norm(suppress), float(eps))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RoutingEdit":
        """Build from ``{"activate": {layer: [ids]}, "suppress": {...}, "eps": 0.01}``."""
        unknown = set(data) - {"activate", "suppress", "eps", "meta"}
        if unknown:
            raise SteerError(f"steering spec has unknown keys {sorted(unknown)}; expected activate, suppress, eps")
        return cls.from_sets(data.get("activate"), data.get("suppress"), eps=data.get("eps", 1e-2))

    def to_json(self) -> dict[str, Any]:
        """The inverse of :meth:`from_json` (layer keys as strings)."""
        return {"activate": {str(k): list(v) for k, v in self.activate.items()},
                "suppress": {str(k): list(v) for k, v in self.suppress.items()}, "eps": self.eps}

    @property
    def empty(self) -> bool:
        """True when no expert is edited."""
        return not self.activate and not self.suppress

    def validate(self, sites: Sequence[RouterSite]) -> None:
        """Check the edit against a model's routers.

        Raises
        ------
        SteerError
            If a layer is not an MoE layer, an expert id is out of range, an expert is both
            activated and suppressed, ``|activate| > top_k``, fewer than ``top_k`` experts remain
            after suppression, or ``eps`` is not positive. For sigmoid, grouped routers also
            (:func:`_validate_grouped`): ``E952`` the activated experts span more than ``topk_group``
            groups; ``E953`` fewer than ``topk_group`` groups keep an unsuppressed expert; ``E954``
            some choice of kept groups holds fewer than ``top_k`` selectable experts.
        """
        if not self.eps > 0:
            raise SteerError(f"eps must be positive, got {self.eps}")
        by_layer = {s.layer: s for s in sites}
        for kind, sets in (("activate", self.activate), ("suppress", self.suppress)):
            for layer, ids in sets.items():
                site = by_layer.get(layer)
                if site is None:
                    raise SteerError(f"{kind}: layer {layer} has no MoE router; MoE layers are {sorted(by_layer)}")
                bad = [e for e in ids if not 0 <= e < site.n_experts]
                if bad:
                    raise SteerError(f"{kind}: expert ids {bad} at layer {layer} are outside 0..{site.n_experts - 1} "
                                     "(shared experts are not routed and cannot be edited)")
        for layer, site in by_layer.items():
            act, sup = set(self.activate.get(layer, ())), set(self.suppress.get(layer, ()))
            if act & sup:
                raise SteerError(f"layer {layer}: experts {sorted(act & sup)} are both activated and suppressed")
            if len(act) > site.top_k:
                raise SteerError(f"layer {layer}: {len(act)} experts to activate but only top-{site.top_k} are selected")
            if site.n_experts - len(sup) < site.top_k:
                raise SteerError(f"layer {layer}: suppressing {len(sup)} of {site.n_experts} experts leaves fewer than "
                                 f"top-{site.top_k} to select")
            # an engine's site without a family (vLLM's VllmSite of an unregistered softmax model type) has no groups
            family = getattr(site, "family", None)
            if family is not None and family.grouped and (act or sup):
                _validate_grouped(site, act, sup)


def _validate_grouped(site: RouterSite, act: set[int], sup: set[int]) -> None:
    """Refuse an edit a sigmoid, grouped router cannot honour for every token.

    The router keeps ``topk_group`` of ``n_group`` groups, then selects ``top_k`` experts inside them.
    Under the edit (:func:`~ror_annotate.steer.families.route`) the groups of activated experts are
    always kept, a group with no unsuppressed expert scores ``-inf``, and which other groups are kept
    depends on the token. So the edit is honoured for every token iff the activated experts span at
    most ``topk_group`` groups, at least ``topk_group`` groups keep an unsuppressed expert, and the
    worst case (the activated groups plus the kept groups with the fewest unsuppressed experts)
    still holds ``top_k`` selectable experts.

    Raises
    ------
    SteerError
        ``E952``, ``E953`` or ``E954`` as listed in :meth:`RoutingEdit.validate`.
    """
    size, layer = site.group_size, site.layer
    act_groups = sorted({e // size for e in act})
    if len(act_groups) > site.topk_group:
        raise SteerError(f"layer {layer}: activated experts {sorted(act)} lie in {len(act_groups)} expert groups "
                         f"{act_groups} but the router keeps only topk_group={site.topk_group} of {site.n_group} groups "
                         f"(groups of {size} experts)", code="E952")
    free = [size - sum(1 for e in sup if e // size == g) for g in range(site.n_group)]
    live = [g for g in range(site.n_group) if free[g] > 0]
    if len(live) < site.topk_group:
        raise SteerError(f"layer {layer}: the suppressed experts empty all but {len(live)} expert groups; the router "
                         f"keeps topk_group={site.topk_group} groups", code="E953")
    others = sorted(free[g] for g in live if g not in act_groups)
    worst = sum(free[g] for g in act_groups) + sum(others[: site.topk_group - len(act_groups)])
    if worst < site.top_k:
        raise SteerError(f"layer {layer}: with experts {sorted(sup)} suppressed, some tokens would keep groups holding only "
                         f"{worst} selectable experts (unsuppressed experts per group: {free}), fewer than "
                         f"top-{site.top_k}", code="E954")


def edit_log_probs(logp, activate: Sequence[int], suppress: Sequence[int], eps: float, rows=None):
    """Apply the SteerMoE edit to fp32 log-probabilities.

    Parameters
    ----------
    logp : torch.Tensor of shape (n_tokens, n_experts), float32
        ``log_softmax`` of the router logits.
    activate, suppress : sequence of int
        Expert ids set to ``max + eps`` and ``min - eps`` (max/min over the unedited row).
    eps : float
        Margin in nats.
    rows : torch.Tensor of shape (n_tokens,), bool, optional
        Tokens the edit applies to; others keep their log-probabilities.

    Returns
    -------
    torch.Tensor of shape (n_tokens, n_experts), float32
    """
    torch = require_torch()
    if logp.dtype != torch.float32:
        raise SteerError(f"the routing edit must run in float32, got {logp.dtype}")
    edited = logp.clone()
    if len(activate):
        edited[:, list(activate)] = logp.max(dim=-1, keepdim=True).values + eps
    if len(suppress):
        edited[:, list(suppress)] = logp.min(dim=-1, keepdim=True).values - eps
    if rows is not None:
        edited = torch.where(rows[:, None], edited, logp)
    return edited


class AlwaysOn:
    """Schedule: the edit applies to every token of every forward."""

    name = "always"

    def reset(self, batch_size: int) -> None:
        """Start a new batch of sequences."""

    def observe(self, input_ids) -> None:
        """See the tokens fed to the next forward (unused)."""

    def active_rows(self, batch_size: int):
        """Return ``None``: every row is active."""
        return None


class AfterFirstAnswer:
    """Schedule: the edit applies to a sequence only after its generated text contains an answer.

    A forward with more than one position is taken as a new prompt (prefill): the generated text
    restarts empty. Each one-token decoding step appends the token, and once the decoded tail of a
    row matches ``pattern`` the row stays steered until the next prompt.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Decodes generated tokens.
    pattern : str
        Regular expression marking a first answer (default: a closed ``\\boxed{...}`` or
        "answer is <something>").
    window : int
        Tokens of the tail decoded at each step (the pattern must fit in it).
    """

    name = "after_first_answer"
    DEFAULT_PATTERN = r"\\boxed\{[^{}]*\}|answer is\s*:?\s*\S"

    def __init__(self, tokenizer: Any, pattern: str = DEFAULT_PATTERN, *, window: int = 48) -> None:
        self.tokenizer = tokenizer
        self.pattern = re.compile(pattern, re.IGNORECASE)
        self.window = window
        self._generated: list[list[int]] = []
        self._active: list[bool] = []
        #: Per row: tokens generated when the row switched on (None: not yet); the tokens generated
        #: after that point are the steered ones.
        self.activated_at: list[int | None] = []

    def reset(self, batch_size: int) -> None:
        """Start a new batch of ``batch_size`` sequences (nothing generated yet)."""
        self._generated = [[] for _ in range(batch_size)]
        self._active = [False] * batch_size
        self.activated_at = [None] * batch_size

    def observe(self, input_ids) -> None:
        """Record the tokens fed to the next forward: a prompt (resets) or one new token per row."""
        batch, seq = int(input_ids.shape[0]), int(input_ids.shape[1])
        if seq > 1 or len(self._generated) != batch:
            self.reset(batch)
            return
        for row, token in enumerate(input_ids[:, -1].tolist()):
            if self._active[row]:
                continue
            self._generated[row].append(int(token))
            tail = self.tokenizer.decode(self._generated[row][-self.window:], skip_special_tokens=True)
            self._active[row] = bool(self.pattern.search(tail))
            if self._active[row]:
                self.activated_at[row] = len(self._generated[row])

    def active_rows(self, batch_size: int):
        """Return a bool tensor ``[batch_size]``: which sequences are steered now."""
        torch = require_torch()
        if len(self._active) != batch_size:
            return torch.zeros(batch_size, dtype=torch.bool)
        return torch.tensor(self._active, dtype=torch.bool)


def random_expert_sets(edit: RoutingEdit, sites: Sequence[RouterSite], *, seed: int = 0) -> RoutingEdit:
    """Control: random expert sets of the same size per layer as ``edit``.

    Parameters
    ----------
    edit : RoutingEdit
        The edit whose per-layer set sizes are matched.
    sites : sequence of RouterSite
        The model's routers (for ``n_experts``).
    seed : int
        Seed of :class:`random.Random`; the same seed gives the same sets.

    Returns
    -------
    RoutingEdit
        Disjoint random activate/suppress sets, same sizes and eps. For sigmoid, grouped routers the
        sets are redrawn (same seeded generator) until the groups can honour them.

    Raises
    ------
    SteerError
        ``E952``-``E954`` when no valid draw was found for a grouped router in 1000 tries.
    """
    rng = random.Random(seed)
    by_layer = {s.layer: s for s in sites}
    activate: dict[int, list[int]] = {}
    suppress: dict[int, list[int]] = {}
    for layer in sorted(set(edit.activate) | set(edit.suppress)):
        n_act, n_sup = len(edit.activate.get(layer, ())), len(edit.suppress.get(layer, ()))
        site = by_layer[layer]
        for attempt in range(_GROUPED_DRAWS):
            drawn = rng.sample(range(site.n_experts), n_act + n_sup)
            activate[layer], suppress[layer] = drawn[:n_act], drawn[n_act:]
            family = getattr(site, "family", None)  # an engine's site may carry no family (vLLM, unregistered type)
            if family is None or not family.grouped:
                break
            try:  # a sigmoid, grouped router: redraw sets its groups cannot honour
                _validate_grouped(site, set(activate[layer]), set(suppress[layer]))
                break
            except SteerError:
                if attempt == _GROUPED_DRAWS - 1:
                    raise
    return RoutingEdit.from_sets(activate, suppress, eps=edit.eps)


#: Draws of a random control set per layer before giving up on a grouped router's constraints.
_GROUPED_DRAWS = 1000


@dataclass
class LayerEdit:
    """One MoE layer's edit, prepared once per steering context on the router's device.

    Attributes
    ----------
    site : RouterSite
    activate, suppress : torch.Tensor of shape (n_experts,), bool, or None
        Expert masks (``None`` when the set is empty), on the router's device.
    eps : float
        Margin in nats.
    """

    site: RouterSite
    activate: Any
    suppress: Any
    eps: float

    @classmethod
    def prepare(cls, site: RouterSite, edit: RoutingEdit, device: Any) -> "LayerEdit | None":
        """Masks for ``site`` on ``device``, or ``None`` when ``edit`` leaves the layer alone."""
        torch = require_torch()

        def mask(ids: Sequence[int]):
            if not ids:
                return None
            out = torch.zeros(site.n_experts, dtype=torch.bool)
            out[list(ids)] = True
            return out.to(device)

        act, sup = edit.activate.get(site.layer, ()), edit.suppress.get(site.layer, ())
        if not act and not sup:
            return None
        return cls(site, mask(act), mask(sup), float(edit.eps))


def edited_routing(layer: LayerEdit, logits, output: tuple, token_rows=None) -> tuple:
    """The router output with the SteerMoE edit applied: one fused computation per layer.

    The edit is applied to the raw logits upcast to fp32 (``activate -> max + eps``, ``suppress ->
    min - eps``, max and min over the unedited row). Setting ``log p`` to ``max(log p) + eps`` is the
    same as setting the logit to ``max(logit) + eps``, because ``log p = logit - logsumexp`` shifts a
    whole row by one constant and the softmax that follows is shift-invariant; working on the logits
    spares a log-softmax and keeps the router's own order: softmax in fp32 over the (edited) logits,
    top-k, normalisation as the family does (:func:`~ror_annotate.steer.families.route`), cast to the
    router's weight dtype last. fp32 because in bf16 ``min - eps`` rounds back onto ``min``.
    Sigmoid, grouped routers get the masks as well, so that the edit holds inside the grouped
    selection (module docstring); their selection bias is never edited.

    No host synchronisation, no ``.item()``, no host-side index lists: the masks are device tensors
    prepared once per context, and rows outside ``token_rows`` get the router's own weights and
    indices back bit for bit (``torch.where``).

    Parameters
    ----------
    layer : LayerEdit
    logits : torch.Tensor of shape (n_tokens, n_experts)
        Raw router logits in the model dtype.
    output : tuple
        The router's own ``(scores, weights [n_tokens, top_k], indices [n_tokens, top_k])``.
    token_rows : torch.Tensor of shape (n_tokens, 1), bool, optional
        Tokens the edit applies to (``None``: all).

    Returns
    -------
    tuple
        ``(output[0], weights, indices)``, dtypes as the router's.
    """
    torch = require_torch()
    x = logits.float()
    lo, hi = torch.aminmax(x, dim=-1, keepdim=True)
    if layer.suppress is not None:
        x = torch.where(layer.suppress, lo - layer.eps, x)
    if layer.activate is not None:
        x = torch.where(layer.activate, hi + layer.eps, x)
    if layer.site.family.grouped:
        weights, indices = route(layer.site, x, activate=layer.activate, suppress=layer.suppress)
    else:
        weights, indices = route(layer.site, x)
    weights, indices = weights.to(output[1].dtype), indices.to(output[2].dtype)
    if token_rows is not None:
        if token_rows.device != weights.device:  # layers spread over devices (device_map)
            token_rows = token_rows.to(weights.device, non_blocking=True)
        weights = torch.where(token_rows, weights, output[1])
        indices = torch.where(token_rows, indices, output[2])
    return (output[0], weights, indices)


@dataclass
class SteeringHandle:
    """What :func:`steer_routing` yields: counters and, if asked, the selections made.

    Attributes
    ----------
    sites : list of RouterSite
        Every MoE router of the model.
    hooks : RouterHooks
        ``hooks.forwards`` and ``hooks.fired`` count forwards and router calls (hooks sit only on
        the layers the edit touches, or on all layers when ``record=True``).
    selections : list of dict
        When ``record=True``: one dict per forward, site position -> selected experts
        ``[batch, seq, top_k]`` (CPU int64), and ``"active"`` -> rows steered at that forward.
    recomputed : int
        Router calls whose routing was recomputed (layers and forwards the edit applied to).
    """

    sites: list[RouterSite]
    hooks: RouterHooks
    selections: list[dict] = field(default_factory=list)
    recomputed: int = 0


def _router_device(site: RouterSite):
    for param in site.module.parameters():
        return param.device
    return None


@contextmanager
def steer_routing(model: Any, edit: RoutingEdit | None = None, *, schedule: Any = None, record: bool = False,
                  check_fired: bool = True) -> Iterator[SteeringHandle]:
    """Steer a loaded MoE model's routing while the context is open.

    Works with ``model(...)`` and ``model.generate(...)`` (with the KV cache): the edit is applied
    at every forward, on every MoE layer it names, to the tokens the schedule marks active
    (:func:`edited_routing`). Everything else is the router's own output, untouched: layers the
    edit does not name get no hook at all (unless ``record``), a forward in which the schedule
    marks no row active recomputes nothing, and inactive rows of a partly active batch get the
    router's weights and indices back bit for bit. So an empty edit, or a schedule that never
    fires, gives outputs bit-identical to the model without the context.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers MoE model of a registered family.
    edit : RoutingEdit, optional
        Experts to activate / suppress per layer; ``None`` means none.
    schedule : AlwaysOn or AfterFirstAnswer, optional
        Default :class:`AlwaysOn`. Any object with ``observe(input_ids)`` and
        ``active_rows(batch) -> None | bool tensor [batch]`` works.
    record : bool, default False
        Keep every forward's selections in ``handle.selections`` (tests, audits; copies to the
        host at every layer, so slow on a GPU).
    check_fired : bool, default True
        Raise if a hooked router did not fire in some forward.

    Yields
    ------
    SteeringHandle

    Raises
    ------
    SteerError
        Unsupported family, invalid edit (see :meth:`RoutingEdit.validate`), or a router that did
        not fire (raised from inside the forward).
    """
    torch = require_torch()
    edit = edit or RoutingEdit()
    schedule = schedule or AlwaysOn()
    sites = find_router_sites(model)
    edit.validate(sites)
    layer_edits = {s.position: LayerEdit.prepare(s, edit, _router_device(s)) for s in sites}
    layer_edits = {pos: le for pos, le in layer_edits.items() if le is not None}
    hooked = sites if record else [s for s in sites if s.position in layer_edits]
    # per forward: "skip" (no row active), None (all rows active) or a bool mask [batch*seq, 1]
    state: dict[str, Any] = {"rows": None, "shape": None}
    device = _router_device(sites[0])
    handle: SteeringHandle

    def on_route(site: RouterSite, logits, output):
        layer = layer_edits.get(site.position)
        rows = state["rows"]
        new = None
        if layer is not None and not isinstance(rows, str):
            new = edited_routing(layer, logits, output, rows)
            handle.recomputed += 1
        if record and state["shape"] is not None and handle.selections:
            indices = (new or output)[2]
            handle.selections[-1][site.position] = indices.detach().cpu().reshape(*state["shape"], site.top_k)
        return new

    hooks = RouterHooks(model, on_route, sites=hooked, check_fired=check_fired)
    handle = SteeringHandle(sites=sites, hooks=hooks)

    def observe(_module, args, kwargs):
        source = kwargs.get("input_ids")
        if source is None and args and torch.is_tensor(args[0]):
            source = args[0]
        if source is None:
            source = kwargs.get("inputs_embeds")
        rows = None
        if source is not None:
            state["shape"] = (int(source.shape[0]), int(source.shape[1]))
            if kwargs.get("input_ids") is not None or (args and torch.is_tensor(args[0])):
                schedule.observe(source)
            rows = schedule.active_rows(state["shape"][0])
        else:
            state["shape"] = None
        if record:
            handle.selections.append({"active": None if rows is None else rows.clone()})
        state["rows"] = _token_rows(rows, state["shape"], device)

    with hooks:
        schedule_handle = model.register_forward_pre_hook(observe, with_kwargs=True)
        try:
            yield handle
        finally:
            schedule_handle.remove()


def _token_rows(rows, shape, device):
    """Per-forward row state: "skip", None (all rows) or a [batch*seq, 1] mask on the routers' device.

    Built once per forward (not per layer). The schedule's rows live on the host, so deciding
    "none" / "all" costs no device synchronisation; a mixed batch is copied to the device once.
    """
    if rows is None:
        return None
    if rows.device.type == "cpu":
        if not bool(rows.any()):
            return "skip"
        if bool(rows.all()):
            return None
    if shape is None:
        return None
    return rows.to(device, non_blocking=True).repeat_interleave(shape[1])[:, None]


__all__ = [
    "AfterFirstAnswer",
    "AlwaysOn",
    "LayerEdit",
    "RoutingEdit",
    "SteeringHandle",
    "edit_log_probs",
    "edited_routing",
    "random_expert_sets",
    "steer_routing",
]
