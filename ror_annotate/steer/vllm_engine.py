"""The vLLM engine of ``ror capture`` / ``ror steer``: router logits read and edited inside vLLM.

Every MoE family vLLM serves reaches one family-independent place: the MoE runner's router,
``FusedMoERouter.select_experts(hidden_states, router_logits, ...)``, once per MoE layer per forward
step (../shared/notes/vllm-cpu.md). :func:`install` patches that method, before any ``LLM`` is
built, to call two opaque ``torch.library`` custom ops around vLLM's own routing:

- ``ror_annotate::route_edit(logits, layer)``: the SteerMoE edit (activate -> max + eps, suppress
  -> min - eps, computed in float32) on the rows of the requests the schedule marks active; every
  other row and every layer without an edit is returned bit for bit;
- ``ror_annotate::route_grouped(logits, weights, topk_ids, layer)`` (sigmoid, grouped top-k routers
  only: DeepSeek-V3/R1, GLM-4-MoE): on the steered rows, the grouped selection recomputed with the
  edit acting inside it, as the HF engine does (:func:`~ror_annotate.steer.families.route`): an
  activated expert's group is always kept and the expert always selected, a suppressed expert is
  never selected nor counted in its group's score; the router's own score-correction bias,
  ``num_expert_group``, ``topk_group``, renormalisation and ``routed_scaling_factor`` apply;
  every other row gets vLLM's weights and ids back bit for bit;
- ``ror_annotate::route_record(logits, topk_ids, layer)``: copies the raw logits and the experts
  vLLM selected into the current step's buffer when a capture is running;
- ``ror_annotate::residual_record(hidden, residual, layer)`` (only on the decoder layers a capture of
  the residual stream asked for when the engine was built): stores ``hidden + residual``, the
  residual stream after the layer (vLLM's layers return the two apart).

Opaque custom ops survive ``torch.compile`` (a Python patch installed after the engine is built is
inlined away: capture comes back empty and edits are silently ignored). The compile cache is
disabled (``VLLM_DISABLE_COMPILE_CACHE=1``) so a graph compiled without the ops is never reused.

Rows map to requests through the model runner's batch state: a wrapper of
``GPUModelRunner._prepare_inputs`` (the CPU runner inherits it) reads, for each forward step, the
request ids in batch order, their scheduled token counts and their computed-token counts (the
position of their first row); a wrapper of ``_model_forward`` moves the step's buffers to the host
once per step (no per-layer host synchronisation) and files the rows under their requests. Steps
without that state (vLLM's warm-up and profiling runs) are ignored.

The engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), its workers in it or in
their own processes (tensor parallel).
Prefix caching stays on: each capture request gets its own ``cache_salt``, so no prompt token is
ever served from the cache (cached tokens never reach the router and their logits would be
missing). A request whose rows are not exactly positions ``0..T-1`` is error ``E920``; a MoE layer
whose hook did not fire in a step is ``E921``; then the self-checks of :mod:`.checks` (E910-E913)
run on every batch before it is written, as on the HF engine.

On CUDA, graphs captured by vLLM replay kernels without running Python, so the ops' bodies would
not run: the engine is built with CUDA graphs off (``cudagraph_mode="NONE"``), compilation kept.
Every engine is built with ``worker_extension_cls`` :data:`WORKER_EXTENSION`: importing it in a worker
process installs the hooks there before vLLM builds the model, and the driver reaches the hooks' state
through ``LLM.collective_rpc`` (:class:`RorWorkerExtension`), in-process at ``tensor_parallel_size=1``
and in every rank's process above it. Under tensor parallelism every rank holds all of a step's tokens
and the replicated gate, so all ranks compute the same router logits: each applies the same edit from
the same configuration and batch state, and rank 0's rows are captured. Expert, pipeline and data
parallelism are refused (:func:`check_parallel`, ``E963``/``E964``).
A router rule the engine does not define (:func:`router_rule`) is ``E955``.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence, cast

import numpy as np

from ..errors import CaptureCheckError, SteerError
from ..options import StageOptions

#: E913 tolerance floor relative to the row's largest logit: the reference is a transformers forward, so other
#: kernels (measured up to 4.4e-5 in float32 on the tiny test models; 4 float32 ulps would be 5e-7).
CROSS_ENGINE_RTOL = 1e-4

#: Environment the engine needs, set by :func:`build_llm` before vLLM is imported.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_DISABLE_COMPILE_CACHE": "1"}


def require_vllm() -> Any:
    """Import and return ``vllm``, or raise ``E922`` saying how to install it.

    Raises
    ------
    SteerError
        ``E922`` when vLLM is not importable in this environment.
    """
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as exc:
        raise SteerError(f"--engine vllm needs vLLM, which is not importable here ({exc}); install it into its own "
                         "environment with `bash scripts/setup_vllm.sh` and run ror from .venv-vllm", code="E922") from None
    return vllm


@dataclass
class _Step:
    """Layout of one forward step: which rows belong to which request, at which positions."""

    req_ids: list[str]
    starts: np.ndarray  # first position of each request's rows
    counts: np.ndarray  # rows of each request
    active: Any = None  # bool tensor [n_rows] of rows to edit, or None (no row)
    logits: dict[int, Any] = field(default_factory=dict)  # layer -> [n_rows, n_experts]
    selected: dict[int, Any] = field(default_factory=dict)  # layer -> [n_rows, top_k]
    residual: dict[int, Any] = field(default_factory=dict)  # decoder layer -> [n_rows, hidden] float16
    rows: dict[tuple, Any] = field(default_factory=dict)  # (n_rows padded, device) -> bool mask on that device

    @property
    def n_rows(self) -> int:
        return int(self.counts.sum())


class _HookState:
    """Process-wide state read by the custom ops (one engine per process, in-process)."""

    def __init__(self) -> None:
        self.pending: _Step | None = None  # set by _prepare_inputs, taken by _model_forward
        self.step: _Step | None = None  # the step whose forward is running
        #: request id -> chunks (positions, logits, selected, residual or None), appended once per step
        self.capture: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]] | None = None
        self.capture_layers: list[int] = []
        self.residual_layers: list[int] = []  # decoder layers whose output stream is captured too
        self.capture_dtype: Any = None
        self.edit_masks: dict[int, tuple[Any, Any]] = {}  # layer -> (activate mask, suppress mask) [n_experts]
        self.eps = 1e-2
        self.schedule: Callable[[Any, str], bool] | None = None  # (runner, req_id) -> steer this request now?
        self.steered: set[str] = set()
        self.failure: tuple[str, str] | None = None  # (code, message) of a capture that went wrong in a step

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def configure(self, config: dict[str, Any], tokenizer: Callable[[], Any]) -> None:
        """Reset, then arm this process's hooks from a plain ``config`` (what :func:`_set_edit` and the capture
        send to every worker: picklable data, no closures).

        Parameters
        ----------
        config : dict
            ``capture_layers`` / ``residual_layers`` (lists of int), ``capture_dtype`` (torch dtype name),
            ``edit`` (``{layer: (n_experts, activate ids, suppress ids)}``), ``eps`` (float), ``schedule``
            (``None``, ``"always"``, ``"after_first_answer"``), ``pattern`` (regex or ``None``); all optional.
        tokenizer : callable
            Returns the worker's tokenizer (``after_first_answer`` decodes the generated tokens with it).
        """
        torch = _torch()
        self.reset()
        self.capture_layers = [int(x) for x in config.get("capture_layers", [])]
        self.residual_layers = [int(x) for x in config.get("residual_layers", [])]
        self.capture_dtype = getattr(torch, config["capture_dtype"]) if config.get("capture_dtype") else None
        for layer, (n_experts, act, sup) in (config.get("edit") or {}).items():
            self.edit_masks[int(layer)] = (_mask(torch, n_experts, act), _mask(torch, n_experts, sup))
        self.eps = float(config.get("eps", 1e-2))
        schedule = config.get("schedule")
        if not self.edit_masks or schedule is None:
            return
        if schedule == "always":
            self.schedule = lambda runner, rid: True
            return
        from .steering import AfterFirstAnswer

        regex = re.compile(config.get("pattern") or AfterFirstAnswer.DEFAULT_PATTERN, re.IGNORECASE)
        tok = tokenizer()

        def after_first_answer(runner: Any, rid: str, window: int = 48) -> bool:
            state = runner.requests.get(rid)
            generated = list(getattr(state, "output_token_ids", []) or [])
            if not generated:
                return False
            return bool(regex.search(tok.decode(generated[-window:], skip_special_tokens=True)))

        self.schedule = after_first_answer

    # -- step bookkeeping (host side, once per step) --
    def begin(self, runner: Any, num_scheduled_tokens: Any) -> None:
        torch = _torch()
        batch = runner.input_batch
        n = int(batch.num_reqs)
        req_ids = list(batch.req_ids[:n])
        step = _Step(req_ids, np.array(batch.num_computed_tokens_cpu[:n], dtype=np.int64),
                     np.asarray(num_scheduled_tokens[:n], dtype=np.int64))
        if self.edit_masks and self.schedule is not None:
            flags = []
            for rid in req_ids:
                if rid not in self.steered and self.schedule(runner, rid):
                    self.steered.add(rid)
                flags.append(rid in self.steered)
            if any(flags):
                step.active = torch.from_numpy(np.repeat(np.array(flags), step.counts))
        self.pending = step

    def start_forward(self) -> None:
        self.step, self.pending = self.pending, None

    def end_forward(self) -> None:
        step, self.step = self.step, None
        if step is None or self.capture is None:
            return
        # a failure is kept, not raised inside vLLM's forward (in a worker process it would kill the engine
        # without its code): the driver raises it when it takes the capture (RorWorkerExtension.ror_take_capture)
        missing = [layer for layer in self.capture_layers if layer not in step.logits]
        if missing:
            self.failure = ("E921", f"vLLM engine: the router hook did not fire for MoE layer(s) {missing} in a forward "
                                    f"step (fired: {sorted(step.logits)}); nothing was written")
        missing = [layer for layer in self.residual_layers if layer not in step.residual]
        if missing and self.failure is None:
            self.failure = ("E921", f"vLLM engine: the residual-stream hook did not fire for decoder layer(s) {missing} "
                                    f"in a forward step (fired: {sorted(step.residual)}); nothing was written")
        if self.failure is not None:
            self.capture = None  # the rest of the batch is not recorded
            return
        torch = _torch()
        n = step.n_rows
        logits = torch.stack([step.logits[layer][:n] for layer in self.capture_layers], dim=1).cpu().numpy()
        selected = torch.stack([step.selected[layer][:n] for layer in self.capture_layers], dim=1).cpu().numpy()
        residual = (torch.stack([step.residual[layer][:n] for layer in self.residual_layers], dim=1).cpu().numpy()
                    if self.residual_layers else None)
        offsets = np.concatenate([[0], np.cumsum(step.counts)])
        for i, rid in enumerate(step.req_ids):
            sl = slice(int(offsets[i]), int(offsets[i + 1]))
            positions = step.starts[i] + np.arange(int(step.counts[i]))
            self.capture.setdefault(rid, []).append((positions, logits[sl], selected[sl],
                                                     None if residual is None else residual[sl]))

    # -- the custom ops' bodies --
    @staticmethod
    def _rows(step: _Step, logits: Any) -> Any:
        """The step's active-row mask ``[n_rows padded]`` on the logits' device (built once per step and device)."""
        rows = step.rows.get((logits.shape[0], logits.device))
        if rows is None:
            torch = _torch()
            n = min(step.n_rows, logits.shape[0])
            rows = torch.zeros(logits.shape[0], dtype=torch.bool)
            rows[:n] = step.active[:n]
            rows = step.rows[(logits.shape[0], logits.device)] = rows.to(logits.device, non_blocking=True)
        return rows

    def edit(self, logits: Any, layer: int) -> Any:
        step = self.step
        masks = self.edit_masks.get(layer)
        if step is None or masks is None or step.active is None:
            return logits.clone()
        torch = _torch()
        rows = self._rows(step, logits)
        act, sup = _on_device(masks, logits.device)
        x = logits.float()
        n_routed = (act if act is not None else sup).shape[0]
        # a fused shared-expert gate column (beside the routed ones) is never edited nor counted in max/min
        lo, hi = torch.aminmax(x[..., :n_routed], dim=-1, keepdim=True)
        extra = logits.shape[-1] - n_routed
        if extra:
            act = None if act is None else torch.cat([act, act.new_zeros(extra)])
            sup = None if sup is None else torch.cat([sup, sup.new_zeros(extra)])
        if sup is not None:
            x = torch.where(sup, lo - self.eps, x)
        if act is not None:
            x = torch.where(act, hi + self.eps, x)
        out = x.to(logits.dtype)
        if logits.dtype != torch.float32:  # keep activated strictly above the max, suppressed below the min
            if act is not None:
                out = torch.where(act, torch.maximum(out, torch.nextafter(hi.to(logits.dtype), out.new_tensor(float("inf")))), out)
            if sup is not None:
                out = torch.where(sup, torch.minimum(out, torch.nextafter(lo.to(logits.dtype), out.new_tensor(float("-inf")))), out)
        return torch.where(rows[:, None], out, logits)

    def regroup(self, logits: Any, weights: Any, ids: Any, layer: int) -> tuple[Any, Any]:
        """Body of ``route_grouped``: the grouped selection under the edit on the steered rows.

        ``logits`` are the edited logits (``route_edit``'s output), ``weights`` / ``ids`` vLLM's
        routing of them; rows not steered, layers without an edit and routers that are not grouped
        get ``weights`` and ``ids`` back bit for bit.
        """
        step, masks, rule = self.step, self.edit_masks.get(layer), GROUPED_RULES.get(layer)
        if step is None or masks is None or step.active is None or rule is None:
            return weights.clone(), ids.clone()
        torch = _torch()
        from .families import _route_grouped

        rows = self._rows(step, logits)[:, None]
        act, sup = _on_device(masks, logits.device)
        new_w, new_i = _route_grouped(rule, logits[..., : rule.n_experts].float(), act, sup)  # type: ignore[arg-type]
        return (torch.where(rows, new_w.to(weights.dtype), weights), torch.where(rows, new_i.to(ids.dtype), ids))

    def record_residual(self, hidden: Any, residual: Any, layer: int) -> None:
        """Body of ``residual_record``: the residual stream after decoder layer ``layer`` (``hidden +
        residual``, vLLM's layers return the two apart and the next norm adds them) in float16."""
        step = self.step
        if step is None or self.capture is None or layer not in self.residual_layers:
            return
        step.residual[layer] = (hidden + residual).detach().to(_torch().float16)

    def record(self, logits: Any, selected: Any, layer: int) -> None:
        step = self.step
        if step is None or self.capture is None or layer not in self.capture_layers:
            return
        # always a copy: ``.to`` of a tensor already in the dtype returns the tensor itself, and under torch.compile
        # its buffer is reused by later ops of the same step (float32 logits stored as float32 came back overwritten)
        step.logits[layer] = logits.detach().to(self.capture_dtype, copy=True)
        step.selected[layer] = selected.detach().to(_torch().int16, copy=True)


def _on_device(masks: tuple[Any, Any], device: Any) -> tuple[Any, Any]:
    """The (activate, suppress) masks on ``device`` (``None`` stays ``None``)."""
    return tuple(None if m is None else m.to(device) for m in masks)  # type: ignore[return-value]


STATE = _HookState()
_INSTALLED = False


def _torch() -> Any:
    import torch

    return torch


def _layer_index(name: str) -> int:
    match = re.search(r"layers\.(\d+)\.", name + ".")
    return int(match.group(1)) if match else -1


@dataclass
class GroupedRule:
    """A vLLM router's sigmoid, grouped top-k rule (DeepSeek-V3 style), read from the router itself.

    Duck-types the fields :func:`~ror_annotate.steer.families.route` reads of a
    :class:`~ror_annotate.steer.families.RouterSite`, so the vLLM engine steers with the HF engine's
    grouped selection. The bias is read from the router at each call (vLLM loads the weights into
    the parameter after the router is built).

    Attributes
    ----------
    router : vllm FusedMoERouter
        Holds ``e_score_correction_bias`` ``[n_experts]`` float32.
    n_experts, top_k, n_group, topk_group : int
        Routed experts, experts per token, expert groups and groups kept (``1, 1`` when vLLM's router
        falls back to ungrouped biased top-k: ``n_experts`` not a multiple of more than ``n_group``).
    renormalize : bool
        Whether the selected sigmoid scores are divided by their sum.
    scaling : float
        The router's ``routed_scaling_factor`` (``1.0`` where vLLM applies the family's factor to the
        MoE output instead, as it does for GLM-4-MoE on CPU: the weights are then vLLM's).
    """

    router: Any
    n_experts: int
    top_k: int
    n_group: int
    topk_group: int
    renormalize: bool
    scaling: float

    @property
    def bias(self) -> Any:
        return self.router.e_score_correction_bias

    @property
    def group_size(self) -> int:
        return self.n_experts // self.n_group


#: Decoder layer -> the grouped rule of its router (filled by :func:`build_llm`; read by ``route_grouped``).
GROUPED_RULES: dict[int, GroupedRule] = {}


def _is_grouped(router: Any) -> bool:
    """True for a router that selects by sigmoid scores plus a score-correction bias (the grouped rule)."""
    return getattr(router, "scoring_func", "softmax") == "sigmoid" and getattr(router, "e_score_correction_bias", None) is not None


def router_rule(router: Any) -> GroupedRule | None:
    """The routing rule of a vLLM MoE router: ``None`` for softmax top-k, a :class:`GroupedRule` for
    sigmoid scores with a score-correction bias (grouped or not).

    Mirrors vLLM 0.32's ``CPURouter`` / ``GroupedTopKRouter``: groups are used when
    ``use_grouped_topk`` (CPU) and ``num_expert_group`` divides ``n_experts`` into more than one
    expert per group; ``GroupedTopKRouter`` otherwise falls back to ungrouped biased top-k, which is
    the grouped rule with one group.

    Raises
    ------
    SteerError
        ``E955`` for a rule this engine does not define the edit or the capture check for: softmax
        scores with groups or a bias (DeepSeek-V2 style), sigmoid scores without a bias, or another
        scoring function (``sqrtsoftplus``...).
    """
    scoring = getattr(router, "scoring_func", "softmax")
    bias = getattr(router, "e_score_correction_bias", None)
    uses_groups = bool(getattr(router, "use_grouped_topk", True))
    n_group = int(getattr(router, "num_expert_group", None) or 1) if uses_groups else 1
    topk_group = int(getattr(router, "topk_group", None) or 1) if uses_groups else 1
    n_experts, top_k = int(router.global_num_experts), int(router.top_k)
    name = type(router).__name__
    if scoring == "softmax" and bias is None and n_group <= 1:
        return None
    if scoring != "sigmoid" or bias is None:
        raise SteerError(f"vLLM router {name} scores experts with {scoring!r}"
                         f"{' and a score-correction bias' if bias is not None else ''}"
                         f"{f' in {n_group} groups' if n_group > 1 else ''}: the vLLM engine defines its edit and capture check "
                         "for softmax top-k and for sigmoid scores with a score-correction bias only", code="E955")
    if n_experts <= n_group or n_experts % n_group:
        n_group = topk_group = 1
    return GroupedRule(router, n_experts, top_k, n_group, topk_group, bool(getattr(router, "renormalize", True)),
                       float(getattr(router, "routed_scaling_factor", 1.0) or 1.0))


#: Decoder layers whose output stream the next engine built instruments (``"all"``, or a set); read once by the
#: model loader's patch, before compilation (the layers' flags are constants to ``torch.compile``).
RESIDUAL_BUILD: dict[str, Any] = {"layers": None}
_DECODER_RE = re.compile(r"(?:^|\.)layers\.(\d+)$")


def _mark_residual_layers(model: Any, torch: Any) -> None:
    """After vLLM built the model and before it is compiled: flag the decoder layers of
    ``RESIDUAL_BUILD["layers"]`` and wrap their class's ``forward`` so that a flagged layer passes its
    output through ``ror_annotate::residual_record``.

    Decoder layers are the modules named ``...layers.<i>``; every vLLM MoE family's layer returns
    ``(hidden_states, residual)``, whose sum is the residual stream after the layer (what a
    transformers decoder layer returns). A layer that returns something else is never recorded, so
    its capture fails with ``E921``.
    """
    wanted = RESIDUAL_BUILD["layers"]
    if wanted is None and os.environ.get(RESIDUAL_ENV):  # a worker process spawned by build_llm
        wanted = json.loads(os.environ[RESIDUAL_ENV])
    found: dict[int, Any] = {}
    for name, module in model.named_modules():
        match = _DECODER_RE.search(name)
        if match:
            found[int(match.group(1))] = module
    RESIDUAL_BUILD["decoder_layers"] = sorted(found)
    if not wanted:
        return
    chosen = sorted(found) if wanted == "all" else sorted(set(wanted) & set(found))
    for index in chosen:
        module = found[index]
        module._ror_residual = index
        cls = type(module)
        if getattr(cls, "_ror_wrapped", False):
            continue
        original = cls.forward

        def forward(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            out = _original(self, *args, **kwargs)
            index = getattr(self, "_ror_residual", -1)
            if index >= 0 and isinstance(out, tuple) and len(out) == 2 and out[1] is not None:
                out = (torch.ops.ror_annotate.residual_record(out[0], out[1], index), out[1])
            return out

        cls.forward = forward
        cls._ror_wrapped = True


def _custom_op(torch: Any, name: str, schema: str, impl: Callable[..., Any], *, like: tuple[int, ...]) -> None:
    """Register ``ror_annotate::<name>`` as an opaque ``torch.library`` custom op with its fake (meta) function.

    ``torch.compile`` keeps an opaque op as one node of the graph, so the Python behind it runs on every
    forward (an instance patch is inlined away, see the module notes). The fake function gives the
    compiler the outputs' shapes and dtypes: ``torch.empty_like`` of the arguments at ``like``.

    Parameters
    ----------
    torch : module
    name : str
        The op's name in the ``ror_annotate`` namespace (called as ``torch.ops.ror_annotate.<name>``).
    schema : str
        Its schema, e.g. ``"(Tensor logits, int layer) -> Tensor"``.
    impl : callable
        What it runs, with the schema's arguments in order; returns new tensors (never an input itself).
    like : tuple of int
        Positions of the arguments each output has the shape and dtype of (one output per position).
    """
    op = torch.library.custom_op(f"ror_annotate::{name}", mutates_args=(), schema=schema)(impl)

    def fake(*args: Any) -> Any:
        out = tuple(torch.empty_like(args[k]) for k in like)
        return out[0] if len(out) == 1 else out

    op.register_fake(fake)


def _patch_loader(torch: Any) -> None:
    """Register ``ror_annotate::residual_record`` and wrap vLLM's model loader so that the decoder layers asked
    for (:data:`RESIDUAL_BUILD`) are flagged after the model is built, before it is compiled."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    def residual_record(hidden: Any, residual: Any, layer: int) -> Any:
        STATE.record_residual(hidden, residual, layer)
        return hidden.clone()

    _custom_op(torch, "residual_record", "(Tensor hidden, Tensor residual, int layer) -> Tensor", residual_record, like=(0,))
    original_load = BaseModelLoader.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = original_load(self, *args, **kwargs)
        _mark_residual_layers(model, torch)
        return model

    BaseModelLoader.load_model = load_model  # type: ignore[method-assign]


def install() -> None:
    """Register the custom ops and patch vLLM's router and model runner (idempotent).

    Call before the ``LLM`` is built (:func:`build_llm` does), so ``torch.compile`` sees the ops.

    Raises
    ------
    SteerError
        ``E922`` when vLLM is not importable.
    """
    global _INSTALLED
    if _INSTALLED:
        return
    require_vllm()
    torch = _torch()
    from vllm.model_executor.layers.fused_moe.router.fused_moe_router import FusedMoERouter
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def route_record(logits: Any, selected: Any, layer: int) -> Any:
        STATE.record(logits, selected, layer)
        return selected.clone()

    _custom_op(torch, "route_edit", "(Tensor logits, int layer) -> Tensor", STATE.edit, like=(0,))
    _custom_op(torch, "route_record", "(Tensor logits, Tensor selected, int layer) -> Tensor", route_record, like=(1,))
    _custom_op(torch, "route_grouped", "(Tensor logits, Tensor weights, Tensor ids, int layer) -> (Tensor, Tensor)", STATE.regroup, like=(1, 2))

    original_select = FusedMoERouter.select_experts

    def select_experts(self: Any, hidden_states: Any, router_logits: Any, topk_indices_dtype: Any = None, *,
                       input_ids: Any = None) -> tuple[Any, Any]:
        layer = getattr(self, "_ror_layer", -1)
        n_experts = int(self.global_num_experts)
        logits = torch.ops.ror_annotate.route_edit(router_logits, layer)
        weights, ids = original_select(self, hidden_states, logits, topk_indices_dtype, input_ids=input_ids)
        if getattr(self, "_ror_grouped", False):  # fixed when the router is built, before compilation
            weights, ids = torch.ops.ror_annotate.route_grouped(logits, weights, ids, layer)
        ids = torch.ops.ror_annotate.route_record(router_logits[..., :n_experts], ids, layer)
        return weights, ids

    original_init = MoERunner.__init__

    def runner_init(self: Any, layer_name: str, *args: Any, **kwargs: Any) -> None:
        original_init(self, layer_name, *args, **kwargs)
        self.router._ror_layer = _layer_index(layer_name)
        self.router._ror_grouped = _is_grouped(self.router)

    original_prepare = GPUModelRunner._prepare_inputs

    def prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: Any, *args: Any, **kwargs: Any) -> Any:
        STATE.begin(self, num_scheduled_tokens)
        return original_prepare(self, scheduler_output, num_scheduled_tokens, *args, **kwargs)

    original_forward = GPUModelRunner._model_forward

    def model_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        STATE.start_forward()
        out = original_forward(self, *args, **kwargs)
        STATE.end_forward()
        return out

    _patch_loader(torch)
    FusedMoERouter.select_experts = select_experts  # type: ignore[method-assign]
    MoERunner.__init__ = runner_init  # type: ignore[method-assign]
    GPUModelRunner._prepare_inputs = prepare_inputs  # type: ignore[method-assign]
    GPUModelRunner._model_forward = model_forward  # type: ignore[method-assign]
    _INSTALLED = True


#: ``worker_extension_cls`` of every engine :func:`build_llm` builds: importing it installs the hooks in the
#: worker process (before vLLM builds the model there) and adds the ``ror_*`` methods reached by ``collective_rpc``.
WORKER_EXTENSION = "ror_annotate.steer.vllm_ext.RorWorkerExtension"
#: Environment variable that carries ``build_llm(residual_layers=...)`` to worker processes (JSON).
RESIDUAL_ENV = "ROR_VLLM_RESIDUAL_LAYERS"


class RorWorkerExtension:
    """Methods vLLM mixes into each of its workers (``worker_extension_cls``), called from the driver through
    ``LLM.collective_rpc(name)``: one worker in-process at ``tensor_parallel_size=1``, one per rank otherwise.

    Every rank computes the same router logits (the gate is a replicated layer and every rank holds all of the
    step's tokens under tensor parallelism), so every rank applies the same edit from the same configuration
    and batch state, and only rank 0 keeps captured rows.
    """

    rank: int
    model_config: Any
    model_runner: Any

    def ror_configure(self, config: dict[str, Any]) -> None:
        """Arm this worker's hooks (:meth:`_HookState.configure`); an empty ``config`` disarms them."""
        def tokenizer() -> Any:
            from vllm.tokenizers import cached_tokenizer_from_config

            return cached_tokenizer_from_config(self.model_config)

        STATE.configure(config, tokenizer)

    def ror_start_capture(self) -> None:
        """Collect the next steps' rows (rank 0 only; the other ranks' rows are the same)."""
        STATE.capture = {} if self.rank == 0 else None
        STATE.failure = None

    def ror_take_capture(self) -> dict[str, Any] | None:
        """Stop collecting; rank 0 returns ``{"chunks": {request id: [(positions, logits, selected, residual),
        ...]}, "failure": None or (code, message)}``, the other ranks ``None``."""
        chunks, failure, STATE.capture, STATE.failure = STATE.capture, STATE.failure, None, None
        return {"chunks": chunks, "failure": failure} if self.rank == 0 else None

    def ror_describe(self) -> dict[str, Any]:
        """The MoE layers of this worker's model: ``sites`` ``{layer: (n_experts, top_k)}``, ``rules`` ``{layer:
        None | {n_experts, top_k, n_group, topk_group, renormalize, scaling, bias}}`` (bias float32 numpy),
        ``dtype``, parameter names ``params``, ``decoder_layers``; fills this process's :data:`GROUPED_RULES`.

        Raises
        ------
        SteerError
            ``E955`` a router rule the engine does not define (:func:`router_rule`).
        """
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

        model = self.model_runner.get_model()
        found, rules = {}, {}
        for _name, module in model.named_modules():
            if isinstance(module, MoERunner):
                router = module.router
                layer = int(router._ror_layer)
                found[layer] = (int(router.global_num_experts), int(router.top_k))
                rules[layer] = router_rule(router)
        GROUPED_RULES.clear()
        GROUPED_RULES.update({layer: rule for layer, rule in rules.items() if rule is not None})
        plain = {layer: None if r is None else {"n_experts": r.n_experts, "top_k": r.top_k, "n_group": r.n_group,
                                                "topk_group": r.topk_group, "renormalize": r.renormalize,
                                                "scaling": r.scaling, "bias": r.bias.detach().float().cpu().numpy()}
                 for layer, r in rules.items()}
        return {"sites": found, "rules": plain, "dtype": str(next(model.parameters()).dtype),
                "params": [name for name, _ in model.named_parameters()], "rank": int(self.rank),
                "decoder_layers": list(RESIDUAL_BUILD.get("decoder_layers", []))}


def _workers(engine: Any, method: str, *args: Any) -> list[Any]:
    """``method`` of :class:`RorWorkerExtension` run on every worker of ``engine``; their results in rank order."""
    return list(engine.llm.collective_rpc(method, args=args))


def _rank0(results: list[Any]) -> Any:
    """The one result a rank-0-only call returns (the other ranks return ``None``)."""
    return next((r for r in results if r is not None), None)


def _take_capture(engine: Any) -> dict[str, list]:
    """Stop the capture on every worker and return rank 0's rows by request id.

    Raises
    ------
    CaptureCheckError
        The failure a worker recorded during the capture (``E921``: a hook did not fire in a step).
    """
    got = _rank0(_workers(engine, "ror_take_capture")) or {"chunks": None, "failure": None}
    if got["failure"] is not None:
        code, message = got["failure"]
        raise CaptureCheckError(message, code=code)
    return got["chunks"] or {}


@dataclass(frozen=True)
class RuleSummary:
    """What the driver keeps of a worker's :class:`GroupedRule` (plain data: it crosses processes).

    Attributes
    ----------
    n_experts, top_k, n_group, topk_group : int
    renormalize : bool
    scaling : float
    bias : numpy.ndarray
        ``[n_experts]`` float32 score-correction bias.
    """

    n_experts: int
    top_k: int
    n_group: int
    topk_group: int
    renormalize: bool
    scaling: float
    bias: np.ndarray


@dataclass(frozen=True)
class VllmSite:
    """A MoE layer of a vLLM model: what steering validates (:meth:`RoutingEdit.validate`).

    Attributes
    ----------
    layer, n_experts, top_k, position : int
        Decoder layer index, routed experts, experts per token, index among the MoE layers.
    family : FamilySpec or None
        The registered family (``None`` for a softmax model type not in the registry).
    n_group, topk_group : int
        Expert groups and groups kept (sigmoid, grouped routers; ``1, 1`` otherwise).
    """

    layer: int
    n_experts: int
    top_k: int
    position: int = 0
    family: Any = None
    n_group: int = 1
    topk_group: int = 1

    @property
    def group_size(self) -> int:
        """Experts per group."""
        return self.n_experts // self.n_group


@dataclass
class VllmEngine:
    """A built ``vllm.LLM`` with the hooks installed, and what capture and steering need of it.

    Attributes
    ----------
    llm : vllm.LLM
    model : str
        The checkpoint path.
    sites : list of VllmSite
        Every MoE layer (from the runners vLLM built).
    expected_layers : list of int
        Decoder layers holding expert parameters, counted from parameter names (E911).
    dtype : str
        The forward dtype (``"torch.float32"``...).
    family : str
        The family name (as the HF engine records it) or the model_type.
    grouped_bias : dict of int to numpy.ndarray
        Sigmoid, grouped routers only: each MoE layer's score-correction bias ``[n_experts]``
        float32, for the E912 check of the family's grouped rule (empty otherwise).
    residual_layers : list of int
        Decoder layers instrumented for residual-stream capture (``build_llm(residual_layers=...)``).
    hidden_size : int
        Width of the residual stream.
    """

    llm: Any
    model: str
    sites: list[VllmSite]
    expected_layers: list[int]
    dtype: str
    family: str
    grouped_bias: dict[int, np.ndarray] = field(default_factory=dict)
    residual_layers: list[int] = field(default_factory=list)
    hidden_size: int = 0

    def grouped_selection(self, layers: Sequence[int]) -> Any:
        """The E912 rule (:class:`~ror_annotate.steer.checks.GroupedSelection`) of ``layers``, or ``None``."""
        from .checks import GroupedSelection

        if not self.grouped_bias:
            return None
        site = next(s for s in self.sites if s.layer == layers[0])
        return GroupedSelection(np.stack([self.grouped_bias[layer] for layer in layers]).astype(np.float32),
                                site.n_group, site.topk_group)

    @property
    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def close(self) -> None:
        """Shut the engine down now: its worker processes (tensor parallel) exit (else at interpreter exit)."""
        self.llm.llm_engine.engine_core.shutdown()


def _family_spec(model_type: str) -> Any:
    """The registered :class:`~ror_annotate.steer.families.FamilySpec` of ``model_type``, or ``None``."""
    from .families import FAMILIES

    for name, spec in FAMILIES.items():
        if name == model_type or model_type in spec.model_types:
            return spec
    return None


def _family_name(model_type: str) -> str:
    """The registered family of ``model_type`` (or ``model_type`` itself)."""
    spec = _family_spec(model_type)
    return model_type if spec is None else spec.name


def _groups(rule: "GroupedRule | RuleSummary | None") -> tuple[int, int]:
    """``(n_group, topk_group)`` of a router rule (``1, 1`` for softmax top-k)."""
    return (1, 1) if rule is None else (rule.n_group, rule.topk_group)


def check_family_rule(family: Any, model_type: str, rules: "Mapping[int, GroupedRule | RuleSummary | None]") -> None:
    """Refuse a model whose vLLM routers and registered family disagree on the routing rule.

    Parameters
    ----------
    family : FamilySpec or None
        The registered family of ``model_type``.
    model_type : str
    rules : dict of int to GroupedRule, RuleSummary or None
        Per MoE layer, :func:`router_rule` of its vLLM router.

    Raises
    ------
    SteerError
        ``E955`` when vLLM routes by the grouped rule but the family is not a registered
        ``sigmoid_grouped`` one (the edits could not be validated against the groups), or the
        family is grouped but vLLM's router is not.
    """
    grouped = {layer for layer, rule in rules.items() if rule is not None}
    if grouped and (family is None or not family.grouped):
        raise SteerError(f"{model_type}: vLLM routes MoE layer(s) {sorted(grouped)} by sigmoid scores with a score-correction "
                         f"bias but the family {getattr(family, 'name', model_type)!r} is not registered as "
                         "scoring='sigmoid_grouped'; register it (ror_annotate.steer.families.register_family)", code="E955")
    if family is not None and family.grouped and len(grouped) != len(rules):
        plain = sorted(set(rules) - grouped)
        raise SteerError(f"family {family.name} routes with sigmoid, grouped top-k but vLLM built softmax routers at "
                         f"layer(s) {plain}: not the family's rule", code="E955")


def _numa_nodes() -> int:
    """NUMA nodes of this machine (1 where ``/sys`` does not say)."""
    return max(1, len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))))


def check_parallel(tensor_parallel_size: int, options: dict[str, Any]) -> None:
    """Refuse the parallel modes capture and steering are not defined or not tested for.

    Tensor parallelism is supported (every rank holds all tokens and the replicated gate, so the router
    logits are the same on every rank: rank 0's are captured, the edit is applied on every rank).

    Parameters
    ----------
    tensor_parallel_size : int
        Ranks of the tensor-parallel group (>= 1).
    options : dict
        The other ``vllm.LLM`` keywords.

    Raises
    ------
    SteerError
        ``E963`` expert parallelism (``enable_expert_parallel``): vLLM 0.32's CPU MoE kernel crashes under
        it (so it could not be tested here) and, with EPLB, ids become physical slots; ``E964`` pipeline
        or data parallelism: a rank then holds only some layers, or only some requests, while capture
        reads rank 0; ``E965`` a ``tensor_parallel_size`` below 1.
    """
    if int(tensor_parallel_size) < 1:
        raise SteerError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}", code="E965")
    if options.get("enable_expert_parallel") or options.get("enable_eplb"):
        raise SteerError("the vLLM engine does not support expert parallelism (enable_expert_parallel / enable_eplb): "
                         "vLLM 0.32's CPU MoE kernel crashes under it, so capture and steering could not be tested; use "
                         "tensor_parallel_size=N without it (every rank then holds every expert's slice), or shard the "
                         "prompts over several engines", code="E963")
    for key in ("pipeline_parallel_size", "data_parallel_size"):
        if int(options.get(key) or 1) > 1:
            raise SteerError(f"the vLLM engine does not support {key}={options[key]}: capture reads rank 0, which would "
                             "hold only some layers (pipeline) or only some requests (data parallel); use "
                             "tensor_parallel_size=N, or shard the prompts over several engines", code="E964")


