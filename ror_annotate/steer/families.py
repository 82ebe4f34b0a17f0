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
- which shared experts run beside the routed ones (never edited; informational).

Adding a family is one :func:`register_family` call with a :class:`FamilySpec`. Routers with a
different scoring rule (sigmoid scores with a score-correction bias and grouped top-k,
DeepSeek-V3 style; Llama 4; sparsemixer) are refused with a :class:`SteerError`, because the
SteerMoE edit (arXiv:2509.09660) is defined on softmax log-probabilities and has no agreed meaning
for them yet.

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

Scoring = Literal["softmax_topk", "topk_softmax"]
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
    scoring : {"softmax_topk", "topk_softmax"}
        ``softmax_topk``: softmax over all experts, then top-k of the probabilities.
        ``topk_softmax``: top-k of the logits, then softmax over the k selected logits.
    renorm : {"always", "flag", "implicit"}
        Whether the k selected probabilities are divided by their sum: ``always``; ``flag``:
        when the router's ``norm_topk_prob`` attribute is true; ``implicit``: the softmax over the
        k winners already sums to one.
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
#: Router attributes that mark sigmoid scoring with a score-correction bias / grouped top-k.
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
        return (f"{name} ({cls}) scores experts with sigmoid/grouped top-k (has {', '.join(attrs)}); the "
                "log-softmax routing edit is not defined for such routers yet")
    return None


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
        If the model has a router the steering edit is not defined for (sigmoid / grouped top-k,
        Llama 4, sparsemixer), routes without calling its router module (GPT-OSS MXFP4 kernels),
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
            spec.renorm == "flag" and bool(getattr(module, "norm_topk_prob", False)))
        sites.append(RouterSite(
            layer=int(match[-1]), position=-1, name=name, module=module, family=spec,
            n_experts=int(_get_path(module, spec.n_experts_attr)), top_k=int(_get_path(module, spec.top_k_attr)),
            renormalize=renorm, shared_experts=shared,
        ))
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


def route(site: RouterSite, scores: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Recompute top-k routing from fp32 scores with the family's own rules and computation order.

    The order mirrors the transformers 5.x routers (``modeling_<family>.py``): ``softmax_topk``
    families take ``softmax(scores, dtype=float32)``, then ``topk``, then divide the k values by
    their sum in place when they renormalise, then (Gemma 4) multiply by ``per_expert_scale[idx]``;
    ``topk_softmax`` (GPT-OSS) takes ``topk`` of the scores, then the softmax over the k. Softmax is
    shift-invariant, so ``scores`` may be raw logits or log-probabilities (edited or not). The caller
    casts to the router's output dtype last, as the routers do.

    Parameters
    ----------
    site : RouterSite
        The router whose rules apply.
    scores : torch.Tensor of shape (n_tokens, n_experts), float32
        Logits or log-probabilities; edited entries need not be normalised (a softmax follows).

    Returns
    -------
    weights : torch.Tensor of shape (n_tokens, top_k), float32
        Routing weights of the selected experts (renormalised / scaled per family).
    indices : torch.Tensor of shape (n_tokens, top_k), int64
        Selected experts, in descending score order (as ``torch.topk`` returns them).
    """
    import torch

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
]
