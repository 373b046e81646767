# mypy: disable-error-code="import-not-found,import-untyped"
# (verifiers ships no type information; this file runs in its virtualenv, not ours.)
"""verifiers' own ``vf-eval``, unchanged but for one class flag: its ``mini_swe_agent`` harness
declares ``NEEDS_CONTAINER`` and would refuse the subprocess runtime vfray's side runs on."""

import sys

from verifiers.v1.cli.eval.main import main
from verifiers.v1.harnesses.mini_swe_agent.harness import MiniSWEAgentHarness

if __name__ == "__main__":
    MiniSWEAgentHarness.NEEDS_CONTAINER = False
    sys.argv[0] = "vf-eval"
    sys.exit(main())
