"""Export: layout, round trips through datasets/parquet/the card's configs, label choice, splits,
atomic replacement, the tokens configuration and publishing offline."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ror_annotate.errors import AlignmentError, ConfigError, ExportError
from ror_annotate.export import (
    choose_label,
    export_dataset,
    load_export,
    publish_export,
    split_traces,
    tokens_features,
)
from ror_annotate.records import BEHAVIORS, Label, Trace
from ror_annotate.store import Store

from . import tokenizers_fixtures as F
from .judge_fixtures import split_segments

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

TEXTS = {
    "tr-a": ("What is 17 + 25?", "Let me add them. 17 + 25 = 42. Wait, is that right? So the answer is 42.", "A"),
    "tr-b": ("Sum 1/2 + 1/3?", "First, compute 数学 ∑ 🎉 terms. $\\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}$ 😀. The answer is 5/6.", "A"),
    "tr-c": ("Pick one.", "Recall the rule. Hmm, check again. Therefore (C) is right.", "B"),
}


def make_store(path: Path, texts: dict = TEXTS) -> Store:
    store = Store(path)
    store.upsert_traces(
        [Trace(trace_id=k, problem=p, text=t, dataset=d, model="m-1", answer="42", gold_answer="42") for k, (p, t, d) in texts.items()]
    )
    for k, (_, t, _) in texts.items():
        store.replace_segments(k, split_segments(k, t), segmenter="test-regex", token_counter="chars/4")
    labels = []
    for s in store.segments():
        labels.append(Label(trace_id=s.trace_id, segment_index=s.segment_index, label=BEHAVIORS[s.segment_index % 6],
                            source="baseline", annotator="baseline:cue-v1", codebook_version="baseline-cue-v1"))
    store.upsert_labels(labels)
    return store


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- layout and round trips
def test_segments_export_layout_and_round_trips(tmp_path):
    import datasets

    store = make_store(tmp_path / "s.duckdb")
    out = tmp_path / "exports" / "demo"
    summary = export_dataset(store, out, split_fractions=(1 / 3, 1 / 3, 1 / 3))
    assert summary.configs == ["traces", "segments"]
    seg_count = {"tr-a": 4, "tr-b": 3, "tr-c": 3}  # sentences of TEXTS, counted by hand
    by_split = {s: sorted(set(d["trace_id"])) for s, d in load_export(out).items()}
    assert all(len(ids) == 1 for ids in by_split.values()) and len(by_split) == 3  # 3 traces at 1/3 each
    assert summary.n_rows["segments"] == {s: seg_count[ids[0]] for s, ids in by_split.items()}
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "analytics.json", "data", "ror_export.json", "segments", "traces"]

    expected = {(s.trace_id, s.segment_index): s for s in store.segments()}
    disk = load_from_disk_rows(out)
    assert len(disk) == len(expected) == 10
    for row in disk:
        seg = expected[(row["trace_id"], row["segment_index"])]
        assert (row["char_start"], row["char_end"], row["text"], row["n_tokens"]) == (seg.char_start, seg.char_end, seg.text, seg.n_tokens)
        assert row["label"] == seg.segment_index % 6  # labeled BEHAVIORS[i % 6] above
        assert row["token_start"] is None and row["token_end"] is None
        assert row["label_source"] == "baseline" and row["annotator"] == "baseline:cue-v1"
        assert row["codebook_version"] == "baseline-cue-v1" and row["tool_version"].startswith("ror_annotate ")

    # the parquet files through the generic parquet builder, and through the card's configs YAML
    files = {s: str(out / f"data/segments/{s}-*.parquet") for s in summary.n_rows["segments"]}
    via_parquet = datasets.load_dataset("parquet", data_files=files)
    via_card = datasets.load_dataset(str(out), "segments")
    for dd in (via_parquet, via_card):
        assert dd["train"].features["label"] == datasets.ClassLabel(names=list(BEHAVIORS))
        assert {s: d.num_rows for s, d in dd.items()} == summary.n_rows["segments"]
    assert sorted(via_card["train"]["trace_id"]) == sorted(load_export(out)["train"]["trace_id"])


def load_from_disk_rows(out: Path) -> list[dict]:
    dd = load_export(out, "segments")
    return [row for split in dd.values() for row in split]


def test_classlabel_survives_parquet_and_card(tmp_path):
    """shared/pitfalls/DS-02: ClassLabel names must survive parquet, pandas sees plain ints, the card names them."""
    import datasets
    from huggingface_hub import DatasetCard

    store = make_store(tmp_path / "s.duckdb")
    out = tmp_path / "x"
    export_dataset(store, out, tokenizer=F.byte_level_bpe(), split_fractions=(1, 0, 0))
    seg_file = out / "data/segments/train-00000-of-00001.parquet"
    tok_file = out / "data/tokens/train-00000-of-00001.parquet"
    seg = datasets.Dataset.from_parquet(str(seg_file))
    tok = datasets.Dataset.from_parquet(str(tok_file))
    assert seg.features["label"] == datasets.ClassLabel(names=list(BEHAVIORS))
    assert tok.features["labeled_classes"] == datasets.List(datasets.ClassLabel(names=list(BEHAVIORS)))
    assert tok.features["labels"] == datasets.List(datasets.Value("int64"))
    assert tok.features == tokens_features()
    assert b"huggingface" in pq.read_schema(seg_file).metadata
    frame = pq.read_table(seg_file).to_pandas()
    assert frame["label"].dtype.kind == "i"
    assert sorted(frame["label"].tolist()) == sorted(s.segment_index % 6 for s in store.segments())

    card = DatasetCard.load(out / "README.md")
    infos = {c["config_name"]: c for c in card.data.dataset_info}
    label_feature = next(f for f in infos["segments"]["features"] if f["name"] == "label")
    assert label_feature["dtype"]["class_label"]["names"] == {str(i): b for i, b in enumerate(BEHAVIORS)}
    assert sorted(c["config_name"] for c in card.data.configs) == ["segments", "tokens", "traces"]
    assert [c["config_name"] for c in card.data.configs if c.get("default")] == ["segments"]
    assert card.data.license == "other"
    for i, b in enumerate(BEHAVIORS):
        assert f"- {i}: `{b}`" in card.text
    assert "No human review study in this store" in card.text


# ----------------------------------------------------------------------------- label choice
def _lab(label, source, annotator, minutes=0, **extra):
    return Label(trace_id="t", segment_index=0, label=label, source=source, annotator=annotator,
                 codebook_version="cb-1", created_at=T0 + timedelta(minutes=minutes), extra=extra)


def test_choose_label_policies():
    seg0 = [_lab("execution", "baseline", "baseline:cue-v1"),
            _lab("planning", "judge", "openai:gpt-x", model="gpt-x", prompt_template_hash="ph1")]
    assert choose_label(seg0, "auto")[0].label == "planning"
    assert choose_label(seg0, "auto")[0].judge_model == "gpt-x"
    assert choose_label(seg0, "auto")[0].prompt_template_hash == "ph1"
    assert choose_label(seg0, "baseline")[0].label == "execution"
    assert choose_label(seg0, "human")[0].label is None

    seg1 = [_lab("fact", "human", "h-1"), _lab("fact", "human", "h-2"), _lab("execution", "human", "h-3"),
            _lab("execution", "judge", "openai:gpt-x")]
    chosen, tied = choose_label(seg1, "auto")
    assert (chosen.label, chosen.source, chosen.n_votes, tied) == ("fact", "human", 3, False)
    assert chosen.vote_share == pytest.approx(2 / 3)
    chosen, tied = choose_label(seg1, "majority")  # 2 fact vs 2 execution
    assert chosen.label is None and tied

    seg2 = [_lab("reflection", "adjudicated", "adjudicator:a1", minutes=5), _lab("fact", "adjudicated", "adjudicator:a2", minutes=1),
            _lab("fact", "human", "h-1"), _lab("conclusion", "human", "h-2")]
    assert choose_label(seg2, "auto")[0].label == "reflection"  # latest adjudication wins
    assert choose_label(seg2, "human") == (choose_label([], "human")[0], True)

    # one vote per annotator: h-1's later label replaces its earlier one
    seg3 = [_lab("fact", "human", "h-1", minutes=0), _lab("planning", "human", "h-1", minutes=9), _lab("planning", "human", "h-2")]
    assert choose_label(seg3, "human")[0].label == "planning" and choose_label(seg3, "human")[0].n_votes == 2
    with pytest.raises(ConfigError, match="unknown label source"):
        choose_label(seg3, "gold")

    # "adjudicated" is the study reference: adjudication where humans disagreed, else their unanimous label
    assert choose_label(seg2, "adjudicated")[0].label == "reflection"
    agreed = [_lab("fact", "human", "h-1"), _lab("fact", "human", "h-2"), _lab("planning", "judge", "openai:gpt-x")]
    assert (choose_label(agreed, "adjudicated")[0].label, choose_label(agreed, "adjudicated")[0].source) == ("fact", "human")
    split = [_lab("fact", "human", "h-1"), _lab("planning", "human", "h-2")]
    assert choose_label(split, "adjudicated")[0].label is None


def test_human_labels_through_export(tmp_path):
    store = make_store(tmp_path / "s.duckdb")
    store.upsert_labels([
        Label(trace_id="tr-a", segment_index=0, label="fact", source="human", annotator="h-1", codebook_version="cb", study="s1"),
        Label(trace_id="tr-a", segment_index=1, label="fact", source="human", annotator="h-1", codebook_version="cb", study="s1"),
        Label(trace_id="tr-a", segment_index=1, label="planning", source="human", annotator="h-2", codebook_version="cb", study="s1"),
    ])
    summary = export_dataset(store, tmp_path / "h", label_source="human", split_fractions=(1, 0, 0))
    rows = {(r["trace_id"], r["segment_index"]): r for r in load_from_disk_rows(tmp_path / "h")}
    assert rows[("tr-a", 0)]["label"] == BEHAVIORS.index("fact")
    assert rows[("tr-a", 1)]["label"] is None and summary.n_ties == 1
    assert rows[("tr-b", 0)]["label"] is None and rows[("tr-b", 0)]["label_source"] is None
    assert summary.label_counts["unlabeled"] == 9 and summary.label_counts["fact"] == 1


# ----------------------------------------------------------------------------- splits
def _traces(n_a: int, n_b: int) -> list[Trace]:
    return [Trace(trace_id=f"a{i:02d}", text="x", dataset="A") for i in range(n_a)] + [
        Trace(trace_id=f"b{i:02d}", text="x", dataset="B") for i in range(n_b)
    ]


def test_splits_are_by_trace_seeded_and_stratified():
    traces = _traces(10, 10)
    split = split_traces(traces, fractions=(0.8, 0.1, 0.1), seed=3, stratify_by="dataset")
    for prefix in "ab":
        got = [split[t.trace_id] for t in traces if t.trace_id.startswith(prefix)]
        assert (got.count("train"), got.count("validation"), got.count("test")) == (8, 1, 1)
    assert split == split_traces(traces, fractions=(0.8, 0.1, 0.1), seed=3, stratify_by="dataset")
    assert split != split_traces(traces, fractions=(0.8, 0.1, 0.1), seed=4, stratify_by="dataset")
    # 7 traces at 0.8/0.1/0.1 = 5.6/0.7/0.7: floors 5/0/0, the two leftover go to the largest remainders (.7, .7)
    counts = list(split_traces(_traces(7, 0), fractions=(0.8, 0.1, 0.1)).values())
    assert (counts.count("train"), counts.count("validation"), counts.count("test")) == (5, 1, 1)
    # 9 traces: 7.2/0.9/0.9 -> floors 7/0/0, leftovers to validation and test
    counts = list(split_traces(_traces(9, 0), fractions=(0.8, 0.1, 0.1)).values())
    assert (counts.count("train"), counts.count("validation"), counts.count("test")) == (7, 1, 1)
    for bad in ((0.5, 0.5), (0.9, 0.2, -0.1), (0.5, 0.3, 0.1)):
        with pytest.raises(ConfigError, match="fractions"):
            split_traces(traces, fractions=bad)
    with pytest.raises(ConfigError, match="stratify"):
        split_traces(traces, stratify_by="colour")


def test_no_trace_is_split_across_splits(tmp_path):
    store = make_store(tmp_path / "s.duckdb")
    export_dataset(store, tmp_path / "o", split_fractions=(0.34, 0.33, 0.33), seed=1)
    where: dict[str, set] = {}
    for split, ds in load_export(tmp_path / "o").items():
        for tid in ds["trace_id"]:
            where.setdefault(tid, set()).add(split)
    assert sorted(where) == sorted(TEXTS) and all(len(v) == 1 for v in where.values())


# ----------------------------------------------------------------------------- tokens configuration
@pytest.mark.parametrize("chat_template", [False, True])
def test_tokens_configuration_matches_segments(tmp_path, chat_template):
    store = make_store(tmp_path / "s.duckdb")
    tok = F.byte_level_bpe()
    summary = export_dataset(store, tmp_path / "t", tokenizer=tok, chat_template=chat_template, split_fractions=(1, 0, 0))
    assert summary.configs == ["traces", "segments", "tokens"]
    tokens = {r["trace_id"]: r for r in load_export(tmp_path / "t", "tokens")["train"]}
    traces = {t.trace_id: t for t in store.iter_traces()}
    assert summary.n_tokens == sum(len(r["input_ids"]) for r in tokens.values())
    for row in load_from_disk_rows(tmp_path / "t"):
        t = tokens[row["trace_id"]]
        assert t["rendering"] == ("chat_template" if chat_template else "raw")
        off = t["text_offset"]
        assert t["text"][off : off + len(traces[row["trace_id"]].text)] == traces[row["trace_id"]].text
        assert (off > 0) == chat_template
        lo, hi = row["token_start"], row["token_end"]
        assert row["n_tokens"] == hi - lo > 0
        labeled = [i for i in range(lo, hi) if t["segment_ids"][i] == row["segment_index"]]
        assert labeled and all(t["labels"][i] == row["label"] for i in labeled)
        # the segment's tokens cover its text: decoding them gives the segment back
        assert row["text"] in tok.decode(t["input_ids"][lo:hi])
        # characters of the tokens with this segment id lie inside the segment (shifted into the rendered text)
        for i in labeled:
            s, e = t["offsets"][i]
            first = next(c for c in range(s, e) if not t["text"][c].isspace())
            assert row["char_start"] + off <= first < row["char_end"] + off
    for t in tokens.values():
        assert len(t["input_ids"]) == len(t["labels"]) == len(t["segment_ids"]) == len(t["offsets"])
        assert t["tokenizer"] == "tiny-byte-level-bpe"
        # every labeled token carries its segment's id, every ignored one (-100) segment id -1 (all segments are labeled here)
        assert all((lab == -100) == (sid == -1) for lab, sid in zip(t["labels"], t["segment_ids"]))
        assert set(t["labels"]) <= set(range(len(BEHAVIORS))) | {-100}
        # the typed pair lists exactly the labelled tokens
        assert t["labeled_positions"] == [i for i, lab in enumerate(t["labels"]) if lab != -100]
        assert t["labeled_classes"] == [t["labels"][i] for i in t["labeled_positions"]]


def test_export_carries_no_local_path(tmp_path):
    # the card and the parquet files get published: a tokenizer loaded from a local directory must not
    # put that directory's path (user name, home, cluster layout) into them
    store = make_store(tmp_path / "s.duckdb")
    F.byte_level_bpe().save_pretrained(tmp_path / "secret-home" / "tiny-tok")
    out = tmp_path / "o"
    export_dataset(store, out, tokenizer=str(tmp_path / "secret-home" / "tiny-tok"), split_fractions=(1, 0, 0))
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "secret-home" not in card and "`tiny-tok`" in card
    assert "secret-home" not in (out / "analytics.json").read_text(encoding="utf-8")
    for f in (out / "data").rglob("*.parquet"):
        table = pq.read_table(f)
        for col in table.column_names:
            if str(table.schema.field(col).type) == "string":
                assert not any("secret-home" in (v or "") for v in table.column(col).to_pylist()), (f, col)
    assert set(pq.read_table(out / "data/tokens/train-00000-of-00001.parquet").column("tokenizer").to_pylist()) == {"tiny-tok"}


def test_export_of_a_label_source_the_store_lacks_is_an_error(tmp_path):
    # baseline labels only: --labels human would silently write a dataset with every label -1
    store = make_store(tmp_path / "s.duckdb")
    with pytest.raises(ExportError, match="no 'human' labels.*baseline"):
        export_dataset(store, tmp_path / "o", label_source="human")
    assert not (tmp_path / "o").exists()


def test_chat_template_without_tokenizer_is_a_config_error(tmp_path):
    store = make_store(tmp_path / "s.duckdb")
    with pytest.raises(ConfigError, match="--chat-template needs --tokenizer"):
        export_dataset(store, tmp_path / "o", chat_template=True)


# ----------------------------------------------------------------------------- atomic replacement
def test_failed_reexport_leaves_previous_export_intact(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s.duckdb")
    out = tmp_path / "o"
    export_dataset(store, out)
    before = tree_digest(out)

    import ror_annotate.card as card

    def broken_card(*a, **k):
        raise OSError("disk full while writing the card")

    monkeypatch.setattr(card, "build_card", broken_card)
    with pytest.raises(OSError, match="disk full"):
        export_dataset(store, out, seed=7)
    assert tree_digest(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary directory left

    monkeypatch.undo()
    tok = F.byte_level_bpe()
    tok.chat_template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(AlignmentError):
        export_dataset(store, out, tokenizer=tok, chat_template=True)
    assert tree_digest(out) == before

    export_dataset(store, out, seed=7)  # a successful re-export replaces it
    assert json.loads((out / "ror_export.json").read_text())["parameters"]["seed"] == 7


def test_refuses_to_replace_a_directory_that_is_not_an_export(tmp_path):
    store = make_store(tmp_path / "s.duckdb")
    victim = tmp_path / "notes"
    victim.mkdir()
    (victim / "thesis.tex").write_text("precious")
    with pytest.raises(ExportError, match="not a ror_annotate export"):
        export_dataset(store, victim)
    assert (victim / "thesis.tex").read_text() == "precious"


def test_empty_store_is_an_error(tmp_path):
    with pytest.raises(ExportError, match="no segmented traces"):
        export_dataset(Store(tmp_path / "e.duckdb"), tmp_path / "o")


# ----------------------------------------------------------------------------- publishing offline
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_publish_offline_fails_clearly_and_keeps_the_export(tmp_path, monkeypatch):
    store = make_store(tmp_path / "s.duckdb")
    out = tmp_path / "exports" / "demo"
    export_dataset(store, out)
    before = tree_digest(out)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ExportError, match="set HF_TOKEN"):
        publish_export("demo", "org/demo", exports_dir=tmp_path / "exports", allow_unknown_license=True)
    secret = "hf_SECRETtoken0123456789"
    monkeypatch.setenv("HF_TOKEN", secret)
    with pytest.raises(ExportError) as err:
        publish_export("demo", "org/demo", exports_dir=tmp_path / "exports", endpoint=f"http://127.0.0.1:{_closed_port()}",
                       allow_unknown_license=True)
    assert "local export" in str(err.value) and "unchanged" in str(err.value)
    assert secret not in str(err.value)
    assert tree_digest(out) == before
    with pytest.raises(ExportError, match="no export named"):
        publish_export("missing", "org/demo", exports_dir=tmp_path / "exports")


def test_cli_export_and_publish(tmp_path):
    db = tmp_path / "s.duckdb"
    make_store(db).close()
    env = {**os.environ, "HF_TOKEN": "hf_SECRETcli987654321", "HF_HUB_OFFLINE": "1", "ROR_DB": str(db)}
    cli = [sys.executable, "-c", "from ror_annotate.cli import app; app()"]
    res = subprocess.run([*cli, "export", "demo", "--out", str(tmp_path / "exports/demo"), "--split", "1,0,0"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "segments rows" in res.stdout and (tmp_path / "exports/demo/README.md").is_file()
    with Store(db) as store:
        assert store.runs()[-1].command == "export" and store.runs()[-1].status == "ok"
    before = tree_digest(tmp_path / "exports/demo")

    res = subprocess.run([*cli, "publish", "demo", "--repo-id", "org/demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.startswith("error [E812]")  # the traces' licence is unknown
    res = subprocess.run([*cli, "publish", "demo", "--repo-id", "org/demo", "--allow-unknown-license"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert res.stderr.startswith("error [E810]") and "Traceback" not in res.stderr
    assert "hf_SECRETcli987654321" not in res.stderr + res.stdout
    assert tree_digest(tmp_path / "exports/demo") == before
    assert not any("hf_SECRETcli987654321" in p.read_text(errors="ignore") for p in (tmp_path / "exports").rglob("*.json"))

    res = subprocess.run([*cli, "export", "demo2", "--labels", "gold"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "unknown label source 'gold'" in res.stderr


def test_card_reports_human_agreement(tmp_path):
    import krippendorff
    import numpy as np

    store = make_store(tmp_path / "s.duckdb")
    h1 = ["fact", "fact", "planning", "conclusion"]
    h2 = ["fact", "planning", "planning", "conclusion"]  # 3 of 4 agree
    store.upsert_labels(
        [Label(trace_id="tr-a", segment_index=i, label=lab, source="human", annotator=a, codebook_version="cb", study="s1")
         for a, labels in (("h-1", h1), ("h-2", h2)) for i, lab in enumerate(labels)]
    )
    export_dataset(store, tmp_path / "o", label_source="human")
    card = (tmp_path / "o" / "README.md").read_text(encoding="utf-8")
    section = card[card.index("## Agreement") : card.index("## Trace analytics")]
    assert "4 segments in 1 traces" in section and "`h-1`, `h-2`" in section
    assert "| percent_agreement | 0.750" in section
    alpha = krippendorff.alpha(reliability_data=np.array([[BEHAVIORS.index(x) for x in h] for h in (h1, h2)]),
                               level_of_measurement="nominal")
    assert f"| krippendorff_alpha | {alpha:.3f}" in section
    assert "No human review study" not in card
    # the full agreement report sits next to the dataset and is linked from the card
    report = tmp_path / "o" / "agreement" / "humans" / "agreement.md"
    assert "[agreement/humans/agreement.md](agreement/humans/agreement.md)" in section
    assert report.exists() and "0.750" in report.read_text(encoding="utf-8")
    assert (report.parent / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the report is published with the dataset: no local path of the store in it
    for f in (tmp_path / "o" / "agreement").rglob("*"):
        if f.suffix in (".md", ".json"):
            assert str(tmp_path) not in f.read_text(encoding="utf-8"), f


def test_card_compares_the_judge_only_on_reviewed_segments(tmp_path):
    # A judge labels every segment (10, in 3 traces); two humans review 4 segments of tr-a. The
    # judge-vs-human figures must cover those 4 reviewed segments, not the 6 only the judge saw.
    store = make_store(tmp_path / "s.duckdb")
    store.upsert_labels(
        [Label(trace_id=s.trace_id, segment_index=s.segment_index, label=BEHAVIORS[s.segment_index % 6], source="judge",
               annotator="openai:gpt-x", codebook_version="cb") for s in store.segments()]
    )
    h1 = ["fact", "fact", "planning", "conclusion"]
    h2 = ["fact", "planning", "planning", "conclusion"]
    store.upsert_labels(
        [Label(trace_id="tr-a", segment_index=i, label=lab, source="human", annotator=a, codebook_version="cb", study="s1")
         for a, labels in (("h-1", h1), ("h-2", h2)) for i, lab in enumerate(labels)]
    )
    export_dataset(store, tmp_path / "o")
    card = (tmp_path / "o" / "README.md").read_text(encoding="utf-8")
    section = card[card.index("## Agreement") : card.index("## Trace analytics")]
    assert "- humans + LLM judge: 4 segments in 1 traces" in section
    # judge on tr-a#0..3 = planning, execution, restatement, fact; pairwise agreement per item among the
    # three raters: 1/3, 0, 1/3, 1/3 -> mean 0.25 (hand calculation)
    row = next(line for line in section.splitlines() if line.startswith("| percent_agreement |"))
    assert row.split("|")[2].strip().startswith("0.750") and row.split("|")[3].strip().startswith("0.250")


# ----------------------------------------------------------------------------- a dataset that stands on its own
def _all_rows(out: Path, config: str) -> list[dict]:
    return [row for split in load_export(out, config).values() for row in split]


def test_traces_configuration_holds_the_text_every_offset_indexes(tmp_path):
    import datasets

    store = make_store(tmp_path / "s.duckdb")
    out = tmp_path / "o"
    summary = export_dataset(store, out, split_fractions=(1 / 3, 1 / 3, 1 / 3))
    traces = {r["trace_id"]: r for r in _all_rows(out, "traces")}
    assert sorted(traces) == sorted(TEXTS)
    for tid, (problem, text, dataset) in TEXTS.items():
        row = traces[tid]
        assert (row["problem"], row["text"], row["dataset"], row["model"]) == (problem, text, dataset, "m-1")
        assert (row["answer"], row["gold_answer"], row["correct"]) == ("42", "42", None)
        assert row["license"] is None and row["source_format"] is None
    segments = _all_rows(out, "segments")
    for seg in segments:
        assert traces[seg["trace_id"]]["text"][seg["char_start"] : seg["char_end"]] == seg["text"]
    assert {t: r["n_segments"] for t, r in traces.items()} == {"tr-a": 4, "tr-b": 3, "tr-c": 3}  # hand count
    # a trace sits in the same split in every configuration, and the card's configs YAML reaches it
    via_card = datasets.load_dataset(str(out), "traces")
    seg_split = {r["trace_id"]: s for s, d in load_export(out, "segments").items() for r in d}
    assert {r["trace_id"]: s for s, d in via_card.items() for r in d} == seg_split
    assert summary.n_rows["traces"] == {s: 1 for s in ("train", "validation", "test")}


def test_every_stored_classlabel_value_decodes(tmp_path):
    """The ignore value never sits in a ClassLabel column: int2str works on every stored value (issue 16)."""
    store = make_store(tmp_path / "s.duckdb")
    store.upsert_labels([
        Label(trace_id="tr-a", segment_index=0, label="fact", source="human", annotator="h-1", codebook_version="cb", study="s1"),
    ])
    out = tmp_path / "o"
    export_dataset(store, out, label_source="human", tokenizer=F.byte_level_bpe(), split_fractions=(1, 0, 0))
    seg = load_export(out, "segments")["train"]
    labels = seg["label"]
    assert labels.count(None) == 9 and [x for x in labels if x is not None] == [BEHAVIORS.index("fact")]
    assert seg.features["label"].int2str([x for x in labels if x is not None]) == ["fact"]
    tok = load_export(out, "tokens")["train"]
    feature = tok.features["labeled_classes"].feature
    n_labelled = 0
    for row in tok:
        names = feature.int2str(row["labeled_classes"])  # raised "Invalid integer class label -1" before
        n_labelled += len(names)
        assert set(names) <= {"fact"}
        assert [row["labels"][i] for i in row["labeled_positions"]] == row["labeled_classes"]
        assert sum(1 for x in row["labels"] if x != -100) == len(row["labeled_positions"])
    first = next(r for r in tok if r["trace_id"] == "tr-a")
    assert n_labelled == len(first["labeled_positions"]) > 0
    # the first segment's labelled tokens are exactly the tr-a tokens carrying segment id 0
    assert first["labeled_positions"] == [i for i, s in enumerate(first["segment_ids"]) if s == 0]


def test_model_ready_labels_work_with_the_token_classification_collator(tmp_path):
    from transformers import DataCollatorForTokenClassification

    store = make_store(tmp_path / "s.duckdb")
    tok = F.byte_level_bpe()
    out = tmp_path / "o"
    export_dataset(store, out, tokenizer=tok, split_fractions=(1, 0, 0))
    rows = load_export(out, "tokens")["train"].select_columns(["input_ids", "labels"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    batch = DataCollatorForTokenClassification(tok, return_tensors="np")([rows[i] for i in range(len(rows))])
    longest = max(len(r["input_ids"]) for r in rows)
    assert batch["labels"].shape == (len(rows), longest)
    for i, r in enumerate(rows):
        n = len(r["labels"])
        assert batch["labels"][i, :n].tolist() == r["labels"]
        assert (batch["labels"][i, n:] == -100).all()  # padding is ignored the same way as unlabeled tokens


def _corrupt(store: Store, label: str = "pondering") -> str:
    label_id = store.execute("SELECT label_id FROM labels WHERE trace_id = 'tr-b' AND segment_index = 1").fetchone()[0]
    store.execute("UPDATE labels SET label = ? WHERE label_id = ?", [label, label_id])
    return label_id


def test_corrupt_store_row_is_one_coded_line_naming_the_row(tmp_path):
    db = tmp_path / "s.duckdb"
    store = make_store(db)
    label_id = _corrupt(store)
    with pytest.raises(ExportError) as err:
        export_dataset(store, tmp_path / "o")
    assert err.value.code == "E811" and label_id in str(err.value) and "tr-b#1" in str(err.value)
    assert "'pondering'" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "o").exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".o")] == []
    store.close()
    env = {**os.environ, "ROR_DB": str(db)}
    res = subprocess.run([sys.executable, "-c", "from ror_annotate.cli import app; app()", "export", "demo", "--out", str(tmp_path / "o")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    # one line (a transient status display may leave an empty line before it on old rich versions)
    assert res.stderr.strip().startswith("error [E811]") and len(res.stderr.strip().splitlines()) == 1 and label_id in res.stderr


def test_licences_decide_what_may_be_published(tmp_path, monkeypatch):
    db = tmp_path / "s.duckdb"
    store = Store(db)
    store.upsert_traces([
        Trace(trace_id="mit-1", text="First I add. So the answer is 4.", source="org/open-traces", model="m"),
        Trace(trace_id="closed-1", text="Let me think. The answer is 5.", source="org/closed-traces", model="m"),
    ])
    for tid in ("mit-1", "closed-1"):
        store.replace_segments(tid, split_segments(tid, store.get_trace(tid).text), segmenter="t", token_counter="approx:regex-v1")
    out = tmp_path / "exports" / "demo"
    summary = export_dataset(store, out, source_licenses={"org/open-traces": "mit"})
    assert {s["source"]: (s["license"], s["publishable"], s["n_traces"]) for s in summary.sources} == {
        "org/open-traces": ("mit", True, 1), "org/closed-traces": (None, False, 1)}
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "| org/open-traces | mit | yes | 1 |" in card
    assert "| org/closed-traces | unknown | **no** (licence unknown or restrictive) | 1 |" in card
    assert {r["trace_id"]: r["license"] for r in _all_rows(out, "traces")} == {"mit-1": "mit", "closed-1": None}
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with pytest.raises(ExportError) as err:
        publish_export("demo", "org/demo", exports_dir=tmp_path / "exports", endpoint=f"http://127.0.0.1:{_closed_port()}")
    assert err.value.code == "E812" and "org/closed-traces" in str(err.value) and "org/open-traces" not in str(err.value)
    # told to, it goes on to the upload (which fails here: nothing listens)
    with pytest.raises(ExportError) as err:
        publish_export("demo", "org/demo", exports_dir=tmp_path / "exports", endpoint=f"http://127.0.0.1:{_closed_port()}",
                       allow_unknown_license=True)
    assert err.value.code == "E810"
    # every source licensed: publishing is no longer refused for licences
    export_dataset(store, out, source_licenses={"org/open-traces": "mit", "org/closed-traces": "cc-by-4.0"})
    with pytest.raises(ExportError) as err:
        publish_export("demo", "org/demo", exports_dir=tmp_path / "exports", endpoint=f"http://127.0.0.1:{_closed_port()}")
    assert err.value.code == "E810"


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_manifest_and_card_name_no_local_path_and_describe_every_column(tmp_path):
    from ror_annotate.export import COLUMN_DOCS, segments_features, traces_features

    store = make_store(tmp_path / "s.duckdb")
    F.byte_level_bpe().save_pretrained(tmp_path / "home" / "tiny-tok")
    out = tmp_path / "o"
    export_dataset(store, out, tokenizer=str(tmp_path / "home" / "tiny-tok"), split_fractions=(1, 0, 0))
    manifest = json.loads((out / "ror_export.json").read_text(encoding="utf-8"))
    for s in _strings(manifest):
        assert str(tmp_path) not in s and not s.startswith("/"), s
    assert manifest["out_dir"] == "o" and manifest["paths"]["segments/train"] == "data/segments/train-*.parquet"
    assert manifest["parameters"]["tokenizer"] == "tiny-tok"
    from ror_annotate.tokenizer import tokenizer_vocab_sha256

    assert manifest["parameters"]["tokenizer_vocab_sha256"] == tokenizer_vocab_sha256(F.byte_level_bpe())
    assert set(load_export(out, "tokens")["train"]["tokenizer_vocab_sha256"]) == {manifest["parameters"]["tokenizer_vocab_sha256"]}
    card = (out / "README.md").read_text(encoding="utf-8")
    for config, features in (("traces", traces_features()), ("segments", segments_features()), ("tokens", tokens_features())):
        assert set(COLUMN_DOCS[config]) == set(features), config
        section = card[card.index(f"### `{config}`") :]
        for col in features:
            assert f"- `{col}`: " in section, (config, col)
    assert "counted with **`tiny-tok`** (subject tokenizer)" in card


def test_card_names_the_approximate_token_counter(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    store.upsert_traces([Trace(trace_id="t1", text="First I add. So the answer is 4.")])
    store.replace_segments("t1", split_segments("t1", "First I add. So the answer is 4."), segmenter="t", token_counter="approx:regex-v1")
    export_dataset(store, tmp_path / "o")
    card = (tmp_path / "o" / "README.md").read_text(encoding="utf-8")
    assert "counted with **`approx:regex-v1`** (approximation)" in card and "not the subject model's tokenizer" in card
    assert "In tokens (approx:regex-v1):" in card


def test_small_batches_and_shards_give_the_same_dataset(tmp_path, monkeypatch):
    """Streaming is invisible in the result: one batch per trace and one shard per batch give the same rows."""
    import datasets

    import ror_annotate.export.write as write

    store = make_store(tmp_path / "s.duckdb")
    tok = F.byte_level_bpe()
    export_dataset(store, tmp_path / "one", tokenizer=tok, split_fractions=(1, 0, 0))
    monkeypatch.setattr(write, "MAX_SHARD_BYTES", 1)  # every row group starts a new shard
    monkeypatch.setattr(write, "ROW_GROUP_BYTES", 1)  # every row is its own row group (layout version 2)
    summary = export_dataset(store, tmp_path / "many", tokenizer=tok, split_fractions=(1, 0, 0), batch_size=1, max_batch_segments=1)
    files = sorted(p.name for p in (tmp_path / "many" / "data" / "traces").iterdir())
    assert files == ["train-00000-of-00003.parquet", "train-00001-of-00003.parquet", "train-00002-of-00003.parquet"]  # 3 traces
    n_seg = summary.n_segments
    files = sorted(p.name for p in (tmp_path / "many" / "data" / "segments").iterdir())
    assert files == [f"train-{i:05d}-of-{n_seg:05d}.parquet" for i in range(n_seg)]  # one shard per segment row
    assert summary.paths["segments/train"] == "data/segments/train-*.parquet"
    for config in ("traces", "segments", "tokens"):
        a = load_export(tmp_path / "one", config)["train"]
        b = load_export(tmp_path / "many", config)["train"]
        assert a.to_list() == b.to_list(), config
        via_card = datasets.load_dataset(str(tmp_path / "many"), config)["train"]
        assert via_card.to_list() == a.to_list(), config
    one = json.loads((tmp_path / "one" / "ror_export.json").read_text())
    many = json.loads((tmp_path / "many" / "ror_export.json").read_text())
    for key in ("label_counts", "segment_length", "analytics", "n_rows", "n_tokens", "n_straddling", "sources"):
        assert one[key] == many[key], key


def test_batches_are_gathered_into_row_groups(tmp_path, monkeypatch):
    """One trace per batch still gives one row group per file below ROW_GROUP_BYTES (a parquet writer keeps
    every row group's metadata until it closes), and a row group per row once each row reaches it."""
    import pyarrow.parquet as pq

    import ror_annotate.export.write as write

    store = make_store(tmp_path / "s.duckdb")  # 3 traces
    export_dataset(store, tmp_path / "gathered", split_fractions=(1, 0, 0), batch_size=1, max_batch_segments=1)
    monkeypatch.setattr(write, "ROW_GROUP_BYTES", 1)
    export_dataset(store, tmp_path / "each", split_fractions=(1, 0, 0), batch_size=1, max_batch_segments=1)
    for config in ("traces", "segments"):
        gathered = pq.ParquetFile(tmp_path / "gathered" / "data" / config / "train-00000-of-00001.parquet")
        each = pq.ParquetFile(tmp_path / "each" / "data" / config / "train-00000-of-00001.parquet")
        assert (gathered.metadata.num_row_groups, each.metadata.num_row_groups) == (1, each.metadata.num_rows), config
        assert gathered.read().to_pylist() == each.read().to_pylist(), config
        assert gathered.metadata.num_rows == each.metadata.num_rows > 0


def test_percentile_from_counts_matches_numpy():
    import numpy as np

    from ror_annotate.export import percentile_from_counts

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101, 1000):
        values = rng.integers(0, 130, size=n)
        counts = np.bincount(values)
        for q in (0, 5, 50, 95, 100):
            assert percentile_from_counts(counts, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9), (n, q)


