"""The scripted model server: a real OpenAI/Anthropic-compatible HTTP server whose replies come
from deterministic policies (``model="scripted:<policy>"``). Internal: users reach it through
:mod:`vfray.testing` (``ScriptedModel``, ``scripted_server``)."""
