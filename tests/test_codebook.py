"""The frozen codebook: pinned hash, canonical form, validation, rendering, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ror_annotate.codebook import (
    Codebook,
    available_codebooks,
    load_codebook,
    load_codebook_file,
    render_markdown,
    summary,
)
from ror_annotate.errors import CodebookError
from ror_annotate.records import BEHAVIORS

REPO = Path(__file__).resolve().parents[1]
V1 = REPO / "ror_annotate" / "codebooks" / "six-behaviors@v1.yaml"
# Pinned by hand when v1 was released: a change to the codebook's content must fail here.
V1_SHA256 = "de0624a56bae30c53b6fa7203ca5d964e4f4d5445a3ba2db5381eb4462c488c7"


def test_v1_hash_is_pinned():
    assert load_codebook("six-behaviors@v1").sha256 == V1_SHA256


def test_hash_is_sha256_of_sorted_compact_json_of_the_yaml():
    # Independent recomputation: parse the YAML ourselves and hash its canonical JSON.
    raw = yaml.safe_load(V1.read_text(encoding="utf-8"))
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(canonical.encode("utf-8")).hexdigest() == V1_SHA256


def test_reformatting_the_yaml_keeps_the_hash(tmp_path):
    raw = yaml.safe_load(V1.read_text(encoding="utf-8"))
    out = tmp_path / "six-behaviors@v1.yaml"
    out.write_text("# reformatted\n" + yaml.safe_dump(raw, width=40, allow_unicode=False, sort_keys=True), encoding="utf-8")
    assert load_codebook_file(out).sha256 == V1_SHA256


def test_edit_in_place_is_refused(tmp_path, monkeypatch):
    raw = yaml.safe_load(V1.read_text(encoding="utf-8"))
    raw["behaviors"][0]["definition"] += " Edited."
    (tmp_path / "six-behaviors@v1.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    monkeypatch.setenv("ROR_CODEBOOK_PATH", str(tmp_path))
    with pytest.raises(CodebookError, match="edited in place.*six-behaviors@v2"):
        load_codebook("six-behaviors@v1")


def test_new_version_beside_the_old_one_loads(tmp_path, monkeypatch):
    raw = yaml.safe_load(V1.read_text(encoding="utf-8"))
    raw["version"] = 2
    raw["behaviors"][0]["definition"] += " Clarified."
    (tmp_path / "six-behaviors@v2.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    monkeypatch.setenv("ROR_CODEBOOK_PATH", str(tmp_path))
    assert "six-behaviors@v2" in available_codebooks()
    v2 = load_codebook("six-behaviors@v2")
    assert v2.sha256 != V1_SHA256 and v2.versioned_name == "six-behaviors@v2"


def test_content_requirements():
    book = load_codebook()
    assert book.labels == BEHAVIORS
    for b in book.behaviors:
        assert len(b.positive_examples) >= 3, b.name
        assert len(b.near_misses) >= 2, b.name
        assert all(nm.label != b.name for nm in b.near_misses)
    boundaries = " | ".join(r.boundary for r in book.decision_rules)
    assert "planning vs reflection" in boundaries and "execution vs restatement vs fact" in boundaries
    assert sorted(book.tie_break_order) == sorted(BEHAVIORS)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r["behaviors"].pop(), "behaviors must be exactly"),
        (lambda r: r["behaviors"][1]["near_misses"].__setitem__(0, {"text": "x", "label": "execution", "why": "y"}), "other behaviors"),
        (lambda r: r["behaviors"][2].__setitem__("positive_examples", r["behaviors"][2]["positive_examples"][:2]), "positive_examples"),
        (lambda r: r.__setitem__("tie_break_order", ["planning"] * 6), "permutation"),
        (lambda r: r.__setitem__("surprise", 1), "surprise"),
    ],
)
def test_invalid_codebooks_name_the_problem(tmp_path, mutate, message):
    raw = yaml.safe_load(V1.read_text(encoding="utf-8"))
    mutate(raw)
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(CodebookError, match=message) as info:
        load_codebook_file(path)
    assert str(path) in str(info.value)


def test_unknown_name_lists_available():
    with pytest.raises(CodebookError, match="Available: .*six-behaviors@v1"):
        load_codebook("six-behaviors@v9")
    with pytest.raises(CodebookError, match="not a codebook name"):
        load_codebook("Six Behaviors")


def test_file_name_must_match_declared_version(tmp_path):
    shutil.copy(V1, tmp_path / "six-behaviors@v3.yaml")
    with pytest.raises(CodebookError, match="must be named six-behaviors@v1.yaml"):
        load_codebook_file(tmp_path / "six-behaviors@v3.yaml")


def test_render_shows_every_definition_example_and_rule():
    book = load_codebook()
    text = render_markdown(book)
    assert text == render_markdown(load_codebook_file(V1))  # deterministic
    for b in book.behaviors:
        assert f"### {b.name}" in text and b.definition in text
        for e in b.positive_examples:
            assert e.text in text
        for e in b.near_misses:
            assert f'"{e.text}" -> {e.label}' in text
    for r in book.decision_rules:
        assert r.rule in text
    short = summary(book)
    assert short.splitlines()[0] == f"six-behaviors@v1 ({V1_SHA256[:12]})"
    assert len(short.splitlines()) == 8 and len(short) < len(text) / 3


def test_codebook_model_round_trips():
    book = load_codebook()
    assert Codebook.model_validate_json(book.canonical_json()) == book


def test_cli_list_show_hash():
    from ror_annotate.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["codebook", "list"])
    assert listed.exit_code == 0, listed.output
    assert f"six-behaviors@v1\t{V1_SHA256}" in listed.output
    hashed = runner.invoke(app, ["codebook", "hash", "six-behaviors@v1"])
    assert hashed.output.strip() == V1_SHA256
    shown = runner.invoke(app, ["codebook", "show"])
    assert shown.exit_code == 0
    assert shown.output == render_markdown(load_codebook()) + "\n"
    as_json = runner.invoke(app, ["codebook", "show", "--format", "json"])
    assert hashlib.sha256(as_json.output.rstrip("\n").encode("utf-8")).hexdigest() == V1_SHA256


def test_cli_unknown_codebook_is_one_line_error():
    from ror_annotate.cli import app

    result = CliRunner().invoke(app, ["codebook", "show", "nope@v1"])
    assert result.exit_code == 2
    assert "error [E400]" in result.output and "Available: six-behaviors@v1" in result.output


def test_codebooks_are_read_from_the_package() -> None:
    """The lookup ends in the package's own codebooks/ folder (the wheel test below checks it ships)."""
    from ror_annotate.codebook import codebook_dirs, packaged_codebooks

    assert Path(str(packaged_codebooks())) == V1.parent
    assert codebook_dirs()[-1] == packaged_codebooks()
    assert available_codebooks() == sorted(p.stem for p in V1.parent.glob("*.yaml"))


