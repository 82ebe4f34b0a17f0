"""Probe and steer on the real exported dataset, end to end through the real ``ror`` entry point.

Real traces (two or more benchmarks) -> ``ror run --tokenizer`` (a real byte-level BPE fast
tokenizer saved to disk) -> ``ror capture`` (a tiny random-weight Qwen3-MoE saved with that
tokenizer) -> ``ror probe`` / ``ror experts`` -> ``ror steer`` with the spec ``ror experts`` wrote.
Every command runs once in a subprocess (module fixture); the tests then check what they wrote
against values computed here independently: from the raw capture files (``np.fromfile``), the
exported dataset (``datasets.load_from_disk``), an unbatched ``transformers`` forward, and hand
formulas (risk difference, majority-baseline macro-F1).
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests import moe_fixtures as mf
from tests.tokenizers_fixtures import byte_level_bpe

pytest.importorskip("torch")
pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

pytestmark = [pytest.mark.integration, pytest.mark.steer]

ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]
BEHAVIORS = ("planning", "execution", "restatement", "fact", "reflection", "conclusion")
N_TRACES = 8  # the export's 80/10/10 split gives 6/1/1 traces: probes need all three splits
MAX_NEW_TOKENS = 6


def ror(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    start = time.perf_counter()
    done = subprocess.run([*ROR, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    done.seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    assert done.returncode == 0, f"ror {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    return done


def _head(text: str, limit: int = 1500) -> str:
    """The trace's first paragraphs up to ``limit`` characters (the whole trace when shorter)."""
    if len(text) < limit:
        return text
    cut = text.rfind("\n\n", 0, limit)
    return text[:cut] if cut > 0 else text[:limit]


def pick_traces(rows: list[dict]) -> list[dict]:
    """Short traces from the benchmarks with most short traces, at least two benchmarks.

    The embedded sample's traces are long (median 9,000 characters): each is cut to its first
    paragraphs under 1,500 characters, so the tiny model's capture stays fast.
    """
    rows = [{**r, "trace": _head(r["trace"])} for r in rows]
    short = sorted((r for r in rows if len(r["trace"]) < 1500 and r.get("problem")),
                   key=lambda r: (len(r["trace"]), r["trace_id"]))
    by_bench: dict[str, list[dict]] = {}
    for r in short:
        by_bench.setdefault(r["benchmark"], []).append(r)
    benches = sorted(by_bench, key=lambda b: (-len(by_bench[b]), b))
    picked = by_bench[benches[0]][:4]
    for b in benches[1:]:
        picked += by_bench[b][: N_TRACES - len(picked)]
        if len(picked) == N_TRACES:
            break
    assert len({r["benchmark"] for r in picked}) >= 2
    return picked


