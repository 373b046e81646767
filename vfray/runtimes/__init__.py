"""Runtimes: the boxes harnesses run in (subprocess, bwrap, docker, modal)."""

from vfray.runtimes.base import ProgramResult, Runtime, RuntimeSpec

__all__ = ["ProgramResult", "Runtime", "RuntimeSpec"]
