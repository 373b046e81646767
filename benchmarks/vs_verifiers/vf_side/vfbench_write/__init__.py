"""The write-a-file agent taskset written for verifiers v1, exported the way its docs show."""

from .taskset import WriteTaskset

__all__ = ["WriteTaskset"]