def build_llm(model: str | Path, *, dtype: str = "auto", enforce_eager: bool = False, max_num_seqs: int = 64,
              max_model_len: int | None = None, seed: int = 0, tensor_parallel_size: int = 1,
              residual_layers: Sequence[int] | str | None = None, **kwargs: Any) -> VllmEngine:
    """Build an in-process ``vllm.LLM`` with the capture/steer hooks installed.

    Parameters
    ----------
    model : str or Path
        Local checkpoint folder (``config.json``, weights, tokenizer).
    dtype : str
        ``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``.
    enforce_eager : bool
        Skip ``torch.compile`` (the hooks work either way).
    max_num_seqs : int
        Requests per step (continuous batching).
    max_model_len : int, optional
    seed : int
    tensor_parallel_size : int
        Ranks of vLLM's tensor-parallel group (worker processes when > 1; every rank runs the hooks,
        rank 0's rows are captured). On a CPU with fewer NUMA nodes than ranks, ``VLLM_CPU_OMP_THREADS_BIND``
        defaults to ``nobind`` (vLLM's CPU build refuses to start otherwise).
    residual_layers : sequence of int or "all", optional
        Decoder layers whose output (the residual stream after the layer) capture may store too:
        they are instrumented while the model is built, before compilation (others cost nothing).
    **kwargs
        Passed to ``vllm.LLM``.

    Returns
    -------
    VllmEngine

    Raises
    ------
    SteerError
        ``E922`` vLLM missing; ``E963``-``E965`` a parallel mode the engine does not support
        (:func:`check_parallel`); ``E901`` no such checkpoint; ``E923``
        the model has no MoE layer vLLM routes through ``select_experts``; ``E955`` a router rule the
        engine does not define (:func:`router_rule`, :func:`check_family_rule`); residual layers that
        are not decoder layers of the model.
    """
    from .capture import check_model_source

    source, _ = check_model_source(model)
    check_parallel(tensor_parallel_size, kwargs)
    vllm = require_vllm()
    install()
    torch = _torch()
    options: dict[str, Any] = {"dtype": dtype, "enforce_eager": enforce_eager, "max_num_seqs": max_num_seqs,
                               "seed": seed, "enable_prefix_caching": True, "tensor_parallel_size": tensor_parallel_size,
                               "worker_extension_cls": WORKER_EXTENSION}
    if max_model_len is not None:
        options["max_model_len"] = max_model_len
    if torch.cuda.is_available() and not enforce_eager:
        options["compilation_config"] = {"cudagraph_mode": "NONE"}
    elif not torch.cuda.is_available() and tensor_parallel_size > _numa_nodes():
        # vLLM's CPU build binds each rank's OpenMP threads to a NUMA node of its own and refuses to start
        # with fewer nodes than ranks; unbound threads work (an explicit binding set by the user is kept)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    options.update(kwargs)
    if isinstance(residual_layers, str) and residual_layers != "all":
        raise SteerError(f"residual_layers must be a list of decoder layers or 'all', got {residual_layers!r}")
    RESIDUAL_BUILD["layers"] = residual_layers if isinstance(residual_layers, str) or residual_layers is None \
        else sorted({int(x) for x in residual_layers})
    os.environ[RESIDUAL_ENV] = json.dumps(RESIDUAL_BUILD["layers"])  # spawned workers read it
    try:
        llm = vllm.LLM(model=source, **options)
    finally:
        wanted, RESIDUAL_BUILD["layers"] = RESIDUAL_BUILD["layers"], None
        os.environ.pop(RESIDUAL_ENV, None)

    info = llm.collective_rpc("ror_describe")[0]
    if not info["sites"]:
        raise SteerError(f"{model}: vLLM built no MoE layer routed through select_experts; not an MoE model "
                         "(or a monolithic MoE kernel that bypasses the router)", code="E923")
    decoder = list(info["decoder_layers"])
    if wanted and wanted != "all" and set(wanted) - set(decoder):
        raise SteerError(f"residual layers {sorted(set(wanted) - set(decoder))} are not decoder layers of the model "
                         f"(0..{max(decoder) if decoder else -1})")
    res_layers = decoder if wanted == "all" else list(wanted or [])
    model_type = getattr(llm.llm_engine.model_config.hf_config, "model_type", "")
    family = _family_spec(model_type)
    rules: dict[int, RuleSummary | None] = {layer: None if r is None else RuleSummary(**r) for layer, r in info["rules"].items()}
    check_family_rule(family, model_type, rules)
    sites = [VllmSite(layer, e, k, i, family, *_groups(rules[layer])) for i, (layer, (e, k)) in enumerate(sorted(info["sites"].items()))]
    expected = sorted({int(m.group(1)) for name in info["params"]
                       if (m := re.search(r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?experts(?:\.|$)", name))})
    bias = {layer: np.asarray(rule.bias, dtype=np.float32) for layer, rule in rules.items() if rule is not None}
    hf_config = llm.llm_engine.model_config.hf_config
    text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return VllmEngine(llm, source, sites, expected, info["dtype"], model_type if family is None else family.name, bias,
                      res_layers, int(getattr(text_config, "hidden_size", 0) or 0))


# ---------------------------------------------------------------------------------------------- capture


class VllmCaptureOptions(StageOptions):
    """Options of :func:`capture_router_logits_vllm` (``ror steer capture --engine vllm``), each
    documented there; the checks of their values run in the function, as before."""

    stage: ClassVar[str] = "the vLLM capture"
    model_name: str = ""
    splits: Sequence[str] | None = None
    layers: Sequence[int] | None = None
    batch_size: int = 64
    logits_dtype: str = "float16"
    overwrite: bool = False
    limit: int | None = None
    checks: bool = True
    reference: bool = True
    residual_layers: Sequence[int] | str | None = None
    background_writer: bool | None = None


def capture_router_logits_vllm(engine: VllmEngine, tokens: Any, out_dir: str | Path,
                               options: VllmCaptureOptions | None = None, *,
                               progress: Callable[[int], None] | None = None, **kwargs: Any) -> Any:
    """Capture router logits of every trace of ``tokens`` with vLLM, in the HF engine's on-disk format.

    Each trace is one request (``max_tokens=1``: only its prompt goes through the model) with its
    own ``cache_salt``; ``batch_size`` requests go to vLLM at once and are continuously batched (a
    step mixes chunks of several prompts). Rows are filed under their request by position.

    Parameters
    ----------
    engine : VllmEngine
        From :func:`build_llm`.
    tokens : datasets.DatasetDict
        The exported ``tokens`` configuration.
    out_dir : str or Path
        Capture directory (resumed when compatible, as with the HF engine).
    options : VllmCaptureOptions, optional
        The settings below as one model; else they are given as keywords (``**kwargs``), validated
        by :meth:`VllmCaptureOptions.from_options` (an unknown name: ConfigError with the closest one).
    model_name, splits, layers, logits_dtype, overwrite, limit, progress
        As :func:`~ror_annotate.steer.capture.capture_router_logits`.
    batch_size : int
        Requests submitted to vLLM per call (and written per batch).
    checks : bool
        Run E910-E913 on every batch before writing.
    reference : bool
        For E913, compare the first rows of the first trace with a plain transformers forward of
        the same checkpoint (loads the checkpoint once more, on CPU, in the engine's dtype).
    residual_layers : sequence of int or "all", optional
        Decoder layers whose output (the residual stream after the layer: vLLM's ``hidden_states +
        residual``) is stored too, from the same steps, in ``residual.bin`` float16 as the HF engine
        stores it; the engine must have been built with them (``build_llm(residual_layers=...)``);
        ``"all"``: every layer the engine was built with.
    background_writer : bool, optional
        Write each batch to disk in a background thread while vLLM runs the next one (default: on
        CUDA). The self-checks still run on every batch before it is handed to the writer.

    Returns
    -------
    CaptureReport

    Raises
    ------
    SteerError
        Unknown split or layer, incompatible existing capture, residual layers the engine was not
        built with.
    CaptureCheckError
        ``E920`` a request's rows are not exactly positions ``0..T-1``; ``E921`` a hook did not
        fire; ``E910``-``E913`` as on the HF engine. Nothing of the failing batch is written.
    """
    o = VllmCaptureOptions.resolve(options, kwargs)
    model_name, splits, layers, batch_size, logits_dtype = o.model_name, o.splits, o.layers, o.batch_size, o.logits_dtype
    overwrite, limit, checks, reference = o.overwrite, o.limit, o.checks, o.reference
    res_layers = _residual_request(engine, o.residual_layers)
    torch = _torch()
    from vllm import SamplingParams

    from .capture import STORE_DTYPES, CaptureMeta, CaptureReport, _BackgroundWriter, _check_vocab, _drop_if_empty, _SplitRows, _Writer
    from .checks import FORWARD_CHECK_ROWS

    if logits_dtype not in STORE_DTYPES:
        raise SteerError(f"logits_dtype must be one of {sorted(STORE_DTYPES)}, got {logits_dtype!r}")
    sites = _capture_sites(engine, layers, checks)
    meta = CaptureMeta(model=model_name or engine.model, family=engine.family, layers=[s.layer for s in sites],
                       n_experts=sites[0].n_experts, top_k=sites[0].top_k, logits_dtype=logits_dtype,
                       model_dtype=engine.dtype, residual_layers=res_layers,
                       hidden_size=engine.hidden_size if res_layers else 0, version=2 if res_layers else 1)
    splits = list(splits) if splits is not None else list(tokens.keys())
    unknown_splits = [s for s in splits if s not in tokens]
    if unknown_splits:
        raise SteerError(f"splits {unknown_splits} not in the tokens dataset; it has {list(tokens.keys())}")
    vocab = int(engine.llm.llm_engine.model_config.get_vocab_size())
    created = not Path(out_dir).exists()
    writer = _Writer(Path(out_dir), meta, overwrite=overwrite)
    kw = {"family": meta.family, "layers": meta.layers, "model_dtype": meta.model_dtype, "storage_dtype": logits_dtype}
    grouped = engine.grouped_selection(meta.layers)  # sigmoid, grouped families: E912 checks their own rule
    ref: dict[str, np.ndarray] = {}
    report = CaptureReport(out_dir=str(out_dir))
    params = SamplingParams(max_tokens=1, temperature=0.0)
    start = time.perf_counter()
    threaded = torch.cuda.is_available() if o.background_writer is None else o.background_writer
    background = _BackgroundWriter(writer, threaded=threaded)  # checks run before submit, in this thread
    _workers(engine, "ror_configure", {"capture_layers": meta.layers, "residual_layers": res_layers,
                                       "capture_dtype": logits_dtype})
    try:
        for split in splits:
            rows_of = _SplitRows(tokens[split])
            todo = [i for i, tid in enumerate(rows_of.trace_ids) if tid not in writer.done]
            report.skipped += len(rows_of) - len(todo)
            if limit is not None:
                todo = todo[: max(0, limit - report.captured)]
            for b in range(0, len(todo), batch_size):
                rows = [rows_of.row(i) for i in todo[b:b + batch_size]]
                empty = [r["trace_id"] for r in rows if not len(r["input_ids"])]
                if empty:
                    raise SteerError(f"{split}: trace(s) {empty[:3]} have no input_ids; re-export them")
                _check_vocab(rows, vocab, split)
                if checks and reference and not ref and rows:
                    ref[rows[0]["trace_id"]] = _reference_rows(engine, rows[0]["input_ids"][:FORWARD_CHECK_ROWS])
                arrays = _capture_batch(engine, [r["input_ids"] for r in rows], params)
                if checks:
                    _check(rows, arrays, ref, meta.top_k, kw, grouped)
                background.submit([{"trace_id": r["trace_id"], "split": split, "dataset": r["dataset"]} for r in rows],
                                  cast(Any, _Ragged(arrays)), [slice(None)] * len(rows))
                report.captured += len(rows)
                report.tokens += sum(len(r["input_ids"]) for r in rows)
                report.splits[split] = report.splits.get(split, 0) + len(rows)
                if progress is not None:
                    progress(len(rows))
        background.close()
    except CaptureCheckError:
        _drop_if_empty(writer, created)
        raise
    finally:
        _workers(engine, "ror_configure", {})
        if background.thread is not None and background.thread.is_alive():
            background.queue.put(None)
            background.thread.join()
        writer.close()
    report.seconds = time.perf_counter() - start
    return report


def _capture_sites(engine: VllmEngine, layers: Sequence[int] | None, checks: bool) -> list[VllmSite]:
    """The MoE layers to capture (every one, checked against the expert count: E911; or ``layers``)."""
    from .checks import check_layers_found

    sites = engine.sites
    if checks:
        check_layers_found(engine.expected_layers, [s.layer for s in sites], family=engine.family)
    if layers is not None:
        unknown = set(int(x) for x in layers) - {s.layer for s in sites}
        if unknown:
            raise SteerError(f"layers {sorted(unknown)} have no MoE router; MoE layers: {[s.layer for s in sites]}")
        sites = [s for s in sites if s.layer in set(int(x) for x in layers)]
    if len({(s.n_experts, s.top_k) for s in sites}) != 1:
        raise SteerError("MoE layers differ in n_experts/top_k; capture them separately with --layers")
    return sites


class _Ragged:
    """A batch of per-request host arrays in the shape :class:`~ror_annotate.steer.capture._BackgroundWriter`
    reads (``arrays()`` -> logits, selected, residual, each indexed ``[row, slice]``)."""

    class _Rows:
        def __init__(self, items: list[np.ndarray]) -> None:
            self.items = items

        def __getitem__(self, key: tuple[int, slice]) -> np.ndarray:
            row, sl = key
            return self.items[row][sl]

    def __init__(self, arrays: list[tuple[np.ndarray, np.ndarray, "np.ndarray | None"]]) -> None:
        self.batch = arrays

    def arrays(self) -> tuple[Any, Any, Any]:
        residual = [a[2] for a in self.batch if a[2] is not None]
        return (self._Rows([a[0] for a in self.batch]), self._Rows([a[1] for a in self.batch]),
                self._Rows(residual) if len(residual) == len(self.batch) else None)


def _residual_request(engine: VllmEngine, spec: "Sequence[int] | str | None") -> list[int]:
    """The residual layers a capture asks for, checked against those the engine was built with."""
    if spec is None:
        return []
    if isinstance(spec, str):
        if spec != "all":
            raise SteerError(f"residual_layers must be a list of decoder layers or 'all', got {spec!r}")
        wanted = list(engine.residual_layers)
    else:
        wanted = sorted({int(x) for x in spec})
    missing = sorted(set(wanted) - set(engine.residual_layers))
    if missing or not wanted:
        raise SteerError(f"residual layers {missing or spec} were not instrumented when the vLLM engine was built "
                         f"(built with {engine.residual_layers}); build it with build_llm(..., residual_layers=...)")
    return wanted


def _check(rows: list[dict], arrays: list[tuple[np.ndarray, np.ndarray, Any]], ref: dict[str, np.ndarray], top_k: int,
           kw: dict[str, Any], grouped: Any = None) -> None:
    """E910-E912 on the batch (``grouped``: the family's grouped rule), E913 on the trace that has a
    transformers reference."""
    from .checks import FORWARD_CHECK_ROWS, check_batch, check_forward

    check_batch(np.concatenate([a[0] for a in arrays]), np.concatenate([a[1] for a in arrays]), top_k=top_k,
                grouped=grouped, **kw)
    for r, (lg, _, _) in zip(rows, arrays):
        if r["trace_id"] in ref:
            check_forward(lg[:FORWARD_CHECK_ROWS], ref[r["trace_id"]], trace_id=r["trace_id"], rtol=CROSS_ENGINE_RTOL, **kw)


def _capture_batch(engine: VllmEngine, sequences: Sequence[Any], params: Any) -> list[tuple[np.ndarray, np.ndarray, Any]]:
    """Run one batch of prompts and return each one's ``(logits [T, L, E], selected [T, L, k], residual [T, R, H]
    float16 or None)`` in order."""
    from vllm.inputs import TokensPrompt

    _workers(engine, "ror_start_capture")
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in seq], cache_salt=uuid.uuid4().hex) for seq in sequences]
    try:
        outputs = engine.llm.generate(prompts, params, use_tqdm=False)
    except BaseException:
        _workers(engine, "ror_take_capture")
        raise
    chunks = _take_capture(engine)
    by_prompt: list[tuple[np.ndarray, np.ndarray, Any]] = []
    for seq, out in zip(sequences, outputs):
        parts = chunks.get(out.request_id) or _match_request(chunks, out.request_id)
        n = len(seq)
        positions = np.concatenate([part[0] for part in parts]) if parts else np.zeros(0, dtype=np.int64)
        if len(positions) != n or not np.array_equal(positions, np.arange(n)):
            got = f"{len(positions)} rows" + (f", positions {positions[:3].tolist()}..{positions[-3:].tolist()}" if len(positions) else "")
            raise CaptureCheckError(f"vLLM engine: request {out.request_id} has {n} prompt tokens but its captured rows are "
                                    f"not exactly positions 0..{n - 1} ({got}); prefix caching or batching lost rows; "
                                    "nothing was written", code="E920")
        residual = None if parts[0][3] is None else np.concatenate([part[3] for part in parts])
        by_prompt.append((np.concatenate([part[1] for part in parts]), np.concatenate([part[2] for part in parts]), residual))
    return by_prompt


def _match_request(chunks: dict, request_id: str) -> list:
    """The rows of a request whose engine-internal id extends the id the output reports."""
    keys = [k for k in chunks if k.startswith(f"{request_id}-") or k.split("-")[0] == request_id]
    return chunks[keys[0]] if len(keys) == 1 else []


def _reference_rows(engine: VllmEngine, ids: Sequence[int]) -> np.ndarray:
    """Router logits of ``ids`` from a plain transformers forward of the same checkpoint (E913)."""
    from .capture import forward_router_logits, load_model

    hf = load_model(engine.model, device="cpu", dtype=engine.dtype.replace("torch.", ""))
    ((logits, _),) = forward_router_logits(hf, [list(int(t) for t in ids)])
    del hf
    return logits.numpy()


# ---------------------------------------------------------------------------------------------- steering


def _mask(torch: Any, n_experts: int, ids: Sequence[int]) -> Any:
    if not ids:
        return None
    out = torch.zeros(n_experts, dtype=torch.bool)
    out[list(ids)] = True
    return out


def _set_edit(engine: VllmEngine, edit: Any, schedule: str, pattern: str | None = None,
              record: bool = False) -> None:
    """Arm the edit (``edit`` None or empty: no edit) and, with ``record``, a float32 capture of every MoE
    layer, on every worker, for the next ``generate`` calls.

    Raises
    ------
    SteerError
        An edit the engine's sites refuse; an unknown schedule.
    """
    if schedule not in ("always", "after_first_answer"):
        raise SteerError(f"unknown schedule {schedule!r}; choose 'always' or 'after_first_answer'")
    config: dict[str, Any] = {}
    if record:
        config.update(capture_layers=[s.layer for s in engine.sites], capture_dtype="float32")
    if edit is not None and not edit.empty:
        edit.validate(engine.sites)  # type: ignore[arg-type]
        masks = {}
        for site in engine.sites:
            act, sup = edit.activate.get(site.layer, ()), edit.suppress.get(site.layer, ())
            if act or sup:
                masks[site.layer] = (site.n_experts, sorted(int(x) for x in act), sorted(int(x) for x in sup))
        config.update(edit=masks, eps=float(edit.eps), schedule=schedule, pattern=pattern)
    _workers(engine, "ror_configure", config)


def generate_vllm(engine: VllmEngine, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, edit: Any = None,
                  schedule: str = "always", record: bool = False, pattern: str | None = None) -> list[dict[str, Any]]:
    """Greedy generation of a batch of prompts, optionally steered, in one continuous batch.

    Parameters
    ----------
    engine : VllmEngine
    prompts : sequence of sequence of int
        Prompt token ids.
    max_new_tokens : int
    edit : RoutingEdit, optional
        The routing edit (``None`` or empty: the model as loaded; no row is touched).
    schedule : {"always", "after_first_answer"}
        Per request: every step, or only once its generated text holds a first answer.
    pattern : str, optional
        The first-answer pattern of ``after_first_answer`` (default: that of
        :class:`~ror_annotate.steer.steering.AfterFirstAnswer`).
    record : bool
        Also return, per request, the experts selected at every row ``[n_rows, n_layers, k]``
        (prompt and generated tokens but the last) in the order of ``engine.sites``.

    Returns
    -------
    list of dict
        Per prompt: ``token_ids`` (generated, cut after the first EOS as the HF engine does),
        ``text``, and with ``record`` ``selected`` and ``positions``.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tokenizer = engine.tokenizer
    _set_edit(engine, edit, schedule, pattern, record=record)
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    try:
        if record:
            _workers(engine, "ror_start_capture")
        outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(map(int, p)), cache_salt=uuid.uuid4().hex)
                                       for p in prompts], params, use_tqdm=False)
        chunks = _take_capture(engine) if record else {}
    finally:
        _workers(engine, "ror_configure", {})
    eos = tokenizer.eos_token_id
    rows = []
    for out in outputs:
        new = list(out.outputs[0].token_ids)
        if eos is not None and eos in new:
            new = new[: new.index(eos) + 1]
        row: dict[str, Any] = {"token_ids": new, "text": tokenizer.decode(new, skip_special_tokens=True)}
        if record:
            parts = chunks.get(out.request_id) or _match_request(chunks, out.request_id)
            row["positions"] = np.concatenate([part[0] for part in parts])
            row["selected"] = np.concatenate([part[2] for part in parts])
            row["logits"] = np.concatenate([part[1] for part in parts])
        rows.append(row)
    return rows


def run_evaluation_vllm(engine: VllmEngine, problems: Sequence[Any], edit: Any, *, conditions: Sequence[str] | None = None,
                        schedule: str = "always", max_new_tokens: int = 1024, seed: int = 0,
                        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The method's protocol on vLLM: every condition over all problems, each condition one batch.

    Same conditions, prompts, answer extraction and token accounting as
    :func:`~ror_annotate.steer.evaluate.run_evaluation` (rows of the same shape, so
    :func:`~ror_annotate.steer.evaluate.summarize` applies).

    Raises
    ------
    SteerError
        Unknown condition or schedule, an invalid or empty edit.
    """
    from ..answers import answers_match, extract_answer
    from .evaluate import CONCISE_SYSTEM_PROMPT, CONDITIONS, build_prompt
    from .steering import random_expert_sets

    conditions = list(conditions or CONDITIONS)
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad:
        raise SteerError(f"unknown conditions {bad}; choose from {', '.join(CONDITIONS)}")
    if schedule not in ("always", "after_first_answer"):
        raise SteerError(f"unknown schedule {schedule!r}; choose 'always' or 'after_first_answer'")
    edit.validate(engine.sites)
    if edit.empty and ("steered" in conditions or "random" in conditions):
        raise SteerError("the steering spec edits no expert; give --spec with activate/suppress sets")
    edits = {"unmodified": None, "steered": edit, "random": random_expert_sets(edit, engine.sites, seed=seed),  # type: ignore[arg-type]
             "concise_prompt": None}
    tokenizer = engine.tokenizer
    rows = []
    for condition in conditions:
        if progress is not None:
            progress(f"{condition} ({len(problems)} problems)")
        system = CONCISE_SYSTEM_PROMPT if condition == "concise_prompt" else None
        prompts = [build_prompt(tokenizer, p.problem, system) for p in problems]
        outs = generate_vllm(engine, prompts, max_new_tokens=max_new_tokens, edit=edits[condition], schedule=schedule)
        for problem, out in zip(problems, outs):
            answer = extract_answer(out["text"])
            rows.append({"condition": condition, "problem_id": problem.problem_id, "generated_tokens": len(out["token_ids"]),
                         "answer": answer, "correct": bool(answers_match(answer, problem.answer)), "text": out["text"]})
    return rows


__all__ = ["ENGINE_ENV", "STATE", "WORKER_EXTENSION", "RorWorkerExtension", "VllmEngine", "VllmSite", "VllmCaptureOptions", "build_llm", "capture_router_logits_vllm", "generate_vllm",
           "check_parallel", "install", "require_vllm", "run_evaluation_vllm"]