def test_wheel_installed_outside_the_prefix_finds_the_codebook(tmp_path) -> None:
    """A wheel installed into a plain directory (as --user or --target do) loads the codebook from package data."""
    import subprocess
    import sys
    import zipfile

    # build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    src = tmp_path / "src"
    shutil.copytree(REPO / "ror_annotate", src / "ror_annotate", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("ror_annotate-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("ror_annotate/codebooks/six-behaviors@v1.yaml") == V1.read_bytes()
        card_template = REPO / "ror_annotate" / "templates" / "dataset_card.md"  # the export's card template ships too
        assert zf.read("ror_annotate/templates/dataset_card.md") == card_template.read_bytes()
        assert not [n for n in zf.namelist() if ".data/data/" in n]  # nothing under <prefix>/share any more
        zf.extractall(tmp_path / "site")  # what pip install --target does with a pure-Python wheel
    env = {k: v for k, v in os.environ.items() if k not in ("ROR_CODEBOOK_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    probe = (
        "import ror_annotate.codebook as c; b = c.load_codebook(); "
        "print(c.__file__); print(b.sha256); print(c.available_codebooks())"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    module_file, sha, names = out.stdout.strip().splitlines()
    assert Path(module_file).is_relative_to(tmp_path / "site")
    assert sha == V1_SHA256
    assert names == "['six-behaviors@v1']"
