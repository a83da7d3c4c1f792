"""HTTP front end (aiohttp): routes per resource, auth, errors, SSE, OpenAPI."""

from ashd.http._app import build_app
from ashd.http._health import configuration_warnings

__all__ = ["build_app", "configuration_warnings"]
