"""Compact JSON text (no spaces, non-ASCII kept): every bridge frame, JSON answer, streamed message
and model request body is written this way.

One encoder, built once: `json.dumps` with arguments builds a JSONEncoder on every call, 4 of its
7.5 µs for a small SDK message (docs/performance.md, twenty-ninth pass).
"""

from __future__ import annotations

import json

dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
