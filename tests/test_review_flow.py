"""`ror review start` / `ror review finish`: the newcomer's review path in two commands (issue 27).

Fast tests check the coded errors without any server (E740-E744) and the weighting rule. Tests
marked ``integration`` run against the REAL Label Studio server of ``LABEL_STUDIO_URL`` (as
tests/test_review_labelstudio.py; skipped, saying why, only when none answers): accounts are
created by ``start``, the annotators log in with the printed passwords and annotate through Label
Studio's API with their own tokens, and ``finish`` must give the very numbers of a separate
``ror review pull`` + ``ror agree``; the human pair's kappa is checked against sklearn.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ror_annotate.errors import ConfigError, ReviewError
from ror_annotate.review.flow import ReviewStartOptions, ensure_server, review_start, weighting_possible
from ror_annotate.review.studies import create_study

from . import review_fixtures as F

URL = os.environ.get("LABEL_STUDIO_URL", "http://127.0.0.1:8089").rstrip("/")
KEY = os.environ.get("LABEL_STUDIO_API_KEY", "0123456789abcdef0123456789abcdef01234567")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "labelstudio.sh"


def _app():
    from ror_annotate.cli import app

    return app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _invoke(args: list[str]):
    return CliRunner().invoke(_app(), args)


@pytest.fixture
def no_ls_env(monkeypatch, tmp_path):
    """No Label Studio in sight: an unused local port and a venv path with nothing installed."""
    monkeypatch.setenv("LS_VENV", str(tmp_path / "no-venv"))
    monkeypatch.setenv("LS_DATA", str(tmp_path / "ls-data"))
    monkeypatch.setenv("LABEL_STUDIO_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.delenv("LABEL_STUDIO_PUBLIC_URL", raising=False)
    return os.environ["LABEL_STUDIO_URL"]


# ----------------------------------------------------------------------------- coded errors, no server
def test_start_without_a_server_or_an_install_names_the_exact_command(no_ls_env, tmp_path):
    db = tmp_path / "s.duckdb"
    F.make_store(db).close()
    done = _invoke(["review", "start", "pilot", "-a", "a@lab.org", "-a", "b@lab.org", "--n", "4", "--db", str(db)])
    assert done.exit_code != 0
    line = " ".join(done.output.split())
    assert "error [E740]" in line and no_ls_env in line
    assert "again with --install" in line and "labelstudio.sh install" in line
    assert "Traceback" not in done.output
    from ror_annotate.store import Store

    with Store(db, read_only=True) as store:  # nothing was created before the server check failed
        assert store.execute("SELECT count(*) FROM review_studies").fetchone()[0] == 0


def test_start_on_a_remote_url_that_does_not_answer_is_e741(tmp_path):
    db = tmp_path / "s.duckdb"
    F.make_store(db).close()
    done = _invoke(["review", "start", "pilot", "-a", "a@lab.org", "--overlap", "1", "--n", "2", "--db", str(db),
                    "--url", "http://user:secret-pw@ls.invalid:8089"])
    assert done.exit_code != 0 and "error [E741]" in done.output
    assert "secret-pw" not in done.output  # the URL's password is scrubbed


def test_a_new_study_needs_annotators_e743_and_an_existing_one_keeps_its_own_e742(tmp_path, no_ls_env):
    db = tmp_path / "s.duckdb"
    store = F.make_store(db)
    with pytest.raises(ReviewError) as new:
        review_start(store, "pilot", n=4)
    assert new.value.code == "E743"
    create_study(store, "pilot", annotators=["a@lab.org", "b@lab.org"], n=4)
    with pytest.raises(ReviewError) as other:
        review_start(store, "pilot", annotators=["a@lab.org", "c@lab.org"])
    assert other.value.code == "E742" and "a@lab.org, b@lab.org" in other.value.message
    # the same people in another order (or none at all) pass the check and reach the server check
    for people in (["B@lab.org", "a@lab.org"], []):
        with pytest.raises(ReviewError) as server:
            review_start(store, "pilot", annotators=people)
        assert server.value.code == "E740"
    # finish has no --install: its E740 names the script's commands instead
    from ror_annotate.review.flow import review_finish

    with pytest.raises(ReviewError) as fin:
        review_finish(store, "pilot")
    assert fin.value.code == "E740" and "labelstudio.sh install && bash" in fin.value.message and "same command again" not in fin.value.message
    store.close()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_a_start_that_fails_is_e744_quoting_the_script(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "label-studio"
    exe.write_text("#!/bin/sh\necho 'fake label-studio cannot start' >&2\nexit 3\n")
    exe.chmod(0o755)
    monkeypatch.setenv("LS_VENV", str(venv))
    monkeypatch.setenv("LS_DATA", str(tmp_path / "data"))
    with pytest.raises(ReviewError) as err:
        ensure_server(f"http://127.0.0.1:{_free_port()}", script=SCRIPT)
    assert err.value.code == "E744" and "start` failed" in err.value.message


FAKE_LS = """#!{python}
# A stand-in for the label-studio executable: answers /health/ like Label Studio, on the --port it is given.
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
host = sys.argv[sys.argv.index("--internal-host") + 1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"status": "UP"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer((host, port), H).serve_forever()
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_a_local_server_that_does_not_answer_is_started_with_the_scripts_token(tmp_path, monkeypatch):
    import subprocess
    import sys

    from ror_annotate.review.flow import server_up

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "label-studio"
    exe.write_text(FAKE_LS.format(python=sys.executable))
    exe.chmod(0o755)
    token = "f" * 40
    monkeypatch.setenv("LS_VENV", str(venv))
    monkeypatch.setenv("LS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("LS_ADMIN_TOKEN", token)
    url = f"http://127.0.0.1:{_free_port()}"
    assert not server_up(url)
    try:
        status = ensure_server(url, script=SCRIPT)
        assert status.started and not status.installed and status.url == url and server_up(url)
        assert status.api_key == token and token not in repr(status)
        again = ensure_server(url, script=SCRIPT)  # answers now: nothing started
        assert not again.started and again.api_key is None
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=dict(os.environ), capture_output=True, timeout=60)
    assert not server_up(url)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_script_installed_action(tmp_path):
    import subprocess

    env = {**os.environ, "LS_VENV": str(tmp_path / "none")}
    assert subprocess.run(["bash", str(SCRIPT), "installed"], env=env).returncode == 1
    (tmp_path / "none" / "bin").mkdir(parents=True)
    exe = tmp_path / "none" / "bin" / "label-studio"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert subprocess.run(["bash", str(SCRIPT), "installed"], env=env).returncode == 0


def test_weighting_follows_the_design(tmp_path):
    store = F.make_store(tmp_path / "s.duckdb")
    create_study(store, "rand", annotators=["a@lab.org"], overlap=1, n=5, strategy="random")
    create_study(store, "strat", annotators=["a@lab.org"], overlap=1, n=6, strategy="stratified", judge_annotator=F.BASELINE)
    create_study(store, "unc0", annotators=["a@lab.org"], overlap=1, n=4, strategy="uncertainty", control_fraction=0.0,
                 rater=F.BASELINE)
    create_study(store, "unc", annotators=["a@lab.org"], overlap=1, n=8, strategy="uncertainty", control_fraction=0.5,
                 rater=F.BASELINE)
    assert weighting_possible(store, "rand") == (True, None)
    assert weighting_possible(store, "unc") == (True, None)
    ok, why = weighting_possible(store, "strat")
    assert not ok and "inclusion probabilities" in why
    ok, why = weighting_possible(store, "unc0")
    assert not ok and "control stratum" in why
    store.close()


def test_start_options_are_one_model_with_did_you_mean():
    o = ReviewStartOptions.from_options({"annotators": ("a@lab.org",), "strategy": "uncertainty", "n": 10})
    assert o.study_options().strategy == "uncertainty" and o.study_options().n == 10
    with pytest.raises(ConfigError, match="did you mean 'annotators'"):
        ReviewStartOptions.from_options({"annotator": ("a@lab.org",)})


# ----------------------------------------------------------------------------- against the real server
def _server_or_skip() -> None:
    try:
        ok = httpx.get(f"{URL}/health/", timeout=5).json().get("status") == "UP"
    except (httpx.HTTPError, ValueError):
        ok = False
    if not ok:
        reason = f"no Label Studio server answers at {URL}/health/ (start one: bash scripts/labelstudio.sh start)"
        if os.environ.get("ROR_REQUIRE_LABEL_STUDIO"):
            pytest.fail(reason)
        pytest.skip(reason)


def flow_store(tmp_path, monkeypatch, *, chdir: bool = True):
    """The real server's environment (skip/fail as :func:`_server_or_skip`), a fixture store, a unique tag: ``(db, tag)``."""
    _server_or_skip()
    monkeypatch.setenv("LABEL_STUDIO_URL", URL)
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", KEY)
    monkeypatch.delenv("LABEL_STUDIO_PUBLIC_URL", raising=False)
    if chdir:
        monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.duckdb"
    F.make_store(db).close()
    return db, uuid.uuid4().hex[:8]


def login_token(email: str, password: str) -> str:
    """Log in as a person would (the login form) and read that user's API token."""
    with httpx.Client(base_url=URL, follow_redirects=False, timeout=60) as c:
        c.get("/user/login/")
        csrf = c.cookies.get("csrftoken")
        r = c.post("/user/login/", data={"email": email, "password": password, "csrfmiddlewaretoken": csrf},
                   headers={"Referer": URL + "/user/login/"})
        assert r.status_code == 302, f"login of {email} refused (HTTP {r.status_code})"
        return c.get("/api/current-user/token").json()["token"]


#: ``  EMAIL (PSEUDONYM): project URL/projects/ID/data`` then, for a new account, its password line.
LINK = re.compile(r"^  (\S+@\S+) \((h-\w+)\): project (\S+/projects/(\d+)/data)\n\s+(new account: log in at \S+ with password (\w+)|existing account)", re.M)


def started_people(output: str) -> dict[str, dict]:
    """What `ror review start` printed per annotator: pseudonym, project id, new password (or None)."""
    return {m[1]: {"pseudonym": m[2], "project": int(m[4]), "password": m[6]} for m in LINK.finditer(output)}


def annotate(email: str, password: str, project: int, answer) -> int:
    """Annotate every task of ``project`` as ``email`` (own token); ``answer(task_data) -> behavior``."""
    from label_studio_sdk import LabelStudio

    ls = LabelStudio(base_url=URL, api_key=login_token(email, password), timeout=60)
    n = 0
    for t in ls.tasks.list(project=project):
        label = answer(t.data)
        ls.annotations.create(id=t.id, result=[{"from_name": "behavior", "to_name": "segment", "type": "choices",
                                                "value": {"choices": [label]}}])
        n += 1
    return n


def _all_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())


