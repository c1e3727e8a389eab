"""Content checks of a shared runs file, run once when it is opened read-only.

The schema check (``schema.schema_problem``) says the tables have this tool's shape; this says
every value the pages and the report read is one they can show: required text present, JSON
that parses into what it should, rule specs and drafters that parse, statuses and kinds from
the known sets, probabilities in [0, 1], token ids non-negative, positions numbered 0 … n − 1,
top-k lists of equal length, and audit evidence with the structure of its layer. The first
problem found is returned as one phrase; a file with none renders on every page and in reports.
"""

from __future__ import annotations

from typing import Any

import duckdb

from diagnostics.untrusted_json import UntrustedJSONError, loads

from diagnostics.store.schema import KINDS, NODE_DECISIONS, STATUSES, SWEEP_ROLES

# (what is wrong, a query returning one example row when it is) for runs and positions.
_RUN_CHECKS: list[tuple[str, str]] = [
    *[(f"a run has no {column}", f"SELECT run_id FROM runs WHERE {column} IS NULL LIMIT 1")
      for column in ("run_id", "status", "rule", "prompt", "target")],
    ("two runs share the id {0}", "SELECT run_id FROM runs GROUP BY run_id HAVING count(*) > 1 LIMIT 1"),
    ("run {0} has an unknown status {1!r}", "SELECT run_id, status FROM runs WHERE status NOT IN ({statuses}) LIMIT 1"),
    ("run {0} has a negative gamma, seed, token budget or divergence position",
     "SELECT run_id FROM runs WHERE gamma < 0 OR seed < 0 OR max_new_tokens < 0 OR divergence_position < 0 LIMIT 1"),
    ("run {0} has a negative token id in its prompt or output",
     "SELECT run_id FROM runs WHERE list_min(prompt_ids) < 0 OR list_min(tokens) < 0 "
     "OR list_count(prompt_ids) < len(prompt_ids) OR list_count(tokens) < len(tokens) LIMIT 1"),
]
_POSITION_CHECKS: list[tuple[str, str]] = [
    ("a position row has no run id, position, kind or token",
     "SELECT run_id FROM positions WHERE run_id IS NULL OR position IS NULL OR kind IS NULL OR token IS NULL LIMIT 1"),
    ("positions of run {0} belong to no run", "SELECT run_id FROM positions ANTI JOIN runs USING (run_id) LIMIT 1"),
    ("run {0} has position {1} twice", "SELECT run_id, position FROM positions GROUP BY run_id, position HAVING count(*) > 1 LIMIT 1"),
    ("the positions of run {0} are not numbered 0 … n − 1",
     "SELECT run_id FROM positions GROUP BY run_id HAVING min(position) <> 0 OR max(position) <> count(*) - 1 LIMIT 1"),
    ("run {0} has a position of unknown kind {1!r}", "SELECT run_id, kind FROM positions WHERE kind NOT IN ({kinds}) LIMIT 1"),
    ("run {0} has a negative token id at position {1}",
     "SELECT run_id, position FROM positions WHERE token < 0 OR draft_token < 0 OR list_min(p_top_ids) < 0 "
     "OR list_min(q_top_ids) < 0 OR list_count(p_top_ids) < len(p_top_ids) OR list_count(q_top_ids) < len(q_top_ids) LIMIT 1"),
    ("run {0} has a probability outside [0, 1] at position {1}",
     "SELECT run_id, position FROM positions WHERE "
     + " OR ".join(f"NOT ({column} BETWEEN -1e-9 AND 1 + 1e-9)" for column in
                   ("p_token", "p_draft", "q_draft", "accept_prob", "u_draft", "u_accept", "u_fallback",
                    "alpha", "p_tail", "q_tail", "allowed_mass"))
     + " OR list_count(list_filter(p_top_probs, lambda x: NOT (x BETWEEN -1e-9 AND 1 + 1e-9))) > 0"
     " OR list_count(list_filter(q_top_probs, lambda x: NOT (x BETWEEN -1e-9 AND 1 + 1e-9))) > 0"
     " OR list_count(p_top_probs) < len(p_top_probs) OR list_count(q_top_probs) < len(q_top_probs) LIMIT 1"),
    ("run {0} has top-k ids and probabilities of different lengths at position {1}",
     "SELECT run_id, position FROM positions WHERE (p_top_ids IS NULL) <> (p_top_probs IS NULL) "
     "OR len(p_top_ids) <> len(p_top_probs) OR (q_top_ids IS NULL) <> (q_top_probs IS NULL) "
     "OR len(q_top_ids) <> len(q_top_probs) LIMIT 1"),
]
_TREE_CHECKS: list[tuple[str, str]] = [
    ("tree rounds of run {0} belong to no run", "SELECT run_id FROM tree_rounds ANTI JOIN runs USING (run_id) LIMIT 1"),
    ("tree nodes of run {0} belong to no run", "SELECT run_id FROM tree_nodes ANTI JOIN runs USING (run_id) LIMIT 1"),
    ("a tree node row has no run id, round, node, parent, depth or token",
     "SELECT run_id FROM tree_nodes WHERE run_id IS NULL OR block IS NULL OR node IS NULL OR parent IS NULL "
     "OR depth IS NULL OR token IS NULL LIMIT 1"),
    ("run {0} has tree node {2} of round {1} whose parent is not an earlier node",
     "SELECT run_id, block, node FROM tree_nodes WHERE parent < -1 OR parent >= node OR node < 0 OR depth < 1 "
     "OR token < 0 OR sibling < 0 LIMIT 1"),
    ("run {0} has a tree node of unknown decision {1!r}",
     "SELECT run_id, decision FROM tree_nodes WHERE decision NOT IN ({decisions}) LIMIT 1"),
    ("run {0} has a probability outside [0, 1] in tree round {1}",
     "SELECT run_id, block FROM tree_nodes WHERE "
     + " OR ".join(f"NOT ({column} BETWEEN -1e-9 AND 1 + 1e-9)" for column in
                   ("q_token", "u_draft", "p_token", "residual", "accept_prob", "u_accept", "reach")) + " LIMIT 1"),
    ("run {0} has a tree round with negative counts",
     "SELECT run_id FROM tree_rounds WHERE nodes < 0 OR depth < 0 OR emitted < 0 OR accepted < 0 "
     "OR NOT (expected_tokens >= 0) LIMIT 1"),
]
_AUDIT_CHECKS: list[tuple[str, str]] = [
    ("an audit has no id, layer, verdict or evidence",
     "SELECT audit_id FROM audits WHERE audit_id IS NULL OR layer IS NULL OR verdict IS NULL OR evidence IS NULL LIMIT 1"),
    ("two audits share the id {0}", "SELECT audit_id FROM audits GROUP BY audit_id HAVING count(*) > 1 LIMIT 1"),
    ("audit {0} has an unknown layer or verdict",
     "SELECT audit_id FROM audits WHERE layer NOT IN ('rule', 'engine', 'recorded', 'external') "
     "OR verdict NOT IN ('pass', 'fail', 'inconclusive') OR (verdict = 'inconclusive' AND layer <> 'external') LIMIT 1"),
]


