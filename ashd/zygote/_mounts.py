"""What the launcher and the fork server's child both need to know of a sandbox: who runs in it,
its host name, and the mount plan's entries as they cross the fork server's socket."""

from __future__ import annotations

from dataclasses import dataclass

SANDBOX_UID = 65534
SANDBOX_GID = 65534
HOSTNAME = "ashd-sandbox"


@dataclass(frozen=True)
class Mount:
    """kind: dir | ro-bind | bind | tmpfs | proc | dev | symlink (src is the link target)."""

    kind: str
    dest: str
    src: str = ""

    def to_json(self) -> list[str]:
        return [self.kind, self.dest, self.src]

    @classmethod
    def from_json(cls, item: list[str]) -> Mount:
        return cls(item[0], item[1], item[2])
