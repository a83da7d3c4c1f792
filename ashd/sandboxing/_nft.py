"""The `nft` command: apply a script atomically, list and delete tables.

The binary (Debian package `nftables`, installed by scripts/_env.sh) speaks the kernel's nftables
netlink protocol; every script it is given is one kernel transaction, so a ruleset is either all
in place or not at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from ashd.errors import SandboxError

NFT_TIMEOUT = 30.0
_TABLE_LINE = re.compile(r"^table (\w+) (\S+)$")


def nft_path() -> str | None:
    return shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(args: list[str], script: str | None = None) -> str:
    nft = nft_path()
    if nft is None:
        raise SandboxError("networked sandboxes need nftables: install the `nftables` package "
                           "(scripts/_env.sh does) or turn sandbox network off")
    proc = subprocess.run([nft, *args], input=script, capture_output=True, text=True, timeout=NFT_TIMEOUT,
                          check=False)
    if proc.returncode != 0:
        raise SandboxError(f"nft {' '.join(args)} failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def apply(script: str) -> None:
    _run(["-f", "-"], script)


def tables(family: str = "inet") -> list[str]:
    names = []
    for line in _run(["list", "tables", family]).splitlines():
        m = _TABLE_LINE.match(line.strip())
        if m and m.group(1) == family:
            names.append(m.group(2))
    return names


def delete_table(name: str, family: str = "inet") -> None:
    # "add" then "delete" in one transaction: no error when the table is already gone.
    apply(f"table {family} {name}\ndelete table {family} {name}\n")
