"""The real model endpoint and the forwarder that talks to it.

The forwarder is one shared ``aiohttp.ClientSession`` per event loop with a large connection
pool: measured in ``benchmarks/interception.py``, it relays several times more requests per
second than one shared ``httpx.AsyncClient`` on the same box. The upstream API key lives only
here, in the proxy process; it never reaches a harness, a log line or a trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp

from vfray.endpoints.client import Target
from vfray.interception.settings import InterceptionSettings


class Upstream:
    """Where model calls go: ``base_url`` includes the version prefix (``http://host/v1``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        model: str,
        sampling: Mapping[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.sampling: dict[str, Any] = dict(sampling or {})

    def __repr__(self) -> str:
        # Never print the key.
        return f"Upstream({self.base_url!r}, model={self.model!r}, sampling={self.sampling!r})"

    def target(self) -> Target:
        """This upstream (the rollout's model endpoint) as a target for vfray's own calls."""
        return Target(self.base_url, self.model, self.api_key)


class Forwarder:
    """Posts request bodies to the upstream; created lazily on the loop that serves requests.

    A plain call is bounded in all by ``settings.upstream_timeout``; a stream only by its
    silences (``stream_idle_timeout``, for the head and for each read), since a long reasoning
    stream is alive as long as it sends."""

    def __init__(
        self,
        upstream: Upstream,
        connection_limit: int = 16384,
        settings: InterceptionSettings | None = None,
    ) -> None:
        self.upstream = upstream
        self.connection_limit = connection_limit
        self.settings = settings or InterceptionSettings()
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        idle = self.settings.stream_idle_timeout
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=idle, sock_read=idle)

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session is bound to its loop; an app served from a new loop (a fresh test
            # server, a restarted replica) gets its own.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.connection_limit, limit_per_host=self.connection_limit
                ),
                timeout=aiohttp.ClientTimeout(total=self.settings.upstream_timeout),
                # One client serves every rollout: a cookie the upstream sets for one must not
                # ride along on the others' calls (and a jar costs CPU on every request).
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
            )
            self._loop = loop
        return self._session

    def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        timeout: float | None = None,
        *,
        stream: bool = False,
        root: bool = False,
    ) -> aiohttp.client._RequestContextManager:
        """``async with forwarder.post(...) as response``: the upstream's response (within
        ``timeout`` seconds when given; else a stream within the idle timeout of each read,
        anything else within the upstream timeout). ``root``: ``path`` is under the server's
        root rather than its version prefix (vLLM's ``/tokenize``)."""
        base = self.upstream.base_url
        if root:
            base = base.removesuffix("/v1")
        url = f"{base}{path}"
        if timeout is not None:
            limit = aiohttp.ClientTimeout(total=timeout)
        elif stream:
            limit = self._stream_timeout
        else:
            return self._client().post(url, data=body, headers=headers)
        return self._client().post(url, data=body, headers=headers, timeout=limit)

    async def aclose(self) -> None:
        session = self._session
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()
        self._session = None
