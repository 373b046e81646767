"""The endpoint side (internal): vfray's own model calls and their retries, and serving ASGI
apps (the interception, tool servers, the scripted model) with uvicorn on loopback."""
