"""Host-side preparation of a workspace for a session: the agent folder copied in, the session's
system prompt and MCP servers applied to the copy only. Runs in actor/worker threads (blocking IO).
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from pathlib import Path
from typing import Any

from ashd.errors import SandboxError
from ashd.storage import open_dir

_SKIP = ("node_modules", ".git", "__pycache__", "*.sock", "*.pid")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_COPY_CHUNK = 1024 * 1024


def copy_agent(agent_dir: Path, workspace: Path) -> None:
    """Copy the agent folder into a workspace without ever following a symlink of the source.

    The folder is opened component by component (a name swapped for a link since the deploy is
    refused), then walked by descriptor: directories and files are opened relative to their parent
    with O_NOFOLLOW, symlinks are copied as links (they resolve inside the sandbox, against its own
    files), and FIFOs, sockets and devices are skipped (a FIFO would block the copy).
    """
    try:
        fd = open_dir(agent_dir)
    except OSError as exc:
        raise SandboxError("The agent's folder is no longer at the path it was deployed from (moved, removed "
                           "or replaced by a link); redeploy the agent") from exc
    try:
        try:
            st = os.stat("AGENT.md", dir_fd=fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise SandboxError("The agent's folder has no AGENT.md; redeploy the agent")
        _copy_dir(fd, workspace)
    finally:
        os.close(fd)


def small_agent(agent_dir: Path, max_entries: int, max_bytes: int) -> bool:
    """Whether the copy of `agent_dir` holds at most `max_entries` entries and `max_bytes` bytes of
    files: a copy short enough for the event loop's thread (a create handled there). A walk of the
    names the copy takes, stopped as soon as either is over; False when the folder cannot be read
    (the copy itself says why)."""
    entries, size = 0, 0
    stack = [str(agent_dir)]
    try:
        while stack:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if _skipped(entry.name):
                        continue
                    entries += 1
                    if entries > max_entries:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_size
                        if size > max_bytes:
                            return False
    except OSError:
        return False
    return True


def _skipped(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _SKIP)


def _copy_dir(src_fd: int, dst: Path) -> None:
    if dst.is_symlink():
        dst.unlink()
    dst.mkdir(exist_ok=True)
    with os.scandir(src_fd) as it:
        names = sorted(e.name for e in it)
    for name in names:
        if _skipped(name):
            continue
        try:
            st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while copying
        target = dst / name
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
            try:
                _copy_dir(sub, target)
            finally:
                os.close(sub)
            os.chmod(target, stat.S_IMODE(st.st_mode) & 0o777 | 0o700)
        elif stat.S_ISLNK(st.st_mode):
            link = os.readlink(name, dir_fd=src_fd)
            if target.is_symlink() or target.is_file():
                target.unlink()
            os.symlink(link, target)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(src_fd, name, target)


def _copy_file(src_fd: int, name: str, target: Path) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return  # swapped for something else since the listing
        if target.is_symlink():
            target.unlink()
        # Permission bits only: no setuid/setgid/sticky bits travel into a workspace.
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(st.st_mode) & 0o777)
        try:
            while chunk := os.read(fd, _COPY_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def apply_session_config(workspace: Path, system_prompt: str | None, mcp_servers: dict[str, Any] | None) -> None:
    if system_prompt is not None:
        target = workspace / "AGENT.md"
        if target.is_symlink():
            target.unlink()
        target.write_text(system_prompt, encoding="utf-8")
    if mcp_servers:
        path = workspace / ".mcp.json"
        merged: dict[str, Any] = {}
        if path.is_file() and not path.is_symlink():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(loaded, dict):
                    merged = loaded
            except (OSError, ValueError):
                merged = {}
        existing = merged.get("mcpServers")
        servers: dict[str, Any] = existing if isinstance(existing, dict) else {}
        merged["mcpServers"] = {**servers, **mcp_servers}  # the session wins on an equal key
        if path.is_symlink():
            path.unlink()
        path.write_text(json.dumps(merged, indent=2), encoding="utf-8")


def chown_tree(root: Path, uid: int | None, gid: int | None) -> None:
    if uid is None or os.geteuid() != 0:
        return
    g = gid if gid is not None else uid
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, g, follow_symlinks=False)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, g, follow_symlinks=False)


def prepare_workspace(agent_dir: Path | None, workspace: Path, system_prompt: str | None,
                      mcp_servers: dict[str, Any] | None, owner: tuple[int, int] | None) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    if agent_dir is not None:
        copy_agent(agent_dir, workspace)
    apply_session_config(workspace, system_prompt, mcp_servers)
    if owner is not None:
        chown_tree(workspace, owner[0], owner[1])
