"""Runs one OpenHands agent (PyPI ``openhands-sdk`` and ``openhands-tools``: the SDK's default
``Agent`` with its terminal and file-editor tools) on a task in the current dir, headless, against
an OpenAI-compatible endpoint, until the agent finishes or its iterations run out. Runs in the box
under the openhands tool dir's Python; imports nothing of vfray. The endpoint, key and model come
from ``LLM_BASE_URL``, ``LLM_API_KEY`` and ``LLM_MODEL``; the conversation's events are kept in
``--events`` as JSON lines. ``--mcp`` (a JSON object of name -> URL) gives the agent a task's MCP
servers (streamable HTTP), as the SDK's ``mcp_config``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--max-iterations", type=int, default=100)
    parser.add_argument("--tools", default="terminal,file_editor")
    parser.add_argument("--num-retries", type=int, default=2)
    parser.add_argument("--mcp", default="{}", help="the task's MCP servers: name -> URL")
    args = parser.parse_args()

    # The tool dir's packages, not vfray's: no stubs here.
    from openhands.sdk import LLM, Agent, Conversation, Tool  # type: ignore[import-not-found]
    from openhands.tools.file_editor import FileEditorTool  # type: ignore[import-not-found]
    from openhands.tools.task_tracker import TaskTrackerTool  # type: ignore[import-not-found]
    from openhands.tools.terminal import TerminalTool  # type: ignore[import-not-found]

    known: dict[str, Tool] = {
        # A plain subprocess shell: tmux is not in every box.
        "terminal": Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
        "file_editor": Tool(name=FileEditorTool.name),
        "task_tracker": Tool(name=TaskTrackerTool.name),
    }
    tools = [known[name] for name in args.tools.split(",") if name]
    mcp = {name: {"url": url, "transport": "http"} for name, url in json.loads(args.mcp).items()}
    llm = LLM(
        model=f"openai/{os.environ['LLM_MODEL']}",
        base_url=os.environ["LLM_BASE_URL"],
        api_key=os.environ["LLM_API_KEY"],
        usage_id="agent",
        num_retries=args.num_retries,
        retry_min_wait=1,
        retry_max_wait=4,
    )
    events = Path(args.events)
    events.parent.mkdir(parents=True, exist_ok=True)
    with events.open("w") as sink:

        def keep(event: Any) -> None:
            sink.write(json.dumps(event.model_dump(mode="json"), default=str) + "\n")
            sink.flush()

        conversation = Conversation(
            agent=Agent(llm=llm, tools=tools, mcp_config=mcp),
            workspace=os.getcwd(),
            callbacks=[keep],
            max_iteration_per_run=args.max_iterations,
            visualizer=None,
        )
        conversation.send_message(Path(args.task_file).read_text())
        conversation.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
