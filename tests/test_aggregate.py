"""``ror aggregate`` and several judges as declared raters (issue 24, items 1 and 3).

The end-to-end world: the embedded sample's real segments (40 traces), labelled through the real
``openai`` client by ``ror label --judge openai:sim-a ... --judge openai:sim-e`` against simulated
judges of known, different accuracies (tests/sim_judges.py: noisy views of a hidden true label with
realistic confusions). Expected values come from the hidden truth, from crowd-kit's own DawidSkene
(the reference for the posteriors) and from hand calculation, never from the code under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ror_annotate import pipeline
from ror_annotate.errors import ConfigError, InputError
from ror_annotate.records import BEHAVIORS, Label
from ror_annotate.sample import sample_path
from ror_annotate.store import Store

from . import judge_fixtures as JF
from .sim_judges import ACCURACY, SimJudges, true_label

# crowd-kit 1.4.2, the reference, uses pandas' deprecated inplace= keywords (pandas 3.1 warns on each call)
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

SIM = list(ACCURACY)  # sim-a (0.85) ... sim-e (0.60)
ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]


def _app():
    from ror_annotate.cli import app

    return app


# ----------------------------------------------------------------------------- the simulated world
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store with the sample's segments labelled by the five simulated judges (one `ror label` command)."""
    saved = {k: os.environ.pop(k, None) for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    db = tmp_path_factory.mktemp("sim") / "sim.duckdb"
    with Store(db) as store:
        ingested = pipeline.ingest(store, str(sample_path()))
        pipeline.segment(store, ingested.trace_ids, workers=1)
    runner = CliRunner()
    with SimJudges(record_bodies=False) as srv:
        args = ["label", "--db", str(db), "--chunk-size", "200"]
        for model in SIM:
            args += ["--judge", f"openai:{model}", "--base-url", srv.base_url]  # one --base-url per --judge, paired
        done = runner.invoke(_app(), args)
        base_url = srv.base_url
    for k, v in saved.items():
        if v is not None:
            os.environ[k] = v
    assert done.exit_code == 0, done.output
    with Store(db) as store:
        truth = {(s.trace_id, s.segment_index): true_label(s.text) for s in store.segments()}
        ds = pipeline.aggregate(store, {"method": "dawid-skene"})
        mv = pipeline.aggregate(store, {"method": "majority-vote"})
    return {"db": db, "truth": truth, "ds": ds, "mv": mv, "base_url": base_url}


def _accuracy(labels: list[Label], truth: dict) -> float:
    return float(np.mean([lab.label == truth[(lab.trace_id, lab.segment_index)] for lab in labels]))


def test_each_judge_is_its_own_declared_rater(world):
    with Store(world["db"], read_only=True) as store:
        declared = store.declared_annotators()
        counts = {a: n for _, a, n in store.annotators()}
    for model in SIM:
        a = declared[f"openai:{model}"]
        assert (a.kind, a.source, a.model, a.provider, a.samples, a.temperature) == ("machine", "judge", model, world["base_url"], 1, 0.0)
        assert a.details["codebook"] == "six-behaviors@v1" and len(a.codebook_version) == 64
        assert counts[f"openai:{model}"] == len(world["truth"])
    # the simulated judges are as accurate as the world says (the test world is sound)
    with Store(world["db"], read_only=True) as store:
        measured = {m: _accuracy(store.labels(annotator=f"openai:{m}"), world["truth"]) for m in SIM}
    for model, acc in ACCURACY.items():
        assert abs(measured[model] - acc) < 0.03, measured


def test_dawid_skene_beats_the_best_judge_and_majority_vote(world):
    truth = world["truth"]
    with Store(world["db"], read_only=True) as store:
        ds = _accuracy(store.labels(annotator="aggregate:dawid-skene"), truth)
        mv = _accuracy(store.labels(annotator="aggregate:majority-vote"), truth)
        best = max(_accuracy(store.labels(annotator=f"openai:{m}"), truth) for m in SIM)
    assert world["ds"].segments == len(truth) and world["ds"].raters == [f"openai:{m}" for m in SIM]
    assert ds > best + 0.03, (ds, best)
    assert ds > mv, (ds, mv)


def test_posteriors_equal_crowdkits_dawid_skene(world):
    import pandas as pd
    from crowdkit.aggregation import DawidSkene

    with Store(world["db"], read_only=True) as store:
        rows = [(f"{lab.trace_id}#{lab.segment_index}", lab.annotator, lab.label)
                for m in SIM for lab in store.labels(annotator=f"openai:{m}")]
        ours = {f"{lab.trace_id}#{lab.segment_index}": lab for lab in store.labels(annotator="aggregate:dawid-skene")}
    ref = DawidSkene(n_iter=100, tol=1e-5).fit_predict_proba(pd.DataFrame(rows, columns=["task", "worker", "label"]))
    ref = ref.reindex(columns=list(BEHAVIORS), fill_value=0.0)
    assert set(ref.index) == set(ours)
    got = np.array([ours[t].distribution for t in ref.index])
    assert np.abs(got - ref.to_numpy()).max() < 1e-6
    conf = np.array([ours[t].confidence for t in ref.index])
    assert np.allclose(conf, ref.to_numpy().max(axis=1), atol=1e-6)


def test_the_aggregates_confidence_is_calibrated(world):
    truth = world["truth"]
    with Store(world["db"], read_only=True) as store:
        labels = store.labels(annotator="aggregate:dawid-skene")
    # expected calibration error, textbook: 10 equal-width bins, |accuracy - mean confidence| weighted by bin size
    bins: list[list[tuple[float, bool]]] = [[] for _ in range(10)]
    for lab in labels:
        assert lab.confidence is not None
        bins[min(int(lab.confidence * 10), 9)].append((lab.confidence, lab.label == truth[(lab.trace_id, lab.segment_index)]))
    ece = 0.0
    for b in bins:
        if b:
            ece += len(b) / len(labels) * abs(sum(c for _, c in b) / len(b) - sum(p for p, _ in b) / len(b))
    assert ece < 0.03, ece
    # majority vote's fractions are not calibrated: the posterior is what makes the difference
    assert world["mv"].mean_confidence < world["ds"].mean_confidence


def test_estimated_rater_accuracy_tracks_the_truth(world):
    with Store(world["db"], read_only=True) as store:
        declared = store.declared_annotators()["aggregate:dawid-skene"]
    assert declared.kind == "machine" and declared.source == "aggregate" and declared.model == "dawid-skene"
    assert declared.details["raters"] == [f"openai:{m}" for m in SIM] and declared.details["human"] == "held-out"
    for model, acc in ACCURACY.items():
        assert abs(declared.details["rater_accuracy"][f"openai:{model}"] - acc) < 0.04
        confusion = np.array(declared.details["rater_confusion"][f"openai:{model}"])  # [true][given]
        for true in ("execution", "reflection"):  # the largest classes: the world's confusions show
            i, j = BEHAVIORS.index(true), BEHAVIORS.index({"execution": "restatement", "reflection": "planning"}[true])
            assert abs(confusion[i, i] - acc) < 0.05 and abs(confusion[i, j] - (1 - acc) * 0.6) < 0.05, (model, confusion[i])


def test_ror_run_takes_several_judges(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    db = tmp_path / "run.duckdb"
    with SimJudges() as srv:
        done = CliRunner().invoke(_app(), ["run", str(sample_path()), "--limit", "2", "--workers", "1", "--db", str(db),
                                           "--out", str(tmp_path / "out"), "--judge", "openai:sim-a", "--judge", "openai:sim-b",
                                           "--base-url", srv.base_url])
    assert done.exit_code == 0, done.output
    with Store(db, read_only=True) as store:
        counts = {a: n for _, a, n in store.annotators()}
        n_segments = len(store.segments())
        run = store.runs()[-1]
    assert counts == {"openai:sim-a": n_segments, "openai:sim-b": n_segments}
    assert run.parameters["judge"] == ["openai:sim-a", "openai:sim-b"] and run.counts["label"]["labeled"] == 2 * n_segments


def test_one_coin_dawid_skene_is_crowdkits(world):
    import pandas as pd
    from crowdkit.aggregation import OneCoinDawidSkene

    with Store(world["db"]) as store:
        pipeline.aggregate(store, {"method": "one-coin-dawid-skene", "raters": ("openai:sim-a", "openai:sim-c", "openai:sim-e")})
        rows = [(f"{lab.trace_id}#{lab.segment_index}", lab.annotator, lab.label)
                for m in ("sim-a", "sim-c", "sim-e") for lab in store.labels(annotator=f"openai:{m}")]
        ours = {f"{lab.trace_id}#{lab.segment_index}": lab.distribution for lab in store.labels(annotator="aggregate:one-coin-dawid-skene")}
    ref = OneCoinDawidSkene(n_iter=100, tol=1e-5).fit_predict_proba(pd.DataFrame(rows, columns=["task", "worker", "label"]))
    ref = ref.reindex(columns=list(BEHAVIORS), fill_value=0.0)
    got = np.array([ours[t] for t in ref.index])
    assert np.abs(got - ref.to_numpy()).max() < 1e-6


def test_a_rerun_writes_the_same_label_ids(world):
    with Store(world["db"]) as store:
        before = {lab.label_id: (lab.label, lab.distribution) for lab in store.labels(annotator="aggregate:dawid-skene")}
        again = pipeline.aggregate(store, {"method": "dawid-skene"})
        after = {lab.label_id: (lab.label, lab.distribution) for lab in store.labels(annotator="aggregate:dawid-skene")}
    assert again.labels_written == len(before) == len(after)
    assert before == after


def test_cli_prints_the_summary(world, tmp_path):
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run([*ROR, "aggregate", "--db", str(world["db"]), "--method", "majority-vote", "--raters",
                           "openai:sim-a,openai:sim-b"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    n = len(world["truth"])
    assert f"aggregate:majority-vote: {n} segments from 2 raters ({2 * n} labels), human held-out" in done.stdout
    assert "openai:sim-a" in done.stdout and "estimated accuracy" in done.stdout and "below 0.5" in done.stdout


# ----------------------------------------------------------------------------- hand-sized stores
def _store(tmp_path: Path) -> Store:
    return JF.build_store(tmp_path / "h.duckdb", {"a": ("Add.", JF.TRACE_A)})  # 6 segments


def _lab(index: int, label: str, annotator: str, *, source: str = "judge", when: datetime | None = None,
         codebook: str = "cb1", study: str | None = None) -> Label:
    return Label(trace_id="a", segment_index=index, label=label, source=source, annotator=annotator, codebook_version=codebook,
                 study=study, created_at=when or datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_majority_vote_of_two_raters_by_hand(tmp_path):
    store = _store(tmp_path)
    store.upsert_labels([
        _lab(0, "planning", "A"), _lab(0, "planning", "B"),  # agree: planning, 1.0
        _lab(1, "fact", "A"), _lab(1, "planning", "B"),      # tie 1:1 -> the first in BEHAVIORS order (planning), 0.5
        _lab(2, "execution", "A"),                           # one rater only: execution, 1.0
    ])
    s = pipeline.aggregate(store, {"method": "majority-vote"})
    got = {lab.segment_index: lab for lab in store.labels(annotator="aggregate:majority-vote")}
    assert (s.segments, s.responses, s.raters) == (3, 5, ["A", "B"])
    assert got[0].distribution == [1.0, 0, 0, 0, 0, 0] and (got[0].label, got[0].confidence) == ("planning", 1.0)
    assert got[1].distribution == [0.5, 0, 0, 0.5, 0, 0] and (got[1].label, got[1].confidence) == ("planning", 0.5)
    assert got[2].distribution == [0, 1.0, 0, 0, 0, 0] and got[2].label == "execution"
    assert got[1].source == "aggregate" and got[1].extra == {"n_raters": 2}
    # mean confidence (1 + 0.5 + 1) / 3; share below 0.5: none (0.5 is not below)
    assert s.mean_confidence == pytest.approx(2.5 / 3) and s.share_below_half == 0.0
    # estimated accuracy = mean posterior of the rater's own labels: A (1 + 0.5 + 1)/3, B (1 + 0.5)/2
    assert s.rater_accuracy == {"A": pytest.approx(2.5 / 3), "B": pytest.approx(0.75)}
    # A's confusion from the posteriors, by hand: truth planning -> said planning 1, fact 0.5; truth fact -> fact 0.5;
    # truth execution -> execution 1 (rows: true class, columns: given label, BEHAVIORS order)
    conf = store.declared_annotators()["aggregate:majority-vote"].details["rater_confusion"]["A"]
    assert conf[0] == pytest.approx([2 / 3, 0, 0, 1 / 3, 0, 0]) and conf[3] == [0, 0, 0, 1, 0, 0] and conf[1] == [0, 1, 0, 0, 0, 0]
    assert conf[2] == [0] * 6  # no restatement mass on A's segments
    # the columnar write stores the same label ids as Label.label_id
    stored_ids = {r[0] for r in store.execute("SELECT label_id FROM labels WHERE annotator = 'aggregate:majority-vote'").fetchall()}
    assert stored_ids == {lab.label_id for lab in got.values()}
    store.close()


def test_columnar_rater_labels_are_checked_before_anything_changes(tmp_path):
    from ror_annotate.errors import StoreError
    from ror_annotate.store import RaterLabels

    store = _store(tmp_path)
    store.upsert_labels([_lab(0, "planning", "agg", source="aggregate")])
    bad = RaterLabels(trace_id=["a"], segment_index=[1], label=[0], codebook_version="cb1", distribution=[[0.5, 0.4, 0, 0, 0, 0]])
    with pytest.raises(StoreError, match="summing to 1"):
        store.replace_rater_labels("aggregate", "agg", bad)
    with pytest.raises(StoreError, match="not in"):  # a segment that is not stored: rolled back, the old label stays
        store.replace_rater_labels("aggregate", "agg", RaterLabels(trace_id=["a"], segment_index=[99], label=[0], codebook_version="cb1"))
    assert [(lab.segment_index, lab.label) for lab in store.labels(annotator="agg")] == [(0, "planning")]
    store.close()


def test_each_raters_latest_label_counts(tmp_path):
    store = _store(tmp_path)
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    store.upsert_labels([
        _lab(0, "fact", "A", when=t0, codebook="old"), _lab(0, "planning", "A", when=t0 + timedelta(days=1), codebook="new"),
        _lab(0, "fact", "B"),
        # same time: the greater label_id wins
        _lab(1, "fact", "A", study="s1", when=t0), _lab(1, "conclusion", "A", study="s2", when=t0), _lab(1, "fact", "B"),
    ])
    tie = max([_lab(1, "fact", "A", study="s1"), _lab(1, "conclusion", "A", study="s2")], key=lambda lab: lab.label_id)
    pipeline.aggregate(store, {"method": "majority-vote"})
    got = {lab.segment_index: lab.distribution for lab in store.labels(annotator="aggregate:majority-vote")}
    assert got[0] == [0.5, 0, 0, 0.5, 0, 0]  # A's newer planning, B's fact
    expected = [0.0] * 6
    expected[BEHAVIORS.index("fact")] += 0.5
    expected[BEHAVIORS.index(tie.label)] += 0.5
    assert got[1] == expected
    store.close()


def test_a_rerun_on_fewer_segments_drops_the_stale_aggregate_labels(tmp_path):
    store = _store(tmp_path)
    store.upsert_labels([_lab(i, "planning", r) for i in range(3) for r in ("A", "B")] + [_lab(3, "fact", "C"), _lab(3, "fact", "D")])
    pipeline.aggregate(store, {"method": "dawid-skene"})
    assert sorted(lab.segment_index for lab in store.labels(annotator="aggregate:dawid-skene")) == [0, 1, 2, 3]
    s = pipeline.aggregate(store, {"method": "dawid-skene", "raters": ("A", "B")})
    assert s.labels_written == 3
    assert sorted(lab.segment_index for lab in store.labels(annotator="aggregate:dawid-skene")) == [0, 1, 2]
    assert store.declared_annotators()["aggregate:dawid-skene"].details["raters"] == ["A", "B"]
    store.close()


def test_humans_are_held_out_by_default_and_anchor_on_request(tmp_path):
    store = _store(tmp_path)
    store.upsert_labels([_lab(i, "planning", r) for i in range(3) for r in ("A", "B")]
                        + [_lab(i, "fact", "alice", source="human", study="st") for i in range(3)])
    held = pipeline.aggregate(store, {"method": "majority-vote"})
    assert held.raters == ["A", "B"] and held.held_out_humans == ["alice"]
    anchored = pipeline.aggregate(store, {"method": "majority-vote", "human": "anchor"})
    assert anchored.raters == ["A", "B", "alice"] and anchored.held_out_humans == []
    got = store.labels(annotator="aggregate:majority-vote")
    assert all(lab.distribution == pytest.approx([2 / 3, 0, 0, 1 / 3, 0, 0]) for lab in got)
    assert store.declared_annotators()["aggregate:majority-vote"].details["human"] == "anchor"
    store.close()


def test_coded_errors_store_nothing(tmp_path):
    store = _store(tmp_path)
    store.upsert_labels([_lab(0, "planning", "A"), _lab(0, "fact", "B"), _lab(0, "fact", "alice", source="human", study="st")])
    cases = [
        ({"method": "dawid-skeen"}, ConfigError, "E710", "did you mean 'dawid-skene'"),
        ({"raters": ("A", "Bx")}, InputError, "E711", "did you mean 'B'"),
        ({"raters": ("A",)}, InputError, "E712", "at least 2 raters"),
        ({"raters": ("A", "alice")}, InputError, "E715", "--human anchor"),
    ]
    for options, exc, code, text in cases:
        with pytest.raises(exc) as info:
            pipeline.aggregate(store, options)
        assert info.value.code == code and text in info.value.message, info.value.message
    with pytest.raises(ConfigError, match="did you mean 'raters'"):
        pipeline.aggregate(store, {"rater": ("A", "B")})
    assert sorted(a for _, a, _ in store.annotators()) == ["A", "B", "alice"] and store.declared_annotators() == {}  # nothing written
    pipeline.aggregate(store, {"method": "majority-vote"})
    with pytest.raises(InputError) as info:
        pipeline.aggregate(store, {"raters": ("A", "aggregate:majority-vote")})
    assert info.value.code == "E714"
    # the default never takes earlier aggregates as raters
    assert pipeline.aggregate(store, {"method": "dawid-skene"}).raters == ["A", "B"]
    store.close()


@pytest.mark.parametrize("method", ["glad", "mace"])
def test_crowdkit_methods_give_distributions(tmp_path, method):
    store = _store(tmp_path)
    store.upsert_labels([_lab(i, lab, r) for i in range(6) for r, lab in (("A", "planning"), ("B", "planning"), ("C", "fact"))])
    s = pipeline.aggregate(store, {"method": method})
    got = store.labels(annotator=f"aggregate:{method}")
    assert s.segments == 6 and all(lab.label == "planning" for lab in got)
    for lab in got:
        assert sum(lab.distribution) == pytest.approx(1.0) and lab.distribution[2] == 0.0  # restatement: nobody said it
    store.close()


def test_the_baseline_declares_itself(tmp_path):
    store = _store(tmp_path)
    pipeline.label(store)
    a = store.declared_annotators()["baseline:cue-v1"]
    assert (a.kind, a.source, a.model) == ("machine", "baseline", "baseline-cue-v1")
    store.close()


def test_several_judges_in_the_library_and_samples_declared(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    store = _store(tmp_path)
    with SimJudges() as srv:
        summary = pipeline.label(store, judge=["openai:sim-a", "baseline", "openai:sim-b"],
                                 judge_options={"base_url": srv.base_url, "samples": 2})
    assert summary.annotator == "openai:sim-a,baseline:cue-v1,openai:sim-b"
    assert [j.annotator for j in summary.judges] == ["openai:sim-a", "baseline:cue-v1", "openai:sim-b"]
    assert summary.labeled == 6 * 5 and summary.counts()["judges"]["openai:sim-b"]["labeled"] == 12
    declared = store.declared_annotators()
    assert set(declared) == {"openai:sim-a", "openai:sim-a@s2", "openai:sim-b", "openai:sim-b@s2", "baseline:cue-v1"}
    assert declared["openai:sim-b@s2"].samples == 2 and declared["openai:sim-b@s2"].temperature == 1.0
    assert declared["openai:sim-b@s2"].details["sample"] == 2
    store.close()


def test_judge_and_base_url_counts_are_checked_before_the_store_opens(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    runner = CliRunner()
    db = tmp_path / "none.duckdb"
    urls = ["--base-url", "http://127.0.0.1:9/v1"] * 3
    done = runner.invoke(_app(), ["label", "--db", str(db), "--judge", "openai:x", "--judge", "openai:y", *urls])
    assert done.exit_code == 2 and "E133" in done.output and "once per --judge" in done.output, done.output
    done = runner.invoke(_app(), ["label", "--db", str(db), "--judge", "openai:x", "--judge", "openai:x", *urls[:2]])
    assert done.exit_code == 2 and "E134" in done.output and "openai:x" in done.output, done.output
    done = runner.invoke(_app(), ["run", "--db", str(db), "--judge", "openai:x", "--judge", "openai:y", *urls])
    assert done.exit_code == 2 and "E133" in done.output, done.output
    assert not db.exists()


def test_review_pull_declares_each_human_rater(tmp_path):
    from ror_annotate.review import create_study, pull_study, push_study
    from ror_annotate.review.studies import pseudonym_for

    from . import review_fixtures as F

    store = F.make_store(tmp_path / "r.duckdb")
    create_study(store, "st", annotators=["a1@example.org"], n=2, seed=1, overlap=1)
    ls = F.FakeLabelStudio({"a1@example.org": 11})
    push_study(store, "st", ls)
    pid = store.execute("SELECT ls_project_id FROM review_projects WHERE study = 'st'").fetchone()[0]
    task = ls.export_tasks(pid)[0]["id"]
    ls.annotate(task, 501, 11, [{"from_name": "behavior", "to_name": "segment", "type": "choices", "value": {"choices": ["fact"]}}],
                when="2026-01-01T00:00:01Z")
    pull_study(store, "st", ls)
    who = pseudonym_for(store, "a1@example.org")
    a = store.declared_annotators()[who]
    assert (a.kind, a.source, a.study, a.details["role"], a.details["studies"]) == ("human", "human", "st", "annotator", ["st"])
    assert "@" not in a.model_dump_json()  # the pseudonym only, never the e-mail
    assert store.rater_kinds()[who] == "human"
    store.close()


@pytest.mark.parametrize("n_raters", [3, 30])  # 30 raters: too many for one pattern code, EM runs per segment
def test_numpy_dawid_skene_equals_crowdkit_on_random_raters(n_raters):
    import pandas as pd
    from crowdkit.aggregation import DawidSkene

    from ror_annotate.aggregate import dawid_skene

    rng = np.random.default_rng(n_raters)
    n = 400
    truth = rng.integers(0, 5, n)  # class 5 never occurs: its posterior must be 0
    tasks, workers, labels = [], [], []
    for w in range(n_raters):
        keep = np.flatnonzero(rng.random(n) < 0.7)
        acc = rng.uniform(0.4, 0.9)
        tasks.append(keep)
        workers.append(np.full(len(keep), w))
        labels.append(np.where(rng.random(len(keep)) < acc, truth[keep], rng.integers(0, 5, len(keep))))
    t, w, lab = np.concatenate(tasks), np.concatenate(workers), np.concatenate(labels)
    seen = np.unique(t)
    t = np.searchsorted(seen, t)
    ours, _ = dawid_skene(t, w, lab, len(seen), n_raters, 6)
    ref = DawidSkene(n_iter=100, tol=1e-5).fit_predict_proba(pd.DataFrame({"task": t, "worker": w, "label": lab}))
    ref = ref.reindex(index=range(len(seen)), columns=range(6), fill_value=0.0).to_numpy()
    assert np.abs(ours - ref).max() < 1e-6 and (ours[:, 5] == 0).all()
