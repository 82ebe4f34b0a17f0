"""Probes and expert association on synthetic router logits with a planted signal (no torch needed),
plus the CLI commands that print and write them."""

from __future__ import annotations

import csv
import os
import textwrap
from pathlib import Path
import json
import subprocess
import sys

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from ror_annotate.errors import SteerError  # noqa: E402
from ror_annotate.records import BEHAVIORS  # noqa: E402
from ror_annotate.steer.capture import Capture, CaptureMeta, _Writer  # noqa: E402
from ror_annotate.steer.experts import (  # noqa: E402
    jaccard,
    jaccard_permutation_test,
    profile_correlation,
    risk_difference,
    top_experts,
    transfer_auc,
)
from ror_annotate.steer.probe import fit_probe, run_probes, segment_means  # noqa: E402
from ror_annotate.steer.table import labeled_tokens  # noqa: E402
from ror_annotate.steer.tokens import load_tokens  # noqa: E402

N_EXPERTS, K_CLASSES, TOP_K = 8, 4, 2


def planted(n, q, rng, *, strength=4.0):
    """Labels y and features whose expert y is boosted with probability q, a random expert otherwise.

    The Bayes-optimal accuracy is q + (1 - q) / K; with balanced classes and a symmetric confusion
    the macro-F1 equals it."""
    y = rng.integers(0, K_CLASSES, size=n)
    shown = np.where(rng.random(n) < q, y, rng.integers(0, K_CLASSES, size=n))
    x = rng.normal(size=(n, N_EXPERTS)).astype(np.float32)
    x[np.arange(n), shown] += strength
    return x, y


def test_probe_recovers_planted_level_and_is_chance_on_shuffled_labels():
    rng = np.random.default_rng(0)
    q = 0.6
    expected = q + (1 - q) / K_CLASSES  # 0.7
    xs, ys = zip(*(planted(n, q, rng) for n in (3000, 1500, 1500)))
    fit = fit_probe(xs[0], ys[0], xs[1], ys[1], xs[2], ys[2])
    assert abs(fit.test_f1 - expected) < 0.05
    shuffled = [rng.permutation(y) for y in ys]
    null = fit_probe(xs[0], shuffled[0], xs[1], shuffled[1], xs[2], shuffled[2])
    assert abs(null.test_f1 - 1 / K_CLASSES) < 0.06
    # majority baseline: one class predicted; F1 of that class is 2p/(1+p) with p its test share, others 0
    p = np.mean(ys[2] == np.bincount(ys[0]).argmax())
    assert fit.baseline_f1 == pytest.approx(2 * p / (1 + p) / K_CLASSES)


def test_probe_needs_two_classes():
    x = np.zeros((4, 2))
    with pytest.raises(SteerError, match="fewer than two"):
        fit_probe(x, np.zeros(4, int), x, np.zeros(4, int), x, np.zeros(4, int))


def test_risk_difference_hand_example():
    # one dataset, one layer, three experts, top-1
    selected = np.array([[[0]], [[1]], [[1]], [[2]]])
    labels = np.array([0, 0, 1, 1])
    out = risk_difference(selected, labels, np.zeros(4, int), n_experts=3, n_behaviors=2)
    # P(e|b=0) = [1/2, 1/2, 0], P(e|b=1) = [0, 1/2, 1/2], P(e) = [1/4, 1/2, 1/4]
    np.testing.assert_allclose(out["rd"][0, 0, 0], [0.25, 0.0, -0.25])
    np.testing.assert_allclose(out["rd"][0, 1, 0], [-0.25, 0.0, 0.25])
    np.testing.assert_allclose(out["p_dataset"][0, 0], [0.25, 0.5, 0.25])
    assert out["counts"].tolist() == [[2, 2]]


def test_risk_difference_absent_behavior_is_nan_and_top_experts():
    selected = np.array([[[0, 1]], [[1, 2]], [[2, 3]]])
    out = risk_difference(selected, np.array([0, 0, 2]), np.zeros(3, int), n_experts=4, n_behaviors=3)
    assert np.isnan(out["rd"][0, 1]).all()
    # b=0: P(e|b) = [1/2, 1, 1/2, 0], P(e) = [1/3, 2/3, 2/3, 1/3] -> RD = [1/6, 1/3, -1/6, -1/3]
    np.testing.assert_allclose(out["rd"][0, 0, 0], [1 / 6, 1 / 3, -1 / 6, -1 / 3])
    top = top_experts(out["rd"], 2)
    assert top[0, 0, 0].tolist() == [1, 0]
    assert top[0, 1, 0].tolist() == [-1, -1]


