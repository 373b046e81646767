"""A v1 user-simulation taskset (run with --env.id user-sim)."""

from .taskset import Chats, ChatTask

__all__ = ["ChatTask", "Chats"]
