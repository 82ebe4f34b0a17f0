"""Declarative adapters for Mixture-of-Experts router families (transformers 5.x).

In transformers 5.x every supported sparse block calls a dedicated router module whose forward
takes the flattened hidden states ``[n_tokens, hidden]`` and returns
``(scores [n_tokens, n_experts], weights [n_tokens, top_k], indices [n_tokens, top_k])``: the
router does the top-k itself (../shared/notes/moe-routers.md). A family differs from another only in

- which router class it uses (found by class name, so multimodal wrappers whose routers sit under
  ``model.language_model`` are handled without extra code),
- where ``n_experts`` and ``top_k`` live on the router module,
- whether softmax comes before top-k (``softmax_topk``) or top-k is taken on the logits and the
  softmax over the k winners (``topk_softmax``, GPT-OSS; mathematically softmax -> top-k -> renorm),
- whether the top-k weights are renormalised (always, or following ``norm_topk_prob``),
- where the raw logits are (item 0 of the router output, or the output of a child projection when
  item 0 is already probabilities, as in Gemma 4),
- a per-expert scale applied after renormalisation (Gemma 4),
- which shared experts run beside the routed ones (never edited; informational),
- for sigmoid, grouped top-k routers (``sigmoid_grouped``, DeepSeek-V3/R1 and GLM-4-MoE): where the
  score-correction bias, the number of groups, the groups kept and the routed scaling factor live.

Adding a family is one :func:`register_family` call with a :class:`FamilySpec`. Routers with yet
another scoring rule (Llama 4; sparsemixer), and unregistered routers that carry a score-correction
bias or expert groups, are refused with a :class:`SteerError`.

torch is imported lazily: this module imports without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import SteerError
from ..registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    import torch

Scoring = Literal["softmax_topk", "topk_softmax", "sigmoid_grouped"]
Renorm = Literal["always", "flag", "implicit"]


@dataclass(frozen=True)
class FamilySpec:
    """How one MoE family routes tokens, stated as data.

    Attributes
    ----------
    name : str
        Registry name, e.g. ``"qwen3_moe"`` (the transformers ``model_type`` where there is one).
    router_classes : tuple of str
        Class names of the router modules (``type(module).__name__``).
    scoring : {"softmax_topk", "topk_softmax", "sigmoid_grouped"}
        ``softmax_topk``: softmax over all experts, then top-k of the probabilities.
        ``topk_softmax``: top-k of the logits, then softmax over the k selected logits.
        ``sigmoid_grouped`` (DeepSeek-V3): ``sigmoid`` scores; selection on scores + correction bias,
        restricted to the ``topk_group`` groups whose two best biased scores sum highest; weights
        are the unbiased scores of the selected experts (see :func:`route`).
    renorm : {"always", "flag", "implicit"}
        Whether the k selected probabilities are divided by their sum: ``always``; ``flag``:
        when the router's ``norm_flag_attr`` attribute is true; ``implicit``: the softmax over the
        k winners already sums to one.
    norm_flag_attr : str
        Router attribute read when ``renorm == "flag"``.
    n_experts_attr, top_k_attr : str
        Dotted attribute paths on the router module giving the number of routed experts and k.
    logits_child : str or None
        ``None`` when item 0 of the router output is the raw logits ``[n_tokens, n_experts]``;
        otherwise the name of the child module whose output is (Gemma 4: ``"proj"``).
    post_scale_attr : str or None
        Router parameter ``[n_experts]`` multiplied into the weights after renormalisation.
    shared_expert_attrs : tuple of str
        Attributes of the router's parent module that hold always-on shared experts.
    model_types : tuple of str
        transformers ``model_type`` values known to use this family (documentation and errors).
    bias_attr, n_group_attr, topk_group_attr, scaling_attr : str or None
        ``sigmoid_grouped`` only: router attributes holding the score-correction bias
        ``[n_experts]`` (selection only), the number of expert groups, the groups kept per token,
        and the routed scaling factor multiplied into the weights. ``None`` elsewhere.
    """

    name: str
    router_classes: tuple[str, ...]
    scoring: Scoring = "softmax_topk"
    renorm: Renorm = "always"
    n_experts_attr: str = "num_experts"
    top_k_attr: str = "top_k"
    logits_child: str | None = None
    post_scale_attr: str | None = None
    shared_expert_attrs: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    norm_flag_attr: str = "norm_topk_prob"
    bias_attr: str | None = None
    n_group_attr: str | None = None
    topk_group_attr: str | None = None
    scaling_attr: str | None = None

    @property
    def grouped(self) -> bool:
        """True for sigmoid, grouped top-k routers (``scoring == "sigmoid_grouped"``)."""
        return self.scoring == "sigmoid_grouped"


#: Every MoE family by name (the one registry mechanism, :mod:`ror_annotate.registry`; plug-ins arrive
#: through the ``ror_annotate.families`` entry-point group, each entry a :class:`FamilySpec`).
FAMILIES: Registry[FamilySpec] = Registry("families", what="MoE family")
_FAMILIES = FAMILIES.loaded()  # the loaded entries, read by the lookups below
_BY_ROUTER_CLASS: dict[str, FamilySpec] = {}

#: Router classes whose scoring the steering edit is not defined for, with the reason.
REFUSED_ROUTER_CLASSES: dict[str, str] = {
    "Llama4Router": "Llama 4 applies a sigmoid after top-k and returns (scores, logits)",
    "PhimoeRouter": "PhiMoE routes with sparsemixer, not softmax top-k",
    "JetMoeTopKGating": "JetMoE's gate has a different signature",
}
#: Router attributes that mark sigmoid scoring with a score-correction bias / grouped top-k; a router that
#: has them and is not a registered family (its rule may differ from DeepSeek-V3's) is refused.
REFUSED_ROUTER_ATTRS: tuple[str, ...] = ("e_score_correction_bias", "n_group", "topk_group", "routed_scaling_factor")
#: Parent modules that compute routing without calling the router module (a hook would never fire).
BYPASSING_PARENTS: dict[str, str] = {
    "Mxfp4GptOssMLP": (
        "GPT-OSS with MXFP4 kernels computes routing inside Mxfp4GptOssMLP.forward without calling the "
        "router module, so no routing hook can fire; load the model dequantized (bf16) or patch "
        "Mxfp4GptOssMLP.forward to call self.router"
    ),
}


def register_family(spec: FamilySpec, *, overwrite: bool = False) -> FamilySpec:
    """Add a family to the registry.

    Parameters
    ----------
    spec : FamilySpec
        The family's routing rules.
    overwrite : bool, default False
        Replace an existing family of the same name (or claiming the same router class).

    Returns
    -------
    FamilySpec
        ``spec``, so the call can be used as an expression.

    Raises
    ------
    ConfigError
        If the name or a router class is already registered and ``overwrite`` is false.
    """
    from ..errors import ConfigError

    if not overwrite:
        if spec.name in _FAMILIES:
            raise ConfigError(f"MoE family {spec.name!r} is already registered; pass overwrite=True to replace it")
        taken = [c for c in spec.router_classes if c in _BY_ROUTER_CLASS]
        if taken:
            raise ConfigError(f"router class(es) {taken} already belong to family {_BY_ROUTER_CLASS[taken[0]].name!r}")
    FAMILIES.register(spec.name, spec, replace=True)
    for cls in spec.router_classes:
        _BY_ROUTER_CLASS[cls] = spec
    return spec


def families() -> dict[str, FamilySpec]:
    """Return a copy of the registry, name -> :class:`FamilySpec` (entry-point families included)."""
    for _name, spec in FAMILIES.items():
        for cls in spec.router_classes:
            _BY_ROUTER_CLASS.setdefault(cls, spec)
    return dict(_FAMILIES)


def family_for_router_class(class_name: str) -> FamilySpec | None:
    """Return the family whose router class is ``class_name``, or ``None``."""
    if class_name not in _BY_ROUTER_CLASS:
        families()  # entry-point families are loaded on first need
    return _BY_ROUTER_CLASS.get(class_name)


register_family(FamilySpec("qwen3_moe", ("Qwen3MoeTopKRouter",), renorm="flag", model_types=("qwen3_moe",)))
register_family(FamilySpec("qwen2_moe", ("Qwen2MoeTopKRouter",), renorm="flag",
                           shared_expert_attrs=("shared_expert", "shared_expert_gate"), model_types=("qwen2_moe",)))
register_family(FamilySpec("mixtral", ("MixtralTopKRouter",), renorm="always", model_types=("mixtral",)))
register_family(FamilySpec("olmoe", ("OlmoeTopKRouter",), renorm="flag", model_types=("olmoe",)))
register_family(FamilySpec("gpt_oss", ("GptOssTopKRouter",), scoring="topk_softmax", renorm="implicit",
                           model_types=("gpt_oss",)))
register_family(FamilySpec("qwen3_5_moe", ("Qwen3_5MoeTopKRouter",), renorm="always",
                           shared_expert_attrs=("shared_expert", "shared_expert_gate"),
                           model_types=("qwen3_5_moe", "qwen3_5_moe_text")))
register_family(FamilySpec("qwen3_next", ("Qwen3NextTopKRouter",), renorm="flag",
                           shared_expert_attrs=("shared_expert", "shared_expert_gate"), model_types=("qwen3_next",)))
register_family(FamilySpec("gemma4", ("Gemma4TextRouter",), renorm="always", n_experts_attr="proj.out_features",
                           top_k_attr="config.top_k_experts", logits_child="proj", post_scale_attr="per_expert_scale",
                           model_types=("gemma4", "gemma4_text")))
# Sigmoid, grouped top-k routers: transformers' DeepseekV3TopkRouter and Glm4MoeTopkRouter compute the same rule.
_SIGMOID_GROUPED = dict(scoring="sigmoid_grouped", renorm="flag", n_experts_attr="num_experts", top_k_attr="top_k",
                        shared_expert_attrs=("shared_experts",), bias_attr="e_score_correction_bias",
                        n_group_attr="num_group", topk_group_attr="topk_group", scaling_attr="routed_scaling_factor")
register_family(FamilySpec("deepseek_v3", ("DeepseekV3TopkRouter",), model_types=("deepseek_v3",),
                           **_SIGMOID_GROUPED))  # type: ignore[arg-type]
register_family(FamilySpec("glm4_moe", ("Glm4MoeTopkRouter",), model_types=("glm4_moe",),
                           **_SIGMOID_GROUPED))  # type: ignore[arg-type]


def _get_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class RouterSite:
    """One router hook point: the router of one MoE decoder layer.

    Attributes
    ----------
    layer : int
        Decoder layer index in the model (``layers.<layer>`` in the module path).
    position : int
        Index among the model's MoE layers (0 .. n_moe_layers-1); capture arrays use this axis.
    name : str
        Full module path, e.g. ``"model.language_model.layers.3.mlp.gate"``.
    module : torch.nn.Module
        The router module.
    family : FamilySpec
        Routing rules.
    n_experts, top_k : int
        Routed experts and experts selected per token.
    renormalize : bool
        Whether the top-k probabilities are divided by their sum (resolved from the family's rule).
    shared_experts : tuple of str
        Module paths of shared experts beside this router (never edited).
    n_group, topk_group : int
        Expert groups and groups kept per token (``1, 1`` for ungrouped families).
    scaling : float
        Routed scaling factor multiplied into the weights (``1.0`` for families without one).
    """

    layer: int
    position: int
    name: str
    module: Any
    family: FamilySpec
    n_experts: int
    top_k: int
    renormalize: bool
    shared_experts: tuple[str, ...] = ()
    n_group: int = 1
    topk_group: int = 1
    scaling: float = 1.0

    @property
    def bias(self) -> Any:
        """The score-correction bias ``[n_experts]`` (a tensor on the router), or ``None``."""
        attr = self.family.bias_attr
        return None if attr is None else _get_path(self.module, attr)

    @property
    def group_size(self) -> int:
        """Experts per group (``n_experts // n_group``)."""
        return self.n_experts // self.n_group

    @property
    def logits_module(self) -> Any:
        """The module whose output is the raw logits (the router itself, or its projection)."""
        return self.module if self.family.logits_child is None else _get_path(self.module, self.family.logits_child)


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def _refusal(name: str, module: Any) -> str | None:
    cls = type(module).__name__
    if cls in REFUSED_ROUTER_CLASSES:
        return f"{name} ({cls}): {REFUSED_ROUTER_CLASSES[cls]}"
    attrs = [a for a in REFUSED_ROUTER_ATTRS if hasattr(module, a)]
    if attrs and (cls.lower().endswith("router") or "gate" in name.rsplit(".", 1)[-1]):
        grouped = sorted(s.name for s in _FAMILIES.values() if s.grouped)
        return (f"{name} ({cls}) scores experts with sigmoid/grouped top-k (has {', '.join(attrs)}) but is not a "
                f"registered family (sigmoid/grouped families: {', '.join(grouped)}); register it with "
                "register_family(FamilySpec(..., scoring='sigmoid_grouped', ...)) if its router computes the same rule")
    return None


def _grouped_site(site: RouterSite) -> None:
    """Fill the grouped top-k fields of a ``sigmoid_grouped`` site and check they are consistent.

    Raises
    ------
    SteerError
        ``E950`` if an attribute is missing or the groups cannot hold the selection (``n_experts``
        not a multiple of ``n_group``, fewer than 2 experts per group, ``topk_group`` outside
        ``1..n_group``, or fewer than ``top_k`` experts in ``topk_group`` groups).
    """
    spec, module = site.family, site.module
    try:
        site.n_group = int(_get_path(module, spec.n_group_attr or "n_group"))
        site.topk_group = int(_get_path(module, spec.topk_group_attr or "topk_group"))
        site.scaling = float(_get_path(module, spec.scaling_attr)) if spec.scaling_attr else 1.0
        site.bias  # noqa: B018 - the attribute must exist
    except AttributeError as exc:
        raise SteerError(f"{site.name} ({type(module).__name__}): family {spec.name} expects attribute {exc}", code="E950") from exc
    e, g, tg = site.n_experts, site.n_group, site.topk_group
    if g < 1 or e % g or e // g < 2 or not 1 <= tg <= g or tg * (e // g) < site.top_k:
        raise SteerError(f"{site.name}: grouped top-k with {e} experts, n_group={g}, topk_group={tg}, top_k={site.top_k} "
                         "cannot be routed (need n_experts divisible by n_group, >= 2 experts per group, "
                         "1 <= topk_group <= n_group and topk_group groups holding >= top_k experts)", code="E950")


def find_router_sites(model: Any) -> list[RouterSite]:
    """Discover every MoE router of a loaded model.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers model (``*ForCausalLM``, ``*ForConditionalGeneration`` or the bare model).

    Returns
    -------
    list of RouterSite
        One per MoE layer, sorted by decoder layer index.

    Raises
    ------
    SteerError
        If the model has a router the steering edit is not defined for (an unregistered sigmoid /
        grouped top-k router, Llama 4, sparsemixer), a grouped router whose groups are inconsistent
        (``E950``), routes without calling its router module (GPT-OSS MXFP4 kernels),
        or has no router of a registered family (the message lists the supported families).
    """
    sites: list[RouterSite] = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        cls = type(module).__name__
        if cls in BYPASSING_PARENTS:
            raise SteerError(f"{name}: {BYPASSING_PARENTS[cls]}")
        spec = family_for_router_class(cls)
        if spec is None:
            reason = _refusal(name, module)
            if reason is not None:
                raise SteerError(f"unsupported MoE router {reason}; supported families: {', '.join(sorted(_FAMILIES))}")
            continue
        match = _LAYER_RE.findall(name)
        if not match:
            raise SteerError(f"router {name} ({cls}) is not under a 'layers.<i>' module; cannot tell its layer")
        parent_name = name.rsplit(".", 1)[0] if "." in name else ""
        parent = modules.get(parent_name)
        shared = tuple(f"{parent_name}.{a}" for a in spec.shared_expert_attrs if parent is not None and hasattr(parent, a))
        renorm = spec.renorm in ("always", "implicit") or (
            spec.renorm == "flag" and bool(getattr(module, spec.norm_flag_attr, False)))
        site = RouterSite(
            layer=int(match[-1]), position=-1, name=name, module=module, family=spec,
            n_experts=int(_get_path(module, spec.n_experts_attr)), top_k=int(_get_path(module, spec.top_k_attr)),
            renormalize=renorm, shared_experts=shared,
        )
        if spec.grouped:
            _grouped_site(site)
        sites.append(site)
    if not sites:
        raise SteerError(
            f"no MoE router of a supported family found in {type(model).__name__}; supported families: "
            f"{', '.join(f'{s.name} ({s.router_classes[0]})' for s in _FAMILIES.values())}. Register a new one with "
            "ror_annotate.steer.families.register_family"
        )
    sites.sort(key=lambda s: s.layer)
    for position, site in enumerate(sites):
        site.position = position
    return sites


def log_probs(logits: "torch.Tensor") -> "torch.Tensor":
    """Log-softmax of router logits in fp32.

    Parameters
    ----------
    logits : torch.Tensor of shape (n_tokens, n_experts)
        Raw router logits, any float dtype.

    Returns
    -------
    torch.Tensor of shape (n_tokens, n_experts), float32
        ``log_softmax(logits)``; fp32 because in bf16 ``min - eps`` rounds back onto ``min``
        for ``|log p| >= 4`` (../shared/notes/moe-routers.md, pitfall 4).
    """
    import torch

    return torch.log_softmax(logits.float(), dim=-1)


def route(site: RouterSite, scores: "torch.Tensor", *, activate: "torch.Tensor | None" = None,
          suppress: "torch.Tensor | None" = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Recompute top-k routing from fp32 scores with the family's own rules and computation order.

    The order mirrors the transformers 5.x routers (``modeling_<family>.py``): ``softmax_topk``
    families take ``softmax(scores, dtype=float32)``, then ``topk``, then divide the k values by
    their sum in place when they renormalise, then (Gemma 4) multiply by ``per_expert_scale[idx]``;
    ``topk_softmax`` (GPT-OSS) takes ``topk`` of the scores, then the softmax over the k. Softmax is
    shift-invariant, so for these ``scores`` may be raw logits or log-probabilities (edited or not).
    The caller casts to the router's output dtype last, as the routers do.

    ``sigmoid_grouped`` (``DeepseekV3TopkRouter.forward`` / ``Glm4MoeTopkRouter.forward`` of
    transformers 5.x, op for op): ``s = sigmoid(scores)`` (``scores`` must be raw logits here),
    ``c = s + bias``; group score = sum of the top-2 of ``c`` in each of ``n_group`` contiguous
    groups; the ``topk_group`` best groups are kept (``topk(sorted=False)``), the rest of ``c`` is
    set to ``-inf``; ``indices = topk(c, top_k, sorted=False)``; ``weights = s[indices]``, divided by
    ``sum + 1e-20`` when the router renormalises, times ``routed_scaling_factor``. The steering edit
    (``activate`` / ``suppress`` masks) acts inside this selection: a suppressed expert's ``c`` is
    ``-inf`` (never selected, and its group is scored by its best two remaining experts, or its one
    remaining expert; ``-inf`` if none remain); an activated expert's group score and ``c`` are
    ``+inf`` (its group is always kept and it is always selected). The bias only selects; the
    weights stay the unbiased sigmoid of ``scores``.

    Parameters
    ----------
    site : RouterSite
        The router whose rules apply.
    scores : torch.Tensor of shape (n_tokens, n_experts), float32
        Logits or (softmax families only) log-probabilities; edited entries need not be normalised.
    activate, suppress : torch.Tensor of shape (n_experts,), bool, optional
        ``sigmoid_grouped`` only: experts forced into / out of the grouped selection. The caller
        validates that the groups can honour them (:meth:`~ror_annotate.steer.steering.RoutingEdit.validate`).

    Returns
    -------
    weights : torch.Tensor of shape (n_tokens, top_k), float32
        Routing weights of the selected experts (renormalised / scaled per family).
    indices : torch.Tensor of shape (n_tokens, top_k), int64
        Selected experts: in descending score order for the softmax families (as ``torch.topk``
        returns them), in ``topk(sorted=False)`` order for ``sigmoid_grouped`` (as the router).

    Raises
    ------
    SteerError
        ``E951`` if ``activate`` / ``suppress`` is given for a family other than ``sigmoid_grouped``.
    """
    import torch

    if site.family.grouped:
        return _route_grouped(site, scores, activate, suppress)
    if activate is not None or suppress is not None:
        raise SteerError(f"{site.name}: expert masks are applied through the scores for family {site.family.name}",
                         code="E951")
    if site.family.scoring == "topk_softmax":
        top, indices = torch.topk(scores, site.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1, dtype=torch.float32)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        weights, indices = torch.topk(probs, site.top_k, dim=-1)
        if site.renormalize:
            weights /= weights.sum(dim=-1, keepdim=True)
    if site.family.post_scale_attr is not None:
        weights = weights * _get_path(site.module, site.family.post_scale_attr)[indices]
    return weights, indices


def _route_grouped(site: RouterSite, logits: "torch.Tensor", activate: "torch.Tensor | None",
                   suppress: "torch.Tensor | None") -> tuple["torch.Tensor", "torch.Tensor"]:
    """``sigmoid_grouped`` routing (see :func:`route`); without masks, the router's ops in its order."""
    import torch

    n_group, size = site.n_group, site.group_size
    scores = logits.sigmoid()
    choice = scores + site.bias
    if suppress is not None:
        choice = choice.masked_fill(suppress, float("-inf"))
    top2 = choice.view(-1, n_group, size).topk(2, dim=-1)[0]
    if suppress is None:
        group_scores = top2.sum(dim=-1)
    else:  # a group keeps its best two remaining experts (its one remaining expert; -inf when none remain)
        second = top2[..., 1]
        group_scores = top2[..., 0] + torch.where(torch.isneginf(second), torch.zeros_like(second), second)
    if activate is not None:
        group_scores = group_scores.masked_fill(activate.view(n_group, size).any(dim=-1), float("inf"))
    group_idx = torch.topk(group_scores, k=site.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, size).reshape(-1, site.n_experts)
    choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    if activate is not None:
        choice = choice.masked_fill(activate, float("inf"))
    indices = torch.topk(choice, k=site.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, indices)
    if site.renormalize:
        weights /= weights.sum(dim=-1, keepdim=True) + 1e-20
    weights = weights * site.scaling
    return weights, indices


def selection_scores(site: RouterSite, logits: "torch.Tensor") -> "torch.Tensor":
    """The fp32 scores :func:`route` expects for this family's captured logits.

    Parameters
    ----------
    site : RouterSite
    logits : torch.Tensor of shape (n_tokens, n_experts)
        Raw router logits (captured; for ``sigmoid_grouped`` the pre-sigmoid logits, bias not added).

    Returns
    -------
    torch.Tensor of shape (n_tokens, n_experts), float32
        :func:`log_probs` for the softmax families, the fp32 logits for ``sigmoid_grouped``
        (sigmoid is not shift-invariant).
    """
    return logits.float() if site.family.grouped else log_probs(logits)


__all__ = [
    "BYPASSING_PARENTS",
    "FamilySpec",
    "REFUSED_ROUTER_ATTRS",
    "REFUSED_ROUTER_CLASSES",
    "RouterSite",
    "families",
    "family_for_router_class",
    "find_router_sites",
    "log_probs",
    "register_family",
    "route",
    "selection_scores",
]
