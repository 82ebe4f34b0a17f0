"""``ror capture``, ``ror probe``, ``ror experts``, ``ror steer``: the probe-and-steer stage.

torch and transformers are imported only inside the commands that need them (capture, steer, and
probe with the embeddings control); without them those commands print one line telling how to
install the ``steer`` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import InputError
from ..options import RESAMPLES_MAX, SEED_MAX
from .app import app, console, err_console

_PANEL = "Probe and steer"

ModelOption = Annotated[str, typer.Option("--model", help="Local checkpoint directory of an MoE causal LM.")]
DeviceOption = Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:1...")]
DtypeOption = Annotated[str, typer.Option("--dtype", help="Model dtype: auto, float32, bfloat16, float16.")]
EngineOption = Annotated[str, typer.Option("--engine", help="hf (transformers) or vllm (its own venv: scripts/setup_vllm.sh).")]
TensorParallelOption = Annotated[int, typer.Option(
    "--tensor-parallel-size", min=1, help="vLLM engine: tensor-parallel ranks (GPUs); capture reads rank 0, edits apply on every rank.")]
_NOISE = "Label noise"
ResamplesOption = Annotated[int, typer.Option(
    "--label-resamples", min=0, max=RESAMPLES_MAX, rich_help_panel=_NOISE,
    help="Redraw every segment's label N times (from the export's label_distribution, else --label-confusion) and "
         "report each figure with its label-noise percentile interval; 0: off.")]
ConfusionOption = Annotated[Optional[Path], typer.Option(
    "--label-confusion", rich_help_panel=_NOISE,
    help="P(true | judge label) for segments without a distribution: `ror agree --json` output, or JSON "
         "{behaviors: [...], matrix: [[...]]} / CSV judge_label,<six behaviors> with rows summing to 1.")]
ConfusionRaterOption = Annotated[Optional[str], typer.Option(
    "--label-confusion-rater", rich_help_panel=_NOISE, help="Whose confusion matrix, when the `ror agree` file has several.")]
LabelSeedOption = Annotated[int, typer.Option("--label-seed", min=0, max=SEED_MAX, rich_help_panel=_NOISE, help="Seed of the label draws.")]


#: Code of an output folder of probe / experts / steer that cannot be created or written.
OUTPUT_NOT_WRITABLE = "E773"


def _writable_output(out: Optional[Path], *, file: bool = False, what: str = "--out") -> None:
    """Create ``--out`` (its folder when ``file``) and check that a file can be written there, before any
    work: a bad ``--out`` used to end a long capture, probe or expert run in a ``FileNotFoundError``
    traceback (after everything was computed, for probe and experts).

    Raises
    ------
    ConfigError
        E773: the folder cannot be created or written (a path under a file, a read-only place).
    """
    import tempfile

    from ..errors import ConfigError

    if out is None:
        return
    folder = out.parent if file else out
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ror-write-check-"):
            pass
        for made in created:  # a check leaves nothing behind: the stage creates its folder when it writes
            made.rmdir()
    except OSError as exc:
        raise ConfigError(f"{what} {out}: cannot write there ({exc.strerror or type(exc).__name__}: {exc.filename or folder}); "
                          "give a folder you can write to", code=OUTPUT_NOT_WRITABLE) from None


def _check_label_options(resamples: int, confusion: Optional[Path], rater: Optional[str]) -> None:
    """The label-noise options' own checks, before any work: E938 (a confusion option without
    ``--label-resamples``), E774 (a ``--label-confusion`` file that does not exist: it was ignored
    silently when every segment had a ``label_distribution``)."""
    from ..errors import InputError, LabelNoiseError

    if not resamples and (confusion is not None or rater is not None):
        raise LabelNoiseError("--label-confusion / --label-confusion-rater take effect with --label-resamples N "
                              "(N > 0); add it, or leave them out", code="E938")
    if confusion is not None and not confusion.is_file():
        raise InputError(f"--label-confusion {confusion}: no such file; give the `ror agree --json` output or a "
                         "confusion JSON/CSV file", code=CONFUSION_FILE_MISSING)


#: Code of a ``--label-confusion`` file that does not exist.
CONFUSION_FILE_MISSING = "E774"


def _label_draws(table, tokens: Path, resamples: int, confusion: Optional[Path], rater: Optional[str], seed: int):
    """The label draws of ``--label-resamples`` (None when 0), announced on stderr."""
    if not resamples:
        if confusion is not None or rater is not None:
            from ..errors import LabelNoiseError

            raise LabelNoiseError("--label-confusion / --label-confusion-rater take effect with --label-resamples N "
                                  "(N > 0); add it, or leave them out", code="E938")
        return None
    from ..steer.noise import LabelNoiseOptions, draw_labels

    options = LabelNoiseOptions.from_options({"resamples": resamples, "confusion": str(confusion) if confusion else None,
                                              "confusion_rater": rater, "seed": seed})
    draws = draw_labels(table, tokens, options)
    err_console.print(f"label noise: {resamples} resamples; {draws.source()}", highlight=False, markup=False, soft_wrap=True)
    for note in draws.notes:
        err_console.print(f"label noise: {note}", highlight=False, markup=False, soft_wrap=True)
    return draws


def _parse_layers(text: str | None) -> list[int] | None:
    if not text:
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise InputError(f"--layers {text!r}: expected comma-separated layer indices or ranges like 8-16") from None
    return out


def _model_identity(model: str) -> str:
    """The name recorded in a capture's meta: a local checkpoint as its absolute path.

    Resuming compares this name, so ``model``, ``./model`` and ``/abs/model`` must agree.
    """
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model



#: The Jaccard statistics of ``ror experts`` as a reader names them (keys of ``ExpertReport.jaccard``).
_JACCARD_NAMES = {
    "observed": "Jaccard of top-k sets across datasets (observed)",
    "null_mean": "Jaccard under the label-permutation null (mean)",
    "null_std": "Jaccard under the label-permutation null (std)",
    "p_value": "Jaccard permutation p-value",
}

@app.command("capture", rich_help_panel=_PANEL)
def capture_cmd(
    tokens: Annotated[Path, typer.Argument(help="Export directory (with tokens/) or the tokens dataset directory.")],
    model: ModelOption,
    out: Annotated[Path, typer.Option("--out", help="Capture directory (resumed if it exists).")],
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "auto",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Traces per forward.")] = 8,
    max_batch_tokens: Annotated[int, typer.Option("--max-batch-tokens", min=1, help="Bound on batch x longest trace.")] = 16384,
    padding_side: Annotated[str, typer.Option("--padding-side", help="left or right (same logits either way).")] = "right",
    layers: Annotated[Optional[str], typer.Option("--layers", help="MoE layers to store, e.g. 8-16,20 (default all).")] = None,
    splits: Annotated[Optional[str], typer.Option("--splits", help="Comma-separated splits (default all).")] = None,
    logits_dtype: Annotated[str, typer.Option("--logits-dtype", help="float16 or float32 on disk.")] = "float16",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Delete an existing capture in --out first.")] = False,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="Capture at most this many new traces.")] = None,
    residual_layers: Annotated[Optional[str], typer.Option(
        "--residual-layers", help="Also store the residual stream after these decoder layers (e.g. 8-16 or all), for the probe's residual control.")] = None,
    engine: EngineOption = "hf",
    tensor_parallel_size: TensorParallelOption = 1,
) -> None:
    """Capture router logits (tokens x layers x experts, before top-k) and the selected experts of every trace."""
    _writable_output(out)
    from ..steer import require_torch

    require_torch()
    from rich.progress import Progress

    from ..steer.capture import check_model_source, model_tokenizer
    from ..steer.engines import get_engine
    from ..steer.tokens import check_model_tokenizer, load_tokens

    spec = get_engine(engine)
    check_model_source(model)

    dd = load_tokens(tokens)
    check_model_tokenizer(dd, model_tokenizer(model), model=model)
    split_list = [s.strip() for s in splits.split(",")] if splits else None
    total = sum(len(dd[s]) for s in (split_list or list(dd.keys())) if s in dd)
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("capturing", total=total)
        options = dict(model_name=_model_identity(model), splits=split_list, layers=_parse_layers(layers), batch_size=batch_size,
                       logits_dtype=logits_dtype, overwrite=overwrite, limit=limit, progress=lambda n: progress.advance(task, n),
                       residual_layers=("all" if residual_layers == "all" else _parse_layers(residual_layers)))
        if engine == "hf":
            options.update(max_batch_tokens=max_batch_tokens, padding_side=padding_side)
        elif padding_side != "right":
            options["padding_side"] = padding_side  # refused by the vLLM engine (E924)
        if tensor_parallel_size != 1:
            options["tensor_parallel_size"] = tensor_parallel_size  # refused by the HF engine (E966)
        report = spec.capture(model, dd, out, dtype=dtype, device=device, options=options)
    rate = report.tokens / report.seconds if report.seconds else 0.0
    console.print(f"captured {report.captured} traces ({report.tokens} tokens, {rate:,.0f} tokens/s), "
                  f"skipped {report.skipped} already captured -> {out}")


@app.command("probe", rich_help_panel=_PANEL)
def probe_cmd(
    tokens: Annotated[Path, typer.Argument(help="Export directory (with tokens/) or the tokens dataset directory.")],
    capture: Annotated[Path, typer.Option("--capture", help="Capture directory written by `ror capture`.")],
    level: Annotated[str, typer.Option("--level", help="token or segment.")] = "token",
    windows: Annotated[str, typer.Option("--windows", help="Window sizes in layers, e.g. 1,9.")] = "1",
    controls: Annotated[str, typer.Option("--controls", help="Comma-separated: position, tfidf, embeddings (needs --model).")] = "position,tfidf",
    model: Annotated[Optional[str], typer.Option("--model", help="Checkpoint for the input-embeddings control.")] = None,
    max_train: Annotated[int, typer.Option("--max-train", min=1, help="Train rows kept (seeded subsample), token level.")] = 50_000,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX)] = 0,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the table as CSV and per-layer dev curves as JSON here.")] = None,
    label_resamples: ResamplesOption = 0,
    label_confusion: ConfusionOption = None,
    label_confusion_rater: ConfusionRaterOption = None,
    label_seed: LabelSeedOption = 0,
) -> None:
    """Train linear probes on router logits (layer and C chosen on validation), report test macro-F1."""
    from ..steer.capture import Capture
    from ..steer.probe import PROBE_COLUMNS, format_table, run_probes
    from ..steer.table import labeled_tokens
    from ..steer.tokens import load_tokens

    _check_label_options(label_resamples, label_confusion, label_confusion_rater)
    _writable_output(out)
    try:
        window_sizes = [int(w) for w in windows.split(",") if w.strip()]
    except ValueError:
        raise InputError(f"--windows {windows!r}: expected comma-separated integers") from None
    control_list = [c.strip() for c in controls.split(",") if c.strip()]
    embeddings = None
    if "embeddings" in control_list:
        if not model:
            raise InputError("the embeddings control needs --model (the checkpoint whose input embeddings to use)")
        from ..steer import require_torch

        require_torch()
        from ..steer.capture import load_model

        embeddings = load_model(model).get_input_embeddings().weight.detach().float().cpu().numpy()
    cap = Capture(capture)
    table = labeled_tokens(cap, load_tokens(tokens))
    draws = _label_draws(table, tokens, label_resamples, label_confusion, label_confusion_rater, label_seed)
    rows, curves = run_probes(cap, table, level=level, windows=window_sizes, controls=control_list,
                              embeddings=embeddings, max_train=max_train, seed=seed,
                              progress=lambda msg: err_console.print(f"probe {msg}", highlight=False, soft_wrap=True), label_draws=draws)
    title = f"behavior probes ({level} level, macro-F1; C and layer chosen on validation)"
    if draws is not None:
        title += (f"; \\[lo, hi] = {100 * draws.confidence_level:g}% percentile interval over {draws.n_resamples} "
                  "label resamples (label noise only)")
    shown = Table(title=title)
    for col in PROBE_COLUMNS:
        shown.add_column(col, overflow="fold")  # at 80 columns "input embeddings" folds, never "embeddi…"
    for r in format_table(rows):
        shown.add_row(*r)
    console.print(shown)
    absent = rows[0].absent_in_test if rows else ""
    console.print("test macro-F1 averages over the behaviors present in the test split"
                  + (f"; absent from it: {absent.replace(',', ', ')}" if absent else " (all six)"))
    if out is not None:
        import csv

        out.mkdir(parents=True, exist_ok=True)
        with (out / "probe.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].as_dict()))
            writer.writeheader()
            writer.writerows(r.as_dict() for r in rows)
        (out / "probe_dev_curves.json").write_text(json.dumps(curves, indent=1))
        console.print(f"wrote {out / 'probe.csv'} and {out / 'probe_dev_curves.json'}")
        if draws is not None:
            from ..steer.noise import write_probe_noise

            files = write_probe_noise(rows, draws, out, data=f"{len(table):,} labeled tokens of {', '.join(table.dataset_names)} "
                                                              f"({tokens}), capture {capture}")
            console.print(f"wrote {', '.join(str(f) for f in files)}")


@app.command("experts", rich_help_panel=_PANEL)
def experts_cmd(
    tokens: Annotated[Path, typer.Argument(help="Export directory (with tokens/) or the tokens dataset directory.")],
    capture: Annotated[Path, typer.Option("--capture", help="Capture directory written by `ror capture`.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the CSV tables, PNG plots and steering specs.")],
    top_k: Annotated[int, typer.Option("--top-k", min=1, help="Size of each behavior's expert set.")] = 10,
    permutations: Annotated[int, typer.Option("--permutations", min=1, help="Label permutations for the Jaccard null.")] = 20,
    steer_size: Annotated[Optional[int], typer.Option("--steer-size", min=0, help="Experts per layer in the steer_suppress_<behavior>.json specs (default: --top-k, capped so the router's top-k stay selectable; 0: no spec).")] = None,
    splits: Annotated[Optional[str], typer.Option("--splits", help="Comma-separated splits (default all).")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX)] = 0,
    label_resamples: ResamplesOption = 0,
    label_confusion: ConfusionOption = None,
    label_confusion_rater: ConfusionRaterOption = None,
    label_seed: LabelSeedOption = 0,
) -> None:
    """Risk difference of every expert per behavior and dataset, top-k sets, Jaccard null, transfer AUC."""
    import numpy as np

    from ..steer.capture import Capture
    from ..steer.experts import analyze, resolve_steer_size, set_size_warning, write_report
    from ..steer.table import labeled_tokens
    from ..steer.tokens import load_tokens

    _check_label_options(label_resamples, label_confusion, label_confusion_rater)
    _writable_output(out)
    cap = Capture(capture)
    warning = set_size_warning(top_k, cap.meta.n_experts)
    if warning:
        err_console.print(f"warning: {warning}", highlight=False)
    size = resolve_steer_size(steer_size, set_size=top_k, n_experts=cap.meta.n_experts, router_top_k=cap.meta.top_k)
    dd = load_tokens(tokens)
    table = labeled_tokens(cap, dd, [s.strip() for s in splits.split(",")] if splits else None)
    draws = _label_draws(table, tokens, label_resamples, label_confusion, label_confusion_rater, label_seed)
    selected = np.asarray(cap.selected[table.rows])
    report = analyze(selected, table.labels, table.dataset, table.segment, dataset_names=table.dataset_names,
                     layers=cap.meta.layers, n_experts=cap.meta.n_experts, k=min(top_k, cap.meta.n_experts),
                     n_permutations=permutations, seed=seed)
    noise = None
    if draws is not None:
        from ..steer.noise import expert_label_noise, fmt_interval, write_expert_noise

        noise = expert_label_noise(selected, table, draws, report, n_experts=cap.meta.n_experts,
                                   k=min(top_k, cap.meta.n_experts))
    files = write_report(report, out, steer_size=size or None, noise=noise)
    if noise is not None:
        files += write_expert_noise(noise, report, out)
    summary = Table(title="expert association" + (
        "" if noise is None else f" (\\[lo, hi] = {100 * noise.level():g}% percentile interval over {noise.draws.n_resamples} "
                                 "label resamples, label noise only)"))
    summary.add_column("statistic", overflow="fold")
    summary.add_column("value", overflow="fold")
    if noise is None:
        for key, value in report.jaccard.items():
            summary.add_row(_JACCARD_NAMES.get(key, key.replace("_", " ")), f"{value:.3f}")
        for key, value in report.corr_summary.items():
            summary.add_row(f"RD-profile correlation, {key.replace('_', ' ')} (mean Pearson r)", f"{value:.3f}")
        if report.transfer:
            cross = [r["auc"] for r in report.transfer if r["source"] != r["target"]]
            if cross:
                summary.add_row("transfer AUC (mean, cross-dataset)", f"{float(np.mean(cross)):.3f}")
    else:
        for key, value in report.jaccard.items():
            if key != "observed":
                summary.add_row(_JACCARD_NAMES.get(key, key.replace("_", " ")) + " (stored labels)", f"{value:.3f}")
        for row in noise.headline(report):
            summary.add_row(row["statistic"], fmt_interval(row["value"], row["interval"]))
    console.print(summary)
    specs = sorted(p.name for p in files if p.name.startswith("steer_suppress_"))
    console.print(f"wrote {len(files)} files to {out}"
                  + (f"; steering specs ({size} experts per layer): {', '.join(specs)}" if specs else ""))


@app.command("steer", rich_help_panel=_PANEL)
def steer_cmd(
    problems: Annotated[Path, typer.Argument(help="JSONL of problems: {id, problem, answer}.")],
    model: ModelOption,
    spec: Annotated[Path, typer.Option("--spec", help="Steering spec JSON: {activate: {layer: [ids]}, suppress: {...}, eps}.")],
    schedule: Annotated[str, typer.Option("--schedule", help="always or after_first_answer.")] = "always",
    conditions: Annotated[str, typer.Option("--conditions", help="Comma-separated: unmodified, steered, random, concise_prompt.")] = "unmodified,steered,random,concise_prompt",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 1024,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "auto",
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Seed of the random-expert control.")] = 0,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write per-generation rows as JSONL here.")] = None,
    engine: EngineOption = "hf",
    tensor_parallel_size: TensorParallelOption = 1,
) -> None:
    """Generate with steered routing vs the unmodified model and controls; print token counts and accuracy."""
    from ..steer import require_torch

    require_torch()
    from ..steer.capture import check_model_source
    from ..steer.engines import get_engine
    from ..steer.evaluate import load_problems, summarize
    from ..steer.steering import RoutingEdit

    spec_engine = get_engine(engine)
    _writable_output(out, file=True)

    if schedule not in ("always", "after_first_answer"):
        raise InputError(f"unknown schedule {schedule!r}; choose 'always' or 'after_first_answer'")
    if not spec.exists():
        raise InputError(f"{spec}: no such steering spec; `ror experts --steer-size N` writes steer_suppress_<behavior>.json")
    from ..configfile import read_config_text

    try:
        edit = RoutingEdit.from_json(json.loads(read_config_text(spec)))
    except (OSError, json.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"{spec}: not a steering spec ({exc})") from None
    items = load_problems(problems)
    check_model_source(model)
    rows = spec_engine.evaluate(model, items, edit, dtype=dtype, device=device,
                                conditions=[c.strip() for c in conditions.split(",") if c.strip()],
                                schedule=schedule, max_new_tokens=max_new_tokens, seed=seed,
                                progress=lambda msg: err_console.print(f"generating {msg}", highlight=False, soft_wrap=True),
                                **({"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size != 1 else {}))
    shown = Table(title=f"steering evaluation ({len(items)} problems, schedule {schedule})")
    for col in ("condition", "n", "median tokens", "mean tokens", "accuracy", "median change vs unmodified", "steered rows", "steered tokens"):
        shown.add_column(col, overflow="fold")  # "unmodified", "concise_prompt" whole at 80 columns, never "unmodif…"
    summary = summarize(rows)
    for s in summary:
        steered = s["steered_rows"] is not None
        shown.add_row(s["condition"], str(s["n"]), f"{s['median_tokens']:g}", f"{s['mean_tokens']:.1f}",
                      f"{s['accuracy']:.3f}", f"{s['median_token_change']:+.1%}",
                      f"{s['steered_rows']}/{s['n']}" if steered else "-", str(s["steered_tokens"]) if steered else "-")
    console.print(shown)
    for s in summary:
        if s["steered_rows"] == 0:
            err_console.print(
                f"warning: condition {s['condition']} steered no token: the schedule {schedule} never switched on"
                + (f" (no first answer within --max-new-tokens {max_new_tokens}); raise --max-new-tokens or use --schedule always"
                   if schedule == "after_first_answer" else ""),
                highlight=False, markup=False, soft_wrap=True,
            )
        elif s["steered_rows"] is not None and s["steered_rows"] < s["n"]:
            err_console.print(
                f"warning: condition {s['condition']} steered {s['steered_rows']} of {s['n']} rows ({s['steered_tokens']} tokens); "
                "the others never switched on", highlight=False, markup=False, soft_wrap=True,
            )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        console.print(f"wrote {out}")


@app.command("tiny-model", rich_help_panel=_PANEL)
def tiny_model_cmd(
    out: Annotated[Path, typer.Argument(help="Folder for the checkpoint and its tokenizer (created).")],
    traces: Annotated[Optional[Path], typer.Option("--traces", help="JSONL of traces to train the tokenizer on (default: the embedded sample).")] = None,
    problems: Annotated[Optional[Path], typer.Option("--problems", help="Also write 4 problems of those traces here, for `ror steer`.")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX)] = 0,
) -> None:
    """Build a tiny random-weight Qwen3-MoE checkpoint and a tokenizer trained on the traces, offline (to try probe/steer)."""
    _writable_output(out, what="OUT")
    _writable_output(problems, file=True, what="--problems")
    from ..steer import require_torch

    require_torch()
    from ..steer.tiny import TinyModelOptions, build_tiny_model, write_problems

    info = build_tiny_model(out, TinyModelOptions.from_options({"traces": str(traces) if traces else None, "seed": seed}))
    console.print(f"wrote a random-weight Qwen3-MoE ({info['layers']} MoE layers x {info['experts']} experts, top-{info['top_k']}, "
                  f"{info['parameters']:,} parameters) and a {info['vocab_size']}-token BPE tokenizer -> {out}", highlight=False)
    if problems is not None:
        n = write_problems(problems, traces)
        console.print(f"wrote {n} problems -> {problems}", highlight=False)
