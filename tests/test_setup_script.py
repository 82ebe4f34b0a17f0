"""scripts/setup.sh picks the torch build that fits the machine, and refuses an old Python clearly.

The script runs for real in a scratch copy of the repository layout, with a stand-in
``.venv/bin/python`` that records every pip command instead of installing, and a PATH holding only
the tools the script uses plus, per case, a stand-in ``nvidia-smi``. Expected commands are written
out by hand from the script's documented behaviour.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "file:///nowhere/cpu-wheels"  # ROR_TORCH_CPU_INDEX, so no index is ever contacted

RECORDER = """#!/bin/sh
# stand-in for .venv/bin/python: log the command; fail a CPU-torch install from the configured
# sources when the case says they do not serve it
echo "$*" >> "$(dirname "$0")/../../pip.log"
case "$*" in
  *+cpu*--extra-index-url*) [ -n "$NO_CPU_INDEX" ] && exit 1; exit 0 ;;
  *+cpu*) [ -n "$NO_LOCAL_CPU_WHEEL" ] && exit 1 ;;
esac
exit 0
"""


def _setup(tmp_path: Path, *, gpu: str | None, env: dict[str, str] | None = None, python: str | None = None):
    """Run setup.sh in a scratch tree; ``gpu``: None (no nvidia-smi), "gpu" (one listed), "broken" (no driver)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    venv_python = root / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(RECORDER)
    venv_python.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "grep", "sh"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    uname = bin_dir / "uname"  # the operating system of the case, whatever runs the test
    uname.write_text(f"#!/bin/sh\necho {(env or {}).get('FAKE_OS', 'Linux')}\n")
    uname.chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    if gpu is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0000)'\n" if gpu == "gpu" else
                       "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n")
        smi.chmod(0o755)
    full_env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "ROR_TORCH_CPU_INDEX": CPU_INDEX, **(env or {})}
    if python is not None:
        full_env["PYTHON"] = python
    done = subprocess.run([shutil.which("bash"), str(root / "scripts" / "setup.sh")], capture_output=True, text=True,
                          env=full_env, timeout=60)
    log = root / "pip.log"
    return done, log.read_text().splitlines() if log.exists() else []


PIP = "-m pip install --quiet"
UPGRADE = f"{PIP} --upgrade pip"
ALL_EXTRAS = f"{PIP} -e .[review,steer,dev]"


@pytest.mark.parametrize(
    "gpu, env, expected",
    [
        (None, {}, [UPGRADE, f"{PIP} torch==2.13.0+cpu", ALL_EXTRAS]),
        ("broken", {}, [UPGRADE, f"{PIP} torch==2.13.0+cpu", ALL_EXTRAS]),
        (None, {"NO_LOCAL_CPU_WHEEL": "1"},
         [UPGRADE, f"{PIP} torch==2.13.0+cpu", f"{PIP} torch==2.13.0+cpu --extra-index-url {CPU_INDEX}", ALL_EXTRAS]),
        ("gpu", {}, [UPGRADE, f"{PIP} torch==2.13.0", ALL_EXTRAS]),
        (None, {"ROR_TORCH": "cuda"}, [UPGRADE, f"{PIP} torch==2.13.0", ALL_EXTRAS]),
        ("gpu", {"ROR_TORCH": "cpu"}, [UPGRADE, f"{PIP} torch==2.13.0+cpu", ALL_EXTRAS]),
        ("gpu", {"ROR_TORCH": "skip"}, [UPGRADE, f"{PIP} -e .[review,dev]"]),
        (None, {"FAKE_OS": "Darwin"}, [UPGRADE, f"{PIP} torch==2.13.0", ALL_EXTRAS]),  # macOS wheels: CPU builds
    ],
)
def test_torch_build_follows_the_machine_and_ror_torch(tmp_path: Path, gpu, env, expected) -> None:
    done, commands = _setup(tmp_path, gpu=gpu, env=env)
    assert done.returncode == 0, done.stderr
    assert commands == expected


def test_unknown_ror_torch_is_refused(tmp_path: Path) -> None:
    done, commands = _setup(tmp_path, gpu=None, env={"ROR_TORCH": "gpu"})
    assert done.returncode == 1 and "ROR_TORCH=gpu: use auto, cpu, cuda or skip" in done.stderr
    assert commands == []


def test_old_python_gets_a_clear_message(tmp_path: Path) -> None:
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\ncase \"$2\" in *version_info*) exit 1 ;; *) echo 3.9.18 ;; esac\n")
    fake.chmod(0o755)
    done, commands = _setup(tmp_path, gpu=None, python=str(fake))
    assert done.returncode == 1
    assert f"ror_annotate needs Python 3.10 or newer; {fake} is 3.9.18" in done.stderr
    assert commands == []
    missing, _ = _setup(tmp_path / "m", gpu=None, python="python-nowhere")
    assert missing.returncode == 1 and "python-nowhere not found" in missing.stderr


def test_unreachable_cpu_wheel_index_gives_a_hint(tmp_path: Path) -> None:
    done, commands = _setup(tmp_path, gpu=None, env={"NO_LOCAL_CPU_WHEEL": "1", "NO_CPU_INDEX": "1"})
    assert done.returncode == 1
    assert f"could not be installed from {CPU_INDEX}" in done.stderr
    assert "ROR_TORCH=skip" in done.stderr and "ROR_TORCH=cuda" in done.stderr
    assert commands == [UPGRADE, f"{PIP} torch==2.13.0+cpu", f"{PIP} torch==2.13.0+cpu --extra-index-url {CPU_INDEX}"]
