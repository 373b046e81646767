"""A v1 taskset package with its own two-agent env."""

from .taskset import Relay, RelayConfig, Sums, SumTask

__all__ = ["Relay", "RelayConfig", "SumTask", "Sums"]
