"""The Ray layer of vfray, and only that: the farm backend on Ray (``ray_farm``), SandboxHost
actors, the run backend over them (``backend``), episode tasks, the built-in models' actors and
the Ray placement of the TraceSink. It imports the Ray-free core in ``vfray`` (the run layer in
``vfray.run``); the core never imports it (``vfray.farm`` names its backend by import path)."""

import logging
import sys
import warnings

# In a notebook without ipywidgets, `import ray` warns twice: tqdm.auto's "IProgress not found"
# (TqdmWarning), and ray.widgets' "Missing packages: ['ipywidgets']" (logged while its classes
# are defined). vfray's progress is an IPython display that needs neither.
logging.getLogger("ray.widgets.util").setLevel(logging.WARNING)
if "ray" not in sys.modules:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import ray  # noqa: F401
