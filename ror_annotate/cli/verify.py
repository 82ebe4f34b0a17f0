"""``ror verify``: an LLM audits the stored labels of one rater against the codebook (:mod:`ror_annotate.verify`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import UsageError, VerifyOutcomeError
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, open_store, progress_display
from .judge_options import (
    JudgeBaseUrlOption,
    JudgeBatchIdOption,
    JudgeBatchOption,
    JudgeBatchPollOption,
    JudgeBatchRequeueOption,
    JudgeChunkSizeOption,
    JudgeCodebookOption,
    JudgeConcurrencyOption,
    JudgeContextTokensOption,
    JudgeMaxAttemptsOption,
    JudgeMaxTokensOption,
    JudgePricesOption,
    JudgeRetryFailedOption,
    JudgeSeedOption,
    JudgeTemperatureOption,
    JudgeTimeoutOption,
    judge_options,
)

_NAMES = ("base_url", "chunk_size", "concurrency", "temperature", "seed", "max_tokens", "batch", "batch_id", "prices",
          "max_attempts", "codebook", "context_tokens", "retry_failed", "batch_poll", "batch_requeue", "timeout")


@app.command()
def verify(
    judge: Annotated[str | None, typer.Option("--judge", help="The verifier, openai:MODEL (the audited judge's model or another).")] = None,
    of: Annotated[str | None, typer.Option("--of", help="Rater to audit (default: the latest aggregate:* rater, else the single judge rater).")] = None,
    trace: Annotated[list[str] | None, typer.Option("--trace", help="Verify only these trace ids (repeatable).")] = None,
    report: Annotated[bool, typer.Option("--report", help="Print the verification report: revisions per verifier and rater, "
                                         "per class, from->to matrix, Cohen's kappa and accuracy vs humans before/after.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's summary and the report as JSON.")] = False,
    base_url: JudgeBaseUrlOption = None,
    chunk_size: JudgeChunkSizeOption = None,
    concurrency: JudgeConcurrencyOption = None,
    temperature: JudgeTemperatureOption = None,
    seed: JudgeSeedOption = None,
    max_tokens: JudgeMaxTokensOption = None,
    batch: JudgeBatchOption = False,
    batch_id: JudgeBatchIdOption = None,
    prices: JudgePricesOption = None,
    max_attempts: JudgeMaxAttemptsOption = None,
    codebook: JudgeCodebookOption = None,
    context_tokens: JudgeContextTokensOption = None,
    retry_failed: JudgeRetryFailedOption = None,
    batch_poll: JudgeBatchPollOption = None,
    batch_requeue: JudgeBatchRequeueOption = None,
    timeout: JudgeTimeoutOption = None,
    max_failed: Annotated[str, typer.Option("--max-failed", help="Exit with status 3 (error E524) when more segments than this get "
                                            "no verdict: a fraction (0.1, 10%) or a count. No verdict at all always exits 3.")] = "10%",
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Audit a rater's labels with an LLM verifier (accept, or revise with a reason); the verdicts are their own rater."""
    from ..verify import VerifyOptions, verify_report
    from ..verify import verify as run_verify

    if judge is None and not (report or as_json):
        raise UsageError("give --judge openai:MODEL to verify, or --report / --json to show the verification report")
    values = locals()
    options = None
    if judge is not None:
        options = VerifyOptions.build(judge, of=of, max_failed=max_failed, **judge_options(**{n: values[n] for n in _NAMES}))
    summary = None
    with open_store(db, lock_timeout, must_exist=True) as store:
        if options is not None:
            try:
                with progress_display() as progress:
                    summary = run_verify(store, options, trace_ids=trace or None, progress=progress)
            except VerifyOutcomeError as exc:  # show what the verifier did before the one-line E524 error
                _print_counts(exc.counts)
                raise
            if not as_json:
                console.print(f"verify: {summary.verifier}: {summary.verified} verdicts ({summary.revised} revised), "
                              f"{summary.skipped} already verified, {summary.failed} failed, of {summary.audited} labels of "
                              f"{summary.of} in {summary.traces} traces", highlight=False)
                _print_counts(summary.counts)
        if report or as_json:
            rep = verify_report(store, verifier=None if summary is None else summary.verifier,
                                of=of if summary is None else summary.of)
            if as_json:
                print(json.dumps({"run": None if summary is None else summary.model_dump(mode="json"),
                                  "report": rep.model_dump(mode="json")}, indent=2, ensure_ascii=False))
            else:
                _print_report(rep)


def _print_counts(counts: dict[str, Any]) -> None:
    keys = ("requests", "cached_responses", "input_tokens", "cached_input_tokens", "output_tokens", "cost_usd")
    shown = {k: counts[k] for k in keys if counts.get(k)}
    if shown:
        console.print("verifier: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()),
                      highlight=False)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _print_report(rep: Any) -> None:
    if not rep.verifiers:
        console.print("no verdicts in the store: run `ror verify --judge openai:MODEL` first")
        return
    for v in rep.verifiers:
        r = v.reference
        t = Table(title=f"Verification by {v.verifier}", show_header=False)
        t.add_column("what")
        t.add_column("value", overflow="fold")
        t.add_row("audited rater", v.of)
        t.add_row("verified / revised", f"{v.verified} / {v.revised} ({_fmt(v.revision_rate, '.1%')})")
        t.add_row("items with a human reference", str(r.n_items))
        t.add_row("kappa before -> after", f"{_fmt(r.kappa_before)} -> {_fmt(r.kappa_after)}")
        t.add_row("accuracy before -> after", f"{_fmt(r.accuracy_before)} -> {_fmt(r.accuracy_after)}")
        console.print(t)
    for v in rep.verifiers:
        m = Table(title="original (rows) -> verified label (columns)")
        m.add_column("original")
        for c in rep.categories:
            m.add_column(c[:5], justify="right")
        m.add_column("revised", justify="right")
        for c in rep.categories:
            row = v.matrix.get(c, {})
            bc = v.by_class.get(c, {})
            m.add_row(c, *(str(row.get(d, 0)) for d in rep.categories), f"{bc.get('revised', 0)}/{bc.get('verified', 0)}"
                      + (f" ({bc['rate']:.0%})" if bc.get("rate") is not None else ""))
        console.print(m)
