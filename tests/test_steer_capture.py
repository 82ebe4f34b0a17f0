"""Capture: the exported tokens dataset in, memory-mapped router logits out; padding, resume, dtypes."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

from ror_annotate.errors import InputError, SteerError  # noqa: E402
from ror_annotate.records import BEHAVIORS  # noqa: E402
from ror_annotate.steer.capture import Capture, capture_router_logits, forward_router_logits  # noqa: E402
from ror_annotate.steer.probe import center_logits, router_features  # noqa: E402
from ror_annotate.steer.tokens import load_tokens  # noqa: E402

from . import moe_fixtures as mf  # noqa: E402

pytestmark = pytest.mark.steer


def tokens_features():
    return datasets.Features({
        "trace_id": datasets.Value("string"),
        "dataset": datasets.Value("string"),
        "model": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.ClassLabel(names=list(BEHAVIORS))),
        "segment_ids": datasets.Sequence(datasets.Value("int32")),
        "offsets": datasets.Sequence(datasets.Sequence(datasets.Value("int32"), length=2)),
        "rendering": datasets.Value("string"),
        "tokenizer": datasets.Value("string"),
    })


def make_tokens(lengths_by_split, *, seed=0, vocab=mf.VOCAB):
    """A tokens DatasetDict with random ids; segments of 3 tokens, first token of each trace unlabeled."""
    rng = np.random.default_rng(seed)
    splits = {}
    for split, lengths in lengths_by_split.items():
        rows = []
        for i, n in enumerate(lengths):
            seg = np.arange(n) // 3
            labels = rng.integers(0, len(BEHAVIORS), size=seg.max() + 1)[seg]
            labels[0], seg[0] = -1, -1
            rows.append({"trace_id": f"{split}-{i}", "dataset": "gsm8k" if i % 2 else "aime", "model": "tiny",
                         "input_ids": rng.integers(3, vocab - 10, size=n).tolist(), "labels": labels.tolist(),
                         "segment_ids": seg.tolist(), "offsets": [[j, j + 1] for j in range(n)],
                         "rendering": "raw", "tokenizer": "tiny"})
        splits[split] = datasets.Dataset.from_list(rows, features=tokens_features())
    return datasets.DatasetDict(splits)


@pytest.fixture(scope="module")
def model():
    return mf.build("qwen2_moe")


@pytest.fixture()
def tokens(tmp_path):
    dd = make_tokens({"train": [7, 12, 5, 9], "validation": [6, 10], "test": [8, 4]})
    dd.save_to_disk(str(tmp_path / "export" / "tokens"))
    return load_tokens(tmp_path / "export")


def test_load_tokens_from_save_to_disk_and_parquet(tmp_path):
    dd = make_tokens({"train": [5, 6], "test": [4]})
    dd.save_to_disk(str(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    for split, ds in dd.items():
        ds.to_parquet(str(tmp_path / "b" / f"{split}-00000.parquet"))
    for path in (tmp_path / "a", tmp_path / "b"):
        loaded = load_tokens(path)
        assert set(loaded) == {"train", "test"}
        assert loaded["train"].features["labels"].feature.names == list(BEHAVIORS)
        assert loaded["train"][1]["input_ids"] == dd["train"][1]["input_ids"]


def test_load_tokens_errors(tmp_path):
    with pytest.raises(InputError, match="no such tokens dataset"):
        load_tokens(tmp_path / "missing")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"trace_id": ["a"]})}).save_to_disk(str(tmp_path / "x"))
    with pytest.raises(InputError, match=r"missing column\(s\).*input_ids"):
        load_tokens(tmp_path / "x")


def test_capture_matches_unbatched_forward(model, tokens, tmp_path):
    out = tmp_path / "cap"
    report = capture_router_logits(model, tokens, out, model_name="tiny-qwen2", batch_size=3, logits_dtype="float32")
    assert report.captured == 8 and report.skipped == 0 and report.tokens == 61
    cap = Capture(out)
    assert cap.meta.layers == [0, 1] and cap.meta.n_experts == 8 and cap.meta.top_k == 2
    assert cap.logits.shape == (61, 2, 8) and cap.selected.shape == (61, 2, 2)
    for split in tokens:
        for rec in tokens[split]:
            logits, selected = cap.trace(rec["trace_id"])
            assert logits.shape == (len(rec["input_ids"]), 2, 8)
            ref_logits, ref_sel = forward_router_logits(model, [rec["input_ids"]])[0]
            np.testing.assert_allclose(logits, ref_logits.numpy(), rtol=1e-5, atol=1e-5)
            assert np.array_equal(selected, ref_sel.numpy())
            # the selected experts are the top-k of the stored logits
            top = np.argsort(-logits, axis=-1, kind="stable")[..., :2]
            assert np.array_equal(np.sort(top, -1), np.sort(selected, -1))


@pytest.mark.parametrize("name", ["qwen3_next", "gemma4_vl", "gpt_oss", "deepseek_v3"])
def test_left_and_right_padding_give_unbatched_logits(name):
    lm = mf.build(name)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(3, 100, size=n).tolist() for n in (4, 13, 8)]
    single = [forward_router_logits(lm, [s])[0] for s in seqs]
    for side in ("left", "right"):
        batched = forward_router_logits(lm, seqs, padding_side=side)
        for (lg, sel), (ref_lg, ref_sel) in zip(batched, single):
            torch.testing.assert_close(lg, ref_lg, rtol=1e-4, atol=1e-4)
            assert torch.equal(sel, ref_sel)


def test_resume_after_interruption_equals_one_run(model, tokens, tmp_path):
    full = tmp_path / "full"
    capture_router_logits(model, tokens, full, model_name="m", batch_size=2, logits_dtype="float32")
    part = tmp_path / "part"
    first = capture_router_logits(model, tokens, part, model_name="m", batch_size=2, logits_dtype="float32", limit=3)
    assert first.captured == 3
    # simulate a crash mid-append: bytes of an uncommitted trace and a torn index line
    with (part / "logits.bin").open("ab") as fh:
        fh.write(b"\x00" * 100)
    with (part / "index.jsonl").open("a") as fh:
        fh.write('{"trace_id": "torn')
    second = capture_router_logits(model, tokens, part, model_name="m", batch_size=2, logits_dtype="float32")
    assert second.skipped == 3 and second.captured == 5
    a, b = Capture(full), Capture(part)
    assert sorted(r["trace_id"] for r in a.index) == sorted(r["trace_id"] for r in b.index)
    for row in a.index:
        la, sa = a.trace(row["trace_id"])
        lb, sb = b.trace(row["trace_id"])
        np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-5)
        assert np.array_equal(sa, sb)
    again = capture_router_logits(model, tokens, part, model_name="m", logits_dtype="float32")
    assert again.captured == 0 and again.skipped == 8


def test_resume_refuses_a_different_model(model, tokens, tmp_path):
    capture_router_logits(model, tokens, tmp_path / "c", model_name="m1", limit=1)
    with pytest.raises(SteerError, match="different model"):
        capture_router_logits(model, tokens, tmp_path / "c", model_name="m2")


def test_float16_storage_layers_and_bf16_model(tokens, tmp_path):
    lm = mf.build("qwen3_moe", dtype=torch.bfloat16)
    capture_router_logits(lm, tokens, tmp_path / "c", model_name="bf16", layers=[1], logits_dtype="float16")
    cap = Capture(tmp_path / "c")
    assert cap.logits.dtype == np.float16 and cap.logits.shape == (61, 1, 8)
    assert cap.meta.model_dtype == "torch.bfloat16"
    rec = tokens["train"][0]
    ref = forward_router_logits(lm, [rec["input_ids"]])[0][0][:, 1:2]
    np.testing.assert_allclose(cap.trace(rec["trace_id"])[0].astype(np.float32), ref.numpy(), rtol=2e-3, atol=2e-3)
    with pytest.raises(SteerError, match=r"layers \[7\] have no MoE router"):
        capture_router_logits(lm, tokens, tmp_path / "d", layers=[7])


def test_centering_and_window_features(model, tokens, tmp_path):
    capture_router_logits(model, tokens, tmp_path / "c", logits_dtype="float32")
    cap = Capture(tmp_path / "c")
    centered = center_logits(cap.logits[:10])
    np.testing.assert_allclose(centered.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(centered[3, 1], cap.logits[3, 1] - cap.logits[3, 1].mean(), rtol=1e-6)
    rows = np.array([9, 2, 5])
    feats = router_features(cap, rows, [0, 1])
    assert feats.shape == (3, 16)
    np.testing.assert_allclose(feats[0, 8:], centered[9, 1], rtol=1e-6)
    np.testing.assert_allclose(feats[1, :8], centered[2, 0], rtol=1e-6)


def test_capture_meta_is_plain_json(model, tokens, tmp_path):
    capture_router_logits(model, tokens, tmp_path / "c", model_name="tiny", limit=1)
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["family"] == "qwen2_moe" and meta["logits_dtype"] == "float16"
    assert meta["model"] == "tiny" and meta["layers"] == [0, 1] and meta["top_k"] == 2


def test_resume_refuses_another_forward_dtype(tokens, tmp_path):
    """Resuming in bfloat16 a float32 capture would mix two routings under one meta.json."""
    capture_router_logits(mf.build("qwen3_moe"), tokens, tmp_path / "c", model_name="m", limit=2)
    with pytest.raises(SteerError, match=r"model_dtype \('torch.float32' vs 'torch.bfloat16'\)"):
        capture_router_logits(mf.build("qwen3_moe", dtype=torch.bfloat16), tokens, tmp_path / "c", model_name="m")
    assert len(Capture(tmp_path / "c").index) == 2


def test_token_ids_outside_the_model_vocabulary_are_a_clear_error(tmp_path):
    """An export tokenized for a bigger vocabulary (another model) names the trace, not an IndexError."""
    dd = make_tokens({"train": [5, 6]})
    bad = dd["train"].map(lambda r: {"input_ids": r["input_ids"][:-1] + [mf.VOCAB]}, features=dd["train"].features)
    dd = datasets.DatasetDict({"train": bad})
    with pytest.raises(SteerError, match=rf"trace 'train-\d' has token id {mf.VOCAB} but the model embeds ids "
                                         rf"0..{mf.VOCAB - 1}; the export was tokenized with 'tiny'"):
        capture_router_logits(mf.build("qwen3_moe"), dd, tmp_path / "c", model_name="m")
    assert not (tmp_path / "c" / "index.jsonl").read_text().strip()


def test_cli_capture_resumes_whatever_the_model_path_spelling(tokens, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ror_annotate.cli import app

    mf.build("qwen3_moe").save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    first = runner.invoke(app, ["capture", "export", "--model", "m", "--out", "cap", "--limit", "3"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["capture", "export", "--model", str(tmp_path / "m"), "--out", "cap"])
    assert second.exit_code == 0, second.output
    assert "captured 5 traces" in second.output and "skipped 3 already captured" in second.output
    assert json.loads((tmp_path / "cap" / "meta.json").read_text())["model"] == str((tmp_path / "m").resolve())


def test_background_writer_writes_the_same_bytes_and_surfaces_errors(model, tokens, tmp_path, monkeypatch):
    from ror_annotate.steer import capture as capture_mod

    sync_dir, thread_dir = tmp_path / "sync", tmp_path / "thread"
    capture_router_logits(model, tokens, sync_dir, model_name="m", batch_size=2, background_writer=False)
    capture_router_logits(model, tokens, thread_dir, model_name="m", batch_size=2, background_writer=True)
    for name in ("logits.bin", "selected.bin", "index.jsonl", "meta.json"):
        assert (sync_dir / name).read_bytes() == (thread_dir / name).read_bytes(), name

    calls = {"n": 0}
    original = capture_mod._Writer.append

    def failing_append(self, rows):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return original(self, rows)

    monkeypatch.setattr(capture_mod._Writer, "append", failing_append)
    broken = tmp_path / "broken"
    with pytest.raises(OSError, match="disk full"):
        capture_router_logits(model, tokens, broken, model_name="m", batch_size=2, background_writer=True)
    monkeypatch.setattr(capture_mod._Writer, "append", original)
    # what the index covers is intact; resuming completes it to the same bytes as one run
    first = Capture(broken)
    assert 0 < len(first.index) < 8
    capture_router_logits(model, tokens, broken, model_name="m", batch_size=2, background_writer=True)
    full, resumed = Capture(sync_dir), Capture(broken)
    for row in full.index:
        a, b = full.trace(row["trace_id"]), resumed.trace(row["trace_id"])
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_export_tokenizer_provenance_old_and_new_fields(tmp_path):
    """Old exports record the tokenizer's folder name only; new ones also `tokenizer_vocab_sha256`."""
    import hashlib

    from ror_annotate.steer.tokens import check_model_tokenizer, tokenizer_provenance, vocab_sha256

    from .tokenizers_fixtures import byte_level_bpe

    tok = byte_level_bpe()
    # independent hash: the JSON of [token, id] pairs sorted by id
    pairs = [[t, i] for t, i in sorted(tok.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))]
    expected = hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
    assert vocab_sha256(tok) == expected

    old = make_tokens({"train": [5, 6]})
    assert tokenizer_provenance(old).name == "tiny" and tokenizer_provenance(old).vocab_sha256 is None
    assert check_model_tokenizer(old, tok).vocab_sha256 is None  # nothing to compare: the id range check remains

    def with_hash(value):
        return datasets.DatasetDict({s: ds.add_column("tokenizer_vocab_sha256", [value] * len(ds)).map(
            lambda r: {"tokenizer": "models/Qwen3-30B-A3B"}) for s, ds in old.items()})

    assert check_model_tokenizer(with_hash(expected), tok).vocab_sha256 == expected
    with pytest.raises(SteerError, match=r"tokenized with 'models/Qwen3-30B-A3B' \(vocabulary sha256 0000000000"
                                         r"00\.\.\.\), but the model's tokenizer has vocabulary sha256 "
                                         + expected[:12]) as err:
        check_model_tokenizer(with_hash("0" * 64), tok)
    assert err.value.code == "E902"


