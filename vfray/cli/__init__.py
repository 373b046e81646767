"""The ``vfray`` command: one thin module per subcommand, dispatched from :mod:`vfray.cli.main`."""
