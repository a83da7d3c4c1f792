"""OpenAPI paths: the queue."""

from __future__ import annotations

from typing import Any

from ashd.http._openapi_common import body, op, path_param, query, reply, wrapped
from ashd.http._openapi_schemas import INT, QUEUE_STATUS, ref

ITEM_ID = path_param("id", "queue item id", fmt="uuid")
ITEM = wrapped("item", ref("QueueItem"))

PATHS: dict[str, dict[str, Any]] = {
    "/api/queue": {
        "post": op("enqueue", "Queue a prompt to run as a turn", "queue", {201: reply("Queued", ITEM)},
                   errors=(400, 409), request=body(ref("CreateQueueItemRequest")),
                   description="The prompt runs as a normal turn (stored, streamed to `GET …/stream`, metered) "
                               "in `sessionId`, or else in a new session of `agentName` that is paused after "
                               "the turn. Items run by priority (highest first), then oldest first. A failed "
                               "attempt is retried after 5 s, doubling up to 5 min, `maxRetries` times; then "
                               "the item is `failed` with the error."),
        "get": op("listQueue", "List the tenant's queue items", "queue",
                  {200: reply("Items, newest first", wrapped("items", ref("QueueItem"), many=True))},
                  errors=(400,), params=[
                      query("status", {"type": "string", "enum": QUEUE_STATUS}, "only items in this status"),
                      query("limit", {**INT, "minimum": 1, "maximum": 1000, "default": 50}, "page size"),
                  ]),
    },
    "/api/queue/stats": {
        "get": op("getQueueStats", "Count the tenant's queue items per status", "queue",
                  {200: reply("Counts", wrapped("stats", ref("QueueStats")))}),
    },
    "/api/queue/{id}": {
        "get": op("getQueueItem", "Get a queue item", "queue", {200: reply("The item", ITEM)}, errors=(404,),
                  params=[ITEM_ID]),
        "delete": op("cancelQueueItem", "Cancel a pending queue item", "queue",
                     {200: reply("The item, now `cancelled`", ITEM)}, errors=(400, 404), params=[ITEM_ID],
                     description="Only a `pending` item can be cancelled (400 otherwise): a running one finishes."),
    },
}