def test_build_card_is_pure(tmp_path, monkeypatch):
    """build_card reads nothing and writes nothing: the same inputs give the same card, and no file appears."""
    from ror_annotate.card import CardFigures, build_card
    from ror_annotate.export.features import features_of

    store = make_store(tmp_path / "s.duckdb")
    summary = export_dataset(store, tmp_path / "o", split_fractions=(1, 0, 0))
    store.close()
    work = tmp_path / "empty"
    work.mkdir()
    monkeypatch.chdir(work)
    data_files = {c: {"train": [f"data/{c}/train-*.parquet"]} for c in ("traces", "segments")}
    infos = {c: (features_of(c), {"train": (n, 1)}) for c, n in (("traces", 3), ("segments", 10))}
    figures = CardFigures(human_labels=True, notes=["- humans: no figures (one annotator)"])
    a = build_card(summary, data_files=data_files, infos=infos, figures=figures, reports={"humans": "agreement/h/agreement.md"})
    b = build_card(summary, data_files=data_files, infos=infos, figures=figures, reports={"humans": "agreement/h/agreement.md"})
    assert str(a) == str(b) and list(work.iterdir()) == []
    assert "[agreement/h/agreement.md](agreement/h/agreement.md)" in a.text
    assert "no agreement figures could be computed:\n- humans: no figures (one annotator)" in a.text
    assert "(the Routes-of-Reasoning corpus: median 16, p5 3, p95 47, cap 125)" in a.text


