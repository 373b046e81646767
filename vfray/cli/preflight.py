"""Checks ``vfray eval`` runs before any rollout (and before Ray starts): the output folder is
a writable directory somewhere durable, and a remote model endpoint answers one real model
call.

Each failure is one :class:`ConfigError` line naming the path or URL; a run that would fail on
every rollout is refused in a second instead of after Ray's start-up and a table of errors.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import tempfile
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vfray.config import EvalConfig
from vfray.endpoints import answers
from vfray.errors import ConfigError

ENDPOINT_TIMEOUT = 60.0
"""Seconds for the endpoint's one-token call: a live server answers in well under a second,
a busy one may queue it a while."""
ENDPOINT_CONNECT_TIMEOUT = 5.0
"""Seconds to connect to it: a live server accepts in milliseconds."""
DURABLE_OUTPUTS = "~/vfray-outputs"
"""Where run folders go by default when the working directory is Ray's temporary copy."""
_RAY_WORKING_DIR_MARK = ("runtime_resources", "working_dir_files")


def in_ray_working_dir_copy(cwd: Path | None = None) -> bool:
    """True inside the copy of ``--working-dir`` that ``ray job submit`` unpacks under Ray's
    session folder (``…/runtime_resources/working_dir_files/_ray_pkg_…``); Ray deletes it
    when the job ends, so nothing written there survives."""
    parts = (cwd or Path.cwd()).absolute().parts
    first, second = _RAY_WORKING_DIR_MARK
    return any(a == first and b == second for a, b in itertools.pairwise(parts))


def resolve_output_dir(config: EvalConfig, cwd: Path | None = None) -> str | None:
    """Make ``config.output_dir`` absolute (so every printed run folder is); returns a note when
    the default was moved out of Ray's temporary working-dir copy."""
    cwd = (cwd or Path.cwd()).absolute()
    path = Path(config.output_dir).expanduser()
    note = None
    if not path.is_absolute() and in_ray_working_dir_copy(cwd):
        if "output_dir" in config.model_fields_set:
            raise ConfigError(
                f"output folder {config.output_dir!r} is relative to Ray's temporary copy of the "
                f"working dir ({cwd}), which is deleted when the job ends: give an absolute -o"
            )
        path = Path(DURABLE_OUTPUTS).expanduser()
        note = (
            f"note: running in Ray's temporary working-dir copy; run folders go to {path} "
            "(set -o to choose)"
        )
    config.output_dir = str(path if path.is_absolute() else cwd / path)
    return note


def check_output_dir(output_dir: str) -> None:
    """The folder (created if missing) must be a directory this process can write in."""
    path = Path(output_dir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"output folder {path}: {existing} is a file, not a directory (-o)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Root ignores permission bits, so only a real write tells (read-only mounts too).
        with tempfile.NamedTemporaryFile(dir=path, prefix=".vfray-write-check-"):
            pass
    except OSError as exc:
        reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror
        raise ConfigError(f"output folder {path} is not writable: {reason or exc} (-o)") from exc


_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_api_key_var(name: str | None) -> None:
    """``--api-key-var`` names an environment variable. A value that cannot be one, or an
    unset long mixed-case-and-digits one, is most likely the key itself pasted in: refused
    without repeating it, since every other message (and eval.log, config.json) would."""
    if not name or name in os.environ:
        return
    looks_like_key = len(name) >= 20 and any(c.isdigit() for c in name) and name != name.upper()
    if _VARIABLE_NAME.fullmatch(name) is None or looks_like_key:
        raise ConfigError(
            f"--api-key-var takes the name of the environment variable holding the key, and "
            f"the value given ({len(name)} characters, not shown) looks like a key itself: "
            "export OPENAI_API_KEY=<key> and pass --api-key-var OPENAI_API_KEY"
        )


def check_endpoint(
    base_url: str,
    api_key_var: str | None,
    timeout: float = ENDPOINT_TIMEOUT,
    *,
    model: str = "",
    sampling: Mapping[str, Any] | None = None,
) -> None:
    """One real, tiny model call, ``POST {base_url}/chat/completions`` asking ``model`` for one
    token with the run's sampling: an endpoint that cannot answer it (down, a 500, a 404 from a
    base URL without ``/v1``, a 400 for the model name or a sampling field) would fail every
    rollout, so it is refused in one line quoting its answer. A 408 or 429 passes: the endpoint
    is there, only busy, and the run's retries ride that out."""
    import httpx

    url = base_url.rstrip("/") + "/chat/completions"
    headers = {}
    key = os.environ.get(api_key_var) if api_key_var else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        **dict(sampling or {}),
        "stream": False,
    }
    body.pop("return_tokens", None)  # vfray's own switch, translated by the interception
    limits = httpx.Timeout(timeout, connect=min(timeout, ENDPOINT_CONNECT_TIMEOUT))
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=limits)
        if (
            response.status_code == 400
            and "max_tokens" in response.text
            and "max_tokens" not in (sampling or {})
        ):
            # Reasoning models refuse the legacy ``max_tokens``; the run never sends it.
            del body["max_tokens"]
            response = httpx.post(url, json=body, headers=headers, timeout=limits)
    except httpx.TimeoutException as exc:
        raise ConfigError(
            f"model endpoint {base_url} did not answer POST {url} within {timeout:g} s "
            "(is the server up? --no-preflight skips this check)"
        ) from exc
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise ConfigError(
            f"model endpoint {base_url} is unreachable: POST {url}: {reason} "
            "(is the server up and --base-url right? --no-preflight skips this check)"
        ) from exc
    status = response.status_code
    if status < 400 or status in answers.OUTAGE_4XX:
        return
    said = answers.describe(status, response.content, limit=200)
    if status in (401, 403):
        hint = (
            f"is ${api_key_var} the right key?"
            if key
            else (f"${api_key_var} is not set" if api_key_var else "pass --api-key-var")
        )
    elif status == 404 and not urllib.parse.urlsplit(base_url).path.rstrip("/").endswith("/v1"):
        hint = f"the base URL usually ends in /v1: --base-url {base_url.rstrip('/')}/v1?"
    elif status == 404:
        hint = f"is {model!r} served there, and --base-url right?"
    else:
        hint = "--no-preflight skips this check"
    raise ConfigError(
        f"model endpoint {base_url} failed a one-token call: POST {url} answered {said} ({hint})"
    )


def preflight(config: EvalConfig, *, endpoint: bool = True) -> None:
    """Every check, in the order a user would fix them."""
    check_output_dir(config.output_dir)
    if endpoint and config.model.base_url:
        check_endpoint(
            config.model.base_url,
            config.model.api_key_var,
            model=config.model.name,
            sampling=config.sampling.as_params(),
        )
