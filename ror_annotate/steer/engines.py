"""Engines behind ``ror capture`` and ``ror steer``: ``hf`` (transformers) and ``vllm``, one registry.

An engine takes a checkpoint folder and runs the stage's two jobs with the same inputs and the
same outputs: :attr:`EngineSpec.capture` writes a capture directory in the one on-disk format
(:mod:`.capture`), :attr:`EngineSpec.evaluate` returns the rows of the method's protocol
(:mod:`.evaluate`; :func:`~ror_annotate.steer.evaluate.summarize` applies to either).

=========  =====================================================================================
``hf``     transformers ``forward`` / ``generate`` with router hooks: every family in
           :mod:`.families`, residual-stream capture, ``device_map`` sharding; batch-1 generation.
``vllm``   vLLM with opaque custom ops in its router (:mod:`.vllm_engine`): continuous batching
           for capture (residual stream included) and steering; its own environment
           (``scripts/setup_vllm.sh``).
=========  =====================================================================================

A third engine is one :func:`ENGINES.register <ror_annotate.registry.Registry.register>` call
(or an entry point in the ``ror_annotate.engines`` group).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import SteerError
from ..registry import Registry


@dataclass(frozen=True)
class EngineSpec:
    """One engine: how it captures and how it runs the steering protocol.

    Attributes
    ----------
    name : str
    description : str
    capture : callable
        ``capture(model, tokens, out_dir, *, dtype, device, options) -> CaptureReport`` where
        ``options`` are the keyword arguments shared by both engines' capture functions (plus
        ``tensor_parallel_size`` for vLLM; the HF engine refuses a value above 1 with ``E966``).
    evaluate : callable
        ``evaluate(model, problems, edit, *, dtype, device, conditions, schedule, max_new_tokens,
        seed, progress) -> list of dict`` (rows as :func:`~ror_annotate.steer.evaluate.run_evaluation`).
    """

    name: str
    description: str
    capture: Callable[..., Any]
    evaluate: Callable[..., list[dict[str, Any]]]


#: Every engine by name (``--engine``).
ENGINES: Registry[EngineSpec] = Registry("engines", what="engine")


def _no_parallel(options: dict[str, Any]) -> None:
    """Refuse a vLLM-only parallel option given to the HF engine (``E966``)."""
    if int(options.pop("tensor_parallel_size", 1) or 1) != 1:
        raise SteerError("--tensor-parallel-size is an option of the vLLM engine (--engine vllm); the HF engine runs "
                         "on one --device", code="E966")


def _hf_capture(model: str, tokens: Any, out_dir: str | Path, *, dtype: str = "auto", device: str = "cpu",
                options: dict[str, Any]) -> Any:
    from .capture import capture_router_logits, load_model

    options = dict(options)
    _no_parallel(options)
    return capture_router_logits(load_model(model, device=device, dtype=dtype), tokens, out_dir, **options)


def _hf_evaluate(model: str, problems: Sequence[Any], edit: Any, *, dtype: str = "auto", device: str = "cpu",
                 **kwargs: Any) -> list[dict[str, Any]]:
    from ..tokenizer import load_tokenizer

    _no_parallel(kwargs)
    from .capture import load_model
    from .evaluate import run_evaluation

    try:
        tokenizer = load_tokenizer(model)
    except (OSError, ValueError) as exc:
        raise SteerError(f"cannot load the tokenizer of {model!r}: {exc}") from None
    return run_evaluation(load_model(model, device=device, dtype=dtype), tokenizer, problems, edit, **kwargs)


#: Capture options only the HF engine has (refused on vLLM with E924 rather than ignored): vLLM batches by
#: requests without padding, and sizes its steps itself.
HF_ONLY_CAPTURE = ("padding_side", "max_batch_tokens")


def _vllm_capture(model: str, tokens: Any, out_dir: str | Path, *, dtype: str = "auto", device: str = "cpu",
                  options: dict[str, Any]) -> Any:
    from .vllm_engine import build_llm, capture_router_logits_vllm

    given = [k for k in HF_ONLY_CAPTURE if options.get(k) not in (None, "right", False)]
    if given:
        raise SteerError(f"the vLLM engine does not support {', '.join(given)}; use --engine hf for them", code="E924")
    options = {k: v for k, v in options.items() if k not in HF_ONLY_CAPTURE}
    tp = int(options.pop("tensor_parallel_size", 1) or 1)
    engine = build_llm(model, dtype=dtype, residual_layers=options.get("residual_layers"),  # instrumented before compiling
                       tensor_parallel_size=tp)
    return capture_router_logits_vllm(engine, tokens, out_dir, **options)


def _vllm_evaluate(model: str, problems: Sequence[Any], edit: Any, *, dtype: str = "auto", device: str = "cpu",
                   **kwargs: Any) -> list[dict[str, Any]]:
    from .vllm_engine import build_llm, run_evaluation_vllm

    tp = int(kwargs.pop("tensor_parallel_size", 1) or 1)
    return run_evaluation_vllm(build_llm(model, dtype=dtype, tensor_parallel_size=tp), problems, edit, **kwargs)


ENGINES.register("hf", EngineSpec("hf", "transformers forward/generate with router hooks", _hf_capture, _hf_evaluate))
ENGINES.register("vllm", EngineSpec("vllm", "vLLM with custom ops in the MoE router (continuous batching)",
                                    _vllm_capture, _vllm_evaluate))


def get_engine(name: str) -> EngineSpec:
    """The engine called ``name`` (did-you-mean error otherwise).

    Raises
    ------
    ConfigError
        Unknown engine name.
    """
    return ENGINES.get(name)


__all__ = ["ENGINES", "EngineSpec", "HF_ONLY_CAPTURE", "get_engine"]
