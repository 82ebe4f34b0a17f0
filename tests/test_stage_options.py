"""Issue 23: one options model per stage, so no library function takes more than 12 parameters.

The models of the older stages (export, run, review study, agreement, capture) refuse an unknown
option with the closest known name and name a bad value by its command-line flag; the functions
that take them still accept their settings as keyword arguments, validated into the model.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import ror_annotate
from ror_annotate import pipeline
from ror_annotate.agreement import AgreementOptions, agreement_summary
from ror_annotate.errors import ConfigError
from ror_annotate.export import ExportOptions, export_dataset
from ror_annotate.options import StageOptions
from ror_annotate.review import StudyOptions, create_study
from ror_annotate.steer.capture import CaptureOptions, capture_router_logits
from ror_annotate.steer.vllm_engine import VllmCaptureOptions, capture_router_logits_vllm

PACKAGE = Path(ror_annotate.__file__).parent
MAX_PARAMS = 12


def _n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters as the project's standing check counts them: *args/**kwargs and self/cls left out."""
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return n - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def test_counting_rule_on_a_hand_made_function() -> None:
    # 2 positional-only + 2 + 1 keyword-only = 5; *args and **kwargs are not counted
    tree = ast.parse("def f(a, b, /, c, d=1, *args, e, **kw): pass\nclass C:\n    def m(self, x, *, y): pass\n")
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert [_n_params(f) for f in fns] == [5, 2]


def test_no_function_outside_the_cli_takes_more_than_12_parameters() -> None:
    too_many = []
    files = [p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts]
    assert len(files) > 50  # the scan sees the package
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _n_params(node) > MAX_PARAMS:
                too_many.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({_n_params(node)})")
    assert not too_many, "use a StageOptions model: " + "; ".join(too_many)


MODELS: list[tuple[type[StageOptions], str, str, dict[str, Any], str]] = [
    # model, misspelt option, the name suggested, a bad value, the flag the error names
    (ExportOptions, "label", "labels", {"split_seed": "abc"}, "--split-seed"),
    (pipeline.RunOptions, "jduge", "judge", {"skip_invalid": "perhaps"}, "--skip-invalid"),
    (StudyOptions, "overlp", "overlap", {"mode": "paragraph"}, "--mode"),
    (AgreementOptions, "n_resample", "n_resamples", {"n_resamples": "many"}, "--n-resamples"),
    (CaptureOptions, "batch_sise", "batch_size", {"batch_size": "big"}, "--batch-size"),
    (VllmCaptureOptions, "refrence", "reference", {"limit": "some"}, "--limit"),
]


@pytest.mark.parametrize(("model", "typo", "meant", "bad", "flag"), MODELS, ids=[m[0].__name__ for m in MODELS])
def test_unknown_option_suggests_and_bad_value_names_its_flag(
    model: type[StageOptions], typo: str, meant: str, bad: dict[str, Any], flag: str,
) -> None:
    with pytest.raises(ConfigError, match=rf"{typo!r} \(did you mean {meant!r}\?\)"):
        model.from_options({typo: 1})
    with pytest.raises(ConfigError, match=rf"^{flag} "):
        model.from_options(bad)
    opts = model.from_options({})
    with pytest.raises(ValidationError, match="frozen"):
        setattr(opts, meant, 1)


def test_the_functions_validate_their_keywords_before_touching_anything(tmp_path: Path) -> None:
    # every call below fails on the typo before it reads the (absent) store, model or dataset
    with pytest.raises(ConfigError, match=r"'labls' \(did you mean 'labels'\?\)"):
        pipeline.export(None, tmp_path / "o", labls="human")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'max_faild' \(did you mean 'max_failed'\?\)"):
        pipeline.run(None, "x.jsonl", max_faild="5%")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'strategi' \(did you mean 'strategy'\?\)"):
        create_study(None, "s", annotators=["a@example.org"], strategi="random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'with_judges' \(did you mean 'with_judge'\?\)"):
        agreement_summary(None, with_judges=True)
    with pytest.raises(ConfigError, match=r"'logit_dtype' \(did you mean 'logits_dtype'\?\)"):
        capture_router_logits(None, None, tmp_path / "c", logit_dtype="float32")
    with pytest.raises(ConfigError, match=r"'padding_side'.*known options: model_name, splits"):
        capture_router_logits_vllm(None, None, tmp_path / "c", padding_side="left")  # type: ignore[arg-type]  # HF-only
    with pytest.raises(ConfigError, match="give the options of the agreement stage either as options= or as keywords"):
        agreement_summary(None, AgreementOptions(), study="s1")
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()


