"""First-start work: the data dir, and the API key of tenant `default`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ashd.config import Settings
from ashd.storage._apikeys import DEFAULT_TENANT, ApiKeys

log = logging.getLogger(__name__)
INITIAL_KEY_FILE = "initial-api-key"


def prepare_data_dir(settings: Settings) -> Path:
    path = settings.data_path
    path.mkdir(parents=True, exist_ok=True)
    # The data dir holds the database, keys and every workspace: nobody else may look inside.
    os.chmod(path, 0o700)
    return path


async def ensure_api_keys(settings: Settings, keys: ApiKeys) -> Path | None:
    """Register SERVICE_API_KEY; on a first start with no key anywhere, generate one into a file.

    Returns the path of the initial key file when one exists. The key itself is never logged.
    """
    if settings.api_key:
        await keys.add(settings.api_key, DEFAULT_TENANT, "SERVICE_API_KEY", "env")
    key_file = settings.data_path / INITIAL_KEY_FILE
    if await keys.count() == 0:
        _, key = await keys.mint(DEFAULT_TENANT, "initial key", source="generated")
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
        log.info("generated the first API key for tenant default", extra={"keyFile": str(key_file)})
    return key_file if key_file.exists() else None