def test_jaccard_and_transfer_auc_hand_examples():
    assert jaccard([1, 2, 3], [2, 3, 4]) == pytest.approx(2 / 4)
    # two datasets, the same association: behavior b selects expert b (top-1), one token per segment
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    dataset = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    selected = labels[:, None, None].copy()
    rd = risk_difference(selected, labels, dataset, n_experts=3, n_behaviors=2)["rd"]
    top = top_experts(rd, 1)
    assert top[:, :, 0, 0].tolist() == [[0, 1], [0, 1]]
    rows = transfer_auc(selected, labels, dataset, np.arange(8), top, n_experts=3)
    assert {(r["source"], r["target"], r["behavior"]): r["auc"] for r in rows} == {
        (s, t, b): 1.0 for s in (0, 1) for t in (0, 1) for b in (0, 1)}
    corr, summary = profile_correlation(rd)
    assert summary["same_behavior"] == pytest.approx(1.0)
    assert summary["cross_behavior"] < 0


def test_jaccard_permutation_null_is_seeded_and_below_a_real_association():
    rng = np.random.default_rng(3)
    n = 2000
    labels = rng.integers(0, K_CLASSES, size=n)
    dataset = rng.integers(0, 2, size=n)
    x, _ = planted(n, 1.0, rng)
    x[np.arange(n), labels] += 4.0
    selected = np.argsort(-x, axis=1)[:, None, :TOP_K]
    a = jaccard_permutation_test(selected, labels, dataset, n_experts=N_EXPERTS, k=1, n_permutations=10, seed=5)
    b = jaccard_permutation_test(selected, labels, dataset, n_experts=N_EXPERTS, k=1, n_permutations=10, seed=5)
    assert a == b
    assert a["observed"] == pytest.approx(1.0)
    assert a["null_mean"] < 0.6
    assert a["p_value"] == pytest.approx(1 / 11)


# ---------------------------------------------------------------- end to end on a synthetic capture


