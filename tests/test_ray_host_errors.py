"""A harness that cannot be built on Ray's hosts is refused with its own error in one line, as
the local backend says it, not Ray's actor-death message (its sentence first, the traceback,
the cause last), on a real local Ray."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.driver_only_harness import CAUSE
from vfray.errors import ConfigError
from vfray.farm import Farm
from vfray.tasksets.arithmetic import ArithmeticTaskset

pytestmark = pytest.mark.usefixtures("ray_local")

HARNESS = f"{Path(__file__).parent / 'fixtures' / 'driver_only_harness.py'}:DriverOnlyHarness"


def test_a_host_that_cannot_build_its_harness_says_why_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import start_local_ray

    start_local_ray()
    monkeypatch.setenv("VFRAY_TEST_DRIVER_PID", str(os.getpid()))
    farm = Farm(
        model="scripted:arithmetic",
        harness=HARNESS,
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
    )
    try:
        with pytest.raises(ConfigError) as caught:
            farm.run(ArithmeticTaskset(num_tasks=1))
    finally:
        farm.close()
    assert str(caught.value) == CAUSE
