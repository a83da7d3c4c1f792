"""HTTP front end (aiohttp): routes per resource, auth, errors, SSE, OpenAPI."""

from ashd.http._app import build_app
from ashd.http._health import configuration_warnings
from ashd.http._runner_api import RunnerApiState, build_runner_app

__all__ = ["RunnerApiState", "build_app", "build_runner_app", "configuration_warnings"]
