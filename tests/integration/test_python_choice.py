"""scripts/_python.sh and scripts/check_python.py: the scripts name the interpreter they use, refuse
one that cannot run ashd with the reason, and rebuild a venv made by another interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def choose(scripts: Path, python: str) -> subprocess.CompletedProcess[str]:
    script = f'source "{scripts}/_python.sh" && ashd_choose_python && echo "$ASHD_PY_VERSION|$ASHD_PY"'
    env = {**os.environ, "PYTHON": python}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_the_chosen_interpreter_is_named() -> None:
    result = choose(REPO / "scripts", sys.executable)
    assert result.returncode == 0, result.stderr
    version = ".".join(map(str, sys.version_info[:3]))
    assert result.stdout.strip() == f"{version}|{os.path.realpath(sys.executable)}"
    assert f"ashd: using Python {version} ({os.path.realpath(sys.executable)}), set by PYTHON" in result.stderr


def test_an_interpreter_outside_requires_python_is_refused_with_the_reason(tmp_path: Path) -> None:
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    text = (REPO / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace('requires-python = ">=3.11,<3.14"',
                                                          'requires-python = ">=3.11,<3.11"'))
    result = choose(tmp_path / "scripts", sys.executable)
    assert result.returncode == 1
    assert f"ashd: refusing PYTHON={sys.executable}: Python" in result.stderr
    assert "outside what ashd supports (requires-python >=3.11,<3.11)" in result.stderr


def test_a_missing_interpreter_is_refused() -> None:
    result = choose(REPO / "scripts", "/nonexistent/python3")
    assert result.returncode == 1 and "refusing PYTHON=/nonexistent/python3: not found" in result.stderr


def test_a_venv_made_by_another_interpreter_is_rebuilt(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    cfg = venv / "pyvenv.cfg"
    script = f'source "{REPO}/scripts/_python.sh" && ashd_choose_python && ashd_venv "{venv}"'
    env = {**os.environ, "PYTHON": sys.executable}
    same = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and "recreating" not in same.stderr, same.stderr
    cfg.write_text(cfg.read_text().replace("version = ", "version = 0."))  # as if made by another one
    other = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert other.returncode == 0, other.stderr
    assert "was made by Python 0." in other.stderr and "recreating it with" in other.stderr
    assert "version = 0." not in cfg.read_text()
