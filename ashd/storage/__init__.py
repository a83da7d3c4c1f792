"""Storage: models, engine, migrations and repositories. Leaves of the call graph."""

from ashd.storage._database import Database
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
from ashd.storage._sequence import allocate

__all__ = [
    "Agent",
    "ApiKey",
    "Attachment",
    "Base",
    "Credential",
    "Database",
    "Message",
    "Meta",
    "QueueItem",
    "Runner",
    "Session",
    "SessionEvent",
    "UsageEvent",
    "allocate",
    "iso",
    "new_id",
    "utcnow",
]
