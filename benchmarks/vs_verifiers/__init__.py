"""vfray side by side with verifiers v1: see benchmarks/README.md and run_all.py."""
