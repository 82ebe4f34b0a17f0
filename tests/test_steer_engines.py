"""``--engine hf|vllm`` on ``ror capture`` / ``ror steer``: the registry and the refusals that need no vLLM."""

from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("datasets")

from ror_annotate.registry import registry  # noqa: E402

from . import moe_fixtures as mf  # noqa: E402
from .test_steer_capture import make_tokens  # noqa: E402

pytestmark = pytest.mark.steer


def test_engines_registry_names_both_engines() -> None:
    engines = registry("engines")
    assert {"hf", "vllm"} <= set(engines.names())
    assert engines.get("vllm").name == "vllm"


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    make_tokens({"train": [7, 5]}).save_to_disk(str(tmp_path / "export" / "tokens"))
    mf.build("qwen3_moe").save_pretrained(tmp_path / "m")
    (tmp_path / "spec.json").write_text(json.dumps({"activate": {"0": [1]}, "suppress": {}}))
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke(args):
    from typer.testing import CliRunner

    from ror_annotate.cli import app

    return CliRunner().invoke(app, args)


def test_unknown_engine_is_a_did_you_mean_error(workdir) -> None:
    result = _invoke(["capture", "export", "--model", "m", "--out", "cap", "--engine", "vlm"])
    assert result.exit_code != 0
    assert "vllm" in result.output and "engine" in result.output
    assert not (workdir / "cap").exists()


def test_hf_only_options_are_refused_on_vllm_before_vllm_loads(workdir) -> None:
    result = _invoke(["capture", "export", "--model", "m", "--out", "cap", "--engine", "vllm", "--padding-side", "left"])
    assert result.exit_code != 0
    assert "E924" in result.output and "padding_side" in result.output
    # residual layers and the background writer are the vLLM engine's too now
    from ror_annotate.steer.engines import HF_ONLY_CAPTURE

    assert "residual_layers" not in HF_ONLY_CAPTURE and "background_writer" not in HF_ONLY_CAPTURE


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how_to_install(workdir) -> None:
    for args in (["capture", "export", "--model", "m", "--out", "cap", "--engine", "vllm"],
                 ["steer", "p.jsonl", "--model", "m", "--spec", "spec.json", "--engine", "vllm"]):
        result = _invoke(args)
        assert result.exit_code != 0
        assert "E922" in result.output and "setup_vllm.sh" in result.output


def test_hf_engine_is_still_the_default(workdir) -> None:
    result = _invoke(["capture", "export", "--model", "m", "--out", "cap"])
    assert result.exit_code == 0, result.output
    assert json.loads((workdir / "cap" / "meta.json").read_text())["family"] == "qwen3_moe"
    explicit = _invoke(["capture", "export", "--model", "m", "--out", "cap2", "--engine", "hf"])
    assert explicit.exit_code == 0, explicit.output
    assert (workdir / "cap" / "logits.bin").read_bytes() == (workdir / "cap2" / "logits.bin").read_bytes()


def test_an_edit_validates_against_the_vllm_engines_sites() -> None:
    # a VllmSite of an unregistered softmax model type carries no family: validation and the random control must not
    # need one
    import pytest as _pytest

    from ror_annotate.errors import SteerError
    from ror_annotate.steer.steering import RoutingEdit
    from ror_annotate.steer.vllm_engine import VllmSite

    sites = [VllmSite(layer=0, n_experts=8, top_k=2), VllmSite(layer=1, n_experts=8, top_k=2, position=1)]
    RoutingEdit(activate={0: (1,)}, suppress={1: (2, 3)}).validate(sites)  # type: ignore[arg-type]
    with _pytest.raises(SteerError, match="3 experts to activate but only top-2"):
        RoutingEdit(activate={0: (1, 2, 3)}).validate(sites)  # type: ignore[arg-type]
    from ror_annotate.steer.steering import random_expert_sets

    control = random_expert_sets(RoutingEdit(activate={0: (1,)}, suppress={1: (2, 3)}), sites, seed=1)  # type: ignore[arg-type]
    assert (len(control.activate[0]), len(control.suppress[1])) == (1, 2)


def test_tensor_parallel_is_refused_on_the_hf_engine(workdir) -> None:
    for args in (["capture", "export", "--model", "m", "--out", "cap", "--tensor-parallel-size", "2"],
                 ["steer", "p.jsonl", "--model", "m", "--spec", "spec.json", "--tensor-parallel-size", "2"]):
        result = _invoke(args)
        assert result.exit_code != 0
        assert "E966" in result.output and "--engine vllm" in result.output
    assert not (workdir / "cap").exists()


def test_parallel_modes_the_vllm_engine_does_not_define_are_coded_errors() -> None:
    # expert, pipeline and data parallelism are refused before vLLM is imported; tensor parallelism passes
    from ror_annotate.errors import SteerError
    from ror_annotate.steer.vllm_engine import check_parallel

    check_parallel(1, {})
    check_parallel(4, {"enable_expert_parallel": False, "pipeline_parallel_size": 1, "data_parallel_size": 1})
    cases = [(2, {"enable_expert_parallel": True}, "E963", "expert parallel"), (1, {"enable_eplb": True}, "E963", "expert parallel"),
             (2, {"pipeline_parallel_size": 2}, "E964", "pipeline_parallel_size=2"),
             (1, {"data_parallel_size": 2}, "E964", "data_parallel_size=2"), (0, {}, "E965", ">= 1")]
    for tp, options, code, words in cases:
        with pytest.raises(SteerError, match=words) as info:
            check_parallel(tp, options)
        assert info.value.code == code