def _features():
    return datasets.Features({
        "trace_id": datasets.Value("string"), "dataset": datasets.Value("string"), "model": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.ClassLabel(names=list(BEHAVIORS))),
        "segment_ids": datasets.Sequence(datasets.Value("int32")),
        "offsets": datasets.Sequence(datasets.Sequence(datasets.Value("int32"), length=2)),
        "rendering": datasets.Value("string"), "tokenizer": datasets.Value("string"),
    })


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Export + capture where layer 1 carries the label (q = 0.8) and layer 0 is noise."""
    root = tmp_path_factory.mktemp("synthetic")
    rng = np.random.default_rng(11)
    meta = CaptureMeta(model="synthetic", family="qwen3_moe", layers=[3, 7], n_experts=N_EXPERTS, top_k=TOP_K,
                       logits_dtype="float32")
    writer = _Writer(root / "capture", meta, overwrite=True)
    splits = {}
    for split, n_traces in (("train", 24), ("validation", 8), ("test", 8)):
        rows = []
        for t in range(n_traces):
            n = 60
            seg = np.arange(n) // 4
            labels = rng.integers(0, K_CLASSES, size=seg.max() + 1)[seg]
            shown = np.where(rng.random(seg.max() + 1) < 0.8, labels[::4], rng.integers(0, K_CLASSES, seg.max() + 1))[seg]
            logits = rng.normal(size=(n, 2, N_EXPERTS)).astype(np.float32) + 5.0  # centering must remove the offset
            logits[np.arange(n), 1, shown] += 3.0
            selected = np.argsort(-logits, axis=-1)[..., :TOP_K].astype(np.int16)
            tid = f"{split}-{t}"
            writer.append([({"trace_id": tid, "split": split, "dataset": ["gsm8k", "aime"][t % 2]}, logits, selected)])
            rows.append({"trace_id": tid, "dataset": ["gsm8k", "aime"][t % 2], "model": "synthetic",
                         "input_ids": rng.integers(0, 50, size=n).tolist(), "labels": labels.tolist(),
                         "segment_ids": seg.tolist(), "offsets": [[i, i + 1] for i in range(n)],
                         "rendering": "raw", "tokenizer": "synthetic"})
        splits[split] = datasets.Dataset.from_list(rows, features=_features())
    writer.close()
    datasets.DatasetDict(splits).save_to_disk(str(root / "export" / "tokens"))
    return root


def test_run_probes_picks_the_planted_layer(synthetic):
    cap = Capture(synthetic / "capture")
    table = labeled_tokens(cap, load_tokens(synthetic / "export"))
    rows, curves = run_probes(cap, table, level="token", windows=(1, 2), controls=("position", "tfidf"),
                              Cs=(0.1, 1.0))
    single, window, position, tfidf = rows
    assert single.layers == "L7" and window.layers == "L3-L7"
    assert curves["window=1"][7] > curves["window=1"][3] + 0.3
    expected = 0.8 + 0.2 / K_CLASSES  # 0.85
    assert abs(single.test_f1 - expected) < 0.06
    assert single.n_features == N_EXPERTS and window.n_features == 2 * N_EXPERTS
    assert position.test_f1 < 0.4 and tfidf.test_f1 < 0.4  # controls carry no signal here
    assert single.baseline_f1 < 0.2


def test_segment_level_probe(synthetic):
    cap = Capture(synthetic / "capture")
    table = labeled_tokens(cap, load_tokens(synthetic / "export"))
    rows, _ = run_probes(cap, table, level="segment", windows=(1,), controls=(), Cs=(1.0,))
    assert rows[0].layers == "L7" and rows[0].test_f1 > 0.8
    feats, labels, split = segment_means(table, np.arange(len(table), dtype=np.float64)[:, None])
    assert len(labels) == 40 * 15  # 60 tokens / 4 per segment, 40 traces
    # the first segment of the first trace averages its tokens' row numbers 0..3
    assert feats[0, 0] == pytest.approx(1.5)


def test_cli_probe_and_experts(synthetic, tmp_path):
    from typer.testing import CliRunner

    from ror_annotate.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["probe", str(synthetic / "export"), "--capture", str(synthetic / "capture"),
                              "--windows", "1", "--controls", "position", "--out", str(tmp_path / "probe")])
    assert res.exit_code == 0, res.output
    assert "behavior probes" in res.output
    with (tmp_path / "probe" / "probe.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["features"] for r in table] == ["router logits", "position"]
    assert table[0]["layers"] == "L7" and float(table[0]["test_f1"]) > float(table[0]["baseline_f1"]) + 0.5
    res = runner.invoke(app, ["experts", str(synthetic / "export"), "--capture", str(synthetic / "capture"),
                              "--out", str(tmp_path / "experts"), "--top-k", "2", "--permutations", "3",
                              "--steer-size", "2"])
    assert res.exit_code == 0, res.output
    names = {p.name for p in (tmp_path / "experts").iterdir()}
    assert {"risk_difference.csv", "top_experts.csv", "profile_correlation.csv", "jaccard.csv", "transfer_auc.csv",
            "rd_gsm8k.png", "rd_aime.png", "profile_correlation.png", "steer_suppress_planning.json"} <= names
    spec = json.loads((tmp_path / "experts" / "steer_suppress_planning.json").read_text())
    # planted: at layer 7 the planning tokens route to expert 0 (class id 0)
    assert 0 in spec["suppress"]["7"]
    with (tmp_path / "experts" / "risk_difference.csv").open() as fh:
        rd_rows = list(csv.DictReader(fh))
    assert len(rd_rows) == 2 * len(BEHAVIORS) * 2 * N_EXPERTS
    res = runner.invoke(app, ["experts", str(synthetic / "export"), "--capture", str(tmp_path / "nothing"),
                              "--out", str(tmp_path / "e2")])
    assert res.exit_code == 2 and "not a capture directory" in res.output


def test_steer_commands_without_torch_say_how_to_install(tmp_path):
    """cli/steer.py imports without torch; commands that need it give one line naming the extra."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from typer.testing import CliRunner\n"
        "from ror_annotate.cli import app\n"
        f"res = CliRunner().invoke(app, ['steer', '{tmp_path}/p.jsonl', '--model', 'x', '--spec', 's.json'])\n"
        "print(res.exit_code); print(res.output)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "2"
    assert "pip install torch==2.13.0 && pip install -e '.[steer]'" in out.stdout


def test_rd_plot_names_stay_distinct_when_dataset_names_sanitise_alike(tmp_path):
    """'a b' and 'a_b' both sanitise to 'a_b' (and 'A_B' clashes on case-insensitive disks): one plot each."""
    from ror_annotate.steer.experts import analyze, write_report

    rng = np.random.default_rng(0)
    n = 300
    labels = rng.integers(0, 2, size=n)
    dataset = rng.integers(0, 3, size=n)
    selected = rng.integers(0, N_EXPERTS, size=(n, 1, TOP_K))
    report = analyze(selected, labels, dataset, np.arange(n) // 3, dataset_names=["a b", "a_b", "A_B"], layers=[0],
                     n_experts=N_EXPERTS, k=2, n_permutations=2)
    pngs = sorted(p.name for p in write_report(report, tmp_path) if p.name.startswith("rd_"))
    assert pngs == ["rd_A_B_2.png", "rd_a_b.png", "rd_a_b_1.png"]
    assert sorted(p.name for p in tmp_path.glob("rd_*.png")) == pngs


