"""Copying an agent folder into a workspace: links stay links, special files and skipped names stay
out, no setuid bit travels, and a folder reached through a link is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ashd.errors import SandboxError
from ashd.sandboxing._agent_setup import copy_agent


def test_copy_keeps_links_as_links_and_skips_what_it_must(tmp_path: Path) -> None:
    src = tmp_path / "agent"
    (src / "sub").mkdir(parents=True)
    (src / "AGENT.md").write_text("prompt")
    (src / "sub" / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "sub" / "tool.sh", 0o4755)
    (src / "node_modules").mkdir()
    (src / "node_modules" / "x.js").write_text("x")
    os.symlink("/etc/shadow", src / "outside")
    os.symlink("sub/tool.sh", src / "inside")
    os.mkfifo(src / "pipe")
    dst = tmp_path / "ws"
    copy_agent(src, dst)
    assert (dst / "AGENT.md").read_text() == "prompt"
    assert os.readlink(dst / "outside") == "/etc/shadow"  # copied as a link, never followed
    assert os.readlink(dst / "inside") == "sub/tool.sh"
    assert stat.S_IMODE((dst / "sub" / "tool.sh").stat().st_mode) == 0o755  # no setuid bit
    assert not (dst / "node_modules").exists() and not (dst / "pipe").exists()


def test_a_folder_behind_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "AGENT.md").write_text("p")
    os.symlink(real, tmp_path / "link")
    with pytest.raises(SandboxError, match="redeploy"):
        copy_agent(tmp_path / "link", tmp_path / "ws")
    with pytest.raises(SandboxError, match="no AGENT.md"):
        (real / "AGENT.md").unlink()
        copy_agent(real, tmp_path / "ws2")
