"""Runs one browser-use agent (PyPI ``browser-use``) on a task against an OpenAI-compatible
endpoint, with a headless Chromium this program starts itself: in the program's own process
group and with a parent-death signal, so ending the program (SIGTERM, then the group's SIGKILL)
ends the browser too. Runs in the box under the browser-use tool dir's Python; imports nothing
of vfray. Writes the agent's final answer and history as JSON files.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

_DEVTOOLS = re.compile(r"DevTools listening on (ws://\S+)")
READY_TIMEOUT = 60.0
"""Seconds Chromium may take to announce its DevTools endpoint (~1 s measured here)."""


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the browser is killed when this program dies, however it dies.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


DEBIAN_BINARY = "/usr/lib/chromium/chromium"
"""The browser behind Debian's ``/usr/bin/chromium``, a shell wrapper that sources
``/etc/chromium.d``, which a box without the host's ``/etc`` lacks; its flags are ours."""


def find_chromium(given: str) -> str:
    for name in (given, "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) if name else None
        if found:
            with open(found, "rb") as head:
                script = head.read(2) == b"#!"
            return DEBIAN_BINARY if script and os.access(DEBIAN_BINARY, os.X_OK) else found
    raise SystemExit(f"no Chromium found (looked for {given or 'chromium'} on PATH)")


def start_chromium(binary: str, state: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Chromium, headless on a free DevTools port, and its WebSocket endpoint."""
    log = state / "chromium.log"
    with open(log, "wb") as err:
        browser = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                f"--user-data-dir={state / 'profile'}",
                # The box is the sandbox: Chromium's own needs user namespaces it may not have.
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--metrics-recording-only",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=_die_with_parent,
        )
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and browser.poll() is None:
        match = _DEVTOOLS.search(log.read_text(errors="replace"))
        if match:
            return browser, match.group(1)
        time.sleep(0.05)
    browser.kill()
    tail = log.read_text(errors="replace")[-1500:]
    raise SystemExit(f"Chromium did not start within {READY_TIMEOUT:g}s: {tail}")


async def run(args: argparse.Namespace) -> int:
    # Only in the box, from the agent's tool dir (never a dependency of vfray).
    from browser_use import Agent, BrowserProfile, BrowserSession  # type: ignore[import-not-found]
    from browser_use.llm import ChatOpenAI  # type: ignore[import-not-found]

    state = Path(args.state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    browser, endpoint = start_chromium(find_chromium(args.chromium), state)
    try:
        llm = ChatOpenAI(
            model=args.model,
            base_url=args.base_url,
            api_key=os.environ["OPENAI_API_KEY"],
            # A refused call (a limit) is final: the interception answers 4xx, never retry.
            max_retries=args.model_retries,
            temperature=None,
            frequency_penalty=None,
        )
        session = BrowserSession(
            cdp_url=endpoint,
            browser_profile=BrowserProfile(
                enable_default_extensions=False,  # they are downloaded from the web
                keep_alive=False,
                minimum_wait_page_load_time=0.05,
                wait_for_network_idle_page_load_time=0.1,
                wait_between_actions=0.05,
            ),
        )
        agent = Agent(
            task=Path(args.task_file).read_text(),
            llm=llm,
            browser_session=session,
            use_vision=args.vision,
            use_judge=False,
            enable_planning=False,
            max_failures=args.max_failures,
            enable_signal_handler=False,  # SIGTERM must end the program, not pause it
            file_system_path=str(state / "files"),
            calculate_cost=False,
        )
        history = await agent.run(max_steps=args.max_steps)
        answer = history.final_result()
        out = {
            "final_result": answer,
            "is_done": history.is_done(),
            "is_successful": history.is_successful(),
            "steps": history.number_of_steps(),
            "errors": [e for e in history.errors() if e],
            "urls": [u for u in history.urls() if u],
        }
        Path(args.result).write_text(json.dumps(out, indent=1))
        print(answer or "")
        return 0 if history.is_done() else 1
    finally:
        browser.kill()
        browser.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--chromium", default="")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--max-failures", type=int, default=2)
    parser.add_argument("--model-retries", type=int, default=0)
    parser.add_argument("--vision", action="store_true")
    args = parser.parse_args()
    # SIGTERM as an exception: the finally above then ends the browser before we exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
