"""ror_annotate: token-aligned datasets of six reasoning behaviors from LLM reasoning traces.

The public API, imported lazily (``import ror_annotate as ror`` loads nothing heavy; torch and
label-studio-sdk are only imported by the steer and review stages when used)::

    import ror_annotate as ror

    with ror.Store("ror.duckdb") as store:
        summary = ror.pipeline.run(store, "traces.jsonl", out="exports/demo")
    ror.segment_text("Let me try n = 2. Wait, that fails.")
    ror.agreement.cohen_kappa(["a", "b", "a"], ["a", "b", "b"], categories="auto")

Stage modules: :mod:`~ror_annotate.traces`, :mod:`~ror_annotate.segment`, :mod:`~ror_annotate.judge`,
:mod:`~ror_annotate.review`, :mod:`~ror_annotate.agreement`, :mod:`~ror_annotate.export`,
:mod:`~ror_annotate.steer`; :mod:`~ror_annotate.pipeline` runs them in order over a
:class:`~ror_annotate.store.Store`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Submodules reachable as attributes (``ror.pipeline``, ``ror.agreement`` ...).
_SUBMODULES = frozenset(
    {
        "agreement", "align", "analytics", "answers", "card", "codebook", "errors", "export", "formats", "judge",
        "pipeline", "records", "reference", "review", "sample", "segment", "steer", "store", "traces",
    }
)

#: Names re-exported at the top level: ``name -> module``.
_EXPORTS: dict[str, str] = {
    "Store": "store",
    "Trace": "records", "Segment": "records", "Label": "records", "Run": "records", "BEHAVIORS": "records",
    "Segmenter": "segment", "segment_text": "segment", "segment_many": "segment", "segment_stats": "segment",
    "load_traces": "traces",
    "sample_path": "sample",
    "make_judge": "judge",
    "load_codebook": "codebook",
    "export_dataset": "export",
    "RorError": "errors",
}

__all__ = ["__version__", *sorted(_EXPORTS), *sorted(_SUBMODULES)]

if TYPE_CHECKING:  # pragma: no cover
    from . import agreement, export, judge, pipeline, review, segment, steer, store, traces  # noqa: F401
    from .codebook import load_codebook  # noqa: F401
    from .errors import RorError  # noqa: F401
    from .export import export_dataset  # noqa: F401
    from .judge import make_judge  # noqa: F401
    from .records import BEHAVIORS, Label, Run, Segment, Trace  # noqa: F401
    from .sample import sample_path  # noqa: F401
    from .segment import Segmenter, segment_many, segment_stats, segment_text  # noqa: F401
    from .store import Store  # noqa: F401
    from .traces import load_traces  # noqa: F401


def __getattr__(name: str) -> Any:
    """Import a submodule or a re-exported name on first use (PEP 562)."""
    if name in _SUBMODULES:
        return import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
