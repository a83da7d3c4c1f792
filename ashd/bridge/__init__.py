"""The in-sandbox bridge: protocol server (`python -m ashd.bridge`), agent engine, tools and MCP.

This package runs inside the sandbox. It never imports aiohttp; the only network it speaks is
plain HTTP over the model socket (`/run/ashd/model.sock`) through its own Messages API client
(`engine/_model_client.py`).
"""

__all__ = ["history", "protocol"]  # the modules the server uses; the rest runs in the sandbox only
