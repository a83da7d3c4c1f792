"""OpenAPI paths and schemas: webhooks (docs/webhooks.md)."""

from __future__ import annotations

from typing import Any

from ashd.http._openapi_common import body, op, path_param, query, reply, wrapped
from ashd.http._openapi_schemas import BOOL, INT, NULL_STR, NULL_TIME, TIME, UUID, Schema, arr, obj, ref
from ashd.storage import WEBHOOK_EVENTS

EVENT: Schema = {"type": "string", "enum": list(WEBHOOK_EVENTS)}
URL: Schema = {"type": "string", "format": "uri", "maxLength": 2048,
               "description": "http(s) URL that receives the deliveries. Public addresses only unless the "
                              "operator allows others (SERVICE_WEBHOOK_ALLOW, SERVICE_SANDBOX_EGRESS_ALLOW)"}
EVENTS: Schema = {**arr(EVENT), "minItems": 1, "description": "the events this hook receives"}
DESCRIPTION: Schema = {"type": ["string", "null"], "maxLength": 1000}

SCHEMAS: dict[str, Schema] = {
    "Webhook": obj({
        "id": UUID, "url": {"type": "string"}, "events": arr(EVENT), "description": NULL_STR, "enabled": BOOL,
        "createdAt": TIME, "updatedAt": TIME,
    }, ("id", "url", "events", "enabled", "createdAt", "updatedAt")),
    "NewWebhook": obj({
        "webhook": ref("Webhook"),
        "secret": {"type": "string", "description": "signing secret (HMAC-SHA256), shown only here"},
    }, ("webhook", "secret")),
    "WebhookDelivery": obj({
        "id": UUID, "webhookId": UUID, "event": {"type": "string"},
        "status": {"type": "string", "enum": ["pending", "sending", "delivered", "failed"]},
        "attempts": INT, "lastStatusCode": {"type": ["integer", "null"]}, "lastError": NULL_STR,
        "nextAttemptAt": NULL_TIME, "createdAt": TIME, "updatedAt": TIME, "deliveredAt": NULL_TIME,
    }, ("id", "webhookId", "event", "status", "attempts", "createdAt", "updatedAt")),
    "CreateWebhookRequest": obj({"url": URL, "events": EVENTS, "description": DESCRIPTION, "enabled": BOOL},
                                ("url", "events")),
    "PatchWebhookRequest": obj({"url": URL, "events": EVENTS, "description": DESCRIPTION, "enabled": BOOL}),
}

HOOK_ID = path_param("id", "webhook id", fmt="uuid")
WEBHOOK = wrapped("webhook", ref("Webhook"))
_URL_400 = ("400: the URL is not http(s), carries credentials, does not resolve, or resolves to a loopback, "
            "private, link-local or other non-public address the operator has not allowed; or an event is "
            "unknown.")

PATHS: dict[str, dict[str, Any]] = {
    "/api/webhooks": {
        "post": op("createWebhook", "Register a webhook (its signing secret is shown once)", "webhooks",
                   {201: reply("Registered", ref("NewWebhook"))}, errors=(400, 409),
                   description=_URL_400 + " 409: the tenant has 50 webhooks.",
                   request=body(ref("CreateWebhookRequest"))),
        "get": op("listWebhooks", "List the tenant's webhooks", "webhooks",
                  {200: reply("Webhooks, oldest first", wrapped("webhooks", ref("Webhook"), many=True))}),
    },
    "/api/webhooks/{id}": {
        "get": op("getWebhook", "Get a webhook", "webhooks", {200: reply("The webhook", WEBHOOK)},
                  errors=(404,), params=[HOOK_ID]),
        "patch": op("patchWebhook", "Change a webhook's url, events, description or enabled", "webhooks",
                    {200: reply("The changed webhook", WEBHOOK)}, errors=(400, 404), params=[HOOK_ID],
                    description=_URL_400, request=body(ref("PatchWebhookRequest"))),
        "delete": op("deleteWebhook", "Delete a webhook and its delivery records", "webhooks",
                     {204: reply("Deleted")}, errors=(404,), params=[HOOK_ID]),
    },
    "/api/webhooks/{id}/deliveries": {
        "get": op("listWebhookDeliveries", "Recent deliveries of a webhook, newest first", "webhooks",
                  {200: reply("Deliveries", wrapped("deliveries", ref("WebhookDelivery"), many=True))},
                  errors=(400, 404), params=[
                      HOOK_ID, query("limit", {**INT, "minimum": 1, "maximum": 500, "default": 50}, "page size")]),
    },
    "/api/webhooks/{id}/test": {
        "post": op("testWebhook", "Send a `webhook.test` delivery to this webhook now", "webhooks",
                   {202: reply("Stored for delivery; follow it in the deliveries list",
                               obj({"deliveryId": UUID}, ("deliveryId",)))}, errors=(404, 409), params=[HOOK_ID],
                   description="409: the webhook is disabled."),
    },
}