@pytest.mark.integration
def test_start_twice_annotate_and_finish_equals_pull_plus_agree(tmp_path, monkeypatch):
    from sklearn.metrics import cohen_kappa_score

    db, tag = flow_store(tmp_path, monkeypatch)
    e1, e2, name = f"ann1-{tag}@example.org", f"ann2-{tag}@example.org", f"flow-{tag}"

    first = _invoke(["review", "start", name, "-a", e1, "-a", e2, "--strategy", "random", "--n", "10", "--seed", "2",
                     "--db", str(db)])
    assert first.exit_code == 0, first.output
    assert "Label Studio running at" in first.output and "20 new tasks, 20 in all" in first.output
    people = started_people(first.output)
    assert set(people) == {e1, e2} and all(p["password"] for p in people.values())

    # Idempotent: a re-run (no -a) creates nothing, prints the same project links, and no password.
    again = _invoke(["review", "start", name, "--db", str(db)])
    assert again.exit_code == 0, again.output
    assert "0 new tasks, 20 in all" in again.output and "0 new;" in again.output
    people2 = started_people(again.output)
    assert {e: p["project"] for e, p in people2.items()} == {e: p["project"] for e, p in people.items()}
    assert all(p["password"] is None for p in people2.values())
    for p in people.values():
        assert p["password"] not in again.output
    from ror_annotate.review.labelstudio import LabelStudioClient

    admin = LabelStudioClient(URL, KEY)
    assert all(len(admin.export_tasks(p["project"])) == 10 for p in people.values())  # overlap 2: every item twice

    # The annotators log in with the printed passwords and label: ann1 gives the baseline label,
    # ann2 the baseline label except on three segments.
    ann1 = {k: F.baseline_label(*k) for k in F.ALL_KEYS}
    flips = {("t-latex", 2): "planning", ("t-zwj", 1): "execution", ("t-cjk", 2): "execution", ("t-latex", 4): "fact"}
    ann2 = ann1 | flips
    assert annotate(e1, people[e1]["password"], people[e1]["project"], lambda d: ann1[(d["trace_id"], d["segment_index"])]) == 10
    assert annotate(e2, people[e2]["password"], people[e2]["project"], lambda d: ann2[(d["trace_id"], d["segment_index"])]) == 10

    done = _invoke(["review", "finish", name, "--db", str(db), "--json", "--resamples", "50"])
    assert done.exit_code == 0, done.output
    finished = json.loads(done.stdout)
    assert "weighted" in finished and finished["weighted"]["study"] == name  # a random study: weighted automatically
    assert (tmp_path / "reports" / name / "agreement.md").is_file()
    table = _invoke(["review", "finish", name, "--db", str(db), "--resamples", "50"])
    assert table.exit_code == 0 and "same as: ror review pull" in table.output and f"--weighted --report reports/{name}" in table.output

    pulled = _invoke(["review", "pull", name, "--db", str(db)])
    assert pulled.exit_code == 0 and "labels written 0, labels unchanged 20" in pulled.output
    alone = _invoke(["agree", "--study", name, "--with-judge", "--weighted", "--json", "--resamples", "50", "--db", str(db)])
    assert alone.exit_code == 0, alone.output
    separate = json.loads(alone.stdout)
    assert finished == separate

    # The human pair's kappa against sklearn on the ten sampled segments.
    from ror_annotate.store import Store

    with Store(db, read_only=True) as store:
        items = [(t, i) for t, i in store.execute(f"SELECT trace_id, segment_index FROM review_items WHERE study = '{name}'").fetchall()]
    want = cohen_kappa_score([ann1[k] for k in items], [ann2[k] for k in items])
    pair = [k for k in finished["cohen_kappa"] if {k["annotator_a"], k["annotator_b"]} == {people[e1]["pseudonym"], people[e2]["pseudonym"]}]
    assert len(pair) == 1 and pair[0]["value"] == pytest.approx(want, abs=1e-12)

    # Secrets: neither the API key nor a password is in the store (file and WAL) or any command's output
    # beyond the one `start` that created the accounts; e-mails stay out of the runs table.
    blob = _all_bytes(db)
    for secret in (KEY, *(p["password"] for p in people.values())):
        assert secret.encode() not in blob
    for result in (again, done, table, pulled, alone):
        assert KEY not in result.output and not any(p["password"] in result.output for p in people.values())
    assert KEY not in first.output
    with Store(db, read_only=True) as store:
        runs = json.dumps([list(map(str, r)) for r in store.execute("SELECT * FROM runs").fetchall()])
    assert e1 not in runs and e2 not in runs and "review start" in runs


