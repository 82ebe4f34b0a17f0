"""The residual-stream control of the probe: captured from the same forward, read back, probed.

Expected values: the residual rows equal the hidden states transformers returns with
``output_hidden_states=True`` (an independent path through the model); on a synthetic capture whose
residual layer 1 carries the label with probability 0.8, the probe picks that layer and reaches
0.8 + 0.2/6 macro-F1 within noise, and the PCA row has the router row's width.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

from ror_annotate.errors import SteerError  # noqa: E402
from ror_annotate.records import BEHAVIORS  # noqa: E402
from ror_annotate.steer.capture import Capture, CaptureMeta, _Writer, capture_router_logits  # noqa: E402
from ror_annotate.steer.probe import run_probes  # noqa: E402
from ror_annotate.steer.table import labeled_tokens  # noqa: E402
from ror_annotate.steer.tokens import load_tokens  # noqa: E402

from . import moe_fixtures as mf  # noqa: E402
from .test_steer_capture import make_tokens  # noqa: E402
from .test_steer_probe import _features  # noqa: E402

pytestmark = pytest.mark.steer
K = len(BEHAVIORS)


def test_residual_rows_equal_transformers_hidden_states(tmp_path) -> None:
    model = mf.build("qwen3_moe")
    toks = make_tokens({"train": [14, 9]})
    capture_router_logits(model, toks, tmp_path / "cap", logits_dtype="float32", residual_layers="all", batch_size=2)
    cap = Capture(tmp_path / "cap")
    n_layers = model.config.num_hidden_layers
    assert cap.meta.residual_layers == list(range(n_layers)) and cap.meta.version == 2
    assert cap.residual is not None and cap.residual.shape == (23, n_layers, model.config.hidden_size)
    for row in cap.index:
        ids = toks["train"][int(row["trace_id"].split("-")[1])]["input_ids"]
        with torch.inference_mode():
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        got = cap.residual[row["start"]: row["start"] + row["n_tokens"]].astype(np.float32)
        for layer in range(n_layers - 1):  # the last entry of hidden_states has the final norm applied
            want = hs[layer + 1][0].float().numpy()
            np.testing.assert_allclose(got[:, layer], want, atol=4e-3 * max(1.0, float(np.abs(want).max())))


def test_resuming_with_other_residual_layers_is_refused(tmp_path) -> None:
    model = mf.build("qwen3_moe")
    toks = make_tokens({"train": [10, 8]})
    capture_router_logits(model, toks, tmp_path / "cap", residual_layers=[0], limit=1)
    with pytest.raises(SteerError, match="residual_layers"):
        capture_router_logits(model, toks, tmp_path / "cap", residual_layers=[1])
    with pytest.raises(SteerError, match="not decoder layers"):
        capture_router_logits(model, toks, tmp_path / "other", residual_layers=[99])
    assert len(Capture(tmp_path / "cap").index) == 1


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Router layers carry nothing; residual layer 1 (of 0, 1) carries the label with q = 0.8."""
    root = tmp_path_factory.mktemp("residual")
    rng = np.random.default_rng(5)
    n_experts, hidden = 8, 32
    meta = CaptureMeta(model="synthetic", family="qwen3_moe", layers=[0, 1], n_experts=n_experts, top_k=2,
                       logits_dtype="float32", residual_layers=[0, 1], hidden_size=hidden, version=2)
    writer = _Writer(root / "capture", meta, overwrite=True)
    splits = {}
    for split, n_traces in (("train", 24), ("validation", 8), ("test", 8)):
        rows = []
        for t in range(n_traces):
            n = 60
            seg = np.arange(n) // 4
            labels = rng.integers(0, K, size=seg.max() + 1)[seg]
            shown = np.where(rng.random(n) < 0.8, labels, rng.integers(0, K, n))
            logits = rng.normal(size=(n, 2, n_experts)).astype(np.float32)
            selected = np.argsort(-logits, axis=-1)[..., :2].astype(np.int16)
            residual = rng.normal(size=(n, 2, hidden)).astype(np.float32)
            residual[np.arange(n), 1, shown] += 4.0
            tid = f"{split}-{t}"
            writer.append([({"trace_id": tid, "split": split, "dataset": "gsm8k"}, logits, selected, residual)])
            rows.append({"trace_id": tid, "dataset": "gsm8k", "model": "synthetic", "input_ids": rng.integers(0, 50, n).tolist(),
                         "labels": labels.tolist(), "segment_ids": seg.tolist(), "offsets": [[i, i + 1] for i in range(n)],
                         "rendering": "raw", "tokenizer": "synthetic"})
        splits[split] = datasets.Dataset.from_list(rows, features=_features())
    writer.close()
    datasets.DatasetDict(splits).save_to_disk(str(root / "export" / "tokens"))
    return root


def test_probe_reports_the_residual_stream_next_to_router_logits(synthetic) -> None:
    cap = Capture(synthetic / "capture")
    table = labeled_tokens(cap, load_tokens(synthetic / "export"))
    rows, curves = run_probes(cap, table, level="token", windows=(1,), controls=("position",), Cs=(0.1, 1.0))
    router, residual, pca, position = rows
    assert (router.features, residual.features) == ("router logits", "residual stream")
    assert residual.layers == "L1" and curves["residual"][1] > curves["residual"][0] + 0.3
    assert abs(residual.test_f1 - (0.8 + 0.2 / K)) < 0.07
    assert router.test_f1 < 0.35  # router logits carry nothing here
    assert pca.features == "residual stream, PCA to 8" and pca.n_features == router.n_features == 8
    assert pca.test_f1 > 0.6  # 8 principal components keep most of the planted direction
    assert position.features == "position"
