"""Sweeps: prompt sets × rules × seeds, each (prompt, seed) unit run coupled with the lossless run
and each rule's matched baseline; aggregates with paired bootstrap intervals over prompts.

``prompts`` (JSONL prompt sets and answer checkers), ``plan`` (rule ranges, units, members),
``sweeper`` (running and resuming a sweep into the store), ``stats`` (per-run figures from the
stored runs, paired differences, intervals, verdicts).
"""
