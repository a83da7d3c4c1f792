"""Where snapshot tars are kept: a local directory, a shared mount (`file://`), or S3 (`s3://`).

Every store has the layout `<root or prefix>/<session id>/<key>` (key: see `_snapshots`), keeps the
newest `keep` snapshots per session, and never shows a partial object: directories get a partial
file renamed into place, and an S3 object becomes visible only once its upload completed.

S3 uses boto3's standard configuration: credentials from the AWS environment chain, endpoint from
`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (for MinIO, moto, Ceph ...), region from `AWS_REGION` /
`AWS_DEFAULT_REGION`. Store methods block; call them from an actor thread or an executor.
"""

from __future__ import annotations

import shutil
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ashd.errors import ConfigError, NotFound, StorageError
from ashd.storage._snapshots import (
    DEFAULT_KEEP,
    check_session_id,
    keys_to_prune,
    list_keys,
    newest_key,
    parse_key,
    prune,
    write_atomically,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef


class SnapshotStore(Protocol):
    """The interface every snapshot store offers. Keys are the snapshot file names."""

    description: str

    def put(self, session_id: str, local_tar_path: Path) -> str:
        """Store a snapshot file (named by its key); return the key."""
        ...

    def latest(self, session_id: str) -> str | None:
        """The newest stored key of the session, or None."""
        ...

    def get(self, session_id: str, key: str, dest_path: Path) -> None:
        """Copy one snapshot to `dest_path`, atomically; NotFound when it is not stored."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Remove every snapshot of the session; no error when there is none."""
        ...


def _check_key(key: str) -> str:
    if parse_key(key) is None:
        raise StorageError(f"not a snapshot key: {key!r} (expected <20 digits>-<count>.tar.gz)")
    return key


def _copy_into(src: Path, dest: Path) -> None:
    def write(raw: Any) -> None:
        with src.open("rb") as fh:
            shutil.copyfileobj(fh, raw, 1024 * 1024)

    write_atomically(dest.parent, write, lambda: dest.name)


class LocalSnapshotStore:
    """Snapshots under `<root>/<session id>/`; `root` is `<data dir>/snapshots` for the local store."""

    def __init__(self, root: Path, keep: int = DEFAULT_KEEP) -> None:
        self.root = root
        self.keep = keep
        self.description = str(root)

    def session_dir(self, session_id: str) -> Path:
        return self.root / check_session_id(session_id)

    def put(self, session_id: str, local_tar_path: Path) -> str:
        key = _check_key(local_tar_path.name)
        directory = self.session_dir(session_id)
        dest = directory / key
        try:
            already_there = dest.exists() and dest.samefile(local_tar_path)
            if not already_there:
                _copy_into(local_tar_path, dest)
            prune(directory, self.keep)
        except OSError as exc:
            raise StorageError(f"cannot store snapshot {key} in {directory}: {exc}") from exc
        return key

    def latest(self, session_id: str) -> str | None:
        return newest_key(list_keys(self.session_dir(session_id)))

    def get(self, session_id: str, key: str, dest_path: Path) -> None:
        src = self.session_dir(session_id) / _check_key(key)
        if not src.is_file():
            raise NotFound(f"snapshot {key} of session {session_id} is not in {self.description}")
        if dest_path.exists() and dest_path.samefile(src):
            return
        try:
            _copy_into(src, dest_path)
        except FileNotFoundError as exc:  # pruned by another writer meanwhile
            raise NotFound(f"snapshot {key} of session {session_id} is no longer stored") from exc

    def delete_session(self, session_id: str) -> None:
        shutil.rmtree(self.session_dir(session_id), ignore_errors=True)


class FileSnapshotStore(LocalSnapshotStore):
    """`file:///shared/path`: the local layout on a mount shared by several runners."""

    @classmethod
    def from_url(cls, url: str, keep: int = DEFAULT_KEEP) -> FileSnapshotStore:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path:
            raise ConfigError(f"snapshot URL {url!r}: expected file:///absolute/path")
        store = cls(Path(urllib.parse.unquote(parsed.path)), keep)
        store.description = url
        return store


class S3SnapshotStore:
    """`s3://bucket/prefix`: objects `<prefix>/<session id>/<key>`."""

    def __init__(
        self, bucket: str, prefix: str = "", keep: int = DEFAULT_KEEP, client: S3Client | None = None
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.keep = keep
        self.description = f"s3://{bucket}/{self.prefix}"
        self._client = client
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, keep: int = DEFAULT_KEEP) -> S3SnapshotStore:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ConfigError(f"snapshot URL {url!r}: expected s3://bucket/prefix")
        return cls(parsed.netloc, parsed.path, keep)

    @property
    def client(self) -> S3Client:
        # boto3 clients are thread-safe once made; making one is not, and it costs ~50 ms.
        with self._lock:
            if self._client is None:
                import boto3

                self._client = boto3.session.Session().client("s3")
            return self._client

    def _dir(self, session_id: str) -> str:
        sid = check_session_id(session_id)
        return f"{self.prefix}/{sid}/" if self.prefix else f"{sid}/"

    def _keys(self, session_id: str) -> list[str]:
        directory = self._dir(session_id)
        names: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=directory):
            for obj in page.get("Contents", []):
                name = obj["Key"][len(directory):]
                if parse_key(name) is not None:
                    names.append(name)
        return sorted(names)

    def _delete(self, object_keys: list[str]) -> None:
        for start in range(0, len(object_keys), 1000):
            batch: list[ObjectIdentifierTypeDef] = [{"Key": k} for k in object_keys[start:start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def put(self, session_id: str, local_tar_path: Path) -> str:
        key = _check_key(local_tar_path.name)
        directory = self._dir(session_id)
        try:
            self.client.upload_file(str(local_tar_path), self.bucket, directory + key)
            old = keys_to_prune(self._keys(session_id), self.keep)
            self._delete([directory + k for k in old])
        except Exception as exc:
            raise StorageError(f"cannot upload snapshot {key} to {self.description}: {exc}") from exc
        return key

    def latest(self, session_id: str) -> str | None:
        try:
            return newest_key(self._keys(session_id))
        except Exception as exc:
            raise StorageError(f"cannot list snapshots in {self.description}: {exc}") from exc

    def get(self, session_id: str, key: str, dest_path: Path) -> None:
        from botocore.exceptions import ClientError

        object_key = self._dir(session_id) + _check_key(key)

        def write(raw: Any) -> None:
            self.client.download_fileobj(self.bucket, object_key, raw)

        try:
            write_atomically(dest_path.parent, write, lambda: dest_path.name)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey"):
                raise NotFound(
                    f"snapshot {key} of session {session_id} is not in {self.description}"
                ) from exc
            raise StorageError(f"cannot download snapshot {key} from {self.description}: {exc}") from exc
        except NotFound:
            raise
        except Exception as exc:
            raise StorageError(f"cannot download snapshot {key} from {self.description}: {exc}") from exc

    def delete_session(self, session_id: str) -> None:
        directory = self._dir(session_id)
        try:
            self._delete([directory + k for k in self._keys(session_id)])
        except Exception as exc:
            raise StorageError(f"cannot delete snapshots in {self.description}: {exc}") from exc


def store_from_url(url: str, keep: int = DEFAULT_KEEP) -> SnapshotStore:
    """The store of `SERVICE_SNAPSHOT_URL`: `file:///path` or `s3://bucket/prefix`."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "file":
        return FileSnapshotStore.from_url(url, keep)
    if scheme == "s3":
        return S3SnapshotStore.from_url(url, keep)
    raise ConfigError(f"snapshot URL {url!r}: expected s3://bucket/prefix or file:///path")
