"""Live-session harnesses speaking the Agent Client Protocol: the base (:mod:`.base`) and the
``claude-code-acp`` and ``codex-acp`` agents built on it."""
