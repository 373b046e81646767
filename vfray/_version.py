"""vfray's version: one place, read by the package and written into every run folder's header."""

__version__ = "0.1.0"
