"""Shared files a colleague (or an attacker) could send: a real export, a hostile one, and a
seeded corpus of malformed ones with one defect each. Built from real runs of a tiny model."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import duckdb
from devices import DEVICE

from diagnostics.audit import audit_recorded_run
from diagnostics.audit.reporting import summary_line
from diagnostics.audit.suite import run_engine_audit, run_rule_audit, tiny_setup
from diagnostics.evaluation.prompts import PromptItem
from diagnostics.evaluation.settings import settings_of
from diagnostics.store import SCHEMA_VERSION
from diagnostics.models import load_model
from diagnostics.comparison import compare_rules
from diagnostics.runner import RunRequest, record_run
from diagnostics.store import Store, export_runs

# Markers show where a payload would have rendered: a test looks for them inside <a>, <img>,
# <strong>, KaTeX and coloured elements, and for requests to 127.0.0.1:9 (nothing listens there).
PAYLOAD = ("PWN **PWNBOLD** [PWNLINK](http://127.0.0.1:9/link) ![PWNIMG](http://127.0.0.1:9/pixel.png) $$PWNTEX$$ "
           "https://127.0.0.1:9/auto www.pwn.example pwn@pwn.example :red[PWNRED] :material/home: "
           "<img src=http://127.0.0.1:9/html.png onerror=\"window.__pwned=1\"><script>window.__pwned=2</script> "
           "\x1b[2J\u202eEND")
HOSTILE_RUN_ID = "r1 ![PWNIMG](http://127.0.0.1:9/id.png) <b>x</b>"
HOSTILE_AUDIT_ID = "a1 [PWNLINK](http://127.0.0.1:9/a)"
HOSTILE_GROUP_ID = "g1 **PWNBOLD**"
HOSTILE_SWEEP_ID = "s1 **PWNBOLD** [PWNLINK](http://127.0.0.1:9/s)"
SWEEP_ID = "sw1"
# The real export's sweep: its group (lossless, lenience:0.1, seed 2) is unit 2 of prompt p0.
SWEEP_SETTINGS = {
    **settings_of([PromptItem("p0", "w1 w2 w3 w1 w2", {"type": "regex", "pattern": "w1"}),
                   PromptItem("p1", "w2 w3", {"type": "exact", "answer": "w3"})], ["lenience:0.1"], 3,
                  RunRequest(prompt="-", draft="ngram:2", gamma=3, max_new_tokens=14, raw=True), "shared.jsonl"),
    "target": "tiny",
}


@dataclass
class RealExport:
    path: Path
    run_ids: list[str]  # a coupled group: lossless, then lenience:0.1
    audit_ids: list[str]  # recorded (of the first run), rule, engine
    tree_run_id: str | None = None  # a tree run (lenience:0.5, tree 2,2), outside the group
    sweep_id: str | None = None  # a sweep linking the group, with its checker scores


def real_export(folder: Path, tiny_folder: str) -> RealExport:
    """A DuckDB export of a coupled group of real runs, with a recorded, a rule and an engine audit."""
    folder.mkdir(parents=True, exist_ok=True)
    store = Store(folder / "mine.duckdb")
    target = load_model(tiny_folder)
    base = {"prompt": "w1 w2 w3 w1 w2", "draft": "ngram:2", "gamma": 3, "max_new_tokens": 14, "seed": 2, "raw": True}
    _, results, _ = compare_rules(store, target, "ngram:2", [RunRequest(rule=rule, **base) for rule in ("lossless", "lenience:0.1")])
    run_ids = [run_id for run_id, _ in results]
    recorded = audit_recorded_run(store, run_ids[0], target).as_dict()
    audit_ids = [store.add_audit(recorded, summary_line(recorded))]
    tree = {**base, "draft": "early-exit:1", "rule": "lenience:0.5", "tree": "2,2"}
    tree_run_id, _ = record_run(store, target, "early-exit:1", RunRequest(**tree))
    path = export_runs(store, [*run_ids, tree_run_id], folder / "export.duckdb", "duckdb")
    shared = Store(path)
    for result in (run_rule_audit("residual_softmax", samples=2_000).as_dict(),
                   run_engine_audit("ours", tiny_setup(DEVICE), generations=20, max_new_tokens=4).as_dict()):
        audit_ids.append(shared.add_audit(result, summary_line(result)))
    _add_sweep(path, run_ids)
    return RealExport(path, run_ids, audit_ids, tree_run_id, SWEEP_ID)


def _add_sweep(path: Path, run_ids: list[str]) -> None:
    """The group as unit 2 of a sweep (prompt p0, seed 2), scored by p0's regex checker as a sweep
    stores it (exports do not carry sweeps: a shared sweep is a whole database someone sent)."""
    import json

    from diagnostics.evaluation.prompts import score

    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO sweeps VALUES (?, now()::TIMESTAMP, now()::TIMESTAMP, 'interrupted', ?, 6, 1, NULL, '0.1.0')",
                    [SWEEP_ID, json.dumps(SWEEP_SETTINGS, sort_keys=True)])
        for run_id, label in zip(run_ids, ("lossless", "lenience:0.1")):
            output = con.execute("SELECT output_text FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
            con.execute("INSERT INTO sweep_runs VALUES (?, 2, 'p0', 2, ?, ?, NULL, ?, ?)",
                        [SWEEP_ID, "lossless" if label == "lossless" else "rule", label, run_id,
                         score(SWEEP_SETTINGS["prompts"][0]["checker"], output)])


def _copy(base: RealExport, path: Path) -> Path:
    shutil.copyfile(base.path, path)
    return path


def hostile_export(base: RealExport, path: Path, marker: Path | None = None) -> RealExport:
    """The real export with the payload in every text a page or report shows: prompt, models,
    output, errors, ids (run, group, audit), token texts, audit implementation, summary and
    every string inside the evidence. Values a validated file must keep parseable (rule specs,
    statuses, kinds, policies) stay valid; a draft becomes ``model:<payload>``."""
    _copy(base, path)
    quoted = PAYLOAD.replace("'", "''")
    with duckdb.connect(str(path)) as con:
        for column in ("prompt", "target", "error", "output_text", "rule_name", "stop_reason", "software_version", "writer"):
            con.execute(f"UPDATE runs SET {column} = ?", [PAYLOAD])
        con.execute("UPDATE runs SET draft = ?, rule_params = ?", [f"model:{PAYLOAD}", '{"payload": ' + _json(PAYLOAD) + "}"])
        con.execute("UPDATE positions SET token_text = ?, draft_text = ?", [PAYLOAD, PAYLOAD])
        con.execute("UPDATE tree_nodes SET token_text = ?", [PAYLOAD])
        for index, run_id in enumerate(base.run_ids):
            new = HOSTILE_RUN_ID if index == 0 else f"r{index} {quoted[:40]}"
            for table in ("runs", "positions", "audits", "sweep_runs"):
                con.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = ?", [new, run_id])
        con.execute("UPDATE runs SET group_id = ? WHERE group_id IS NOT NULL", [HOSTILE_GROUP_ID])
        rows = con.execute("SELECT audit_id, evidence FROM audits").fetchall()
        for index, (audit_id, evidence) in enumerate(rows):
            import json

            hostile = _poison(json.loads(evidence))
            new_id = HOSTILE_AUDIT_ID if index == 0 else f"a{index} {PAYLOAD[:30]}"
            con.execute("UPDATE audits SET audit_id = ?, implementation = ?, summary = ?, evidence = ? WHERE audit_id = ?",
                        [new_id, PAYLOAD, PAYLOAD, json.dumps(hostile), audit_id])
        _hostile_sweep(con, marker or path.with_name(path.stem + "-ran"))
    return RealExport(path, [HOSTILE_RUN_ID, f"r1 {quoted[:40]}"], [HOSTILE_AUDIT_ID], base.tree_run_id, HOSTILE_SWEEP_ID)


def hostile_code(marker: Path) -> str:
    """A reply whose code, if anything ran it outside a sandbox, would create ``marker``."""
    return (f"\n```python\nopen({str(marker)!r}, 'w').write('ran')\n"
            "def has_close_elements(numbers, threshold):\n    return False\n```\n")


def _hostile_sweep(con, marker: Path) -> None:
    """The sweep of a hostile file: payloads in its id, prompt file, prompt ids, prompts and labels;
    a HumanEval checker over outputs that hold code (``hostile_code``), with no stored scores so that
    a page would be tempted to check them; a second prompt with a catastrophic regex."""
    import json

    prompts = [{"id": PAYLOAD, "prompt": PAYLOAD, "checker": {"type": "humaneval", "task_id": "HumanEval/0"}},
               {"id": "redos " + PAYLOAD[:40], "prompt": PAYLOAD, "checker": {"type": "regex", "pattern": "^(a+)+$"}}]
    settings = {**SWEEP_SETTINGS, "prompt_file": PAYLOAD, "target": PAYLOAD, "prompts": prompts}
    con.execute("UPDATE sweeps SET sweep_id = ?, settings = ?, units = 6, error = ?", [HOSTILE_SWEEP_ID, json.dumps(settings), PAYLOAD])
    con.execute("UPDATE sweep_runs SET sweep_id = ?, prompt_id = ?, score = NULL", [HOSTILE_SWEEP_ID, PAYLOAD])
    con.execute("UPDATE sweep_runs SET label = ? WHERE role = 'rule'", ["lenience:0.1 " + PAYLOAD])
    con.execute("UPDATE runs SET output_text = output_text || ? WHERE run_id IN (SELECT run_id FROM sweep_runs)", [hostile_code(marker)])


def _json(text: str) -> str:
    import json

    return json.dumps(text)


def _poison(value, key: str = ""):
    """Every string of a JSON value replaced by the payload, except the keys pages branch on."""
    if isinstance(value, dict):
        return {name: item if name in ("layer", "verdict", "run_id") else _poison(item, name) for name, item in value.items()} | (
            {"settings": {"payload": PAYLOAD}} if "layer" in value else {})
    if isinstance(value, list):
        return [_poison(item, key) for item in value]
    return PAYLOAD if isinstance(value, str) else value


# One defect per file: (name, SQL applied to a copy of the real export, what must happen).
# "refused: <fragment>" — the import refuses it with that one-line message; "renders" — it opens,
# and every page and the report show it.
DEFECTS: list[tuple[str, list[str], str]] = [
    ("policy not JSON", ["UPDATE runs SET policy = '{temperature: 1'"], "refused: a run's policy is not a valid policy"),
    ("policy with an unknown key", ["UPDATE runs SET policy = '{\"temperature\": 1, \"evil\": 2}'"], "refused: a run's policy is not a valid policy"),
    ("NULL rule", ["UPDATE runs SET rule = NULL"], "refused: a run has no rule"),
    ("NULL prompt", ["UPDATE runs SET prompt = NULL"], "refused: a run has no prompt"),
    ("NULL target", ["UPDATE runs SET target = NULL"], "refused: a run has no target"),
    ("NULL tokens", ["UPDATE runs SET tokens = NULL, n_tokens = NULL, output_text = NULL"], "renders"),
    ("NULL prompt ids", ["UPDATE runs SET prompt_ids = NULL"], "renders"),
    ("unknown rule spec", ["UPDATE runs SET rule = 'magic:3'"], "refused: a run has the unknown rule spec 'magic:3'"),
    ("unknown drafter", ["UPDATE runs SET draft = 'telepathy:9'"], "refused: a run has the unknown drafter 'telepathy:9'"),
    ("drafter that only begins with none", ["UPDATE runs SET draft = 'nonesuch'"],  # not plain (is_plain_draft): replay would fail
     "refused: a run has the unknown drafter 'nonesuch'"),
    ("unknown status", ["UPDATE runs SET status = 'exploded'"], "refused: has an unknown status 'exploded'"),
    ("evidence not JSON", ["UPDATE audits SET evidence = 'not json {'"], "refused: is not a JSON object"),
    ("evidence without positions", ["UPDATE audits SET evidence = json_object('layer', 'recorded', 'verdict', 'pass')::VARCHAR"],
     "refused: lacks 'run_id'"),
    ("evidence without verdict", ["UPDATE audits SET evidence = replace(evidence, '\"verdict\"', '\"x\"')"],
     "refused: lacks 'verdict'"),
    ("evidence with a bad pair", ["UPDATE audits SET evidence = replace(evidence, '\"dof\": ', '\"dof\": \"many\", \"x\": ') WHERE layer = 'rule'"],
     "refused: has an unusable 'pairs'"),
    ("missing prompt column", ["ALTER TABLE runs DROP COLUMN prompt"], "refused: its table runs has other columns than this tool writes (missing prompt)"),
    ("no positions table", ["DROP TABLE positions"], f"refused: claims schema {SCHEMA_VERSION} but has no positions table"),
    ("tree nodes of no run", ["INSERT INTO tree_nodes VALUES ('nope', 0, 0, -1, 1, 0, 3, 0.5, NULL, 0.5, 0.5, 0.5, 0.1, "
                              "'accepted', 0.5, 'x')"], "refused: is not a runs file this tool can show: tree nodes of run nope belong to no run"),
    ("a tree node with an unknown decision", ["INSERT INTO tree_nodes SELECT run_id, 0, 0, -1, 1, 0, 3, 0.5, NULL, 0.5, 0.5, "
                                              "0.5, 0.1, 'maybe', 0.5, 'x' FROM runs LIMIT 1"], "refused: has a tree node of unknown decision 'maybe'"),
    ("a tree node probability above 1", ["INSERT INTO tree_nodes SELECT run_id, 0, 0, -1, 1, 0, 3, 1.5, NULL, 0.5, 0.5, "
                                         "0.5, 0.1, 'refused', 0.5, 'x' FROM runs LIMIT 1"], "refused: has a probability outside [0, 1] in tree round 0"),
    ("an unknown tree shape", ["UPDATE runs SET tree = '3,x'"], "refused: is not a runs file this tool can show: a run has the unknown tree shape '3,x'"),
    ("positions without token_text", ["ALTER TABLE positions DROP COLUMN token_text"],
     "refused: its table positions has other columns than this tool writes (missing token_text)"),
    ("NULL token texts", ["UPDATE positions SET token_text = NULL, draft_text = NULL"], "renders"),
    ("schema version 'two'", ["UPDATE meta SET value = 'two'"], "refused: has schema version 'two', not a whole number"),
    ("unknown kind", ["UPDATE positions SET kind = 'teleported' WHERE position = 1"], "refused: has a position of unknown kind 'teleported'"),
    ("probability above 1", ["UPDATE positions SET p_token = 7 WHERE position = 2"], "refused: has a probability outside [0, 1] at position 2"),
    ("negative token", ["UPDATE positions SET token = -3 WHERE position = 0"], "refused: has a negative token id at position 0"),
    ("gap in positions", ["DELETE FROM positions WHERE position = 3"], "refused: are not numbered 0 … n − 1"),
    ("top-k lengths differ", ["UPDATE positions SET p_top_probs = [0.5] WHERE position = 0"],
     "refused: has top-k ids and probabilities of different lengths at position 0"),
    ("token id past any vocabulary", ["UPDATE positions SET token = 2000000000, p_top_ids = list_transform(p_top_ids, lambda x: x + 1999999990)"],
     "renders"),
    ("negative divergence", ["UPDATE runs SET divergence_position = -1"], "refused: negative gamma, seed, token budget or divergence position"),
    ("audit of a missing run", ["UPDATE audits SET run_id = 'nobody' WHERE layer = 'recorded'"], "renders"),
]


def _settings_sql(change) -> list[str]:
    """An UPDATE giving the sweep the real export's settings with ``change`` applied (a function of a
    copy of them, returning the new JSON value)."""
    import copy
    import json

    value = change(copy.deepcopy(SWEEP_SETTINGS))
    return [f"UPDATE sweeps SET settings = '{json.dumps(value).replace(chr(39), chr(39) * 2)}'"]


def _with(key: str, value):
    return lambda settings: {**settings, key: value}


def _prompt0(**fields):
    def change(settings):
        settings["prompts"][0].update(fields)
        return settings
    return change


# One defect per file in the real export's sweep (settings and links), as DEFECTS: a shared sweep
# must be refused with one line, or render on the Sweeps page and in ``report --sweep``.
SWEEP_DEFECTS: list[tuple[str, list[str], str]] = [
    ("settings not JSON", ["UPDATE sweeps SET settings = '{\"prompts\": ['"], "refused: the settings of sweep sw1 are not JSON"),
    ("settings {}", ["UPDATE sweeps SET settings = '{}'"], "refused: the settings of sweep sw1 have no prompts"),
    ("settings a list", ["UPDATE sweeps SET settings = '[1, 2]'"], "refused: the settings of sweep sw1 are not a JSON object but a list"),
    ("settings null", ["UPDATE sweeps SET settings = 'null'"], "refused: are not a JSON object but null"),
    ("settings with an unknown key", _settings_sql(_with("evil", 1)), "refused: have the unknown key 'evil'"),
    ("null prompts", _settings_sql(_with("prompts", None)), "refused: have no prompts (\"prompts\" is null"),
    ("a prompt that is a number", _settings_sql(_with("prompts", [7])), "refused: have prompt 1 without a text \"id\""),
    ("a null prompt text", _settings_sql(_prompt0(prompt=None)), "refused: have prompt 1 without a text \"id\" and a non-empty \"prompt\""),
    ("a prompt id twice", _settings_sql(lambda s: {**s, "prompts": [s["prompts"][0], {**s["prompts"][1], "id": "p0"}]}),
     "refused: have the prompt id 'p0' twice"),
    ("a checker without type", _settings_sql(_prompt0(checker={"pattern": "w1"})), "refused: checker must be an object with type"),
    ("an exact checker without answer", _settings_sql(_prompt0(checker={"type": "exact"})), 'refused: needs a non-empty "answer" string'),
    ("a regex checker without pattern", _settings_sql(_prompt0(checker={"type": "regex"})), 'refused: needs a non-empty "pattern" string'),
    ("a regex that does not compile", _settings_sql(_prompt0(checker={"type": "regex", "pattern": "(w1"})), "refused: is not valid RE2 syntax"),
    ("a regex that is not text", _settings_sql(_prompt0(checker={"type": "regex", "pattern": ["w1"]})),
     'refused: needs a non-empty "pattern" string'),
    ("a regex with a backreference", _settings_sql(_prompt0(checker={"type": "regex", "pattern": "(w)\\1"})),
     "refused: RE2 has no backreferences"),
    ("a checker with extra keys", _settings_sql(_prompt0(checker={"type": "regex", "pattern": "w1", "code": "import os"})),
     "refused: whose checker has keys of no checker"),
    ("an unknown HumanEval task", _settings_sql(_prompt0(checker={"type": "humaneval", "task_id": "HumanEval/9999"})),
     'refused: needs a known "task_id"'),
    ("an unknown rule", _settings_sql(_with("rules", ["magic:3"])), "refused: the settings of sweep sw1 cannot be run: unknown rule"),
    ("rules not a list", _settings_sql(_with("rules", "lenience:0.1")), "refused: have no rules"),
    ("null seeds", _settings_sql(_with("seeds", None)), "refused: have seeds None, not a whole number"),
    ("seeds as text", _settings_sql(_with("seeds", "3")), "refused: have seeds '3', not a whole number"),
    ("no generation settings", _settings_sql(_with("request", None)), "refused: have generation settings"),
    ("a policy that is a list", _settings_sql(lambda s: {**s, "request": {**s["request"], "policy": [1]}}),
     "refused: the settings of sweep sw1 cannot be run"),
    ("an unknown drafter", _settings_sql(lambda s: {**s, "request": {**s["request"], "draft": "telepathy:9"}}),
     "refused: the settings of sweep sw1 cannot be run"),
    ("a target that is a list", _settings_sql(_with("target", ["x"])), "refused: have a target that is a list"),
    ("a cost ratio that is text", _settings_sql(_with("cost", {"ratio": "0.4", "source": "measured"})),
     "refused: have a cost ratio '0.4', not a number from 0 to 1000"),
    ("a negative cost ratio", _settings_sql(_with("cost", {"ratio": -1, "source": "measured"})), "refused: have a cost ratio -1"),
    ("a huge cost ratio", _settings_sql(_with("cost", {"ratio": 1e308, "source": "measured"})), "refused: have a cost ratio 1e+308"),
    ("a NaN cost ratio", _settings_sql(_with("cost", {"ratio": float("nan"), "source": "measured"})),
     "refused: the settings of sweep sw1 are not JSON this tool accepts"),
    ("a cost of unknown source", _settings_sql(_with("cost", {"ratio": 0.4, "source": "<b>trust me</b>"})),
     "refused: have a cost that is not"),
    ("a stored cost ratio", _settings_sql(_with("cost", {"ratio": 0.4213, "source": "given"})), "renders"),
    ("null unit", ["UPDATE sweep_runs SET unit = NULL WHERE role = 'lossless'"], "refused: a run of a sweep has no sweep id, unit"),
    ("null seed", ["UPDATE sweep_runs SET seed = NULL"], "refused: a run of a sweep has no sweep id, unit, prompt id, seed"),
    ("unknown role", ["UPDATE sweep_runs SET role = 'judge' WHERE role = 'rule'"], "refused: has a run of unknown role 'judge'"),
    ("a linked run the file lacks", ["UPDATE sweep_runs SET run_id = 'nobody' WHERE role = 'rule'"],
     "refused: links run nobody, which the file does not hold"),
    ("links of no sweep", ["UPDATE sweep_runs SET sweep_id = 'ghost'"], "refused: runs of sweep ghost belong to no sweep"),
    ("unknown sweep status", ["UPDATE sweeps SET status = 'exploded'"], "refused: sweep sw1 has an unknown status 'exploded'"),
    ("more units done than planned", ["UPDATE sweeps SET units_done = 9"], "refused: a count of units done outside"),
    ("units that are not prompts × seeds", ["UPDATE sweeps SET units = 4"], "refused: plans 4 units, not its prompts × seeds"),
    ("a unit beyond the sweep's", ["UPDATE sweep_runs SET unit = 99 WHERE role = 'rule'"], "refused: unit or seed is outside"),
    ("a prompt id the settings lack", ["UPDATE sweep_runs SET prompt_id = 'p9'"], "refused: which its settings do not hold"),
    ("a score of 7", ["UPDATE sweep_runs SET score = 7 WHERE role = 'rule'"], "refused: has a score 7.0 outside [0, 1]"),
    ("two lossless runs in a unit", ["UPDATE sweep_runs SET role = 'lossless', label = 'lossless 2' WHERE role = 'rule'"],
     "refused: two lossless runs in unit 2"),
    ("a catastrophic regex", _settings_sql(_prompt0(checker={"type": "regex", "pattern": "^(a+)+$"}))
     + ["UPDATE runs SET output_text = repeat('a', 50000) || '!'", "UPDATE sweep_runs SET score = NULL"], "renders"),
    ("a sweep with no runs", ["DELETE FROM sweep_runs"], "renders"),
    ("scores missing (an older version's sweep)", ["UPDATE sweep_runs SET score = NULL"], "renders"),
]


def sweep_corpus(base: RealExport, folder: Path) -> list[tuple[str, Path, str]]:
    """``(defect, path, expectation)`` for every entry of ``SWEEP_DEFECTS``."""
    return _corpus(base, folder, SWEEP_DEFECTS, "sweep")


def _corpus(base: RealExport, folder: Path, defects: list[tuple[str, list[str], str]], stem: str) -> list[tuple[str, Path, str]]:
    """A copy of the real export per defect, with the defect's statements applied."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = []
    for index, (name, statements, expectation) in enumerate(defects):
        path = _copy(base, folder / f"{stem}{index:02d}.duckdb")
        with duckdb.connect(str(path)) as con:
            for statement in statements:
                con.execute(statement)
        corpus.append((name, path, expectation))
    return corpus


def malformed_corpus(base: RealExport, folder: Path) -> list[tuple[str, Path, str]]:
    """``(defect, path, expectation)`` for every entry of ``DEFECTS`` plus a truncated file."""
    corpus = _corpus(base, folder, DEFECTS, "defect")
    data = base.path.read_bytes()
    truncated = folder / "truncated.duckdb"
    truncated.write_bytes(data[: len(data) // 2])
    corpus.append(("truncated to half", truncated, "refused: is not a readable DuckDB database"))
    return corpus
