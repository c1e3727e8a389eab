"""Diagnostic lab for speculative-decoding verification: rules, policy, rng, metrics, charts."""

__version__ = "0.1.0"
