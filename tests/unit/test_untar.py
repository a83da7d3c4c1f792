"""Safe extraction on every admitted Python (3.11.2 has no tarfile filters): the `data` filter's
refusals, and no write ever through a link, whatever the archive or the destination holds."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from ashd.storage import _untar
from tests.fixtures.files import write


def member(tf: tarfile.TarFile, name: str, *, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tf.addfile(info, io.BytesIO(data) if data else None)


def extract(archive: bytes, dest: Path) -> _untar.Outcome:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tf:
        return _untar.extract(tf, dest, keep=lambda rel: True)


def build(*entries: tuple[str, dict[str, object]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, attrs in entries:
            member(tf, name, **attrs)  # type: ignore[arg-type]
    return buf.getvalue()


def test_an_existing_link_in_the_destination_is_replaced_never_written_through(tmp_path: Path) -> None:
    write(tmp_path / "outside", "target.txt", "host file")
    dest = tmp_path / "ws"
    dest.mkdir()
    (dest / "notes.txt").symlink_to(tmp_path / "outside" / "target.txt")
    (dest / "dir_link").symlink_to(tmp_path / "outside", target_is_directory=True)

    out = extract(build(("notes.txt", {"data": b"from the snapshot"}),
                        ("dir_link/planted.txt", {"data": b"evil"})), dest)

    assert (tmp_path / "outside" / "target.txt").read_text() == "host file"
    assert sorted(os.listdir(tmp_path / "outside")) == ["target.txt"]
    assert not (dest / "notes.txt").is_symlink() and (dest / "notes.txt").read_text() == "from the snapshot"
    assert out.restored == ["notes.txt"] and "dir_link/planted.txt" in out.skipped[0]


def test_a_link_made_to_escape_by_a_later_link_is_removed(tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    out = extract(build(("a", {"type": tarfile.SYMTYPE, "linkname": "b/c/../.."}),
                        ("b", {"type": tarfile.SYMTYPE, "linkname": "."})), dest)
    assert not os.path.lexists(dest / "a") and (dest / "b").is_symlink()
    assert out.restored == ["b"] and "leads outside" in out.skipped[0]


def test_entries_below_a_link_are_refused_and_links_inside_are_kept(tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    out = extract(build(("src/app.py", {"data": b"print(1)\n", "mode": 0o755}),
                        ("alias", {"type": tarfile.SYMTYPE, "linkname": "src"}),
                        ("alias/extra.py", {"data": b"x"}),
                        ("hard.py", {"type": tarfile.LNKTYPE, "linkname": "src/app.py"})), dest)
    assert out.restored == ["src/app.py", "alias", "hard.py"]
    assert os.readlink(dest / "alias") == "src" and not (dest / "src" / "extra.py").exists()
    assert (dest / "hard.py").stat().st_ino == (dest / "src" / "app.py").stat().st_ino
    assert (dest / "src" / "app.py").stat().st_mode & 0o777 == 0o755


CASES = [
    ("plain.txt", {"data": b"x"}),
    ("/abs/leading.txt", {"data": b"x"}),
    ("../up.txt", {"data": b"x"}),
    ("a/../../up2.txt", {"data": b"x"}),
    ("abs_link", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}),
    ("rel_out", {"type": tarfile.SYMTYPE, "linkname": "../outside"}),
    ("deep/rel_ok", {"type": tarfile.SYMTYPE, "linkname": "../plain.txt"}),
    ("deep/rel_out", {"type": tarfile.SYMTYPE, "linkname": "../../x"}),
    ("hard_out", {"type": tarfile.LNKTYPE, "linkname": "/etc/passwd"}),
    ("hard_up", {"type": tarfile.LNKTYPE, "linkname": "../x"}),
    ("chr", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}),
    ("blk", {"type": tarfile.BLKTYPE}),
    ("fifo", {"type": tarfile.FIFOTYPE}),
    ("setuid", {"data": b"x", "mode": 0o6777}),
]


@pytest.mark.parametrize(("name", "attrs"), CASES, ids=[c[0] for c in CASES])
def test_refuses_what_the_data_filter_refuses(tmp_path: Path, name: str, attrs: dict[str, object]) -> None:
    """Same decisions as the standard library's `data` filter where the interpreter has one."""
    info = tarfile.TarInfo(name)
    for key, value in attrs.items():
        if key != "data":
            setattr(info, key, value)
    dest = str(tmp_path.resolve())
    try:
        _untar.check_member(info, dest)
        ours = "allowed"
    except _untar.Refused:
        ours = "refused"
    expected = {"../up.txt", "a/../../up2.txt", "abs_link", "rel_out", "deep/rel_out", "hard_out", "hard_up",
                "chr", "blk", "fifo"}
    assert ours == ("refused" if name in expected else "allowed")
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is not None:
        try:
            data_filter(info, dest)
            theirs = "allowed"
        except tarfile.FilterError:
            theirs = "refused"
        assert ours == theirs
