"""Every help text and summary read at 80 columns, as in a default terminal: nothing cut to "…",
no line broken where the docstring happened to wrap, every line within 80 characters.

The commands come from click's own command tree (so a new command is checked without listing it
here); the expected texts are the docstrings' sentences, written by hand below.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from .view_fixtures import tiny_store

runner = CliRunner()


def _commands() -> list[list[str]]:
    from ror_annotate.cli import app

    out: list[list[str]] = [[]]

    def walk(group, prefix: list[str]) -> None:
        for name, command in group.commands.items():
            out.append([*prefix, name])
            if isinstance(getattr(command, "commands", None), dict):
                walk(command, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return out


def _help(args: list[str], monkeypatch) -> str:
    from ror_annotate.cli import app

    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, [*args, "--help"], prog_name="ror")
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args", _commands(), ids=lambda a: " ".join(a) or "ror")
def test_help_at_80_columns_cuts_nothing(args, monkeypatch):
    text = _help(args, monkeypatch)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


def _flat(text: str) -> str:
    """The help's words in order, box drawing and line ends removed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def _squeezed(text: str) -> str:
    """The help without box drawing, line ends and spaces: a word folded over two lines is whole again."""
    return re.sub(r"[│\s]", "", text)


def test_help_keeps_long_option_names_urls_and_variables_whole(monkeypatch):
    """These were cut to "--no-retry-fail…", "http://127.0.0.1…", "LABEL_STUDIO_API_K…" at 80 columns."""
    label = _help(["label"], monkeypatch)
    assert "--no-retry-failed" in label
    assert "http://127.0.0.1:8000/v1" in _squeezed(label)
    assert "LABEL_STUDIO_API_KEY" in _squeezed(_help(["review", "start"], monkeypatch))


def test_a_docstring_line_end_is_not_a_line_end_of_the_help(monkeypatch):
    top = _help([], monkeypatch)
    agree_row = next(i for i, line in enumerate(top.splitlines()) if line.startswith("│ agree "))
    lines = top.splitlines()[agree_row : agree_row + 3]
    # "Krippendorff's alpha," used to end its line half-way, with "Gwet's AC1, ..." on the next
    assert all(len(line) == 80 for line in lines)
    assert "Krippendorff's alpha, Gwet's AC1, per-class scores" in _flat("\n".join(lines))
    start = _help(["review", "start"], monkeypatch)
    assert "links again. With --adjudicator EMAIL the adjudicator's account is created too" in _flat(start)
    assert not any(line.rstrip().endswith("With") for line in start.splitlines())


def test_run_summary_folds_the_export_path_instead_of_cutting_it(tmp_path: Path, monkeypatch):
    from ror_annotate.cli import app

    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / ("a-rather-long-folder-name-for-the-export" * 2)
    result = runner.invoke(app, ["run", "--db", str(tmp_path / "s.duckdb"), "--out", str(out), "--workers", "1"], prog_name="ror")
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert str(out / "README.md") in _squeezed(result.stdout)


def test_agree_with_one_rater_says_why_and_what_to_do(tmp_path: Path, monkeypatch):
    """Once a Python list repr ("['baseline:cue-v1'] (of ['baseline:cue-v1'])") and no next step."""
    from ror_annotate.cli import app

    db = tiny_store(tmp_path / "s.duckdb")
    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, ["agree", "--db", str(db)], prog_name="ror")
    assert result.exit_code == 2
    line = " ".join(result.output.split())
    assert line.startswith("error [E700]: agreement needs labels from at least two annotators, and only baseline:cue-v1 has labels")
    assert "nothing to compare. Add a second annotator's labels" in line
    assert "ror label --judge openai:MODEL" in line and "ror review pull" in line
    assert "['" not in line


def test_card_with_one_human_says_what_agreement_needs(tmp_path: Path):
    """The card quoted the agreement stage's refusal (judges, selections) for a lone human annotator."""
    from ror_annotate.card import agreement_figures
    from ror_annotate.store import Store

    with Store(tiny_store(tmp_path / "s.duckdb", human="alice")) as store:
        present, figures, notes = agreement_figures(store)
    assert present and figures == {}
    assert notes == ["- humans: no figures (one human annotator, alice: agreement between humans needs a second annotator on the "
                     "same segments, e.g. a review study with two: `ror review start NAME -a A -a B`)"]


def test_agree_on_one_trace_says_its_intervals_have_zero_width(tmp_path: Path, monkeypatch):
    from ror_annotate.cli import app

    db = tiny_store(tmp_path / "s.duckdb", human="bob")
    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, ["agree", "--db", str(db), "--resamples", "20"], prog_name="ror")
    assert result.exit_code == 0, result.output
    text = _flat(result.stdout)
    assert "labelled by two or more), 1 trace, 2 annotators" in text
    assert "note: one trace, so the trace-level bootstrap intervals have zero width" in text
