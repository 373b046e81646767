# mypy: ignore-errors
"""The toolset, in a module of its own as v1's docs show: v1 serves it per rollout by running
``python -m v1tools.tools`` (its config arrives in ``VF_CONFIG``)."""

from __future__ import annotations

import verifiers.v1 as vf


class Doubler(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def double(self, x: int) -> str:
        """Twice x."""
        return str(2 * x)


if __name__ == "__main__":
    Doubler.run()
