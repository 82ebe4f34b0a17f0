"""The README's four-command review flow and its Python cell run verbatim against the real Label Studio.

Only the e-mails are made unique (accounts live on a shared server). The two LLM judges the README
names are answered by the local OpenAI-compatible server of simulated judges (tests/sim_judges.py:
noisy views of a hidden true label, accuracies 0.85 and 0.70); the two annotators log in with the
passwords ``ror review start`` printed and label through Label Studio's API: alice gives the hidden
true label, bob the true label except on every fifth task, where he gives the label judges confuse it with.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ror_annotate.store import DEFAULT_DB, Store

from .sim_judges import CONFUSED_WITH, SimJudges, true_label
from .test_review_flow import KEY, URL, _server_or_skip, annotate, started_people

pytestmark = [pytest.mark.integration, pytest.mark.slow]

README = Path(__file__).resolve().parents[1] / "README.md"
ROOT = README.parent
#: The README's judges, answered as these simulated judges.
AS_SIM = {"gpt-4.1-mini": "sim-a", "gpt-4.1-nano": "sim-c"}


class ReadmeJudges(SimJudges):
    def answer(self, body, fault):
        return super().answer({**body, "model": AS_SIM.get(body.get("model", ""), body.get("model", ""))}, fault)


def human(*, bob: bool):
    """An annotator's answer per task: the hidden truth; bob gives the confused class on every fifth task."""
    seen = [0]

    def answer(data: dict) -> str:
        seen[0] += 1
        truth = true_label(data["segment"])
        return CONFUSED_WITH[truth] if bob and seen[0] % 5 == 0 else truth

    return answer


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### From nothing to a calibrated, uncertainty-first two-annotator study")
    return text[start:text.index("### Each step alone", start)]


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", _section(), re.S)
    assert block is not None
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def readme_python() -> str:
    block = re.search(r"```python\n(.*?)```", _section(), re.S)
    assert block is not None
    return block.group(1)


def test_the_flow_is_four_commands_ending_in_start_and_finish():
    commands = readme_commands()
    assert len(commands) <= 4
    assert commands[0].startswith("ror run") and commands[-2].startswith("ror review start") and commands[-1].startswith("ror review finish")
    assert "--strategy uncertainty" in commands[-2] and commands[-2].count(" -a ") == 2


def test_readme_review_flow_runs_verbatim(tmp_path):
    _server_or_skip()
    tag = uuid.uuid4().hex[:6]

    def unique(text: str) -> str:
        return text.replace("alice@lab.org", f"alice-{tag}@lab.org").replace("bob@lab.org", f"bob-{tag}@lab.org")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LABEL_STUDIO_", "ROR_DB"))}
    env.update(LABEL_STUDIO_URL=URL, LABEL_STUDIO_API_KEY=KEY, PYTHONPATH=str(ROOT), OPENAI_API_KEY="sk-readme-test",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    outputs: dict[str, subprocess.CompletedProcess] = {}
    with ReadmeJudges(record_bodies=False) as srv:
        env["OPENAI_BASE_URL"] = srv.base_url
        for command in readme_commands():
            done = subprocess.run(unique(command), shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            outputs[command.split()[1] if command.split()[1] != "review" else command.split()[2]] = done
            if command.startswith("ror review start"):
                people = started_people(done.stdout)
                assert len(people) == 2 and all(p["password"] for p in people.values()), done.stdout
                for email, p in people.items():
                    assert annotate(email, p["password"], p["project"], human(bob=email.startswith("bob"))) == 100

        finish = outputs["finish"].stdout
        flat = " ".join(finish.split())
        with Store(tmp_path / DEFAULT_DB, read_only=True) as store:
            n_segments = store.counts()["segments"]  # N is every segment of the sample (segmenter-dependent)
        assert f"Weighted estimates, study pilot: 100 reviewed of N = {n_segments}" in flat
        assert "report: reports/pilot/agreement.md" in flat and "--with-judge --weighted" in flat
        report = json.loads((tmp_path / "reports" / "pilot" / "agreement.json").read_text())
        by_rater = {r["rater"]: r for r in report["weighted"]["raters"]}
        agg = by_rater["aggregate:dawid-skene"]
        assert agg["n_items"] > 0 and agg["weighted"]["accuracy"]["value"] is not None
        # the uncertainty stratum is where the aggregate's errors are (its confidence ranks them)
        per = agg["errors_per_100"]
        assert per["uncertainty"]["per_100"]["value"] > per["control"]["per_100"]["value"]

        # The Python cell, verbatim, on the same store: the judges' answers come from the store's cache, the
        # study exists (an idempotent start: no new account, no password), and finish gives the CLI's figures.
        cell = tmp_path / "cell.py"
        cell.write_text(unique(readme_python()), encoding="utf-8")
        done = subprocess.run([sys.executable, str(cell)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.splitlines()
    assert sum("(existing account)" in ln for ln in lines) == 2
    printed = {ln.split()[0]: float(ln.split()[1]) for ln in lines if ln.startswith(("aggregate:", "openai:"))}
    assert printed["aggregate:dawid-skene"] == pytest.approx(agg["weighted"]["accuracy"]["value"], abs=1e-12)
