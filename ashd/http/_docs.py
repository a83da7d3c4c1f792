"""GET /openapi.json and GET /docs: Swagger UI served from the installed `swagger-ui-bundle`
package, so the documentation works without internet access (no CDN)."""

from __future__ import annotations

import functools
from pathlib import Path

import swagger_ui_bundle
from aiohttp import web

from ashd.compact_json import dumps
from ashd.errors import NotFound
from ashd.http._openapi import openapi_document

routes = web.RouteTableDef()

# Only what the page needs: the package's own index.html points at a public demo API.
_ASSETS = frozenset({
    "swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "favicon-32x32.png",
    "favicon-16x16.png",
})

# Relative URLs: the page keeps working behind a reverse proxy that mounts ashd under a prefix.
_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>ashd API</title>
  <link rel="stylesheet" href="docs/assets/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/assets/swagger-ui-bundle.js"></script>
  <script src="docs/assets/swagger-ui-standalone-preset.js"></script>
  <script>
    window.ui = SwaggerUIBundle({
      url: "openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
      layout: "StandaloneLayout"
    });
  </script>
</body>
</html>
"""


@functools.cache
def _openapi_text() -> str:
    return dumps(openapi_document())


@routes.get("/openapi.json")
async def openapi(_request: web.Request) -> web.Response:
    return web.Response(text=_openapi_text(), content_type="application/json")


@routes.get("/docs")
async def docs(_request: web.Request) -> web.Response:
    return web.Response(text=_PAGE, content_type="text/html")


@routes.get("/docs/assets/{file}")
async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["file"]
    if name not in _ASSETS:
        raise NotFound(f"no documentation asset {name!r}")
    path = Path(swagger_ui_bundle.swagger_ui_path) / name
    return web.FileResponse(path, headers={"Cache-Control": "public, max-age=86400"})
