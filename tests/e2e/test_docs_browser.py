"""/docs in a real headless browser (Debian's chromium): Swagger UI renders ashd's OpenAPI 3.1 document
from the locally served assets, with every operation on the page and no rendering error."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from tests.conftest import Api
from tests.fixtures.tools import tool

# Enough virtual time for the page to fetch the assets and the document and render them; chromium
# stops as soon as the page is idle, so this bounds the wait instead of adding to it.
_BUDGET_MS = "30000"


async def chromium(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", f"--virtual-time-budget={_BUDGET_MS}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


async def test_docs_page_renders_every_operation_in_chromium(api: Api, tmp_path: Path) -> None:
    url = str(api.client.make_url("/docs"))
    dom = await chromium("--dump-dom", url)
    assert "Unable to render this definition" not in dom
    assert 'class="errors-wrapper"' not in dom, "Swagger UI reports errors in the document"
    document = await (await api.client.get("/openapi.json")).json()
    assert re.search(r'<span class="version[^"]*">\s*3\.1', dom) or "OAS 3.1" in dom
    rendered = {(m.group(1).lower(), m.group(2)) for m in re.finditer(
        r'class="opblock opblock-(\w+)[^"]*".*?data-path="([^"]+)"', dom, re.S)}
    expected = {(method, path) for path, ops in document["paths"].items() for method in ops
                if method in {"get", "post", "put", "patch", "delete"}}
    assert expected, "the document lists no operations"
    assert rendered == expected, (expected - rendered, rendered - expected)

    shots = Path(os.environ.get("ASHD_TEST_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    png = shots / "docs-page.png"
    await chromium(f"--screenshot={png}", "--window-size=1280,1600", "--hide-scrollbars", url)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
