"""Compatibility layers that run other frameworks' tasksets and configs on vfray unchanged
(:mod:`vfray.compat.v1`: verifiers v1)."""
