"""How a run flows, Ray-free: the config is resolved once into a run spec, the driver
(:mod:`~vfray.run.driver`) pulls tasks lazily and keeps rollouts in flight over a backend
(:mod:`~vfray.run.local` here, ``actors`` on Ray), episodes are scored into rows
(:mod:`~vfray.run.outcomes`) that the sink (:mod:`~vfray.run.sink`) writes to the run folder
(:mod:`~vfray.run.folders`), which :mod:`~vfray.run.resume` and :mod:`~vfray.run.results` read.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""
