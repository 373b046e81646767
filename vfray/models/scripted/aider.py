"""The scripted ``agent`` policy's answers to Aider, which edits files through blocks in its
replies' text rather than a shell tool: each ``write "TEXT" to PATH`` of the task becomes, in
one reply, a *file listing* (Aider's ``whole`` format: the path, then the file's whole content
fenced) or a *SEARCH/REPLACE block* with an empty search (its ``diff`` formats: a new file).
A ``run: COMMAND`` step is suggested as a fenced ``bash`` block, as a model would: Aider runs no
suggestion without a person's yes, and its ``whole`` format takes the block for a file listing
with no name and asks again (a second call). A later request (Aider's reflection on a failed
edit) is answered with a plain text: the plan is read from the task message only.
"""

from __future__ import annotations

from vfray.models.scripted import agent
from vfray.models.scripted.conversation import Conversation, Decision

WHOLE = "*file listing*"
"""Aider's ``whole`` edit format's prompt names its blocks so."""
SEARCH_REPLACE = "*SEARCH/REPLACE block*"
"""Aider's ``diff`` (and ``diff-fenced``) edit formats' prompts name their blocks so."""


def is_aider(conv: Conversation) -> bool:
    """The conversation is Aider's: no tools, and its system prompt asks for its edit blocks."""
    return not conv.tool_names and (WHOLE in conv.system or SEARCH_REPLACE in conv.system)


def steps(text: str) -> list[tuple[str, str]]:
    """The ``write "TEXT" to PATH`` and ``run: COMMAND`` steps in ``text`` in order, as
    (path, text) and ("", command)."""
    found = []
    for match in agent._STEP.finditer(text):
        if match.group("path"):
            found.append((match.group("path"), match.group("text")))
        elif match.group("run"):
            found.append(("", match.group("run").strip().strip("`")))
    return found


def decide(conv: Conversation) -> Decision:
    """One reply with every step of the task's message as a block, or a plain answer."""
    edits = steps(conv.last_user)
    if not edits:
        return Decision(text="Done: there is nothing more to change.")
    blocks = []
    for path, text in edits:
        if not path:
            blocks.append(f"```bash\n{text}\n```")
        elif WHOLE in conv.system:
            blocks.append(f"{path}\n```\n{text}\n```")
        else:
            blocks.append(f"{path}\n```\n<<<<<<< SEARCH\n=======\n{text}\n>>>>>>> REPLACE\n```")
    return Decision(text="Here are the files.\n\n" + "\n\n".join(blocks) + "\n")
