"""The OpenAPI document is valid, describes exactly the routes served, and /docs works offline."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from openapi_spec_validator import validate

from ashd import API_VERSION
from tests.conftest import Api

_PARAM = re.compile(r"\{[^}]*\}")
_IGNORED_METHODS = {"HEAD", "OPTIONS", "*"}


def normalise(path: str) -> str:
    """`/a/{id}/files/{path:.*}` and `/a/{sid}/files/{path}` both become `/a/{}/files/{}`."""
    return _PARAM.sub("{}", path)


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    served = set()
    for route in app.router.routes():
        if route.method in _IGNORED_METHODS or isinstance(route.resource, web.StaticResource):
            continue
        assert route.resource is not None
        served.add((route.method, normalise(route.resource.canonical)))
    return served


def documented_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    methods = {"get", "put", "post", "delete", "patch"}
    return {(m.upper(), normalise(path)) for path, item in doc["paths"].items() for m in item if m in methods}


async def fetch_document(api: Api) -> dict[str, Any]:
    resp = await api.client.get("/openapi.json")  # public: no key
    assert resp.status == 200
    assert resp.content_type == "application/json"
    doc: dict[str, Any] = await resp.json()
    return doc


async def test_document_is_valid_openapi_31(api: Api) -> None:
    doc = await fetch_document(api)
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["version"] == API_VERSION == "0.1.0"
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearerApiKey"]["scheme"] == "bearer"
    assert "internalSecret" in schemes
    for name in ("Agent", "Session", "Message", "SessionEvent", "Credential", "UsageEvent", "UsageStats",
                 "FileEntry", "PoolStats", "HealthResponse", "ApiError", "McpServerConfig"):
        assert name in doc["components"]["schemas"], name


async def test_document_agrees_with_the_router(api: Api) -> None:
    doc = await fetch_document(api)
    assert api.server.app is not None
    served = served_routes(api.server.app)
    documented = documented_routes(doc)
    assert served - documented == set(), "served but not documented"
    assert documented - served == set(), "documented but not served"


async def test_every_operation_documents_its_errors_as_api_error(api: Api) -> None:
    doc = await fetch_document(api)
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert any(code.startswith("2") for code in responses), (method, path)
            for code, response in responses.items():
                if code.startswith(("4", "5")):
                    assert response == {"$ref": f"#/components/responses/E{code}"}, (method, path, code)
            public = operation.get("security") == []
            assert public or "401" in responses, (method, path)
    for response in doc["components"]["responses"].values():
        assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ApiError"}


async def test_docs_page_and_its_local_assets_load(api: Api) -> None:
    resp = await api.client.get("/docs")
    assert resp.status == 200
    assert resp.content_type == "text/html"
    page = await resp.text()
    assert "openapi.json" in page
    assert "http://" not in page
    assert "https://" not in page  # no CDN
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert len(assets) >= 3
    for asset in assets:
        got = await api.client.get("/" + asset)  # the page's URLs are relative to /
        assert got.status == 200, asset
        assert len(await got.read()) > 0
    js = await api.client.get("/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in js.content_type
    missing = await api.client.get("/docs/assets/index.html")  # the package's demo page is not served
    assert missing.status == 404
    assert (await missing.json())["statusCode"] == 404
