"""Capture self-checks (E910-E913): each fault injected into a real capture of a tiny random MoE model.

Expected behaviour is stated by hand: a router that returns probabilities, log-probabilities or
sigmoid scores, a layer whose router is missing or whose hook never fires, selections that are not
the top-k, and batching that changes the logits each stop the capture with their code, write
nothing of the failing batch, and leave no empty capture folder behind.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("datasets")

from ror_annotate.errors import CaptureCheckError  # noqa: E402
from ror_annotate.steer import checks  # noqa: E402
from ror_annotate.steer.capture import Capture, capture_router_logits  # noqa: E402
from ror_annotate.steer.families import find_router_sites  # noqa: E402

from . import moe_fixtures as mf  # noqa: E402
from .test_steer_capture import make_tokens  # noqa: E402

pytestmark = pytest.mark.steer


@pytest.fixture(scope="module")
def model():
    return mf.build("qwen3_moe")


@pytest.fixture(scope="module")
def tokens():
    return make_tokens({"train": [20, 33, 7]})


def _patch_router_output(monkeypatch: pytest.MonkeyPatch, model, fn, layer_position: int | None = None) -> None:
    """Wrap the logits module's forward of every (or one) router so its output goes through ``fn``."""
    for site in find_router_sites(model):
        if layer_position is not None and site.position != layer_position:
            continue
        module = site.logits_module
        original = module.forward

        def forward(*args, _orig=original, **kwargs):
            out = _orig(*args, **kwargs)
            if isinstance(out, tuple):
                return (fn(out[0]), *out[1:])
            return fn(out)

        monkeypatch.setattr(module, "forward", forward)


def test_a_clean_capture_passes_every_check(model, tokens, tmp_path) -> None:
    report = capture_router_logits(model, tokens, tmp_path / "cap", logits_dtype="float32")
    assert report.captured == 3
    cap = Capture(tmp_path / "cap")
    assert cap.n_tokens == 60


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (lambda x: torch.softmax(x, dim=-1), "softmax probabilities"),
        (lambda x: torch.log_softmax(x, dim=-1), "log-probabilities"),
        (lambda x: torch.sigmoid(x), "sigmoid scores"),
        (lambda x: torch.zeros_like(x), "all zeros"),
        (lambda x: x + float("nan"), "NaN or infinite"),
    ],
    ids=["softmax", "log-softmax", "sigmoid", "zeros", "nan"],
)
def test_values_that_are_not_logits_are_refused(model, tokens, tmp_path, monkeypatch, fault, message) -> None:
    # the router returns the transformed values under the name of logits (a real upstream defect)
    _patch_router_output(monkeypatch, model, fault)
    out = tmp_path / "cap"
    with pytest.raises(CaptureCheckError, match=message) as info:
        capture_router_logits(model, tokens, out, logits_dtype="float32", checks=True)
    assert info.value.code in ("E910", "E912", "E913")
    assert not out.exists(), "a capture folder this call created and left empty must be removed"


def test_softmax_values_name_code_e910(tokens, tmp_path, monkeypatch) -> None:
    model = mf.build("qwen3_moe")
    # the forward check (E913) compares like with like, so E910 is what names the fault
    _patch_router_output(monkeypatch, model, lambda x: torch.softmax(x, dim=-1))
    with pytest.raises(CaptureCheckError) as info:
        capture_router_logits(model, tokens, tmp_path / "cap", logits_dtype="float32")
    assert info.value.code == "E910" and "layer" in str(info.value) and "qwen3_moe" in str(info.value)


def test_a_layer_that_returned_nothing_is_e911(model, tokens, tmp_path, monkeypatch) -> None:
    # the hook fires (RouterHooks' own guard is satisfied) but the layer's rows never reach the buffer
    from ror_annotate.steer import capture as capture_module

    original = capture_module._BatchRecorder.on_route

    def drop_second_layer(self, site, logits, output):
        if site.position != 1:
            original(self, site, logits, output)

    monkeypatch.setattr(capture_module._BatchRecorder, "on_route", drop_second_layer)
    with pytest.raises(CaptureCheckError, match="never fired") as info:
        capture_router_logits(model, tokens, tmp_path / "cap", logits_dtype="float32")
    assert info.value.code == "E911" and "layer 1" in str(info.value)


def test_a_hook_that_never_fires_stops_the_forward(model, tokens, tmp_path, monkeypatch) -> None:
    from ror_annotate.errors import SteerError
    from ror_annotate.steer import hooks

    original = hooks.RouterHooks._router_hook

    def silent_for_second_layer(self, site):
        hook = original(self, site)
        return (lambda *a, **k: None) if site.position == 1 else hook

    monkeypatch.setattr(hooks.RouterHooks, "_router_hook", silent_for_second_layer)
    with pytest.raises(SteerError, match="did not fire on 1 of 2 MoE layers"):
        capture_router_logits(model, tokens, tmp_path / "cap", logits_dtype="float32")
    assert not (tmp_path / "cap").exists() or not (tmp_path / "cap" / "index.jsonl").read_text()


