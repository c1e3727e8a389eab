"""Audit: does an implementation do what its rule declares? Run an audit at one layer, read its verdict and evidence."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import streamlit as st

from diagnostics.audit import audit_recorded_run
from diagnostics.audit.collect import collect
from diagnostics.audit.completions import Sampling
from diagnostics.audit.external import DEFAULT_DETECT_TV, audit_samples, audit_scored_samples
from diagnostics.audit.reporting import (json_safe, number, pair_rows, readable_rows, readable_settings, seconds_text, summary_line,
                                         worst_position_rows, worst_prompt_rows)
from diagnostics.audit.samples import MAX_FILE_BYTES, SamplesError, load_samples, retokenize_with_target, target_tokenize
from diagnostics.audit.two_sample import two_sample_audit
from diagnostics.audit.suite import (
    ENGINE_IMPLEMENTATIONS,
    MODEL_BUDGET,
    RULE_IMPLEMENTATIONS,
    TINY_BUDGET,
    AuditError,
    describe,
    model_setup,
    real_positions,
    run_engine_audit,
    run_rule_audit,
    tiny_setup,
)
from diagnostics.charts import CHART_CONFIG, audit_figure
from diagnostics.engine import eos_ids
from diagnostics.inspection import target_spec
from diagnostics.models import ModelError
from diagnostics.report import build_report
from diagnostics.rules import RuleError, get_rule
from views.verdicts_panel import verdict_table
from views.common import cached_model, default_target, file_name_part, literal, md, model_consent, open_store, plain, run_label, run_link, show_error, try_model

LAYERS = {
    "Rule level": "One verification step run many times on a battery of (p, q) pairs; its output law tested against p.",
    "Engine level": "Many seeded generations; every token's randomized PIT under the target's law recomputed by teacher forcing.",
    "Recorded run": "Replay every stored decision from its uniforms; recompute p with plain forwards when the model is here.",
    "External engine": "Generations from any engine (vLLM, SGLang, llama.cpp, TGI…) in a JSONL file: their PIT under the target's "
                       "law by teacher forcing here, under the server's own scores, or a two-sample test against the same "
                       "engine with speculation off.",
}
SAMPLES_FORMAT = ('One JSON object per line: {"prompt": "...", "token_ids": [...], "temperature": 1.0, "top_k": null, '
                  '"top_p": null, "min_p": null} (optional prompt_ids, text, engine, speculative, max_tokens, completion_tokens, '
                  "and scores: log-probs per token from the server). A line with text and no token_ids is tokenised with the "
                  "target's tokenizer (test against the target's law). "
                  "Write one with python -m diagnostics audit --engine ours --write-samples FILE.")

st.title("Audit")
st.caption("Does an implementation do what its rule declares? An audit of a rule or of the engine tests whether its output "
           "law is the target's (lossless) or a declared lossy rule's: a correct one fails with probability at most the level "
           "(1%), and each verdict states the smallest error its sample size could detect. An audit of a stored run checks "
           "that its decisions are consistent with the rule it declares, lossless or not.")
store = open_store()
if store is None:
    st.stop()


@st.cache_resource(show_spinner="Building the tiny audit models…")
def _tiny():
    return tiny_setup()


@st.cache_resource(show_spinner="Loading the target and its early-exit draft…")
def _real(spec: str):
    return model_setup(spec)


def _save(evidence: dict) -> None:
    evidence = json_safe(evidence)
    if store.read_only:
        st.session_state["audit_unsaved"] = evidence
        st.session_state.pop("audit_selected", None)
        st.info("This database is a shared file, opened read-only: the audit is shown but not stored.")
        return
    st.session_state["audit_selected"] = store.add_audit(evidence, summary_line(evidence))
    st.session_state.pop("audit_unsaved", None)


VERDICT_WORDS = {"fail": "FAIL", "inconclusive": "INCONCLUSIVE", "pass": "PASS"}
# What each verdict says of the output law (rule, engine and external layers).
LAW_CLAIMS = {"fail": "differs from {reference}", "inconclusive": "could not be told from {reference} with this sample",
              "pass": "is consistent with {reference}"}


def law_claim(evidence: dict, verdict: str) -> str:
    """The first sentence: what was audited and what the verdict says of its output law."""
    layer = evidence.get("layer")
    implementation = evidence.get("implementation")
    if layer == "rule":
        lossless = evidence.get("reference") in (None, "p", "p (lossless)")
        reference = "the target's p (the lossless claim)" if lossless else "the declared rule {reference}"
        return md("Rule-level audit of {implementation}: its output law " + LAW_CLAIMS[verdict].format(reference=reference) + ".",
                  implementation=implementation, reference=evidence.get("reference"))
    if layer == "engine":
        return md("Engine-level audit of {implementation}: its output law " + LAW_CLAIMS[verdict].format(reference="the target's law") + ".",
                  implementation=implementation)
    oracle = "the server's own scores" if evidence.get("rests_on") else "its reference"
    return md("External engine {implementation}: its output law " + LAW_CLAIMS[verdict].format(reference=oracle) + ".",
              implementation=implementation)


def evidence_sentence(evidence: dict) -> str:
    """The numbers that decided the verdict, in words (untrusted text through md/literal)."""
    layer = evidence.get("layer")
    if layer == "rule":
        pairs = evidence.get("pairs") or []
        worst = min(pairs, key=lambda pair: pair["adjusted_p"] if pair["adjusted_p"] is not None else 0.0, default={})
        return (md("Worst pair {label}: ", label=worst.get("label")) + f"Holm-adjusted p = {number(worst.get('adjusted_p'))}, "
                f"observed TV = {number(worst.get('observed_tv'), '.4f')}. {number(evidence.get('n_per_pair'), ',')} steps on each of "
                f"{len(pairs)} pairs; the test detects TV ≥ {number(evidence.get('max_detectable_tv'), '.3f')} with power 0.9.")
    if layer == "recorded":
        difference = evidence.get("max_p_difference")
        recomputed = (f"max |p recorded − p recomputed| = {number(difference, '.2g')}" if difference is not None
                      else "p not recomputed (the model is not available here)")
        return (md("Run {run}: ", run=evidence.get("run_id")) + f"{number(evidence.get('positions'), ',')} positions, "
                f"{len(evidence.get('flags') or [])} flags, acceptance z = {number(evidence.get('acceptance_z'), '.2f')}, {recomputed}.")
    tokens = (f"{number(evidence.get('tokens'), ',')} tokens from {number(evidence.get('generations'), ',')} generations"
              + (f" of {number(evidence.get('prompts'), ',')} prompts" if layer == "external" else ""))
    label = "pooled PIT p" if layer == "engine" else "p"
    detects = "a PIT-law TV" if layer == "engine" else "TV"
    sentence = f"{tokens}; {label} = {number(evidence.get('p_value'))}; the test detects {detects} ≥ {number(evidence.get('detectable_tv'), '.3f')}"
    if evidence.get("distortion") is not None:
        sentence += (f"; estimated distortion {number(evidence.get('distortion'), '.3f')} "
                     f"[{number(evidence.get('distortion_low'), '.3f')}, {number(evidence.get('distortion_high'), '.3f')}]")
    if evidence.get("rests_on"):
        checked = (evidence.get("score_check") or {}).get("positions")
        sentence += (f"; the scores were cross-checked against the target at {number(checked, ',')} positions" if checked
                     else "; the server's scores are taken as true, unchecked")
    return sentence + "."


def verdict_paragraph(evidence: dict) -> str:
    """One readable paragraph: the verdict, what it says, the numbers behind it, and why (each
    reason once). Untrusted text (names, labels, ids, reasons) only through ``md``/``literal``."""
    verdict = evidence.get("verdict") if evidence.get("verdict") in VERDICT_WORDS else "pass"
    if evidence.get("layer") == "recorded":
        claim = recorded_claim(evidence, verdict == "fail")
        claim = claim[0].upper() + claim[1:] + "."
    else:
        claim = law_claim(evidence, verdict)
    reasons = evidence.get("reasons") or []
    why = (" Why: " + "; ".join(literal(reason) for reason in reasons) + ".") if reasons else ""
    return f"**{VERDICT_WORDS[verdict]}** · {claim} {evidence_sentence(evidence)}{why}"


def recorded_claim(evidence: dict, failed: bool) -> str:
    """What a recorded-run audit checked: the stored decisions against the run's declared rule,
    which may be lossy (a PASS then means "did what the rule says", not "lossless")."""
    run = store.get_run(str(evidence.get("run_id")))
    if run is None:
        return "the recorded decisions are " + ("not " if failed else "") + "consistent with the run's declared rule (the run is not in this database)"
    try:
        lossy = get_rule(run["rule"]).lossy
    except RuleError:
        lossy = None
    note = " (a lossy rule: not a lossless guarantee)" if lossy else " (a lossless rule)" if lossy is False else ""
    return md("the recorded decisions are " + ("not " if failed else "") + "consistent with the declared rule {rule}", rule=run["rule"]) + note


def _uploaded_samples(label: str, key: str):
    """Samples from an uploaded JSONL file (bounded, checked line by line), or ``None``."""
    upload = st.file_uploader(label, type=["jsonl", "json", "txt"], key=key, help=SAMPLES_FORMAT)  # literal-ok: label and help are constants of this page
    if upload is None:
        return None
    if upload.size > MAX_FILE_BYTES:
        raise SamplesError(f"the file is {upload.size / 2**20:.0f} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB: split it")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{file_name_part(Path(upload.name).stem)}.jsonl"  # errors name the user's file (a tame form)
        path.write_bytes(upload.getvalue())
        return load_samples(path)


def _endpoint_fields() -> dict | None:
    """The endpoint to collect from and what to ask it, or ``None`` until it is filled in."""
    left, right = st.columns(2)
    url = left.text_input("Endpoint (OpenAI-compatible)", "http://127.0.0.1:8000", key="audit_ext_url",
                          help="vLLM, SGLang, llama.cpp, TGI…: the server with speculation on; /v1/completions is called")
    model = right.text_input("Model name (as the server knows it)", "", key="audit_ext_model")
    prompts = st.text_area("Prompts (one per line, sent as raw completions)", "The capital of France is", key="audit_ext_prompts")
    cols = st.columns(4)
    n = cols[0].number_input("Generations per prompt", 1, 10_000, 100, key="audit_ext_n")
    max_tokens = cols[1].number_input("Tokens per generation", 1, 1024, 16, key="audit_ext_tokens")
    temperature = cols[2].number_input("Temperature", 0.0, 5.0, 1.0, 0.05, key="audit_ext_temperature")
    top_k = cols[3].number_input("top-k (0: off)", 0, 1_000_000, 0, key="audit_ext_top_k")
    lines = [line for line in prompts.splitlines() if line.strip()]
    if not model.strip() or not lines:
        st.caption("Give the model name and at least one prompt.")
        return None
    return {"url": url.strip(), "model": model.strip(), "prompts": lines,
            "sampling": Sampling(max_tokens=int(max_tokens), temperature=float(temperature), top_k=int(top_k) or None),
            "n": int(n)}


def _collect_on_page(fields: dict, url: str, out: Path, first_seed: int, speculative: bool, tokenize, eos_id,
                     scores: tuple[str, int] | None = None) -> list:
    """Collect from ``url`` into ``out`` with a progress bar (Stop keeps what came), scored by the
    server when ``scores`` = (API, log-probs per token); its samples."""
    bar = st.progress(0.0, text=md("collecting from {url}", url=url))
    collect(url, fields["model"], fields["prompts"], out, n=fields["n"], sampling=fields["sampling"], first_seed=first_seed,
            speculative=speculative, tokenize=tokenize, eos_id=eos_id, scores_api=None if scores is None else scores[0],
            score_logprobs=20 if scores is None else scores[1],
            progress=lambda done, total: bar.progress(done / total, text=f"{int(done)} / {int(total)} generations"))  # literal-ok: counts
    bar.empty()
    return load_samples(out)


def external_form() -> None:
    """Audit an engine from its outputs: a samples file (uploaded) or generations collected from an
    endpoint here, against the local target or the same engine with speculation off."""
    source = st.radio("Generations", ["file", "endpoint"], horizontal=True, key="audit_ext_source",
                      format_func={"file": "an uploaded JSONL file", "endpoint": "collected now from an endpoint"}.get)
    fields = _endpoint_fields() if source == "endpoint" else None
    samples = _uploaded_samples("Generations (JSONL, speculation on)", "audit_ext_file") if source == "file" else None
    oracle = st.radio("Test against", ["target", "baseline", "server"], horizontal=True, key="audit_ext_oracle",
                      format_func={"target": "the target's law here (teacher forcing)",
                                   "baseline": "the same engine with speculation off (two-sample; no weights needed)",
                                   "server": "the server's own scores (vLLM, SGLang; no weights needed)"}.get,
                      help="The server's scores settle the declared law exactly at temperature 0, with top-k at most the "
                           "log-probs returned, at temperature 1 without truncation, or with a min-p cut inside them.")
    left, right = st.columns(2)
    detect = left.number_input("TV to rule out", 0.005, 0.5, DEFAULT_DETECT_TV, 0.005, format="%.3f", key="audit_ext_tv",
                               help="A clean sample too small to detect this distortion is 'inconclusive', not 'pass'.")
    baseline, baseline_url, target_name, scores = None, None, None, None
    if oracle == "server":
        if source == "endpoint":
            api = right.selectbox("Scores API", ["vllm", "sglang"], key="audit_ext_scores_api",
                                  help="vLLM: prompt_logprobs; SGLang: input_top_logprobs. Asked after each generation, never with it.")
            scores = (api, int(st.number_input("Log-probs per token", 1, 1024, 20, key="audit_ext_score_k")))
    elif oracle == "target":
        target_name = right.text_input("Target (the model the engine served)", default_target(), key="audit_ext_target")
    elif source == "file":
        baseline = _uploaded_samples("Baseline generations (JSONL, speculation off)", "audit_ext_baseline")
    else:
        baseline_url = right.text_input("Baseline endpoint (speculation off)", "http://127.0.0.1:8001", key="audit_ext_baseline_url")
    if source == "file":
        ready = samples is not None and (oracle != "baseline" or baseline is not None)
        if samples is not None:
            text_only = sum(sample.text_only for sample in samples)
            st.caption(f"{len(samples)} generations, {sum(len(sample.token_ids) for sample in samples):,} tokens"  # literal-ok: counts
                       + (f", {text_only} with text only (tokenised with the target)" if text_only else "")  # literal-ok: counts
                       + ("" if baseline is None else f"; baseline {len(baseline)} generations"))  # literal-ok: counts
    else:
        ready = fields is not None and (oracle != "baseline" or bool(baseline_url and baseline_url.strip()))
    if not st.button("Audit the generations", type="primary", key="audit_ext_go", disabled=not ready):
        return
    stop = st.empty()  # cleared when the audit is done
    stop.button("Stop", key="audit_ext_stop", help="Stops now; collected generations stay in their file, nothing is audited")
    target = cached_model(target_name.strip() or "default") if oracle == "target" else None
    if fields is not None:
        out = Path("data") / f"samples-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        tokenize, eos_id = target_tokenize(target)
        samples = _collect_on_page(fields, fields["url"], out, 0, True, tokenize, eos_id, scores)
        st.caption(md("collected into {path}", path=str(out)))
        if baseline_url:
            baseline = _collect_on_page(fields, baseline_url.strip(), out.with_name(out.stem + ".baseline.jsonl"),
                                        len(fields["prompts"]) * fields["n"], False, tokenize, eos_id)
    source_name = "uploaded file" if fields is None else str(out)
    if target is not None:  # text-only lines: ids from the target's tokenizer, as the CLI's --target gives
        retokenize_with_target(target, [samples])
    if baseline is not None:
        result = two_sample_audit(samples, baseline, detect_tv=float(detect), source=source_name)
    elif oracle == "server":
        result = audit_scored_samples(samples, detect_tv=float(detect), source=source_name)
    else:
        bar = st.progress(0.0, text="Teacher forcing…")
        result = audit_samples(samples, target, detect_tv=float(detect), source=source_name, eos=eos_ids(target, None),
                               progress=lambda done, total: bar.progress(done / total, text=f"Teacher forcing {int(done)}/{int(total)}"))
        bar.empty()
    stop.empty()
    _save(result.as_dict())


# Open while there is no audit yet, and stays open once the user has run one from it this session
# (a rerun that closed it would hide the result's messages and the form's controls).
if any(st.session_state.get(key) for key in ("audit_rule_go", "audit_engine_go", "audit_ext_go", "audit_run_go")):
    st.session_state["audit_form_used"] = True  # the click's own rerun: a button's state is true only now
with st.expander("New audit", expanded=store.list_audits().empty or st.session_state.get("audit_form_used", False)):
    layer = st.radio("Layer", list(LAYERS), horizontal=True, key="audit_layer")
    st.caption(LAYERS[layer])
    try:
        if layer == "Rule level":
            implementation = st.selectbox("Implementation", RULE_IMPLEMENTATIONS, format_func=lambda name: plain(f"{name}: {describe(name)}"),
                                          key="audit_rule_impl")
            left, middle, right = st.columns(3)
            rule = left.text_input("Our rule (for 'ours')", "lossless", key="audit_rule_spec")
            declared = middle.text_input("Test against a declared lossy rule (empty: p)", "", key="audit_declared")
            samples = right.number_input("Steps per pair", 1_000, 1_000_000, 60_000, step=10_000, key="audit_samples")
            real = st.checkbox("Add 2 real positions of the target (full-vocabulary p and its early-exit q)", key="audit_real")
            if st.button("Run the rule-level audit", type="primary", key="audit_rule_go"):
                with st.spinner("Auditing…"):
                    pairs = real_positions(_real(default_target()), 2) if real else None
                    result = run_rule_audit(implementation, rule=rule or None, samples=int(samples),
                                            declared=declared or None, real_pairs=pairs)
                _save(result.as_dict())
        elif layer == "Engine level":
            implementation = st.selectbox("Generator", ENGINE_IMPLEMENTATIONS, format_func=lambda name: plain(f"{name}: {describe(name)}"),
                                          key="audit_engine_impl")
            models = st.radio("Models", ["tiny", "target"], key="audit_models",
                              format_func={"tiny": "tiny (random 12-token Llamas, seconds)",
                                           "target": md("the target {target} with its early-exit draft (minutes)", target=default_target())}.get)
            tiny = models == "tiny"
            left, middle, right = st.columns(3)
            default_generations, default_tokens = TINY_BUDGET if tiny else MODEL_BUDGET
            generations = left.number_input("Generations", 10, 5_000, default_generations, key=f"audit_generations_{tiny}")
            max_new = middle.number_input("Tokens per generation", 1, 64, default_tokens, key=f"audit_tokens_{tiny}")
            gamma = right.number_input("γ (draft tokens per block)", 1, 8, 3, key="audit_gamma")
            if st.button("Run the engine-level audit", type="primary", key="audit_engine_go"):
                setup = _tiny() if tiny else _real(default_target())
                bar = st.progress(0.0, text="Generating…")
                result = run_engine_audit(implementation, setup, generations=int(generations), max_new_tokens=int(max_new),
                                          gamma=int(gamma), progress=lambda done, total: bar.progress(done / total, text=f"Generation {int(done)}/{int(total)}"))
                bar.empty()
                _save(result.as_dict())
        elif layer == "External engine":
            external_form()
        else:
            runs = store.list_runs()
            if runs.empty:
                st.info("No runs yet: record one on the Run page first.")
            else:
                labels = {row.run_id: run_label(row) for row in runs.itertuples()}
                run_id = st.selectbox("Run", list(labels), format_func=labels.get, key="audit_run")
                chosen = store.get_run(run_id)
                # Loading the run's models (to recompute p) is the user's call when a file names them.
                allowed = model_consent(chosen, key="audit_load_models")
                if st.button("Audit this run", type="primary", key="audit_run_go"):
                    with st.spinner("Replaying every decision…"):
                        target = try_model(target_spec(chosen)) if allowed else None
                        evidence = audit_recorded_run(store, run_id, target).as_dict()
                    evidence["p_recomputed"] = target is not None
                    _save(evidence)
    except (AuditError, RuleError, ModelError, ValueError) as error:
        show_error(error)

verdict_table(store, _save)

st.subheader("Audits")
audits = store.list_audits()
unsaved = st.session_state.get("audit_unsaved")
if audits.empty and unsaved is None:
    st.info("No audits yet. Run one above, or `python -m diagnostics audit --all --save` for every implementation and planted bug.")
    st.stop()

evidence = unsaved
audit_id = None
if not audits.empty:
    shown = audits[["audit_id", "created", "layer", "implementation", "verdict", "run_id", "summary"]].copy()
    shown["created"] = [seconds_text(value) for value in shown["created"]]  # to the second: microseconds say nothing here
    ids = shown["audit_id"].tolist()
    # The audit just run wins over the one in the link (?audit=ID).
    wanted = st.session_state.get("audit_selected") or st.query_params.get("audit")
    audit_id = st.selectbox("Show", ids, index=ids.index(wanted) if wanted in ids else 0, key=f"audit_show_{wanted}",
                            format_func=lambda value: plain(" · ".join(str(item) for item in shown.set_index("audit_id").loc[value, ["verdict", "layer", "implementation", "created"]])))
    with st.expander(f"All {len(shown)} stored audits"):
        st.dataframe(shown.fillna("–"), hide_index=True, column_config={
            "audit_id": st.column_config.TextColumn("audit"), "run_id": st.column_config.TextColumn("run"),
            "summary": st.column_config.TextColumn("summary", width="large")})
    if unsaved is None or st.session_state.get("audit_selected"):
        evidence = store.get_audit(audit_id)["evidence"]

verdict = evidence["verdict"]
# Material symbols (Streamlit's bundled icon font), not emoji: without an emoji font those draw as empty boxes.
banner = {"fail": (st.error, ":material/error:"), "inconclusive": (st.warning, ":material/warning:")}.get(
    verdict, (st.success, ":material/check_circle:"))
# One paragraph says the verdict once, in words; the reasons are in it (not listed again below).
banner[0](verdict_paragraph(evidence), icon=banner[1])  # literal-ok: verdict_paragraph passes untrusted text through md/literal
figure = audit_figure(evidence)
if figure is not None:
    st.plotly_chart(figure, key="audit_chart", config=CHART_CONFIG)
if evidence.get("layer") == "rule":
    st.markdown("**Evidence per (p, q) pair** (worst first; Holm-adjusted across the pairs)")
    st.dataframe(readable_rows(pair_rows(evidence)), hide_index=True)
rows = worst_position_rows(evidence)
if rows:
    st.markdown("**Worst positions**" + (" (output position: the t-th emitted token of every generation)" if evidence.get("layer") == "engine" else ""))
    st.dataframe(readable_rows(rows), hide_index=True)
    if evidence.get("layer") == "recorded":
        # The positions the table lists, in its order (flags first, then the largest |Δp|), each linked to itself.
        positions = list(dict.fromkeys(int(row["position"]) for row in rows if row["position"] >= 0))
        if positions:
            st.markdown("Inspect: " + " · ".join(run_link(f"position {position}", evidence["run_id"], position) for position in positions))  # literal-ok: run_link pieces
elif evidence.get("layer") in ("engine", "external") and evidence.get("bin_counts"):
    st.caption("No output position had the 100 tokens needed for a test of its own; only the pooled test ran.")
prompts = worst_prompt_rows(evidence)
if prompts:
    st.markdown("**Worst prompts** (each prompt's PIT on its own; Holm-adjusted across prompts)")
    st.dataframe(readable_rows(prompts), hide_index=True)
settings = evidence.get("settings")
if settings:
    st.caption(md("Settings: {settings}", settings=readable_settings(settings)))
if audit_id is not None and evidence is not unsaved:
    st.download_button("Download report (HTML)", build_report(store, [], [audit_id]), file_name=f"audit-{file_name_part(audit_id)}.html",
                       mime="text/html", key="audit_report")
