"""Diagnostic lab for speculative-decoding verification: rules, policy, rng, metrics, charts."""

import os as _os

__version__ = "0.1.0"

# OpenMP threads that wait passively (asleep) between torch's parallel regions, unless the user
# chose otherwise. With the default (spin first), a thread that reaches a region's end spins on its
# core while the region's other thread waits for a core that other work holds: on a 2-core machine
# with anything else running, each parallel op then costs a scheduler slice. Measured here (2 cores,
# load average 6 to 8): one 1-token attention 19 ms instead of 0.02 ms; transformers' assisted
# generate of 12 tokens on the embedded model 146 s instead of 7.8 s; our engine's batch of 8 seeds
# 177 s instead of 19 s. libgomp reads the policy once, when torch loads it: this runs first
# whenever anything of ``diagnostics`` is imported before torch (the CLI, the dashboard, the
# worker processes); processes started from here (an engine under audit) inherit it, which changes
# their speed only.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
