"""The form shared by the Run and Compare pages: prompt, models, rule, policy, γ, budget, seed."""

from __future__ import annotations

import streamlit as st

from diagnostics.audit.suite import DEFAULT_EARLY_EXIT_LAYER
from diagnostics.models import layer_count
from diagnostics.policy import Policy, PolicyError
from diagnostics.rules import EXAMPLE_SPECS
from diagnostics.request import RunRequest
from views.common import default_target, show_error


def draft_widget(prefix: str, target_layers: int | None) -> str | None:
    """The drafter spec. Early exit defaults to layer 26 on the embedded model and to the last but
    one layer of a shallower target (as the CLI does); an unknown depth allows up to 255."""
    kind = st.selectbox("Draft", ["early-exit", "ngram", "model", "eagle3", "medusa", "none"], key=f"{prefix}_draft_kind",
                        help="early-exit: the target's first layers and its head; ngram: prompt lookup; "
                             "model: another model with the same tokenizer; eagle3 / medusa: a draft head on the target's "
                             "hidden states (a folder in the published layout; make one with python -m diagnostics "
                             "make-head); none: plain decoding.")
    if kind == "early-exit":
        high = max(1, (target_layers or 256) - 1)
        # Keyed by the depth, so a new target brings its own default instead of the old value.
        layer = st.number_input("Exit after layer", 1, high, min(DEFAULT_EARLY_EXIT_LAYER, high),
                                key=f"{prefix}_layer_{target_layers}")
        return f"early-exit:{int(layer)}"
    if kind == "ngram":
        return f"ngram:{int(st.number_input('n-gram size', 1, 8, 3, key=f'{prefix}_ngram'))}"
    if kind == "model":
        name = st.text_input("Draft model (hub id or local path)", key=f"{prefix}_draft_model")
        return f"model:{name.strip()}" if name.strip() else None
    if kind in ("eagle3", "medusa"):
        folder = st.text_input(f"{'EAGLE-3' if kind == 'eagle3' else 'Medusa'} head (folder or hub id)", key=f"{prefix}_head_{kind}",
                               help="config.json and the weights in the layout the authors publish")
        return f"{kind}:{folder.strip()}" if folder.strip() else None
    return None


def policy_widgets(prefix: str) -> Policy | None:
    cols = st.columns(5)
    temperature = cols[0].number_input("temperature", 0.0, 5.0, 1.0, 0.1, key=f"{prefix}_temperature", help="0 means greedy")
    top_k = cols[1].number_input("top-k (0 = off)", 0, 100000, 0, key=f"{prefix}_top_k")
    top_p = cols[2].number_input("top-p", 0.01, 1.0, 1.0, 0.01, key=f"{prefix}_top_p")
    min_p = cols[3].number_input("min-p", 0.0, 1.0, 0.0, 0.01, key=f"{prefix}_min_p")
    eta = cols[4].number_input("eta (0 = off)", 0.0, 0.99, 0.0, 0.001, format="%.3f", key=f"{prefix}_eta")
    try:
        return Policy(temperature=temperature, top_k=int(top_k) or None, top_p=top_p if top_p < 1 else None,
                      min_p=min_p or None, eta=eta or None)
    except PolicyError as error:
        show_error(error)
        return None


def request_widgets(prefix: str, rule: str, with_prompt: bool = True, with_seed: bool = True) -> tuple[str, RunRequest | None]:
    """Widgets for everything but the rule(s); returns the target spec and a request.
    ``with_prompt=False`` (a sweep: the prompt set gives the prompts, the seeds are planned): no
    prompt and no seed widgets. ``with_seed=False`` (Compare: its own Seeds field plans them): no
    seed widget, the request's seed is 0."""
    with_seed = with_seed and with_prompt
    prompt = st.text_area("Prompt", "Write a haiku about the sea.", key=f"{prefix}_prompt", height=90) if with_prompt else "-"
    cols = st.columns(2)
    target = cols[0].text_input("Target", default_target(), key=f"{prefix}_target",
                                help="'default' is the embedded SmolLM2-135M-Instruct; or a hub id or local path")
    with cols[1]:
        draft = draft_widget(prefix, layer_count(target.strip() or "default"))
    cols = st.columns(3 if with_seed else 2)
    gamma = cols[0].number_input("γ (drafts per block)", 1, 16, 4, key=f"{prefix}_gamma")
    budget = cols[1].number_input("max new tokens", 1, 2048, RunRequest.max_new_tokens if with_prompt else 16,
                                  key=f"{prefix}_max_tokens")
    seed = cols[2].number_input("seed", 0, 2**31 - 1, 0, key=f"{prefix}_seed") if with_seed else 0
    policy = policy_widgets(prefix)
    tree, children = tree_widgets(prefix)
    raw = st.checkbox("Raw prompt (no chat template)", key=f"{prefix}_raw")
    if policy is None:
        return target, None
    return target, RunRequest(prompt=prompt, rule=rule, draft=draft, gamma=int(gamma), max_new_tokens=int(budget),
                              seed=int(seed), policy=policy, raw=raw, tree=tree, tree_children=children)


def tree_widgets(prefix: str) -> tuple[str | None, str]:
    """Chain or token tree: the tree's children per level (``3,2,1``) and how children are drafted."""
    cols = st.columns([1, 2, 2])
    shape = cols[0].radio("Verification", ["chain", "tree"], key=f"{prefix}_shape", horizontal=True,
                          help="chain: γ drafts in a row; tree: a token tree per round, every node verified in one target forward")
    if shape == "chain":
        return None, "top"
    tree = cols[1].text_input("Children per level", "3,2,1", key=f"{prefix}_tree",
                              help="each node at depth i gets Ki children: 3,2,1 drafts 3 + 6 + 6 = 15 nodes per round. "
                                   "Or a sparse tree as Medusa's medusa_choices, paths of child numbers: [[0],[1],[0,0]] "
                                   "is the root's two best children and the best child of the first")
    children = cols[2].selectbox("Children", ["top", "sample", "sample-distinct"], key=f"{prefix}_tree_children",
                                 help="top: the draft's most likely tokens (EAGLE; every tree rule); sample: i.i.d. draws from q "
                                      "(SpecInfer); sample-distinct: draws without replacement (Sequoia); sampled children are "
                                      "verified losslessly only")
    return tree.strip() or None, children


RULE_HELP = "One of: " + ", ".join(EXAMPLE_SPECS)