_SWEEP_CHECKS: list[tuple[str, str]] = [
    ("a sweep has no id, status or settings", "SELECT sweep_id FROM sweeps WHERE sweep_id IS NULL OR status IS NULL OR settings IS NULL LIMIT 1"),
    ("two sweeps share the id {0}", "SELECT sweep_id FROM sweeps GROUP BY sweep_id HAVING count(*) > 1 LIMIT 1"),
    ("sweep {0} has an unknown status {1!r}", "SELECT sweep_id, status FROM sweeps WHERE status NOT IN ({statuses}) LIMIT 1"),
    ("sweep {0} has no unit count, or a count of units done outside 0 … its units",
     "SELECT sweep_id FROM sweeps WHERE units IS NULL OR units < 1 OR units_done < 0 OR units_done > units LIMIT 1"),
    ("a run of a sweep has no sweep id, unit, prompt id, seed, role, label or run id",
     "SELECT sweep_id FROM sweep_runs WHERE sweep_id IS NULL OR unit IS NULL OR prompt_id IS NULL OR seed IS NULL "
     "OR role IS NULL OR label IS NULL OR run_id IS NULL LIMIT 1"),
    ("runs of sweep {0} belong to no sweep", "SELECT sweep_id FROM sweep_runs ANTI JOIN sweeps USING (sweep_id) LIMIT 1"),
    ("sweep {0} links run {1}, which the file does not hold", "SELECT sweep_id, run_id FROM sweep_runs ANTI JOIN runs USING (run_id) LIMIT 1"),
    ("sweep {0} has a run of unknown role {1!r}", "SELECT sweep_id, role FROM sweep_runs WHERE role NOT IN ({roles}) LIMIT 1"),
    ("sweep {0} has a run whose unit or seed is outside the sweep's",
     "SELECT s.sweep_id FROM sweep_runs s JOIN sweeps w USING (sweep_id) WHERE s.unit < 0 OR s.unit >= w.units OR s.seed < 0 LIMIT 1"),
    ("sweep {0} has two runs labelled {2!r} in unit {1}",
     "SELECT sweep_id, unit, label FROM sweep_runs GROUP BY sweep_id, unit, label HAVING count(*) > 1 LIMIT 1"),
    ("sweep {0} has two lossless runs in unit {1}",
     "SELECT sweep_id, unit FROM sweep_runs WHERE role = 'lossless' GROUP BY sweep_id, unit HAVING count(*) > 1 LIMIT 1"),
    ("sweep {0} has two baselines of {2!r} in unit {1}",
     "SELECT sweep_id, unit, rule_for FROM sweep_runs WHERE role = 'baseline' GROUP BY sweep_id, unit, rule_for "
     "HAVING count(*) > 1 LIMIT 1"),
    ("sweep {0} gives the label {1!r} more than one role",
     "SELECT sweep_id, label FROM sweep_runs GROUP BY sweep_id, label HAVING count(DISTINCT role) > 1 LIMIT 1"),
]


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def _first(con: duckdb.DuckDBPyConnection, checks: list[tuple[str, str]]) -> str | None:
    for message, sql in checks:
        row = con.execute(sql.format(statuses=_quoted(STATUSES), kinds=_quoted(KINDS), decisions=_quoted(NODE_DECISIONS),
                                     roles=_quoted(SWEEP_ROLES))).fetchone()
        if row is not None:
            return message.format(*(str(value)[:60] for value in row))
    return None


