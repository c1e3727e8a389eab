"""Named audits, ready to run: what ``python -m diagnostics audit`` and the Audit page call.

Rule level: ``ours[:SPEC]``, ``transformers`` (its ``_speculative_sampling``) or a rule-level
planted bug, on the battery (plus real positions of a model when asked). Engine level:
``ours``, ``transformers`` (``generate`` with ``assistant_model``, ``do_sample=True``) or an
engine-level planted bug, on a target/draft pair: ``tiny`` (random 2-layer Llamas built locally,
thousands of generations in seconds) or a real model with an early-exit draft (the embedded
default: ``default``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from diagnostics.audit.engine_level import EngineAudit, PitSample, audit_generator, engine_generator, pit_sample, transformers_generator
from diagnostics.audit.mutants import BATCH_MUTANTS, ENGINE_MUTANT_POLICY, ENGINE_MUTANTS, RULE_MUTANTS, TREE_MUTANTS
from diagnostics.audit.rule_level import RuleAudit, audit_rule, battery, model_pairs, rule_adapter, transformers_adapter
from diagnostics.engine import CORRECT
from diagnostics.policy import Policy
from diagnostics.engine.tree_draft import TreeSpec

RULE_IMPLEMENTATIONS = ["ours", "transformers", *RULE_MUTANTS]
ENGINE_IMPLEMENTATIONS = ["ours", "transformers", *ENGINE_MUTANTS, *BATCH_MUTANTS]
TREE_IMPLEMENTATIONS = ["ours", *TREE_MUTANTS]  # with --tree: transformers has no tree verification
TINY = "tiny"
DEFAULT_PROMPT = "Tell me a short story about a robot who learns to paint."
DEFAULT_EARLY_EXIT_LAYER = 26  # the Run page's default draft for the embedded model


# (generations, tokens per generation): seconds on the tiny models, about a minute on the embedded one.
TINY_BUDGET = (800, 12)
MODEL_BUDGET = (40, 16)


class AuditError(ValueError):
    """An audit cannot run as asked; the message says what to change."""


def check_budget(generations: int, max_new_tokens: int, gamma: int) -> None:
    """Refuse an empty engine audit (callers check before loading any model)."""
    if generations < 1 or max_new_tokens < 1 or gamma < 1:
        raise AuditError("--generations, --max-new-tokens and --gamma must all be at least 1")


def describe(implementation: str) -> str:
    """One line on what an implementation name audits."""
    if implementation == "ours":
        return "this tool's verification (rule level) or engine (engine level)"
    if implementation == "transformers":
        return "Hugging Face transformers: _speculative_sampling (rule level), generate with assistant_model (engine level)"
    if implementation in RULE_MUTANTS:
        return f"planted bug (rule level): {RULE_MUTANTS[implementation][0]}"
    if implementation in ENGINE_MUTANTS:
        return f"planted bug (engine level): {ENGINE_MUTANTS[implementation][0]}"
    if implementation in BATCH_MUTANTS:
        return f"planted bug (batched engine, rows of one batch): {BATCH_MUTANTS[implementation][0]}"
    if implementation in TREE_MUTANTS:
        return f"planted bug (tree engine, with --tree): {TREE_MUTANTS[implementation][0]}"
    names = dict.fromkeys(RULE_IMPLEMENTATIONS + ENGINE_IMPLEMENTATIONS + TREE_IMPLEMENTATIONS)
    raise AuditError(f"unknown implementation {implementation!r}; use one of {', '.join(names)}")


def run_rule_audit(implementation: str = "ours", rule: str | None = None, samples: int = 60_000, level: float = 0.01,
                   declared: str | None = None, seed: int = 0, real_pairs: list | None = None) -> RuleAudit:
    """The rule-level audit of a named implementation on the battery (and ``real_pairs``)."""
    if samples < 100:
        raise AuditError(f"--samples must be at least 100 per pair, got {samples}")
    if not 0 < level < 1:
        raise AuditError(f"--level must lie in (0, 1), got {level}")
    if implementation == "ours":
        verify, name = rule_adapter(rule or "lossless"), f"ours:{rule or 'lossless'}"
    elif implementation == "transformers":
        verify, name = transformers_adapter(), "transformers._speculative_sampling"
    elif implementation in RULE_MUTANTS:
        verify, name = RULE_MUTANTS[implementation][1], f"planted:{implementation}"
    else:
        describe(implementation)  # raises with the list of names
        raise AuditError(f"{implementation!r} is an engine-level planted bug; audit it with --engine {implementation}")
    return audit_rule(verify, battery(seed=seed, extra=real_pairs), n=samples, level=level, declared=declared,
                      seed=seed, implementation=name)


@dataclass
class EngineSetup:
    """A target, its draft (also transformers' assistant), a prompt and the stop tokens."""

    target: object
    draft: object
    prompt_ids: list[int]
    eos: set[int]
    description: dict = field(default_factory=dict)


def tiny_setup(device: str | torch.device = "cpu") -> EngineSetup:
    """Two random 2-layer Llamas over 12 tokens (EOS = 11) and a 7-token prompt, on ``device``."""
    from diagnostics.tiny import tiny_llama

    target = tiny_llama(0, vocab=12, sharpness=2.0, device=device)
    draft = tiny_llama(1, vocab=12, sharpness=2.0, device=device)
    return EngineSetup(target, draft, [1, 2, 3, 4, 1, 2, 3], {11},
                       {"target": "tiny-llama-0 (random, 12 tokens)", "draft": "tiny-llama-1 (random)"})


def model_setup(target_spec: str = "default", layer: int | None = None, prompt: str = DEFAULT_PROMPT,
                local_only: bool = False) -> EngineSetup:
    """A real target and its first ``layer`` layers as the draft (usable as transformers' assistant);
    by default layer 26, or the last but one for a shallower target."""
    from diagnostics.engine import eos_ids
    from diagnostics.models import early_exit_model, load_model
    from diagnostics.runner import encode_prompt

    target = load_model(target_spec, local_only=local_only)
    draft = early_exit_model(target, layer if layer is not None else max(1, min(DEFAULT_EARLY_EXIT_LAYER, target.num_layers - 1)))
    return EngineSetup(target, draft, encode_prompt(target, prompt), eos_ids(target, None),
                       {"target": target.name, "draft": draft.name, "prompt": prompt})


@dataclass
class EnginePlan:
    """A named generator ready to audit: what ``run_engine_audit`` runs, and what ``audit --all``
    runs in parts (disjoint seed ranges in worker processes, merged before the verdict)."""

    generator: Callable[[list[int], int], list[int]]
    policy: Policy
    name: str
    settings: dict
    seeds: range


def plan_engine_audit(implementation: str, setup: EngineSetup, generations: int = TINY_BUDGET[0],
                      max_new_tokens: int = TINY_BUDGET[1], gamma: int = 3, policy: Policy | None = None,
                      level: float = 0.01, first_seed: int = 0, tree: TreeSpec | None = None) -> EnginePlan:
    """Check the settings and build the generator of a named implementation (see ``run_engine_audit``)."""
    check_budget(generations, max_new_tokens, gamma)
    if not 0 < level < 1:
        raise AuditError(f"--level must lie in (0, 1), got {level}")
    seeds = range(first_seed, first_seed + generations)
    if tree is not None:
        return _tree_engine_plan(implementation, setup, max_new_tokens, tree, policy, seeds)
    if implementation in TREE_MUTANTS:
        raise AuditError(f"{implementation!r} is a planted tree bug; audit it with --tree, e.g. --tree 3,2,1")
    if implementation not in ENGINE_IMPLEMENTATIONS:
        describe(implementation)
        raise AuditError(f"{implementation!r} is a rule-level planted bug; audit it without --engine")
    if policy is None:
        policy = Policy(**ENGINE_MUTANT_POLICY.get(implementation, {}))
    if implementation == "transformers":
        generator = transformers_generator(setup.target, setup.draft, max_new_tokens, policy=policy, gamma=gamma)
    else:
        seams = {**ENGINE_MUTANTS, **BATCH_MUTANTS}.get(implementation, (None, CORRECT))[1]
        generator = engine_generator(setup.target, setup.draft, max_new_tokens, policy=policy, gamma=gamma,
                                     eos_token_id=sorted(setup.eos), seams=seams)
    name = {"ours": "ours (lossless engine)", "transformers": "transformers generate(assistant_model, do_sample=True)"}.get(
        implementation, f"planted:{implementation}")
    settings = dict(setup.description, implementation=implementation, gamma=gamma, max_new_tokens=max_new_tokens,
                    policy=policy.as_dict())
    return EnginePlan(generator, policy, name, settings, seeds)


def run_engine_audit(implementation: str, setup: EngineSetup, generations: int = TINY_BUDGET[0], max_new_tokens: int = TINY_BUDGET[1],
                     gamma: int = 3, policy: Policy | None = None, level: float = 0.01, first_seed: int = 0,
                     progress: Callable[[int, int], None] | None = None, tree: TreeSpec | None = None) -> EngineAudit:
    """Seeded generations ``first_seed … first_seed + generations − 1`` of a named generator, audited.
    With ``tree``, our tree engine (``ours``) or a planted tree bug (``TREE_MUTANTS``)."""
    plan = plan_engine_audit(implementation, setup, generations, max_new_tokens, gamma, policy, level, first_seed, tree)
    return audit_generator(plan.generator, setup.target, setup.prompt_ids, plan.seeds, policy=plan.policy, level=level,
                           eos=setup.eos, implementation=plan.name, settings=plan.settings, progress=progress)


def engine_samples(plan: EnginePlan, setup: EngineSetup, path: str, engine: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> int:
    """Write the plan's seeded generations (each cut after its first EOS) as a samples file, the
    format ``audit --samples`` reads, and return how many were written (a crashed seed has none).
    The file is rewritten after each batch of seeds (``BATCH_SEEDS`` seeds for a generator that
    batches, one seed for one that does not, such as transformers' ``generate``: seconds a seed), so
    a stopped run leaves what it made; ``progress(done, total)`` after each batch."""
    from diagnostics.audit.engine_level import BATCH_SEEDS, _generate_chunk
    from diagnostics.audit.samples import Sample, write_samples

    policy = plan.policy or Policy()
    seeds = list(plan.seeds)
    batch = getattr(plan.generator, "batch", None)
    step = BATCH_SEEDS if batch is not None else 1  # as ``pit_sample`` steps
    samples = []
    for first in range(0, len(seeds), step):
        chunk = seeds[first : first + step]
        for seed, tokens in zip(chunk, _generate_chunk(plan.generator, batch, setup.prompt_ids, chunk)):
            if isinstance(tokens, Exception):
                continue
            ended = next((index for index, token in enumerate(tokens) if token in setup.eos), None)
            tokens = tokens if ended is None else tokens[: ended + 1]
            samples.append(Sample(prompt=setup.description.get("prompt", ""), token_ids=list(tokens), temperature=policy.temperature,
                                  top_k=policy.top_k, top_p=policy.top_p, min_p=policy.min_p, prompt_ids=list(setup.prompt_ids),
                                  engine=engine or plan.name, speculative=True, seed=int(seed)))
        write_samples(path, samples)
        if progress is not None:
            progress(first + len(chunk), len(seeds))
    if not seeds:
        write_samples(path, samples)
    return len(samples)


def engine_audit_part(plan: EnginePlan, setup: EngineSetup, part: int, parts: int) -> PitSample:
    """The PIT sample of the ``part``-th of ``parts`` contiguous slices of the plan's seeds."""
    seeds = list(plan.seeds)
    chunk = seeds[part * len(seeds) // parts : (part + 1) * len(seeds) // parts]
    return pit_sample(plan.generator, setup.target, setup.prompt_ids, chunk, policy=plan.policy, eos=setup.eos)


def _tree_engine_plan(implementation: str, setup: EngineSetup, max_new_tokens: int, tree: TreeSpec,
                      policy: Policy | None, seeds: range) -> EnginePlan:
    if implementation not in TREE_IMPLEMENTATIONS:
        describe(implementation)
        raise AuditError(f"{implementation!r} cannot be audited with --tree; tree implementations: {', '.join(TREE_IMPLEMENTATIONS)}")
    policy = policy or Policy()
    seams = TREE_MUTANTS[implementation][1] if implementation in TREE_MUTANTS else CORRECT
    generator = engine_generator(setup.target, setup.draft, max_new_tokens, policy=policy, tree=tree,
                                 eos_token_id=sorted(setup.eos), seams=seams)
    name = (f"ours (lossless tree engine, {tree.text}, {tree.children} children)" if implementation == "ours"
            else f"planted:{implementation}")
    settings = dict(setup.description, implementation=implementation, tree=tree.text, tree_children=tree.children,
                    max_new_tokens=max_new_tokens, policy=policy.as_dict())
    return EnginePlan(generator, policy, name, settings, seeds)


def real_positions(setup: EngineSetup, count: int, max_new_tokens: int = 24, seed: int = 0) -> list:
    """``count`` real ``(p, q)`` positions of ``setup``'s target and draft on one of our own generations."""
    from diagnostics.engine import generate

    tokens = generate(setup.target, None, setup.prompt_ids, max_new_tokens=max_new_tokens, seed=seed, record=False).tokens
    return model_pairs(setup.target, setup.draft, setup.prompt_ids, tokens, count=count)