#: ``Adjudicator: EMAIL (PSEUDONYM): WHERE`` then a new account's password line, or ``existing account``.
ADJ = re.compile(r"^Adjudicator: (\S+@\S+) \((h-\w+)\): (.+)\n\s+(new account: log in at \S+ with password (\w+)|existing account)", re.M)


@pytest.mark.integration
def test_start_and_adjudicate_sign_the_adjudicator_up_once(tmp_path, monkeypatch):
    """Issue 27: the adjudicator no longer signs up by hand. `start --adjudicator` and `adjudicate --adjudicator`
    create the account (the printed password logs in on the real server), print it once, store it nowhere, and
    are idempotent; another adjudicator for the study is refused before anything is done."""
    db, tag = flow_store(tmp_path, monkeypatch, chdir=False)
    e1, e2, adj, adj2 = (f"{who}-{tag}@example.org" for who in ("ann1", "ann2", "adj1", "adj2"))

    first = _invoke(["review", "start", f"a-{tag}", "-a", e1, "-a", e2, "--adjudicator", adj, "--n", "4", "--db", str(db)])
    assert first.exit_code == 0, first.output
    (m,) = ADJ.findall(first.output)
    assert m[0] == adj and "ror review adjudicate" in m[2] and m[4], first.output  # no project yet; a password
    password = m[4]
    assert login_token(adj, password)  # the printed password logs in
    again = _invoke(["review", "start", f"a-{tag}", "--adjudicator", adj.upper(), "--db", str(db)])
    assert again.exit_code == 0, again.output
    (m2,) = ADJ.findall(again.output)
    assert m2[:2] == m[:2] and m2[3] == "existing account" and password not in again.output
    other = _invoke(["review", "start", f"a-{tag}", "--adjudicator", adj2, "--db", str(db)])
    assert other.exit_code != 0 and "one study has one adjudicator" in " ".join(other.output.split())
    from ror_annotate.review.labelstudio import LabelStudioClient

    assert adj2 not in LabelStudioClient(URL, KEY).users_by_email()  # refused before any account was made

    # the adjudication step of a study started without one
    assert _invoke(["review", "start", f"b-{tag}", "-a", e1, "-a", e2, "--n", "4", "--db", str(db)]).exit_code == 0
    assert _invoke(["review", "pull", f"b-{tag}", "--db", str(db)]).exit_code == 0
    step = _invoke(["review", "adjudicate", f"b-{tag}", "--adjudicator", adj2, "--db", str(db)])
    assert step.exit_code == 0, step.output
    (m3,) = ADJ.findall(step.output)
    assert m3[0] == adj2 and re.fullmatch(r"project \S+/projects/\d+/data", m3[2]) and m3[4], step.output
    assert login_token(adj2, m3[4])
    step2 = _invoke(["review", "adjudicate", f"b-{tag}", "--db", str(db)])
    assert step2.exit_code == 0, step2.output
    (m4,) = ADJ.findall(step2.output)
    assert m4[:3] == m3[:3] and m4[3] == "existing account" and m3[4] not in step2.output

    blob = _all_bytes(db)
    for secret in (KEY, password, m3[4]):
        assert secret.encode() not in blob
