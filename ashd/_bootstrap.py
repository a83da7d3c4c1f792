"""First-start work: the data dir, the API key of tenant `default` and the internal secret.

Generated secrets go into files of the data dir (mode 0600), never into a log stream.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from ashd.config import Settings
from ashd.errors import ConfigError
from ashd.storage import DEFAULT_TENANT, ENV_SOURCE, ApiKeys

log = logging.getLogger(__name__)
INITIAL_KEY_FILE = "initial-api-key"
INTERNAL_SECRET_FILE = "internal-secret"  # noqa: S105 - a file name, not a secret
# Shorter operator-set secrets are accepted (so a rollout is never blocked) but reported at start.
MIN_SECRET_CHARS = 16
# A SERVICE_API_KEY is a bearer key for tenant `default` that anyone who reaches the port can try.
MIN_SAFE_KEY_CHARS = 32
MIN_DISTINCT_KEY_CHARS = 10


def prepare_data_dir(settings: Settings) -> Path:
    path = settings.data_path
    path.mkdir(parents=True, exist_ok=True)
    # The data dir holds the database, keys and every workspace: nobody else may look inside.
    os.chmod(path, 0o700)
    return path


def _write_secret_file(path: Path, value: str) -> bool:
    """Create `path` (0600) holding `value`; False when it already exists (another start won)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return True


def _read_secret_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} must be a regular file holding the internal secret")
        if st.st_mode & 0o077:
            # Someone loosened it: close it again rather than serve with a readable secret.
            os.fchmod(fh.fileno(), 0o600)
            log.warning("the internal secret file was readable by others; mode set back to 0600",
                        extra={"file": str(path)})
        value = fh.read().strip()
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(f"{path} holds no usable internal secret (at least {MIN_SECRET_CHARS} characters); "
                          "remove the file to generate a new one, or set SERVICE_INTERNAL_SECRET")
    return value


def ensure_internal_secret(settings: Settings) -> str:
    """The secret every `/api/internal/*` request must carry: SERVICE_INTERNAL_SECRET, else the one
    generated on first start into `<data dir>/internal-secret`. The value is never logged."""
    if settings.internal_secret:
        if len(settings.internal_secret) < MIN_SECRET_CHARS:
            log.warning("SERVICE_INTERNAL_SECRET is shorter than %d characters and could be guessed; "
                        "use a long random value (e.g. `openssl rand -hex 32`)", MIN_SECRET_CHARS)
        return settings.internal_secret
    path = settings.data_path / INTERNAL_SECRET_FILE
    if _write_secret_file(path, secrets.token_urlsafe(32)):
        log.info("generated the internal secret for /api/internal/*", extra={"secretFile": str(path)})
    return _read_secret_file(path)


def warn_if_weak(key: str) -> bool:
    """Warn (never fail: the operator chose it) about a SERVICE_API_KEY that could be guessed.
    Generated keys carry 240 random bits; 32 characters of a random alphabet carry at least 128."""
    if len(key) >= MIN_SAFE_KEY_CHARS and len(set(key)) >= MIN_DISTINCT_KEY_CHARS:
        return False
    log.warning(
        "SERVICE_API_KEY is too short or too repetitive to be safe: anyone who can reach the server "
        "could guess it. Use at least %d random characters (for example `openssl rand -base64 32`), "
        "or unset it and use the generated key", MIN_SAFE_KEY_CHARS,
        extra={"length": len(key), "distinctCharacters": len(set(key)), "minimumLength": MIN_SAFE_KEY_CHARS},
    )
    return True


async def ensure_api_keys(settings: Settings, keys: ApiKeys) -> Path | None:
    """Register SERVICE_API_KEY; on a first start with no key anywhere, generate one into a file.

    A key that an earlier SERVICE_API_KEY registered and the setting no longer names is removed:
    changing (or unsetting) the setting is how that key is revoked. Returns the path of the initial
    key file when one exists. Keys themselves are never logged.
    """
    if settings.api_key:
        warn_if_weak(settings.api_key)
    keep = await keys.add(settings.api_key, DEFAULT_TENANT, "SERVICE_API_KEY", ENV_SOURCE) if settings.api_key else None
    retired = await keys.retire_env_keys(keep)
    if retired:
        log.info("revoked the key of a previous SERVICE_API_KEY value", extra={"count": retired})
    key_file = settings.data_path / INITIAL_KEY_FILE
    if await keys.count() == 0:
        _, key = await keys.mint(DEFAULT_TENANT, "initial key", source="generated")
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
        log.info("generated the first API key for tenant default", extra={"keyFile": str(key_file)})
    return key_file if key_file.exists() else None


SERVER_ID_FILE = "server-id"


def sandbox_owner_id(settings: Settings) -> str:
    """The id this process stamps on the sessions whose sandboxes it hosts, stable across restarts:
    a runner's SERVICE_RUNNER_ID, else SERVICE_SERVER_ID, else `srv-<random>` generated once into
    `<data dir>/server-id`. Its start-up sweep pauses only sessions with this owner."""
    if settings.runner_id:
        return settings.runner_id
    if settings.server_id:
        return settings.server_id
    path = settings.data_path / SERVER_ID_FILE
    if _write_secret_file(path, f"srv-{secrets.token_hex(8)}"):
        log.info("generated this server's id", extra={"serverIdFile": str(path)})
    value = path.read_text().strip()
    if not value:
        raise ConfigError(f"{path} is empty; remove it to generate a new server id, or set SERVICE_SERVER_ID")
    return value
