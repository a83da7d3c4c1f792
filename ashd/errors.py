"""The domain's error tree. Domain code raises these; one HTTP middleware maps them to ApiError.

Nothing here imports aiohttp: the status code is data carried by the class, so `actors/`,
`sandboxing/` and `storage/` can say what went wrong without knowing about HTTP.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error a client may see. `message` must be actionable by a person."""

    status_code = 500

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(ServiceError):
    status_code = 400


class Unauthorized(ServiceError):
    status_code = 401


class NotFound(ServiceError):
    status_code = 404


class MethodNotAllowed(ServiceError):
    status_code = 405


class Conflict(ServiceError):
    status_code = 409


class Gone(ServiceError):
    status_code = 410


class PayloadTooLarge(ServiceError):
    status_code = 413


class QuotaExceeded(ServiceError):
    """A tenant reached one of its storage limits (a count or a total); deleting frees room."""

    status_code = 409


class RateLimited(ServiceError):
    status_code = 429


class SandboxError(ServiceError):
    """A sandbox could not be created, started or reached."""

    status_code = 500


class StorageError(ServiceError):
    status_code = 500


class StorageFull(StorageError):
    """The server's data disk (or the database's disk) has no room for a write: 507."""

    status_code = 507


class DiskQuotaExceeded(ServiceError):
    """Files do not fit in a sandbox's disk quota (a larger `diskMb` would help)."""

    status_code = 507


class DatabaseUnavailable(StorageError):
    """The database cannot be reached (connection refused, lost, shutting down): 503."""

    status_code = 503


class CapacityError(ServiceError):
    """No sandbox can be had: capacity reached and nothing evictable, or no runner."""

    status_code = 503


class Unavailable(ServiceError):
    """A component did not answer in time (actor ask timeout, shutting down)."""

    status_code = 503


class ConfigError(Exception):
    """A setting has a bad value; raised at start, names the variable and what it accepts."""