@pytest.fixture(scope="module")
def run(tmp_path_factory, real_trace_rows) -> dict:
    """Run the whole stage once; returns paths, command outputs and timings."""
    work = tmp_path_factory.mktemp("pipeline_steer")
    traces = pick_traces(real_trace_rows)
    (work / "traces.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in traces),
                                       encoding="utf-8")
    tokenizer = byte_level_bpe()
    tokenizer.save_pretrained(work / "tok")
    model = mf.build("qwen3_moe", vocab_size=len(tokenizer), max_position_embeddings=4096,
                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    # the traces file itself is the problems file: trace_id is the id, gold_answer the reference
    (work / "problems.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in traces[:2]),
                                         encoding="utf-8")
    out: dict = {"work": work, "traces": traces, "times": {}}

    def step(name: str, *args: str) -> subprocess.CompletedProcess:
        done = ror(*args, cwd=work)
        out["times"][name] = round(done.seconds, 1)  # type: ignore[attr-defined]
        return done

    out["run"] = step("run", "run", "traces.jsonl", "--db", "s.duckdb", "--out", "export", "--tokenizer", "tok")
    # interrupted capture (--limit), resumed from a path spelled differently, then re-run: nothing to do
    out["capture_part"] = step("capture_part", "capture", "export", "--model", "model", "--out", "cap",
                               "--limit", "3", "--batch-size", "2")
    out["capture"] = step("capture", "capture", "export", "--model", str(work / "model"), "--out", "cap",
                          "--batch-size", "3", "--padding-side", "left")
    out["cap_bytes"] = {p.name: p.read_bytes() for p in (work / "cap").iterdir()}
    out["capture_again"] = step("capture_again", "capture", "export", "--model", "./model", "--out", "cap")
    out["probe"] = step("probe", "probe", "export", "--capture", "cap", "--windows", "1,2", "--controls",
                        "position,tfidf", "--out", "probe")
    out["experts"] = step("experts", "experts", "export", "--capture", "cap", "--out", "exp", "--top-k", "3",
                          "--steer-size", "2", "--permutations", "5")
    out["steer"] = step("steer", "steer", "problems.jsonl", "--model", "model", "--spec",
                        "exp/steer_suppress_planning.json", "--max-new-tokens", str(MAX_NEW_TOKENS), "--out",
                        "steer.jsonl")
    print("ror wall seconds:", json.dumps(out["times"]))  # shown with -s / -rP
    return out


@pytest.fixture(scope="module")
def tokens(run) -> dict[str, dict]:
    """Exported ``tokens`` rows by trace id (with their split)."""
    dd = datasets.load_from_disk(str(run["work"] / "export" / "tokens"))
    return {rec["trace_id"]: {**rec, "split": split} for split in dd for rec in dd[split]}


@pytest.fixture(scope="module")
def raw_capture(run) -> dict:
    """The capture read with plain numpy from its documented layout (not through ``Capture``)."""
    cap = run["work"] / "cap"
    meta = json.loads((cap / "meta.json").read_text())
    index = [json.loads(line) for line in (cap / "index.jsonl").read_text().splitlines()]
    n = sum(e["n_tokens"] for e in index)
    n_layers = len(meta["layers"])
    logits = np.fromfile(cap / "logits.bin", dtype=meta["logits_dtype"]).reshape(n, n_layers, meta["n_experts"])
    selected = np.fromfile(cap / "selected.bin", dtype=np.int16).reshape(n, n_layers, meta["top_k"])
    return {"meta": meta, "index": index, "logits": logits, "selected": selected}


def test_export_has_the_tokens_config_over_two_datasets(run, tokens):
    assert (run["work"] / "export" / "tokens" / "dataset_dict.json").exists()
    assert set(tokens) == {r["trace_id"] for r in run["traces"]}
    assert len({t["dataset"] for t in tokens.values()}) >= 2
    assert {t["split"] for t in tokens.values()} == {"train", "validation", "test"}
    assert all(t["tokenizer"] and len(t["input_ids"]) == len(t["labels"]) for t in tokens.values())


def test_capture_token_grid_equals_the_export(raw_capture, tokens):
    index = raw_capture["index"]
    assert sorted(e["trace_id"] for e in index) == sorted(tokens)
    for e in index:
        assert e["n_tokens"] == len(tokens[e["trace_id"]]["input_ids"]), e["trace_id"]
    starts = [e["start"] for e in index]
    assert starts == list(np.cumsum([0] + [e["n_tokens"] for e in index[:-1]]))
    assert raw_capture["meta"]["layers"] == [0, 1] and raw_capture["meta"]["n_experts"] == 8


def test_capture_equals_an_unbatched_forward(run, raw_capture, tokens):
    """Resumed, batched, left-padded capture == a plain transformers forward of each exported trace."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run["work"] / "model", dtype=torch.float32).eval()
    k = raw_capture["meta"]["top_k"]
    for e in raw_capture["index"]:
        ids = torch.tensor([tokens[e["trace_id"]]["input_ids"]])
        with torch.inference_mode():
            ref = model(input_ids=ids, output_router_logits=True).router_logits
        ref = torch.stack([r.float() for r in ref], dim=1).numpy()  # [n_tokens, n_layers, n_experts]
        got = raw_capture["logits"][e["start"]:e["start"] + e["n_tokens"]].astype(np.float32)
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)  # float16 storage
        top = np.sort(np.argsort(-ref, axis=-1)[..., :k], axis=-1)
        ordered = np.sort(ref, axis=-1)[..., ::-1]
        clear = (ordered[..., k - 1] - ordered[..., k]) > 1e-3  # no near-tie at the k-th place
        sel = np.sort(raw_capture["selected"][e["start"]:e["start"] + e["n_tokens"]], axis=-1)
        assert (sel[clear] == top[clear]).all()


def test_capture_resumes_and_a_rerun_changes_nothing(run):
    assert re.search(r"captured 3 traces .* skipped 0", run["capture_part"].stdout)
    assert re.search(rf"captured {N_TRACES - 3} traces .* skipped 3 already captured", run["capture"].stdout)
    assert re.search(rf"captured 0 traces .* skipped {N_TRACES} already captured", run["capture_again"].stdout)
    after = {p.name: p.read_bytes() for p in (run["work"] / "cap").iterdir()}
    assert after == run["cap_bytes"]


def _majority_macro_f1(train: list[int], test: list[int]) -> float:
    """By hand: predict train's majority class m everywhere; F1(m) = 2p/(1+p) with p = share of m
    in test (recall 1), every other class F1 0; averaged over the classes present in test (the
    reference), as scikit-learn's ``labels=`` makes explicit."""
    m = int(np.bincount(train).argmax())
    p = test.count(m) / len(test)
    f1_m = 2 * p / (1 + p) if p else 0.0
    return f1_m / len(set(test))


def test_probe_table_has_layers_windows_f1_and_baseline(run, tokens):
    text = run["probe"].stdout
    for needle in ("router logits", "L0-L1", "position", "TF-IDF", "test macro-F1", "majority baseline"):
        assert needle in text
    rows = list(csv.DictReader((run["work"] / "probe" / "probe.csv").open()))
    assert [(r["features"], r["layers"].count("-")) for r in rows][:2] == [("router logits", 0), ("router logits", 1)]
    assert rows[1]["layers"] == "L0-L1" and rows[1]["n_features"] == "16"
    for r in rows:
        for key in ("dev_f1", "test_f1", "baseline_f1"):
            assert 0.0 <= float(r[key]) <= 1.0
    labels = {s: [] for s in ("train", "test")}
    for t in tokens.values():
        if t["split"] in labels:
            labels[t["split"]] += [y for y in t["labels"] if y >= 0]
    expected = _majority_macro_f1(labels["train"], labels["test"])
    assert all(float(r["baseline_f1"]) == pytest.approx(expected, abs=1e-9) for r in rows)
    absent = [b for i, b in enumerate(BEHAVIORS) if i not in set(labels["test"])]
    assert all(r["absent_in_test"] == ",".join(absent) for r in rows)
    assert ("absent from it: " + ", ".join(absent)) in " ".join(text.split()) if absent else "(all six)" in text
    curves = json.loads((run["work"] / "probe" / "probe_dev_curves.json").read_text())
    assert set(curves) == {"window=1", "window=2"} and set(curves["window=1"]) == {"0", "1"}


def _independent_rd(raw_capture, tokens, layer_pos: int) -> dict[tuple[str, str, int], float]:
    """RD(e,b,d) = P(e selected | b, d) - P(e selected | d), counted token by token in Python."""
    per_dataset: dict[str, list[tuple[int, set]]] = {}
    for e in raw_capture["index"]:
        rec = tokens[e["trace_id"]]
        sel = raw_capture["selected"][e["start"]:e["start"] + e["n_tokens"], layer_pos]
        for label, chosen in zip(rec["labels"], sel.tolist()):
            if label >= 0:
                per_dataset.setdefault(rec["dataset"], []).append((label, set(chosen)))
    out = {}
    for d, toks in per_dataset.items():
        for b in set(lab for lab, _ in toks):
            in_b = [c for lab, c in toks if lab == b]
            for expert in range(raw_capture["meta"]["n_experts"]):
                p_b = sum(expert in c for c in in_b) / len(in_b)
                p_d = sum(expert in c for _, c in toks) / len(toks)
                out[(d, BEHAVIORS[b], expert)] = p_b - p_d
    return out


def test_experts_risk_difference_matches_an_independent_count(run, raw_capture, tokens):
    exp = run["work"] / "exp"
    names = {p.name for p in exp.iterdir()}
    assert {"risk_difference.csv", "top_experts.csv", "jaccard.csv", "transfer_auc.csv",
            "profile_correlation.png", "steer_suppress_planning.json"} <= names
    n_datasets = len({t["dataset"] for t in tokens.values()})
    assert sum(n.startswith("rd_") and n.endswith(".png") for n in names) == n_datasets
    layer_pos = 1
    layer = raw_capture["meta"]["layers"][layer_pos]
    expected = _independent_rd(raw_capture, tokens, layer_pos)
    got = {(r["dataset"], r["behavior"], int(r["expert"])): float(r["rd"])
           for r in csv.DictReader((exp / "risk_difference.csv").open())
           if int(r["layer"]) == layer and r["rd"] != "nan"}
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-5), key


