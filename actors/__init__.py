"""The Ray layer of vfray: SandboxHost actors, the Interception Serve deployment, episode tasks
and the TraceSink actor. It imports the Ray-free core in ``vfray``; the core never imports it
(only ``vfray.farm`` and ``vfray.cli`` sit on top)."""
