"""ashd installed into a venv's own site-packages (as a wheel installs it, not the editable
checkout) starts sandboxes on both launch routes: the mount plan shows the interpreter, the venv
and the package by rule. The venv lives under /tmp, which the sandbox replaces with its own tmpfs.
The full wheel (built, installed into a fresh venv, the e2e tests run against it) is
scripts/test_installed, run by CI."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import ashd
from tests.fixtures.sandboxes import ROUTES, require_isolation

pytestmark = pytest.mark.sandbox
DRIVER = Path(__file__).resolve().parent.parent / "fixtures" / "installed_driver.py"


@pytest.fixture(scope="module")
def installed_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inst", numbered=True)
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    shutil.copytree(Path(ashd.__file__).parent, purelib / "ashd", ignore=shutil.ignore_patterns("__pycache__"))
    # The host side of the launcher needs ashd's dependencies: reach this environment's through a
    # .pth. Inside the sandbox that directory is not shown and the payload needs none of them.
    (purelib / "zz-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    shutil.copy(DRIVER, root / DRIVER.name)
    return env


@pytest.mark.parametrize("route", ROUTES)
def test_a_venv_installed_ashd_runs_sandboxes(installed_venv: Path, short_tmp: Path, route: str) -> None:
    require_isolation()
    python = installed_venv / "bin" / "python"
    driver = installed_venv.parent / DRIVER.name
    result = subprocess.run([str(python), "-I", str(driver), str(short_tmp / "data"), route],
                            cwd=installed_venv.parent, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["returncode"] == 0, out["log"]
    inside = json.loads(out["log"].strip().splitlines()[-1])
    assert Path(inside["ashd"]).is_relative_to(installed_venv), inside
    assert inside["prefix"] == str(installed_venv)
