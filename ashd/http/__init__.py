"""HTTP front end (aiohttp): routes per resource, auth, errors, SSE, OpenAPI."""
