"""The README's probe/steer sequence runs verbatim, offline, on the tiny checkpoint it builds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.steer, pytest.mark.slow]

README = Path(__file__).resolve().parents[1] / "README.md"


def _sequence() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Probe and steer"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README's Probe and steer section has no bash block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_probe_and_steer_sequence_runs_verbatim(tmp_path: Path) -> None:
    commands = _sequence()
    assert commands[0] == "ror run" and any(c.startswith("ror tiny-model") for c in commands)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert (tmp_path / "cap" / "meta.json").exists()
    assert (tmp_path / "experts" / "steer_suppress_planning.json").exists()
    assert (tmp_path / "tiny-moe" / "tokenizer.json").exists()


def test_tiny_model_is_byte_identical_per_seed(tmp_path: Path) -> None:
    from ror_annotate.steer.tiny import TinyModelOptions, build_tiny_model

    a = build_tiny_model(tmp_path / "a", TinyModelOptions(seed=3, vocab_size=400))
    b = build_tiny_model(tmp_path / "b", TinyModelOptions(seed=3, vocab_size=400))
    assert a["vocab_size"] == b["vocab_size"] <= 400
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    from ror_annotate.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'vocab_size'"):
        TinyModelOptions.from_options({"vocab": 10})
