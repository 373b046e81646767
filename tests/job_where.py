"""Run as a Ray job's entrypoint (tests/test_runtime_env_wheel.py): where do the job's driver
and a worker import vfray and actors from? Prints one ``WHERE {json}`` line."""

import json
import shutil

import ray

import vfray

ray.init(log_to_driver=False)  # the job's cluster, under the job's runtime_env


@ray.remote
def where() -> dict[str, str]:
    import actors.sandbox_host
    import vfray

    return {"vfray": str(vfray.__file__), "actors": str(actors.sandbox_host.__file__)}


found = {
    "driver": vfray.__file__,
    "worker": ray.get(where.remote()),
    "command": shutil.which("vfray"),
}
print("WHERE " + json.dumps(found))