def test_probe_without_a_test_split_says_how_to_re_export(synthetic):
    cap = Capture(synthetic / "capture")
    table = labeled_tokens(cap, load_tokens(synthetic / "export"), ["train", "validation"])
    with pytest.raises(SteerError, match=r"no labeled tokens in the 'test' split \(have train, validation\).*"
                                         r"ror export --split 0.6,0.2,0.2"):
        run_probes(cap, table, windows=(1,), controls=())


def test_unknown_split_is_a_clear_error(synthetic):
    cap = Capture(synthetic / "capture")
    with pytest.raises(SteerError, match=r"splits \['trian'\] not in the tokens dataset; it has \['train', "):
        labeled_tokens(cap, load_tokens(synthetic / "export"), ["trian"])


def test_macro_f1_averages_over_behaviors_present_in_the_reference():
    """A perfect probe scores 1.0 even when behaviors are absent from the test split (scikit-learn labels=)."""
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(3)
    # four classes in train and dev, only classes 0 and 2 in test; features reveal the class exactly
    y_train, y_dev, y_test = rng.integers(0, 4, 400), rng.integers(0, 4, 200), rng.choice([0, 2], 100)
    onehot = lambda y: np.eye(4, dtype=np.float32)[y] * 5 + rng.normal(scale=0.01, size=(len(y), 4))  # noqa: E731
    fit = fit_probe(onehot(y_train), y_train, onehot(y_dev), y_dev, onehot(y_test), y_test)
    assert fit.test_f1 == pytest.approx(1.0) and fit.dev_f1 == pytest.approx(1.0)
    assert fit.absent_test == [1, 3]
    # the majority baseline over the two present classes, by hand: one class has F1 2p/(1+p), the other 0
    majority = np.bincount(y_train).argmax()
    p = np.mean(y_test == majority)
    expected = (2 * p / (1 + p)) / 2 if majority in (0, 2) else 0.0
    assert fit.baseline_f1 == pytest.approx(expected)
    assert fit.baseline_f1 == pytest.approx(f1_score(y_test, np.full_like(y_test, majority), labels=[0, 2],
                                                     average="macro", zero_division=0))


def test_run_probes_lists_behaviors_absent_from_test(synthetic):
    cap = Capture(synthetic / "capture")
    table = labeled_tokens(cap, load_tokens(synthetic / "export"))
    keep = ~((table.split == "test") & np.isin(table.labels, [1, 3]))
    rows, _ = run_probes(cap, table.subset(keep), windows=[1], controls=["position"])
    present = set(np.unique(table.labels[keep & (table.split == "test")]).tolist())
    expected = ",".join(b for c, b in enumerate(BEHAVIORS) if c not in present)
    assert "execution" in expected and "fact" in expected
    assert all(r.absent_in_test == expected for r in rows)


def test_experts_default_writes_the_spec_the_readme_steers_with_and_warns_on_large_top_k(synthetic, tmp_path):
    from typer.testing import CliRunner

    from ror_annotate.cli import app
    from ror_annotate.errors import InputError
    from ror_annotate.steer.experts import resolve_steer_size

    runner = CliRunner()
    res = runner.invoke(app, ["experts", str(synthetic / "export"), "--capture", str(synthetic / "capture"),
                              "--out", str(tmp_path / "experts"), "--permutations", "2"])
    assert res.exit_code == 0, res.output
    # default --top-k 10 >= 8 experts: the Jaccard figures are 1 by construction, said out loud
    assert "--top-k 10 >= 8 experts" in " ".join(res.output.split())
    spec = json.loads((tmp_path / "experts" / "steer_suppress_planning.json").read_text())
    # default steer size: min(--top-k 10, 8 experts - router top-2) = 6 per layer at most
    assert spec["suppress"] and max(len(v) for v in spec["suppress"].values()) <= 6
    assert 0 in spec["suppress"]["7"]
    res = runner.invoke(app, ["experts", str(synthetic / "export"), "--capture", str(synthetic / "capture"),
                              "--out", str(tmp_path / "e3"), "--top-k", "3", "--permutations", "2",
                              "--steer-size", "0"])
    assert res.exit_code == 0 and "--top-k" not in res.output
    assert not list((tmp_path / "e3").glob("steer_suppress_*.json"))
    assert resolve_steer_size(None, set_size=10, n_experts=128, router_top_k=8) == 10
    assert resolve_steer_size(None, set_size=10, n_experts=8, router_top_k=2) == 6
    with pytest.raises(InputError, match="leaves fewer than top-2"):
        resolve_steer_size(7, set_size=3, n_experts=8, router_top_k=2)


