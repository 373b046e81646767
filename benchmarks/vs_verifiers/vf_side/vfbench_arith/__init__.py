"""The arithmetic taskset written for verifiers v1, exported the way its docs show."""

from .taskset import ArithmeticTaskset

__all__ = ["ArithmeticTaskset"]
