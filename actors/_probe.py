"""Check a Ray cluster's address before ``ray.init`` joins it, in seconds: ``ray.init`` itself
waits minutes on an address where nothing listens (printing only C++ warnings), and answers a
cluster that wants a token with "Failed to connect" after 20 s of retries."""

from __future__ import annotations

import os
import socket
import urllib.parse

from vfray.errors import ConfigError

PROBE_TIMEOUT_S = 5.0

_TOKEN_HINT = (
    "set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
    "~/.ray/auth_token) before running vfray"
)


def host_port(address: str) -> tuple[str, int] | None:
    """The TCP endpoint behind a ``ray.init`` address (``host:port`` of the GCS, or
    ``ray://host:port`` of Ray Client); None for ``auto``/``local`` and other forms Ray resolves
    itself."""
    if address in ("auto", "local") or ("://" in address and not address.startswith("ray://")):
        return None
    parsed = urllib.parse.urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname or port is None:
        return None
    return parsed.hostname, port


def check_address(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise a one-line :class:`ConfigError` when nothing answers at ``address``, or when its
    GCS refuses this process for want of Ray's auth token."""
    target = host_port(address)
    if target is None:
        return
    host, port = target
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ConfigError(
            f"cannot reach the Ray cluster at {address}: nothing answers on {host}:{port} "
            f"({reason}); check --address / RAY_ADDRESS, or run with --backend local"
        ) from None
    if address.startswith("ray://") or os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return
    if _gcs_wants_token(f"{host}:{port}", timeout):
        raise ConfigError(
            f"the Ray cluster at {address} requires token authentication: {_TOKEN_HINT}"
        )


def _gcs_wants_token(target: str, timeout: float) -> bool:
    """Whether the GCS at ``target`` refuses a call without a token (an empty GetClusterId
    request: the first call ``ray.init`` makes)."""
    import grpc  # type: ignore[import-untyped]  # Ray's own dependency

    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
        try:
            call(b"", timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            return bool(code == grpc.StatusCode.UNAUTHENTICATED)
    return False