def test_profile_correlation_heatmap_names_its_dataset_behavior_axes(tmp_path, monkeypatch):
    """Issue 27: the heatmap's rows and columns are named dataset:behavior, not bare integers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ror_annotate.records import BEHAVIORS
    from ror_annotate.steer import experts as ex

    rng = np.random.default_rng(0)
    rd = rng.normal(size=(2, 6, 2, 8))
    corr, summary = ex.profile_correlation(rd)
    report = ex.ExpertReport({"rd": rd}, ex.top_experts(rd, 2), corr, summary, {}, [], ["gsm8k", "aime"], [0, 1])
    seen = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, path, *args, **kwargs):
        if str(path).endswith("profile_correlation.png"):
            ax = [a for a in fig.axes if a.get_images()][0]
            seen["y"] = [t.get_text() for t in ax.get_yticklabels()]
            seen["x"] = [t.get_text() for t in ax.get_xticklabels()]
            seen["xlabel"] = ax.get_xlabel()
        return real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    ex._plots(report, tmp_path)
    expected = [f"{d}:{b}" for d in ("gsm8k", "aime") for b in BEHAVIORS]
    assert seen["y"] == expected and seen["x"] == expected
    assert "dataset" in seen["xlabel"] and "behavior" in seen["xlabel"]
    assert (tmp_path / "profile_correlation.png").stat().st_size > 0


def test_expert_plots_keep_the_global_matplotlib_backend(tmp_path):
    """A notebook's backend ('svg' here) survives `write_report`: no matplotlib.use, no pyplot (issue 23)."""
    script = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        import matplotlib
        before = matplotlib.get_backend()
        from ror_annotate.steer.experts import analyze, write_report
        rng = np.random.default_rng(0)
        n = 200
        report = analyze(rng.integers(0, 8, size=(n, 1, 2)), rng.integers(0, 2, size=n), rng.integers(0, 2, size=n),
                         np.arange(n) // 4, dataset_names=["a", "b"], layers=[0], n_experts=8, k=2, n_permutations=2)
        pngs = [p.name for p in write_report(report, {str(tmp_path)!r}) if p.suffix == ".png"]
        print(json.dumps({{"before": before, "after": matplotlib.get_backend(), "pyplot": "matplotlib.pyplot" in sys.modules,
                           "pngs": sorted(pngs)}}))
        """
    )
    env = {**os.environ, "MPLBACKEND": "svg", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == seen["after"] == "svg"
    assert seen["pyplot"] is False
    assert seen["pngs"] == ["profile_correlation.png", "rd_a.png", "rd_b.png"]
    for name in seen["pngs"]:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rd_heatmap_names_its_axes_and_greys_an_absent_behavior(tmp_path, monkeypatch):
    """A behavior absent from a dataset (RD NaN) is grey and named, never the white of RD = 0; axes and scale named."""
    from matplotlib.figure import Figure

    from ror_annotate.records import BEHAVIORS
    from ror_annotate.steer import experts as ex

    rng = np.random.default_rng(1)
    rd = rng.normal(scale=0.1, size=(1, 6, 2, 8))
    rd[0, BEHAVIORS.index("fact")] = np.nan  # no fact tokens in this dataset
    corr, summary = ex.profile_correlation(rd)
    report = ex.ExpertReport({"rd": rd}, ex.top_experts(rd, 2), corr, summary, {}, [], ["gsm8k"], [0, 1])
    seen = {}
    real_savefig = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        if Path(path).name.startswith("rd_"):
            seen["fig"] = fig
        return real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    ex._plots(report, tmp_path)
    fig = seen["fig"]
    ax = [a for a in fig.axes if a.get_images()][0]
    assert ax.get_ylabel() == "behavior" and ax.get_xlabel() == "expert (grey: fact absent from this dataset)"
    assert ax.get_title().startswith("Risk difference per expert, gsm8k, layer ")
    bar = [a for a in fig.axes if a is not ax][0]
    assert bar.get_ylabel() == "RD = P(expert | behavior) - P(expert)"
    image = ax.get_images()[0]
    grey = image.cmap(np.ma.masked_invalid([np.nan]))[0]
    white = image.cmap(image.norm(0.0))
    assert np.allclose(grey[:3], [0xB0 / 255] * 3) and not np.allclose(grey, white, atol=0.05)
