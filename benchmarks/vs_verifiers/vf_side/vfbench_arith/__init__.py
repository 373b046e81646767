"""The arithmetic taskset written for verifiers v1, exported the way its docs show."""

from vfbench_arith.taskset import ArithmeticTaskset

__all__ = ["ArithmeticTaskset"]