def test_steering_spec_suppresses_the_top_pooled_planning_experts(run, raw_capture, tokens):
    """Pooled RD = token-weighted mean of RD over datasets; the spec holds its top positive experts."""
    spec = json.loads((run["work"] / "exp" / "steer_suppress_planning.json").read_text())
    assert spec["activate"] == {} and spec["suppress"]
    counts: dict[str, int] = {}
    for t in tokens.values():
        counts[t["dataset"]] = counts.get(t["dataset"], 0) + sum(y == 0 for y in t["labels"])
    for pos, layer in enumerate(raw_capture["meta"]["layers"]):
        rd = _independent_rd(raw_capture, tokens, pos)
        pooled = {e: sum(rd[(d, "planning", e)] * n for d, n in counts.items() if n)
                  / sum(n for n in counts.values() if n) for e in range(raw_capture["meta"]["n_experts"])}
        ranked = sorted(pooled, key=lambda e: (-pooled[e], e))
        expected = sorted(e for e in ranked[:2] if pooled[e] > 0)
        assert sorted(spec["suppress"].get(str(layer), [])) == expected


def test_steer_table_has_every_condition(run):
    text = run["steer"].stdout
    for condition in ("unmodified", "steered", "random", "concise_prompt"):
        assert re.search(rf"{condition}\s*│\s*2\s*│", text), condition
    rows = [json.loads(line) for line in (run["work"] / "steer.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    ids = {r["trace_id"] for r in run["traces"][:2]}
    assert {r["problem_id"] for r in rows} == ids
    assert all(0 < r["generated_tokens"] <= MAX_NEW_TOKENS for r in rows)



README_MODEL = "Qwen/Qwen3-30B-A3B"


def readme_probe_steer_commands() -> list[list[str]]:
    """The ``ror`` lines of the README's "Probe and steer" bash block, as argument lists."""
    import shlex

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = text.split("## Probe and steer", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True)[1:] for line in block.splitlines() if line.strip().startswith("ror ")]