def _json_object(text: str | None, where: str = "the JSON") -> dict | None:
    """The JSON object in ``text`` (``None`` stays ``None``), parsed with bounds (``untrusted_json``:
    nesting, 64-bit integers; non-finite numbers allowed, as this tool's own writer may store them);
    raises ``ValueError`` (one line naming the bound) otherwise."""
    if text is None:
        return None
    value = loads(text, where, allow_non_finite=True)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _run_values_problem(con: duckdb.DuckDBPyConnection) -> str | None:
    """Rule specs, drafters and policies parse; JSON columns hold objects."""
    from diagnostics.models import ModelError, is_plain_draft, parse_draft
    from diagnostics.policy import Policy, PolicyError
    from diagnostics.rules import RuleError, get_rule

    for (rule,) in con.execute("SELECT DISTINCT rule FROM runs").fetchall():
        try:
            get_rule(rule)
        except RuleError:
            return f"a run has the unknown rule spec {rule[:60]!r}"
    for (draft,) in con.execute("SELECT DISTINCT draft FROM runs WHERE draft IS NOT NULL").fetchall():
        if is_plain_draft(draft):
            continue
        try:
            parse_draft(draft)
        except ModelError:
            return f"a run has the unknown drafter {draft[:60]!r}"
    for column in ("policy", "draft_policy", "rule_params"):
        for (text,) in con.execute(f"SELECT DISTINCT {column} FROM runs WHERE {column} IS NOT NULL").fetchall():
            try:
                value = _json_object(text, "its JSON")
                if column != "rule_params":
                    unknown = set(value) - set(Policy.__dataclass_fields__)
                    if unknown:
                        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
                    Policy(**value)
            except (ValueError, TypeError, PolicyError) as error:
                return f"a run's {column} is not a valid policy ({str(error).splitlines()[0][:80]})"
    return None


