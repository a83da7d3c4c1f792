"""Below the data disk's reserve, requests that would add stored data are refused before they start.

The rule is by shape, so routes added later (attachments, file uploads, workspace bundles) are
covered without a line here: every POST, PUT or PATCH under `/api/` adds data, except the actions
below, which save or free what exists (pause and stop snapshot a workspace the tenant would
otherwise lose; interrupt ends a turn) and the runner endpoints (`/api/internal/*`, operator-owned
heartbeats that keep the cluster alive). DELETE is never refused: it is how space comes back.
"""

from __future__ import annotations

import re

from aiohttp import web

from ashd.http._keys import COMPONENTS

_ADDS_DATA = frozenset({"POST", "PUT", "PATCH"})
_EXEMPT = re.compile(r"^/api/(internal/.*|sessions/[^/]+/(pause|stop|interrupt))$")
_WHAT = (
    (re.compile(r"^/api/sessions$"), "a new session"),
    (re.compile(r"^/api/sessions/[^/]+/messages$"), "a new message"),
    (re.compile(r"^/api/sessions/[^/]+/attachments$"), "a new attachment"),
    (re.compile(r"^/api/sessions/[^/]+/resume$"), "resuming a session"),
    (re.compile(r"^/api/agents"), "deploying or changing an agent"),
)


def _what(path: str) -> str:
    for pattern, what in _WHAT:
        if pattern.match(path):
            return what
    return "this request"


def guard_storage(request: web.Request) -> None:
    """507 for a request that adds data while the data disk is below its reserve."""
    if request.method in _ADDS_DATA and request.path.startswith("/api/") and not _EXEMPT.match(request.path):
        space = request.app[COMPONENTS].data_space
        if space is not None:
            space.require_room(lambda: _what(request.path))  # matched only for a refusal's message
