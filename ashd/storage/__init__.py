"""Storage: models, engine, migrations and repositories. Leaves of the call graph."""

from ashd.storage._agent_paths import DEFAULT_TENANT, SYSTEM_PROMPT_FILE, AgentFolderReader, open_dir, roots_warning
from ashd.storage._agents import KEEP, AgentFile, Agents
from ashd.storage._apikeys import ENV_SOURCE, ApiKeys, KeyIdentity
from ashd.storage._credentials import Credentials
from ashd.storage._crypto import Cipher, load_or_create_key
from ashd.storage._database import Database
from ashd.storage._diskspace import MIB, DataDirSpace, DiskSpace
from ashd.storage._failures import (
    is_no_space,
    log_failure,
    storage_failure,
)
from ashd.storage._files import (
    DirectoryReader,
    FileSource,
    check_raw_size,
    check_relative_path,
    content_disposition,
    mime_type,
)
from ashd.storage._holdings import TenantStorage
from ashd.storage._model_calls import ModelCallRecord, list_model_calls, session_spend, store_model_calls, tenant_spend
from ashd.storage._models import (
    Agent,
    ApiKey,
    Attachment,
    Base,
    Credential,
    Message,
    Meta,
    QueueItem,
    Runner,
    Session,
    SessionEvent,
    UsageEvent,
    iso,
    new_id,
    utcnow,
)
from ashd.storage._runners import Runners
from ashd.storage._sequence import allocate
from ashd.storage._sessions import EventRecord, Sessions, session_json
from ashd.storage._snapshots import (
    DEFAULT_KEEP,
    PARTIAL_PREFIX,
    SnapshotBoard,
    SnapshotInfo,
    SnapshotTooLarge,
    bundle_budget,
    bundle_workspace,
    info_for,
    latest_local,
    prune,
    remove_stale_partials,
    restore_bundle,
    restore_workspace,
    snapshot_workspace,
)
from ashd.storage._snapshots_reader import SnapshotReader
from ashd.storage._snapshots_stores import LocalSnapshotStore, SnapshotStore, store_from_url
from ashd.storage._usage import UsageFilter, list_usage, parse_time, record_usage, usage_stats
from ashd.storage._workspace_writes import write_files

__all__ = [
    "DEFAULT_KEEP",
    "DEFAULT_TENANT",
    "ENV_SOURCE",
    "KEEP",
    "MIB",
    "PARTIAL_PREFIX",
    "SYSTEM_PROMPT_FILE",
    "Agent",
    "AgentFile",
    "AgentFolderReader",
    "Agents",
    "ApiKey",
    "ApiKeys",
    "Attachment",
    "Base",
    "Cipher",
    "Credential",
    "Credentials",
    "DataDirSpace",
    "Database",
    "DirectoryReader",
    "DiskSpace",
    "EventRecord",
    "FileSource",
    "KeyIdentity",
    "LocalSnapshotStore",
    "Message",
    "Meta",
    "ModelCallRecord",
    "QueueItem",
    "Runner",
    "Runners",
    "Session",
    "SessionEvent",
    "Sessions",
    "SnapshotBoard",
    "SnapshotInfo",
    "SnapshotReader",
    "SnapshotStore",
    "SnapshotTooLarge",
    "TenantStorage",
    "UsageEvent",
    "UsageFilter",
    "allocate",
    "bundle_budget",
    "bundle_workspace",
    "check_raw_size",
    "check_relative_path",
    "content_disposition",
    "info_for",
    "is_no_space",
    "iso",
    "latest_local",
    "list_model_calls",
    "list_usage",
    "load_or_create_key",
    "log_failure",
    "mime_type",
    "new_id",
    "open_dir",
    "parse_time",
    "prune",
    "record_usage",
    "remove_stale_partials",
    "restore_bundle",
    "restore_workspace",
    "roots_warning",
    "session_json",
    "session_spend",
    "snapshot_workspace",
    "storage_failure",
    "store_from_url",
    "store_model_calls",
    "tenant_spend",
    "usage_stats",
    "utcnow",
    "write_files",
]
