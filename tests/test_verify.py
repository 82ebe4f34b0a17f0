"""``ror verify``: an LLM verifier audits stored labels, against a local OpenAI-compatible server and the real openai client.

The verifier server answers from the cue rule of :mod:`tests.openai_server` (the "truth" of every
segment of the hand-written traces is known by hand: ``LABELS_A`` / ``LABELS_U``): it accepts a
shown label equal to the truth and revises any other to the truth. Judge labels are stored with
planted errors, so the expected revisions and from->to matrix are the planted ones, counted here by
hand; kappa before/after is checked with scikit-learn.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sklearn.metrics import cohen_kappa_score

from ror_annotate.codebook import load_codebook
from ror_annotate.errors import ConfigError, VerifyError, VerifyOutcomeError
from ror_annotate.records import BEHAVIORS, Label
from ror_annotate.store import Store
from ror_annotate.verify import VerifyOptions, default_rater, verify, verify_report

from .judge_fixtures import LABELS_A, LABELS_U, TRACE_A, TRACE_U, build_store
from .openai_server import FakeOpenAI
from .verify_fixtures import VIDS as _VIDS
from .verify_fixtures import VerifierServer, parse_verify_prompt

pytestmark = pytest.mark.integration

ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]
ROOT = Path(__file__).resolve().parents[1]
JUDGE = "openai:judge-m"
VERIFIER = "openai:verifier-m"
V1 = load_codebook("six-behaviors@v1").sha256

TRACES = {"a0": ("Add 17 and 25.", TRACE_A), "a1": ("Add 17 and 25 again.", TRACE_A), "a2": ("Sum twice.", TRACE_A),
          "u": ("Add 1/2 and 1/3 — 数学.", TRACE_U)}
TRUTH = {**{(t, i): lab for t in ("a0", "a1", "a2") for i, lab in enumerate(LABELS_A)}, **{("u", i): lab for i, lab in enumerate(LABELS_U)}}
#: Judge errors planted on purpose (segment -> wrong label), including on the non-ASCII trace.
PLANTED = {("a0", 0): "execution", ("a0", 2): "planning", ("a1", 3): "restatement", ("a2", 5): "reflection",
           ("u", 1): "fact", ("u", 2): "planning", ("a2", 2): "planning"}
#: Human labels on a0, u (all) and a1 (first three): the truth, except one segment where the human differs.
HUMANS = {**{k: v for k, v in TRUTH.items() if k[0] in ("a0", "u") or (k[0] == "a1" and k[1] < 3)}, ("a0", 4): "fact"}


def _labelled_store(path: Path) -> Store:
    store = build_store(path, TRACES)
    judge = [Label(trace_id=t, segment_index=i, label=PLANTED.get((t, i), lab), source="judge", annotator=JUDGE, codebook_version=V1)
             for (t, i), lab in TRUTH.items()]
    humans = [Label(trace_id=t, segment_index=i, label=lab, source="human", annotator="h1", codebook_version=V1, study="s1")
              for (t, i), lab in HUMANS.items()]
    store.upsert_labels(judge + humans)
    return store


def _options(srv: FakeOpenAI, **kw: Any) -> VerifyOptions:
    return VerifyOptions.build(VERIFIER, base_url=srv.base_url, **{"chunk_size": 3, "backoff_base": 0.0, **kw})


def _verdicts(store: Store) -> dict[tuple[str, int], Label]:
    return {(lab.trace_id, lab.segment_index): lab for lab in store.labels(source="verify")}


def test_verifier_revises_exactly_the_planted_errors(tmp_path):
    store = _labelled_store(tmp_path / "s.duckdb")
    with VerifierServer() as srv:
        summary = verify(store, _options(srv))
        bodies = srv.chat_requests()
    assert default_rater(store) == JUDGE  # the single judge rater (the verifier is not a judge rater)
    assert summary.verifier == f"verify:verifier-m:of:{JUDGE}" and summary.of == JUDGE
    assert (summary.audited, summary.verified, summary.revised, summary.failed) == (len(TRUTH), len(TRUTH), len(PLANTED), 0)
    # chunked: ceil(6/3) requests per TRACE_A copy, ceil(4/3) for the non-ASCII trace; one copy of the trace in each
    assert len(bodies) == 3 * 2 + 2 and summary.counts["requests"] == 8
    assert all(b["messages"][1]["content"].count("<trace>") == 1 for b in bodies)
    assert all("Audit exactly these segment ids" in b["messages"][1]["content"] for b in bodies)
    # the audited label is shown in every segment's marker
    tid_of = {problem: tid for tid, (problem, _) in TRACES.items()}
    for body in bodies:
        tid = tid_of[body["messages"][1]["content"].split("<problem>\n", 1)[1].split("\n</problem>", 1)[0]]
        segs, _ = parse_verify_prompt(body["messages"])
        assert {i: shown for i, (shown, _) in segs.items()} == {i: PLANTED.get((t, i), lab) for (t, i), lab in TRUTH.items() if t == tid}
    assert "«1 | fact» " in next(b for b in bodies if "数学" in b["messages"][1]["content"])["messages"][1]["content"]
    verdicts = _verdicts(store)
    assert set(verdicts) == set(TRUTH)
    for key, lab in verdicts.items():
        original = PLANTED.get(key, TRUTH[key])
        assert lab.label == TRUTH[key] and lab.extra["original"] == original and lab.extra["of"] == JUDGE
        assert lab.extra["verdict"] == ("revise" if key in PLANTED else "accept")
        assert (lab.extra["reason"] is not None) == (key in PLANTED)
        assert lab.source == "verify" and lab.annotator == summary.verifier and lab.codebook_version == V1
    assert "✓" in verdicts[("u", 1)].extra["reason"]  # non-ASCII reason kept
    declared = store.declared_annotators()[summary.verifier]
    assert (declared.kind, declared.source, declared.model, declared.details["of"]) == ("machine", "verify", "verifier-m", JUDGE)
    assert declared.codebook_version == V1 and declared.provider == srv.base_url

    report = verify_report(store)
    (v,) = report.verifiers
    planted_moves = Counter((wrong, TRUTH[k]) for k, wrong in PLANTED.items())
    accepted = Counter(TRUTH[k] for k in TRUTH if k not in PLANTED)
    for a in BEHAVIORS:
        for b in BEHAVIORS:
            assert v.matrix[a][b] == (accepted[a] if a == b else planted_moves[(a, b)]), (a, b)
    assert (v.verified, v.revised) == (len(TRUTH), len(PLANTED))
    by_orig = Counter(PLANTED.get(k, TRUTH[k]) for k in TRUTH)
    revised_from = Counter(PLANTED.values())
    for c in BEHAVIORS:
        assert v.by_class[c]["verified"] == by_orig[c] and v.by_class[c]["revised"] == revised_from[c]

    keys = sorted(HUMANS)
    ref = [HUMANS[k] for k in keys]
    before = [PLANTED.get(k, TRUTH[k]) for k in keys]
    after = [TRUTH[k] for k in keys]
    r = v.reference
    assert r.n_items == len(keys)
    assert r.kappa_before == pytest.approx(cohen_kappa_score(ref, before))
    assert r.kappa_after == pytest.approx(cohen_kappa_score(ref, after))
    assert r.accuracy_before == pytest.approx(sum(x == y for x, y in zip(ref, before)) / len(keys))
    assert r.accuracy_after == pytest.approx((len(keys) - 1) / len(keys))  # only the human's own deviation remains
    assert r.kappa_after > r.kappa_before


def test_rerun_and_cache_replay_make_zero_requests(tmp_path):
    store = _labelled_store(tmp_path / "s.duckdb")
    with VerifierServer() as srv:
        verify(store, _options(srv))
        n = len(srv.chat_requests())
        again = verify(store, _options(srv))
        assert len(srv.chat_requests()) == n
        assert (again.verified, again.skipped, again.counts["requests"]) == (0, len(TRUTH), 0)
        # verdicts gone, responses cached: replayed from the cache, still no request
        store.delete_labels(lab.label_id for lab in store.labels(source="verify"))
        replay = verify(store, _options(srv))
        assert len(srv.chat_requests()) == n
        assert replay.verified == len(TRUTH) and replay.revised == len(PLANTED) and replay.counts["cached_responses"] == n
        # a changed audited label is verified again (one request for its chunk), the others are not
        store.upsert_labels([Label(trace_id="a0", segment_index=1, label="fact", source="judge", annotator=JUDGE, codebook_version=V1)])
        changed = verify(store, _options(srv))
        assert len(srv.chat_requests()) == n + 1 and changed.verified == 1 and changed.revised == 1
    assert _verdicts(store)[("a0", 1)].extra["original"] == "fact" and _verdicts(store)[("a0", 1)].label == "execution"


def test_batch_mode_gives_the_same_verdicts(tmp_path):
    store = _labelled_store(tmp_path / "s.duckdb")
    with VerifierServer() as srv:
        summary = verify(store, _options(srv, batch=True, batch_poll_s=0.01))
        paths = [r["path"] for r in srv.requests]
    assert "/v1/batches" in paths and "/v1/chat/completions" not in paths
    assert summary.revised == len(PLANTED) and summary.verified == len(TRUTH)
    assert summary.counts["batches"] and set(summary.counts["batches"].values()) == {"completed"}
    assert {k: v.label for k, v in _verdicts(store).items()} == TRUTH


def test_default_rater_choice_and_coded_errors(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES)
    with pytest.raises(VerifyError, match="nothing to verify") as e:
        default_rater(store)
    assert e.value.code == "E523"
    store.upsert_labels([Label(trace_id="a0", segment_index=0, label="planning", source="judge", annotator=a, codebook_version=V1)
                         for a in ("openai:x", "openai:y")])
    with pytest.raises(VerifyError, match="openai:x, openai:y") as e:
        default_rater(store)
    assert e.value.code == "E522"
    store.upsert_labels([Label(trace_id="a0", segment_index=0, label="planning", source="aggregate", annotator="aggregate:old",
                               codebook_version=V1, created_at="2026-01-01T00:00:00Z"),
                         Label(trace_id="a0", segment_index=1, label="planning", source="aggregate", annotator="aggregate:new",
                               codebook_version=V1, created_at="2026-02-01T00:00:00Z")])
    assert default_rater(store) == "aggregate:new"
    with VerifierServer() as srv:
        with pytest.raises(VerifyError, match="has no labels") as e:
            verify(store, _options(srv, of="openai:nobody"))
        assert e.value.code == "E521"
        store.upsert_labels([Label(trace_id="a0", segment_index=0, label="planning", source="judge", annotator="openai:oldbook",
                                   codebook_version="0" * 64)])
        with pytest.raises(VerifyError, match="no labels under codebook six-behaviors@v1") as e:
            verify(store, _options(srv, of="openai:oldbook"))
        assert e.value.code == "E521"
        with pytest.raises(VerifyError, match="none of the given traces") as e:
            verify(store, _options(srv, of="openai:x"), trace_ids=["u"])
        assert e.value.code == "E523"
        assert not srv.chat_requests()
    with pytest.raises(ConfigError, match="did you mean 'chunk_size'"):
        VerifyOptions.build(VERIFIER, chunksize=3)
    with pytest.raises(ConfigError, match="LLM verifier"):
        verify(store, VerifyOptions.build("baseline"))
    with pytest.raises(ConfigError, match="samples"):
        verify(store, VerifyOptions.build(VERIFIER, of="openai:x", base_url="http://127.0.0.1:9/v1", samples=2))


def test_no_verdicts_is_e524_and_nothing_stored(tmp_path):
    store = _labelled_store(tmp_path / "s.duckdb")
    with VerifierServer(broken=True) as srv, pytest.raises(VerifyOutcomeError, match="no verdict") as e:
        verify(store, _options(srv, max_attempts=1))
    assert e.value.code == "E524" and e.value.exit_status == 3
    assert not store.labels(source="verify")
    assert store.runs()[-1].status != "ok"
    store.close()
    with VerifierServer(broken=True) as srv:
        done = _cli("verify", "--judge", VERIFIER, "--base-url", srv.base_url, "--max-attempts", "1", "--db", str(tmp_path / "s.duckdb"))
    assert done.returncode == 3 and done.stderr.startswith("error [E524]") and len(done.stderr.strip().splitlines()) == 1
    assert "requests=" in done.stdout


def test_secrets_never_stored(tmp_path, monkeypatch):
    store = _labelled_store(tmp_path / "s.duckdb")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-verify-SECRET-123")
    with VerifierServer() as srv:
        url = srv.base_url.replace("http://", "http://user:pw-URLSECRET-9@")
        summary = verify(store, VerifyOptions.build(VERIFIER, base_url=url))
        assert srv.chat_requests()  # (httpx sends the URL's user:password as Basic auth, replacing the bearer key)
    assert summary.verified == len(TRUTH)
    assert store.declared_annotators()[summary.verifier].provider == srv.base_url.replace("http://", "http://user:***@")
    store.execute("CHECKPOINT")
    path = store.path
    store.close()
    raw = Path(path).read_bytes()
    assert b"sk-verify-SECRET-123" not in raw and b"URLSECRET" not in raw


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*ROR, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or {**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_verify_report_json_and_errors(tmp_path):
    db = tmp_path / "s.duckdb"
    _labelled_store(db).close()
    with VerifierServer() as srv:
        done = _cli("verify", "--judge", VERIFIER, "--base-url", srv.base_url, "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["run"]["revised"] == len(PLANTED) and out["report"]["verifiers"][0]["revised"] == len(PLANTED)
    table = _cli("verify", "--report", "--db", str(db))
    assert table.returncode == 0 and "kappa before -> after" in table.stdout and f"verify:verifier-m:of:{JUDGE}" in table.stdout
    store = Store(db)
    store.upsert_labels([Label(trace_id="a0", segment_index=0, label="planning", source="judge", annotator="openai:other",
                               codebook_version=V1)])
    store.close()
    bad = _cli("verify", "--judge", VERIFIER, "--base-url", "http://127.0.0.1:9/v1", "--db", str(db))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert bad.stderr.startswith("error [E522]") and JUDGE in bad.stderr and "openai:other" in bad.stderr
    assert _cli("verify", "--db", str(db)).returncode == 2


_CHILD = """
import sys
from ror_annotate.store import Store
from ror_annotate.verify import VerifyOptions, verify
store = Store(sys.argv[1])
verify(store, VerifyOptions.build("openai:verifier-m", base_url=sys.argv[2], chunk_size=2, concurrency=1))
"""


def _asked(bodies: list[dict[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for b in bodies:
        user = b["messages"][1]["content"]
        problem = user.split("<problem>\n", 1)[1].split("\n</problem>", 1)[0]
        out.append((problem, tuple(int(x) for x in _VIDS.search(user).group(1).split(","))))
    return out


@pytest.mark.parametrize("how", ["kill9", "sigterm"])
def test_resume_after_interrupt_loses_nothing_and_pays_nothing_twice(tmp_path, how):
    db = tmp_path / "s.duckdb"
    _labelled_store(db).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OPENAI_API_KEY", None)
    with VerifierServer(latency=0.3) as srv:
        if how == "kill9":
            child = subprocess.Popen([sys.executable, "-c", _CHILD, str(db), srv.base_url], env=env)
        else:
            child = subprocess.Popen([*ROR, "verify", "--judge", VERIFIER, "--base-url", srv.base_url, "--chunk-size", "2",
                                      "--concurrency", "1", "--db", str(db)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while len(srv.chat_requests()) < 4 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL if how == "kill9" else signal.SIGTERM)
        _, err = child.communicate(timeout=60)
        if how == "kill9":
            assert child.returncode == -signal.SIGKILL
        else:
            assert child.returncode == 130, err
            assert len(err.strip().splitlines()) == 1, err
        before = len(srv.chat_requests())
        store = Store(db)
        n_before = len(store.labels(source="verify"))
        assert 0 < n_before < len(TRUTH)
        # requests whose answers were stored before the interrupt: (problem, ids)
        cached = {(p, tuple(json.loads(ids))) for p, ids in store.execute(
            "SELECT t.problem, c.segment_ids FROM judge_cache c JOIN traces t USING (trace_id)").fetchall()}
        assert cached
        summary = verify(store, VerifyOptions.build(VERIFIER, base_url=srv.base_url, chunk_size=2))
        resent = _asked(srv.chat_requests()[before:])
    assert not cached & set(resent), "a request whose answer was stored was sent again"
    assert len(resent) == len(set(resent))
    assert summary.verified == len(TRUTH) - n_before and summary.skipped == n_before
    assert {k: v.label for k, v in _verdicts(store).items()} == TRUTH
    rows = store.execute("SELECT trace_id, segment_index, count(*) FROM labels WHERE source = 'verify' GROUP BY 1, 2").fetchall()
    assert len(rows) == len(TRUTH) and {r[2] for r in rows} == {1}
