"""A runs database holding very long runs (10⁵ to 10⁶ positions), built in SQL in seconds.

The positions are synthetic but valid (the read-only check of a shared file passes): blocks of
four, kinds and probabilities from a deterministic hash of the position, top-k lists of ``p``
and ``q`` of ``TOP_K`` ids each, a token text per position. The runs' summary columns are those
the stored positions determine (``summary_from_positions``), as a writer that died leaves them.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from diagnostics.store import Store

TOP_K = 8
LONG_PROMPT = "a prompt whose run went on for a very long time"


def _positions_sql(run_id: str, count: int, salt: int) -> str:
    """An INSERT of ``count`` positions for ``run_id``; ``salt`` changes the hash (so two runs of a
    group decide differently from some position on, where the caller sets it)."""
    # hash(position + salt) is deterministic in DuckDB (same value on every machine and run).
    h = f"hash(position * 7919 + {salt})"
    return f"""
INSERT INTO positions
SELECT '{run_id}' AS run_id, position::INTEGER, (position // 4)::INTEGER AS block, (position % 4)::INTEGER AS index_in_block,
       CASE WHEN position % 4 = 3 THEN 'bonus' WHEN {h} % 5 = 0 THEN 'rejected' ELSE 'accepted' END AS kind,
       ({h} % 50000)::INTEGER AS token,
       CASE WHEN position % 4 = 3 THEN NULL ELSE (({h} // 7) % 50000)::INTEGER END AS draft_token,
       (({h} % 1000) + 1) / 1001.0 AS p_token,
       CASE WHEN position % 4 = 3 THEN NULL ELSE (({h} // 3) % 1000) / 1000.0 END AS p_draft,
       CASE WHEN position % 4 = 3 THEN NULL ELSE (({h} // 11) % 1000) / 1000.0 END AS q_draft,
       CASE WHEN position % 4 = 3 THEN NULL ELSE (({h} // 13) % 1000) / 1000.0 END AS accept_prob,
       (({h} // 17) % 1000) / 1000.0 AS u_draft, (({h} // 19) % 1000) / 1000.0 AS u_accept,
       (({h} // 23) % 1000) / 1000.0 AS u_fallback, (({h} // 29) % 1000) / 1000.0 AS alpha,
       (({h} // 31) % 1000) / 1000.0 AS tv_pq, (({h} // 37) % 1000) / 100.0 AS entropy_p,
       (({h} // 41) % 1000) / 100.0 AS entropy_q, 0.0 AS overshoot, 0.0 AS severe_overshoot,
       NULL AS allowed_size, NULL AS allowed_mass,
       (({h} // 43) % 1000) / 10000.0 AS tv_target, (({h} // 47) % 1000) / 10000.0 AS tv_baseline,
       (({h} // 53) % 1000) / 10000.0 AS kl_target,
       list_transform(range({TOP_K}), lambda k: ((({h} // 59) + k * 101) % 50000)::INTEGER) AS p_top_ids,
       list_transform(range({TOP_K}), lambda k: 0.1) AS p_top_probs, 0.2 AS p_tail,
       list_transform(range({TOP_K}), lambda k: ((({h} // 61) + k * 103) % 50000)::INTEGER) AS q_top_ids,
       list_transform(range({TOP_K}), lambda k: 0.1) AS q_top_probs, 0.2 AS q_tail,
       'w' || ({h} % 50000)::VARCHAR AS token_text,
       CASE WHEN position % 4 = 3 THEN NULL ELSE 'w' || (({h} // 7) % 50000)::VARCHAR END AS draft_text,
       NULL AS tree_node
FROM range({count}) AS numbers(position)"""


def long_runs_db(path: Path, count: int, diverge_at: int | None = None) -> list[str]:
    """A database at ``path`` with one complete run of ``count`` positions (run id ``long0``), or,
    with ``diverge_at``, a compared group of two such runs (``long0`` the reference, ``long1``
    deciding differently from position ``diverge_at`` on). Returns the run ids."""
    Store(path)  # this tool's schema, made by the store itself
    run_ids = ["long0"] if diverge_at is None else ["long0", "long1"]
    with duckdb.connect(str(path)) as con:
        con.execute("SET enable_progress_bar = false")
        for index, run_id in enumerate(run_ids):
            con.execute(
                "INSERT INTO runs (run_id, created, finished, status, target, draft, rule, policy, draft_policy, gamma, seed, "
                "max_new_tokens, prompt, raw_prompt, group_id) VALUES (?, TIMESTAMP '2024-01-01 00:00:00' + to_seconds(?), "
                "TIMESTAMP '2024-01-02', 'complete', 'tiny', 'ngram:2', ?, '{}', '{}', 3, 0, 1000000, ?, true, ?)",
                [run_id, index, "lossless" if index == 0 else "lenience:0.5", LONG_PROMPT, None if diverge_at is None else "g-long"])
            con.execute(_positions_sql(run_id, count, 0))
            if index and diverge_at is not None:
                # The second run: the same decisions up to ``diverge_at``, other ones from there on.
                con.execute(f"DELETE FROM positions WHERE run_id = '{run_id}' AND position >= {diverge_at}")
                con.execute(_positions_sql(run_id, count, 1).replace("FROM range(", f"FROM range({diverge_at}, "))
                # Position ``diverge_at`` certainly decides differently (not by chance the same).
                con.execute(f"UPDATE positions SET kind = 'rejected', token = token + 1 WHERE run_id = '{run_id}' "
                            f"AND position = {diverge_at} AND kind = 'accepted'")
                con.execute(f"UPDATE positions SET token = token + 1 WHERE run_id = '{run_id}' AND position = {diverge_at} "
                            "AND kind <> 'rejected'")
            # The summary columns, from the stored positions (as the store rebuilds a dead writer's).
            con.execute(
                "UPDATE runs SET tokens = s.tokens, n_tokens = s.n, output_text = s.text, accepted = s.accepted, "
                "drafted = s.drafted, target_passes = s.blocks, acceptance_rate = s.accepted / s.drafted, "
                "block_efficiency = s.n / s.blocks, mean_tv_target = s.mean_tv, mean_tv_baseline = s.mean_baseline, "
                "max_tv_target = s.max_tv, divergence_position = ? "
                "FROM (SELECT list(token ORDER BY position) AS tokens, count(*) AS n, string_agg(token_text, '' ORDER BY position) AS text, "
                "count(*) FILTER (WHERE kind = 'accepted') AS accepted, count(*) FILTER (WHERE kind <> 'bonus') AS drafted, "
                "count(DISTINCT block) AS blocks, avg(tv_target) AS mean_tv, avg(tv_baseline) AS mean_baseline, "
                "max(tv_target) AS max_tv FROM positions WHERE run_id = ?) AS s WHERE run_id = ?",
                [None if index == 0 else diverge_at, run_id, run_id])
    return run_ids