def test_agreement_stage_bugs_are_not_turned_into_card_notes(tmp_path, monkeypatch):
    import ror_annotate.agreement as agreement

    store = make_store(tmp_path / "s.duckdb")
    store.upsert_labels([Label(trace_id="tr-a", segment_index=i, label="fact", source="human", annotator=a, codebook_version="cb",
                               study="s1") for a in ("h-1", "h-2") for i in range(2)])

    def buggy(*args, **kwargs):
        raise TypeError("a bug in the agreement stage")

    monkeypatch.setattr(agreement, "agreement_summary", buggy)
    with pytest.raises(TypeError, match="a bug"):
        export_dataset(store, tmp_path / "o")
    assert not (tmp_path / "o").exists()

    def refuses(*args, **kwargs):
        from ror_annotate.errors import AgreementError

        raise AgreementError("needs at least two annotators")

    monkeypatch.setattr(agreement, "agreement_summary", refuses)
    export_dataset(store, tmp_path / "o")
    assert "- humans: no figures (needs at least two annotators)" in (tmp_path / "o" / "README.md").read_text(encoding="utf-8")


def test_traces_configuration_records_the_source_format(tmp_path):
    from ror_annotate import pipeline

    src = tmp_path / "in.jsonl"
    rows = [{"id": "think-1", "response": "<think>\nFirst I add 2 and 2. So it is 4.\n</think>\n\nThe answer is 4.", "problem": "2+2?"},
            {"id": "plain-1", "response": "First I add 3 and 3. So the answer is 6.", "problem": "3+3?"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with Store(tmp_path / "s.duckdb") as store:
        summary = pipeline.run(store, str(src), out=tmp_path / "o")
        stored = {t.trace_id: t.source_format for t in store.iter_traces()}
    assert summary.export.configs == ["traces", "segments"]
    exported = {r["trace_id"]: r for r in _all_rows(tmp_path / "o", "traces")}
    assert {t: r["source_format"] for t, r in exported.items()} == stored
    assert stored["think-1"] != stored["plain-1"] and all(stored.values())  # <think> tags vs a plain response
    assert exported["think-1"]["text"] == "First I add 2 and 2. So it is 4." and exported["think-1"]["answer"] == "The answer is 4."
