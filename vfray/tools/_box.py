"""The in-box tool server program: ``python -m vfray.tools._box SPEC LOG`` serves the pickled
toolset in SPEC on the box's loopback at ``/mcp/box``, appends each call to LOG as a JSON line,
and prints ``vfray-tools listening on PORT`` once it accepts connections."""

from __future__ import annotations

import asyncio
import pickle
import sys

from vfray.tools._mcp_app import Binding, build_app


async def _serve(spec_path: str, log_path: str) -> None:
    from vfray.endpoints.serving import serve_in_loop

    with open(spec_path, "rb") as fh:
        toolset = pickle.load(fh)
    log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - open for the server's life

    def record(call: object) -> None:
        log.write(call.model_dump_json() + "\n")  # type: ignore[attr-defined]
        log.flush()

    binding = Binding(server=toolset.server_name(), toolset=toolset, on_call=record, state={})
    app = build_app(lambda token: binding if token == "box" else None)
    async with serve_in_loop(app, lifespan="on") as url:
        print(f"vfray-tools listening on {url.rsplit(':', 1)[1]}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    asyncio.run(_serve(sys.argv[1], sys.argv[2]))


if __name__ == "__main__":
    main()
