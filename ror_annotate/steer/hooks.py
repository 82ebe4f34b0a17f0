"""Named router hook points shared by capture and steering, with a "hook fired" check.

:class:`RouterHooks` installs, on every :class:`~ror_annotate.steer.families.RouterSite`,

- a forward hook on the router (``prepend=True``, so it runs before transformers' lazily installed
  ``OutputRecorder`` hooks; item 0 of the output is always passed through unchanged, so
  ``output_router_logits`` keeps working whatever the order),
- for families whose raw logits come from a child projection (Gemma 4), a forward hook on that
  child that stashes its output for the router hook,
- a forward pre-hook and a forward hook on the model itself: the first records the batch shape
  ``(batch, seq)`` (router inputs are flattened to ``[batch*seq, hidden]``) and resets the fired
  set, the second raises :class:`SteerError` if some router did not fire during that forward. A
  silent bypass (fused kernels such as GPT-OSS MXFP4 that never call the router module) is an
  error, never a no-op.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import SteerError
from .families import RouterSite, find_router_sites

#: ``on_route(site, logits [n_tokens, n_experts], output) -> new output tuple or None``
OnRoute = Callable[[RouterSite, Any, tuple], "tuple | None"]


def _batch_shape(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if value is not None:
            return int(value.shape[0]), int(value.shape[1])
    if args and hasattr(args[0], "shape") and len(args[0].shape) >= 2:
        return int(args[0].shape[0]), int(args[0].shape[1])
    return None


class RouterHooks:
    """Context manager that calls ``on_route`` on every router of ``model`` at every forward.

    Parameters
    ----------
    model : torch.nn.Module
        A loaded transformers MoE model.
    on_route : callable
        ``on_route(site, logits, output)`` where ``logits`` is the raw router logits
        ``[batch*seq, n_experts]`` and ``output`` the router's own
        ``(scores, weights [batch*seq, top_k], indices [batch*seq, top_k])``. Return a new output
        tuple to replace the routing, or ``None`` to keep it.
    sites : list of RouterSite, optional
        Defaults to :func:`find_router_sites(model) <ror_annotate.steer.families.find_router_sites>`.
    check_fired : bool, default True
        Raise :class:`SteerError` after a forward in which some router did not fire.

    Attributes
    ----------
    batch_shape : tuple of (int, int) or None
        ``(batch, seq)`` of the forward in progress.
    forwards : int
        Model forwards seen while the hooks were installed.
    fired : dict of int to int
        Calls per site position, over the whole context.
    """

    def __init__(self, model: Any, on_route: OnRoute, *, sites: list[RouterSite] | None = None,
                 check_fired: bool = True) -> None:
        self.model = model
        self.sites = sites if sites is not None else find_router_sites(model)
        self.on_route = on_route
        self.check_fired = check_fired
        self.batch_shape: tuple[int, int] | None = None
        self.forwards = 0
        self.fired: dict[int, int] = {s.position: 0 for s in self.sites}
        self._fired_now: set[int] = set()
        self._stash: dict[int, Any] = {}
        self._handles: list[Any] = []

    def _pre_forward(self, _module, args, kwargs):
        self.batch_shape = _batch_shape(args, kwargs)
        self._fired_now.clear()
        self._stash.clear()

    def _post_forward(self, _module, _args, _kwargs, _output):
        self.forwards += 1
        if self.check_fired:
            missing = [s for s in self.sites if s.position not in self._fired_now]
            if missing:
                names = ", ".join(f"layer {s.layer} ({s.name})" for s in missing[:5])
                raise SteerError(
                    f"router hook did not fire on {len(missing)} of {len(self.sites)} MoE layers during a forward of "
                    f"{type(self.model).__name__}: {names}. Something computes routing without calling the router "
                    "module (fused MoE kernels, use_kernels=True, MXFP4); load the model without them"
                )

    def _stash_hook(self, site: RouterSite) -> Callable:
        def hook(_module, _args, output):
            self._stash[site.position] = output
        return hook

    def _router_hook(self, site: RouterSite) -> Callable:
        def hook(_module, _args, output):
            self._fired_now.add(site.position)
            self.fired[site.position] += 1
            logits = self._stash.pop(site.position, None) if site.family.logits_child else output[0]
            if logits is None:
                raise SteerError(f"{site.name}: the logits projection {site.family.logits_child!r} did not run")
            return self.on_route(site, logits, output)
        return hook

    def __enter__(self) -> "RouterHooks":
        try:
            self._handles.append(self.model.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
            self._handles.append(self.model.register_forward_hook(self._post_forward, with_kwargs=True))
            for site in self.sites:
                if site.family.logits_child is not None:
                    self._handles.append(site.logits_module.register_forward_hook(self._stash_hook(site), prepend=True))
                self._handles.append(site.module.register_forward_hook(self._router_hook(site), prepend=True))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Remove every hook this object installed (idempotent)."""
        while self._handles:
            self._handles.pop().remove()

    def __exit__(self, *exc) -> None:
        self.remove()


__all__ = ["OnRoute", "RouterHooks"]
