"""Did a labeling pass do its job? The decision behind the exit status of ``ror label`` and ``ror run``.

A pass that labelled nothing (every segment judge-failed: a dead endpoint, a judge whose answers
never parse), or that left more segments judge-failed than ``--max-failed`` allows, raises
:class:`~ror_annotate.errors.JudgeOutcomeError` (code E506, exit status 3), so scripts and CI can
tell a dead judge from success and ``ror run`` exports nothing. The labels that were written stay
stored; a re-run retries the failed segments.

``--max-failed`` is a fraction (``0.1``, ``10%``) of the segments the pass covered, or a count
(``25``; ``0`` allows none). Default :data:`DEFAULT_MAX_FAILED`: 10%, so one over-long trace among
many only warns while a judge that fails a tenth of its segments stops the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, JudgeOutcomeError

if TYPE_CHECKING:  # pragma: no cover
    from . import JudgeReport


@dataclass(frozen=True)
class MaxFailed:
    """How many judge-failed segments a pass may leave: ``fraction`` of them (0..1) or ``count``."""

    fraction: float | None = None
    count: int | None = None

    @classmethod
    def parse(cls, value: "str | float | int | MaxFailed") -> "MaxFailed":
        """``"10%"`` / ``"0.1"`` / ``0.1`` -> a fraction; ``"25"`` / ``25`` -> a count.

        Raises
        ------
        ConfigError
            Not a number, a negative one, or a fraction above 1 (the message shows both forms).
        """
        if isinstance(value, MaxFailed):
            return value
        hint = "give a fraction of the segments (0.1 or 10%) or a count (25)"
        if isinstance(value, bool):
            raise ConfigError(f"--max-failed {value!r}: {hint}")
        if isinstance(value, int):
            if value < 0:
                raise ConfigError(f"--max-failed {value}: must be >= 0; {hint}")
            return cls(count=value)
        if isinstance(value, float):
            fraction = value
        else:
            text = str(value).strip()
            try:
                if text.endswith("%"):
                    fraction = float(text[:-1]) / 100.0
                elif text.isdigit():
                    return cls(count=int(text))
                else:
                    fraction = float(text)
            except ValueError:
                raise ConfigError(f"--max-failed {value!r} is not a number; {hint}") from None
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"--max-failed {value!r}: a fraction must lie in [0, 1]; {hint}")
        return cls(fraction=fraction)

    def allowed(self, total: int) -> float:
        """Failed segments allowed out of ``total``."""
        return float(self.count) if self.count is not None else (self.fraction or 0.0) * total

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{(self.fraction or 0.0):.0%}"


#: Default of ``--max-failed``: a tenth of the segments.
DEFAULT_MAX_FAILED = MaxFailed(fraction=0.1)


def check_label_outcome(report: "JudgeReport | Mapping[str, Any]", *,
                        max_failed: "str | float | int | MaxFailed" = DEFAULT_MAX_FAILED) -> None:
    """Raise when a labeling pass labelled nothing, or left too many segments judge-failed.

    Counts (segments): ``failed`` = newly judge-failed + kept failed (``extra["failed_kept"]``, with
    ``retry_failed=False``); ``total`` = labelled now + labelled before (``skipped``) + failed.

    Parameters
    ----------
    report : JudgeReport or mapping
        What :meth:`Judge.label` returned, or its :meth:`~JudgeReport.as_counts` (as stored with a run).
    max_failed : MaxFailed, str, float or int
        See :meth:`MaxFailed.parse`; default 10% of ``total``.

    Raises
    ------
    JudgeOutcomeError
        ``failed > 0`` and nothing is labelled, or ``failed`` exceeds ``max_failed``.
    ConfigError
        ``max_failed`` cannot be parsed.
    """
    limit = MaxFailed.parse(max_failed)
    counts: Mapping[str, Any] = report if isinstance(report, Mapping) else report.as_counts()
    failed = int(counts.get("failed", 0)) + int(counts.get("failed_kept", 0))
    labelled = int(counts.get("labeled", 0)) + int(counts.get("skipped", 0))
    total = labelled + failed
    if failed == 0:
        return
    example = counts.get("failure_example")
    why = f" First reason: {example}." if example else ""
    after = ("The labels written are kept; run the same command again to retry the failed segments "
             "(the reason of each is in the judge_failures table).")
    if labelled == 0:
        raise JudgeOutcomeError(f"the judge labelled none of the {total} segments: all are judge-failed.{why} {after}",
                                counts=dict(counts))
    if failed > limit.allowed(total):
        raise JudgeOutcomeError(
            f"{failed} of {total} segments ({failed / total:.1%}) are judge-failed, more than --max-failed {limit} allows.{why} "
            f"{after} Pass --max-failed to accept more.",
            counts=dict(counts),
        )
