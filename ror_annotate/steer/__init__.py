"""Probe and steer: read reasoning behaviors from MoE router logits and reshape them.

The stage consumes the exported ``tokens`` dataset configuration (one row per trace with the
subject model's ``input_ids`` and per-token behavior ``labels``) and never touches the DuckDB store.

Modules, in pipeline order:

- :mod:`.families` -- declarative per-family router adapters (where routers are, top-k rules).
- :mod:`.hooks` -- router hook points shared by capture and steering, with a "hook fired" check.
- :mod:`.tokens` -- loading and validating the exported ``tokens`` dataset.
- :mod:`.capture` -- teacher-forced capture of router logits, streamed to memory-mapped files.
- :mod:`.probe` -- linear probes on router logits and the control features.
- :mod:`.experts` -- expert association by risk difference, transfer AUC, Jaccard with a null.
- :mod:`.steering` -- the routing-score operator as a context manager, schedules and controls.
- :mod:`.evaluate` -- the small generation evaluation behind ``ror steer``.

torch and transformers are an optional extra; this package imports without them and
:func:`require_torch` turns their absence into a clear :class:`~ror_annotate.errors.SteerError`.
"""

from __future__ import annotations

from ..errors import SteerError

INSTALL_HINT = "install the steer extra: pip install torch==2.13.0 && pip install -e '.[steer]'"


def require_torch():
    """Import and return ``torch``, or raise a :class:`SteerError` saying how to install it.

    Returns
    -------
    module
        The ``torch`` module.

    Raises
    ------
    SteerError
        If torch (or transformers) is not importable.
    """
    try:
        import torch
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        raise SteerError(f"this command needs {exc.name!r}, which is not installed; {INSTALL_HINT}") from None
    return torch


__all__ = ["INSTALL_HINT", "require_torch"]
