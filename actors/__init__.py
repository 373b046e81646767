"""The Ray layer of vfray, and only that: the farm backend on Ray (``ray_farm``), SandboxHost
actors, the run backend over them (``backend``), episode tasks, the built-in models' actors and
the Ray placement of the TraceSink. It imports the Ray-free core in ``vfray`` (the run layer in
``vfray.run``); the core never imports it (``vfray.farm`` names its backend by import path)."""