def test_a_layer_with_experts_but_no_router_found_is_e911() -> None:
    with pytest.raises(CaptureCheckError, match=r"decoder layer\(s\) \[3\] hold experts") as info:
        checks.check_layers_found([0, 1, 2, 3], [0, 1, 2], family="qwen3_moe")
    assert info.value.code == "E911"


def test_moe_layers_are_counted_from_expert_parameters(model) -> None:
    sites = find_router_sites(model)
    assert checks.moe_layers_of(model) == [s.layer for s in sites]


def test_selections_that_are_not_the_top_k_are_e912(model, tokens, tmp_path, monkeypatch) -> None:
    from ror_annotate.steer import capture as capture_module

    original = capture_module._BatchRecorder.on_route

    def zero_ids(self, site, logits, output):  # an engine that returned all-zero expert ids
        original(self, site, logits, output)
        i = self.slot.get(site.position)
        self.selected[:, :, i] = 0

    monkeypatch.setattr(capture_module._BatchRecorder, "on_route", zero_ids)
    with pytest.raises(CaptureCheckError, match="same expert twice") as info:
        capture_router_logits(model, tokens, tmp_path / "cap", logits_dtype="float32")
    assert info.value.code == "E912"


def test_top_k_check_by_hand() -> None:
    # 2 tokens, 1 layer, 4 experts, top-2: token 0's top-2 is {1, 3}, token 1's {0, 2}
    logits = np.array([[[0.1, 2.0, -1.0, 1.5]], [[3.0, -2.0, 2.5, 0.0]]], dtype=np.float32)
    good = np.array([[[3, 1]], [[0, 2]]])
    checks.check_batch(logits, good, family="f", layers=[5], top_k=2, model_dtype="float32", storage_dtype="float32")
    wrong = np.array([[[3, 0]], [[0, 2]]])
    with pytest.raises(CaptureCheckError, match=r"token 0 selects experts \[0, 3\] but the top-2 of its logits are \[1, 3\]"):
        checks.check_batch(logits, wrong, family="f", layers=[5], top_k=2, model_dtype="float32", storage_dtype="float32")
    out_of_range = np.array([[[3, 4]], [[0, 2]]])
    with pytest.raises(CaptureCheckError, match=r"outside \[0, 4\)"):
        checks.check_batch(logits, out_of_range, family="f", layers=[5], top_k=2, model_dtype="float32", storage_dtype="float32")
    # a near-tie within the storage precision is accepted: experts 1 and 3 differ by less than 4 fp16 ulps
    tie = np.array([[[0.1, 2.0, -1.0, 2.0005]]], dtype=np.float32)
    checks.check_batch(tie, np.array([[[3, 0]]]) * 0 + np.array([[[1, 3]]]), family="f", layers=[5], top_k=2,
                       model_dtype="float16", storage_dtype="float16")


def test_batching_that_changes_the_logits_is_e913(model, tokens, tmp_path, monkeypatch) -> None:
    from ror_annotate.steer import capture as capture_module

    original = capture_module._padded_batch

    def shifted_positions(sequences, padding_side, pad_token_id, device):  # a batching bug: every position 0
        kwargs = original(sequences, padding_side, pad_token_id, device)
        if len(sequences) > 1:
            kwargs["position_ids"] = torch.zeros_like(kwargs["input_ids"])
        return kwargs

    monkeypatch.setattr(capture_module, "_padded_batch", shifted_positions)
    with pytest.raises(CaptureCheckError, match="plain unbatched forward") as info:
        capture_router_logits(model, tokens, tmp_path / "cap", logits_dtype="float32")
    assert info.value.code == "E913"


def test_a_failing_batch_after_good_ones_keeps_the_good_ones(model, tokens, tmp_path, monkeypatch) -> None:
    out = tmp_path / "cap"
    capture_router_logits(model, tokens, out, logits_dtype="float32", limit=1, batch_size=1)
    assert len(Capture(out).index) == 1
    _patch_router_output(monkeypatch, model, lambda x: torch.softmax(x, dim=-1))
    with pytest.raises(CaptureCheckError):
        capture_router_logits(model, tokens, out, logits_dtype="float32", batch_size=1)
    kept = Capture(out)
    assert len(kept.index) == 1 and out.exists()


@pytest.mark.parametrize("name", sorted(mf.BUILDERS))
def test_every_family_passes_the_checks_on_a_clean_capture(name, tmp_path) -> None:
    m = mf.build(name)
    toks = make_tokens({"train": [12, 5]}, vocab=min(mf.VOCAB, m.get_input_embeddings().num_embeddings))
    capture_router_logits(m, toks, tmp_path / "cap", logits_dtype="float16", batch_size=2)
    sites = find_router_sites(m)
    assert checks.moe_layers_of(m) == [s.layer for s in sites]
    assert Capture(tmp_path / "cap").n_tokens == 17
