"""Counts the requests in flight for `Activity`: the background work that can wait, waits for them."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from ashd.actors import Activity


def activity_middleware(activity: Activity) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        activity.begin()
        try:
            return await handler(request)
        finally:
            activity.end()

    return middleware
