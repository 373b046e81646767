"""Runtimes: the boxes harnesses run in (subprocess, bwrap, docker, modal).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from vfray.runtimes.base import ProgramResult, Runtime, RuntimeSpec

__all__ = ["ProgramResult", "Runtime", "RuntimeSpec"]