def test_missing_model_folder_is_our_error_not_the_hubs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ror_annotate.cli import app
    from ror_annotate.steer.capture import load_model

    monkeypatch.chdir(tmp_path)
    make_tokens({"train": [5]}).save_to_disk(str(tmp_path / "export" / "tokens"))
    for missing in ("models/not/here", "./nothere", str(tmp_path / "absent")):
        with pytest.raises(SteerError, match=r"model folder .* does not exist") as err:
            load_model(missing)
        assert err.value.code == "E901" and "Repo id" not in str(err.value)
        res = CliRunner().invoke(app, ["capture", "export", "--model", missing, "--out", "cap"])
        assert res.exit_code != 0 and "does not exist" in res.output and "Repo id" not in res.output
    with pytest.raises(SteerError, match="has no config.json"):
        load_model(str(tmp_path))


def test_capture_reads_shuffled_and_multi_chunk_splits_row_for_row(model, tmp_path):
    """Rows are read column-wise from Arrow: an indices mapping (shuffle) and several chunks must not
    move a trace's ids."""
    base = make_tokens({"train": [5, 9, 3, 7, 4, 6]}, seed=5)["train"]
    chunked = datasets.concatenate_datasets([base.select(range(3)), base.select(range(3, 6))])
    dd = datasets.DatasetDict({"train": chunked.shuffle(seed=1)})
    capture_router_logits(model, dd, tmp_path / "c", model_name="m", batch_size=2, logits_dtype="float32")
    cap = Capture(tmp_path / "c")
    for rec in base:
        logits, selected = cap.trace(rec["trace_id"])
        ref_logits, ref_sel = forward_router_logits(model, [rec["input_ids"]])[0]
        np.testing.assert_allclose(logits, ref_logits.numpy(), rtol=1e-5, atol=1e-5)
        assert np.array_equal(selected, ref_sel.numpy())