def _audits_problem(con: duckdb.DuckDBPyConnection) -> str | None:
    from diagnostics.audit.reporting import evidence_problem

    problem = _first(con, _AUDIT_CHECKS)
    if problem:
        return problem
    for audit_id, layer, verdict, text in con.execute("SELECT audit_id, layer, verdict, evidence FROM audits").fetchall():
        try:
            evidence: Any = _json_object(text, "its JSON")
        except UntrustedJSONError as error:  # too deep, an integer beyond 64 bits, not JSON: one line
            return f"the evidence of audit {str(audit_id)[:60]} is not a JSON object within bounds ({str(error)[:120]})"
        except ValueError:
            return f"the evidence of audit {str(audit_id)[:60]} is not a JSON object"
        problem = evidence_problem(evidence)
        if problem is None and (evidence.get("layer") != layer or evidence.get("verdict") != verdict):
            problem = "its layer or verdict differs from the audit row's"
        if problem:
            return f"the evidence of audit {audit_id} {problem}"
    return None


def _tree_problem(con: duckdb.DuckDBPyConnection) -> str | None:
    """Tree shapes of tree runs parse, and their rows are consistent (only in files of schema 3)."""
    from diagnostics.engine.tree_draft import spec_from_text

    has_trees = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'tree_nodes'").fetchone()[0]
    if not has_trees:
        return None
    for text, children in con.execute("SELECT DISTINCT tree, tree_children FROM runs WHERE tree IS NOT NULL").fetchall():
        try:
            spec_from_text(text, children)
        except ValueError:
            return f"a run has the unknown tree shape {str(text)[:60]!r}"
    return _first(con, _TREE_CHECKS)


def content_problem(con: duckdb.DuckDBPyConnection, has_audits: bool) -> str | None:
    """The first value a page or report could not show, as a phrase, or ``None``."""
    return (_first(con, _RUN_CHECKS) or _run_values_problem(con) or _draft_stop_problem(con) or _first(con, _POSITION_CHECKS)
            or _tree_problem(con) or (_audits_problem(con) if has_audits else None) or _sweeps_problem(con))


def _sweeps_problem(con: duckdb.DuckDBPyConnection) -> str | None:
    """Sweeps (files of schema 4 on): rows consistent with each other and with the runs, and
    settings that a page, a report or a resume can use (``settings.check_settings``): prompts,
    checkers (a known HumanEval task, a regex RE2 compiles), rules, seeds, generation settings.
    Nothing a file holds is run: a checker is only parsed here."""
    from diagnostics.evaluation.settings import SweepSettingsError, parse_settings

    present = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'sweeps'").fetchone()[0]
    if not present:
        return None
    problem = _first(con, _SWEEP_CHECKS)
    if problem:
        return problem
    has_scores = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'sweep_runs' "
                             "AND column_name = 'score'").fetchone()[0]
    for sweep_id, text, units in con.execute("SELECT sweep_id, settings, units FROM sweeps").fetchall():
        shown = str(sweep_id)[:60]
        try:
            settings = parse_settings(text)
        except SweepSettingsError as error:
            return f"the settings of sweep {shown} {error}"
        if len(settings["prompts"]) * settings["seeds"] != units:
            return f"sweep {shown} plans {units} units, not its prompts × seeds"
        checked = {item["id"]: item.get("checker") is not None for item in settings["prompts"]}
        score = "score" if has_scores else "NULL AS score"
        for prompt_id, seed, value in con.execute(f"SELECT prompt_id, seed, {score} FROM sweep_runs WHERE sweep_id = ?",
                                                  [sweep_id]).fetchall():
            if prompt_id not in checked:
                return f"sweep {shown} has runs of the prompt {str(prompt_id)[:60]!r}, which its settings do not hold"
            if seed >= settings["seeds"]:
                return f"sweep {shown} has a run of seed {seed}, beyond its {settings['seeds']} seeds"
            if value is not None and (not checked[prompt_id] or not 0 <= value <= 1):
                return f"sweep {shown} has a score {value!r} outside [0, 1] or for a prompt without a checker"
    return None


def _draft_stop_problem(con: duckdb.DuckDBPyConnection) -> str | None:
    """Adaptive drafting thresholds are probabilities in (0, 1] (only in files of schema 5)."""
    present = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'runs' "
                          "AND column_name = 'draft_stop'").fetchone()[0]
    if not present:
        return None
    return _first(con, [("run {0} has a draft stop outside (0, 1]",
                         "SELECT run_id FROM runs WHERE draft_stop IS NOT NULL AND NOT (draft_stop > 0 AND draft_stop <= 1) LIMIT 1")])
