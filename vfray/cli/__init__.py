"""The ``vfray`` command: one thin module per subcommand, dispatched from :mod:`vfray.cli.main`.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""
