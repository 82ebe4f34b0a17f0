"""Judges: things that label segments with one of the six behaviors.

Judges are looked up by name in a registry (spaCy-style): ``"baseline"`` is the offline cue-phrase
baseline, ``"openai:MODEL"`` the LLM judge over any OpenAI-compatible endpoint. Third-party judges
arrive through the ``ror_annotate.judges`` entry-point group; adding one is adding one module with a
``@register_judge("name")`` factory.

A judge reads traces and segments from the store and writes :class:`~ror_annotate.records.Label`
records back through it; it never touches another stage's tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError
from ..registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress

    from ..records import Annotator, Run
    from ..store import Store


@dataclass
class JudgeReport:
    """What one judging pass did. Token counts are in the judge model's tokens; cost in USD."""

    labeled: int = 0
    failed: int = 0
    skipped: int = 0
    requests: int = 0
    cached_responses: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_counts(self) -> dict[str, Any]:
        """Flat dict of every counter plus ``extra``, for ``Store.finish_run(counts=...)``."""
        out = {k: v for k, v in self.__dict__.items() if k != "extra"}
        out.update(self.extra)
        return out


class Judge(Protocol):
    """The interface every judge implements.

    Attributes
    ----------
    annotator : str
        Annotator id written on its labels (``"baseline:cue-v1"``, ``"openai:gpt-4.1-mini"``).
    source : str
        ``"baseline"`` or ``"judge"``.
    codebook_version : str
        What its labels are relative to: a codebook content hash, or the baseline's rule-set name.
    """

    annotator: str
    source: str
    codebook_version: str

    def label(
        self, store: "Store", trace_ids: Sequence[str], *, run: "Run", progress: "Progress | None" = None
    ) -> JudgeReport:
        """Label every stored segment of ``trace_ids`` and write the labels to ``store``; idempotent.

        Parameters
        ----------
        store : Store
            Holds the traces and their segments; labels are written with :meth:`Store.upsert_labels`.
        trace_ids : sequence of str
            Traces to label; each must already be segmented.
        run : Run
            The ``ror label``/``ror run`` run the labels are attributed to (``Label.run_id``).
        progress : rich.progress.Progress, optional
            The judge adds its own task (counting traces or segments, as it chooses).

        Returns
        -------
        JudgeReport
            Segment counts, token usage in the judge model's tokens and cost in USD.

        Raises
        ------
        JudgeError
            The judge cannot run (rejected key or model, endpoint unreachable); labels already
            written by this call stay stored and a rerun resumes.
        """
        ...


JudgeFactory = Callable[..., Judge]
#: Every judge by name: built-ins import their module on first use; others come through the
#: ``ror_annotate.judges`` entry-point group (see :mod:`ror_annotate.registry`).
JUDGES: Registry[JudgeFactory] = Registry(
    "judges", builtin_modules={"baseline": "ror_annotate.judge.baseline", "openai": "ror_annotate.judge.llm"}, what="judge"
)


def register_judge(name: str) -> Callable[[JudgeFactory], JudgeFactory]:
    """Decorator: register ``factory(model: str | None, **options) -> Judge`` under ``name``."""
    return JUDGES.register(name)


def available_judges() -> list[str]:
    """Names of every judge that can be made (built-in and entry points)."""
    return JUDGES.names()


def make_judge(spec: str, **options: Any) -> Judge:
    """Build a judge from a spec ``"NAME"`` or ``"NAME:MODEL"`` (e.g. ``"openai:gpt-4.1-mini"``).

    Raises
    ------
    ConfigError
        Unknown judge name (the message lists the available ones).
    """
    name, _, model = spec.partition(":")
    factory = JUDGES.find(name)
    if factory is None:
        raise ConfigError(f"unknown judge {spec!r}. Available judges: {', '.join(available_judges())} (e.g. --judge openai:gpt-4.1-mini)")
    return factory(model or None, **options)


def judge_annotators(judge: Judge) -> list["Annotator"]:
    """The raters a judge writes labels as, declared (``judge.declared_annotators()`` when it has one).

    A judge without that method (a third-party plug-in) is declared from its ``annotator``,
    ``source`` and ``codebook_version`` as one machine rater.
    """
    from ..records import Annotator

    declare = getattr(judge, "declared_annotators", None)
    if callable(declare):
        return list(declare())
    return [Annotator(annotator=judge.annotator, kind="machine", source=judge.source, codebook_version=judge.codebook_version)]


from .config import JudgeConfig  # noqa: E402
from .outcome import DEFAULT_MAX_FAILED, MaxFailed, check_label_outcome  # noqa: E402  (needs JudgeReport above)

__all__ = [
    "DEFAULT_MAX_FAILED", "Judge", "JudgeConfig", "JudgeReport", "MaxFailed", "available_judges", "check_label_outcome", "make_judge",
    "JUDGES", "judge_annotators", "register_judge",
]