def test_export_dataset_keeps_its_earlier_keyword_names(tmp_path: Path) -> None:
    # label_source= and seed= are export_dataset's names for --labels and --split-seed: they reach
    # the label-source check (which runs before the store is read), not the unknown-option error
    with pytest.raises(ConfigError, match="unknown label source 'nope'"):
        export_dataset(None, tmp_path / "o", label_source="nope", seed=3)  # type: ignore[arg-type]


def test_none_is_a_value_for_library_keywords() -> None:
    # max_failed=None means "no limit" in pipeline.run, reference=None "no reference" in ror agree:
    # a library call keeps the None; the CLI form (None = not given) takes the default
    assert pipeline.RunOptions.from_options({"max_failed": None}, keep_none=True).max_failed is None
    assert pipeline.RunOptions.from_options({"max_failed": None}).max_failed == "10%"
    assert AgreementOptions.from_options({"reference": None}, keep_none=True).reference is None
    assert CaptureOptions.from_options({"max_batch_tokens": None}, keep_none=True).max_batch_tokens is None


def test_run_options_extend_the_export_options() -> None:
    run = pipeline.RunOptions(labels="human", split_seed=7, out="exports/x")
    assert isinstance(run, ExportOptions)
    assert (run.labels, run.split_seed, run.split_fractions, run.judge, run.max_failed) == ("human", 7, (0.8, 0.1, 0.1), "baseline", "10%")


def _stage_models() -> list[type[StageOptions]]:
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(ror_annotate.__path__, "ror_annotate."):
        if ".steer" in info.name or info.name.endswith("__main__"):
            continue  # steer's optional dependencies (torch); its two models are imported above
        importlib.import_module(info.name)
    seen: list[type[StageOptions]] = []
    todo = list(StageOptions.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo += cls.__subclasses__()
    return sorted(seen, key=lambda c: c.__qualname__)


def test_stage_is_a_class_variable_of_every_options_model() -> None:
    from ror_annotate.judge.config import JudgeConfig

    models = _stage_models()
    assert {JudgeConfig, ExportOptions, pipeline.RunOptions, StudyOptions, AgreementOptions, CaptureOptions} <= set(models)
    for model in models:
        assert "stage" not in model.model_fields, model
        assert isinstance(model.stage, str) and model.stage != "stage", model  # each names itself
        if not any(f.is_required() for f in model.model_fields.values()):
            assert "stage" not in model.from_options({}).recorded()
        with pytest.raises(ConfigError, match=rf"unknown option\(s\) for {model.stage}: 'stage'"):
            model.from_options({"stage": "x"})


@pytest.mark.filterwarnings("ignore:Field name \"stage\":UserWarning")  # pydantic's own note on the shadowing, before the refusal
def test_a_stage_declared_as_a_field_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Broken.stage must be a class variable: declare it as `stage: ClassVar\[str\] = ...`"):
        class Broken(StageOptions):
            stage: str = "the broken stage"  # type: ignore[misc]


def test_judge_config_is_a_stage_options_model_with_its_errors() -> None:
    from ror_annotate.judge.config import JudgeConfig

    assert issubclass(JudgeConfig, StageOptions)
    # the messages JudgeConfig.from_options gave before it was a StageOptions
    known = ", ".join(JudgeConfig.model_fields)
    with pytest.raises(ConfigError, match=r"^unknown option\(s\) for the openai judge: 'chunksize' \(did you mean 'chunk_size'\?\); known options: ") as info:
        JudgeConfig.from_options({"chunksize": 3})
    assert str(info.value).endswith(f"known options: {known}") and known.startswith("base_url, codebook, mode, chunk_size")
    with pytest.raises(ConfigError, match=r"^unknown option\(s\) for the verifier judge: 'sead' \(did you mean 'seed'\?\)"):
        JudgeConfig.from_options({"sead": 1}, judge="verifier")
    with pytest.raises(ConfigError, match=r"^--chunk-size must be >= 1, got 0$"):
        JudgeConfig.from_options({"chunk_size": 0})
    cfg = JudgeConfig.from_options({"chunk_size": 5, "seed": None})
    assert (cfg.chunk_size, cfg.seed) == (5, None)
    assert cfg.recorded()["chunk_size"] == 5 and "stage" not in cfg.recorded() and len(cfg.recorded()) == len(JudgeConfig.model_fields)
