"""POST /api/sessions/{id}/fork: a new session with the parent's workspace and conversation."""

from __future__ import annotations

from aiohttp import web

from ashd.http._json import ok, tenant
from ashd.http._keys import COMPONENTS, backend
from ashd.storage import Sessions, new_id

routes = web.RouteTableDef()


@routes.post("/api/sessions/{id}/fork")
async def fork_session(request: web.Request) -> web.Response:
    components = request.app[COMPONENTS]
    ten, parent_id = tenant(request), request.match_info["id"]
    parent = await Sessions(components.db).get(ten, parent_id)  # 404 before anything is written
    await components.tenant_storage.require_room(ten, "a forked session")
    child_id = new_id()
    # The session's own environment is encrypted bound to its id: the child gets its own copy.
    cipher = components.cipher
    env = cipher.decrypt_json(parent.env_ciphertext, parent_id.encode()) if parent.env_ciphertext else None
    encrypted = cipher.encrypt_json(env, child_id.encode()) if env else None
    session = await backend(request).fork(ten, parent_id, child_id, encrypted)
    return ok({"session": session}, status=201, headers={"Location": f"/api/sessions/{child_id}"})
