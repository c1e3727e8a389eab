"""The reference programs: one row at a time, in plain Python over one row's laws.

``chain.chain_row`` (a chain round), ``tree.tree_row`` (a tree round) and ``tree_walk`` (the walk of one
drafted tree) are the exact per-position programs the tensor programs (``chain_program`` with
``chain_verify``, ``tree_program`` with ``tree_verify``) are tested against, and the path for draft
heads and custom drafters, which the tensor programs do not run. ``generate_batch(..., core="reference")``
runs every row through them.
"""
