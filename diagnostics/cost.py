"""The draft/target cost ratio ``c`` of one decoding step, measured on this machine.

``c`` enters the modelled speed-up ``(1 − α^{γ+1}) / ((1 − α)(γ·c + 1))`` (see
``diagnostics.metrics.modelled_speedup``): the one hardware-dependent number, measured here so
the speed-up a page shows is this machine's, and editable because the user's GPU is not.

A timing on a busy machine can be far off (issue 45: c = 1.727 for ``early-exit:26`` of 30
layers), so ``measure_cost`` repeats the paired timing and reports its spread,
``pair_analytic_cost`` gives the c the pair's shapes imply (``analytic_cost_ratio``), and
``cost_flag`` says in plain words when a measured c is implausible and what to do.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from diagnostics.models import LoadedModel, is_draft_head


def step_seconds(loaded: LoadedModel, context: list[int], steps: int = 5) -> float:
    """Median wall time of one cached single-token forward after a prefill of ``context``."""
    return _Stepper(loaded, context).seconds(steps)


@torch.inference_mode()
def head_step_seconds(head, target: LoadedModel, steps: int = 5) -> float:
    """Median wall time of one draft step of a head (EAGLE-3: its layer on one new pair after 32
    cached; Medusa: every head on one state)."""
    from diagnostics.heads.eagle3 import HeadCache

    module = head.module
    hidden = torch.zeros(1, module.config.hidden_size, dtype=next(module.parameters()).dtype, device=target.device)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        if head.kind == "medusa":
            module.logits(hidden[0], module.config.medusa_num_heads)
        else:
            cache = HeadCache(torch.zeros(module.config.num_key_value_heads, 32, module.config.dim, dtype=hidden.dtype,
                                          device=target.device), None)
            cache.values = cache.keys.clone()
            module.logits(module.step(hidden, hidden, 32, cache)[-1], target.vocab_size)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def draft_cost_ratio(target: LoadedModel, drafter, context: list[int], steps: int = 3) -> float:
    """``c = t_draft / t_target`` for one decoding step at ``context``: the median of
    ``measure_cost``'s paired repeats (0 for an n-gram drafter, whose lookup costs no forward; a
    head's own step for EAGLE-3 and Medusa)."""
    return measure_cost(target, drafter, context, steps=steps).ratio


# --------------------------------------------------------------------------------------------
# The analytic c, the measurement's spread, and the flag on a measured c that is implausible
# --------------------------------------------------------------------------------------------

ANALYTIC = "analytic"  # the value of a --cost option that asks for the analytic c
FLAG_FACTOR = 1.5  # an early exit's measured c further than this factor from L/N, either way, is flagged
FLAG_FLOOR = 0.1  # … and further than this from it: a very short exit's shared head and overhead are real (L=1 of 30: c ≈ 0.1)
FLAG_SPREAD = 0.25  # a measurement whose repeats' relative IQR exceeds this is flagged
COST_REPEATS = 5  # paired (draft, target) timings per measurement: the median and the spread of their ratios


@dataclass(frozen=True)
class AnalyticCost:
    """A cost ratio from the pair's shapes, not a clock: ``ratio`` and its basis in words."""

    ratio: float
    basis: str


def analytic_cost_ratio(kind: str, *, draft_layers: int | None = None, target_layers: int | None = None,
                        draft_params: int | None = None, target_params: int | None = None) -> float | None:
    """The draft/target cost ratio ``c`` a drafter's shape implies; ``None`` where its inputs are unknown.

    - ``early-exit:L`` → ``c = L / N``, ``N`` the target's decoder layers: self-speculation runs the
      target's own first ``L`` layers, so a step costs ``L/N`` of the layers' work (the embedding
      lookup, final norm and head they share push a real c a little above it, never above 1).
    - ``model:…`` → ``c = P_draft / P_target`` with ``P`` the **non-embedding** parameter count
      (``non_embedding_parameters``: the token-embedding and output-head matrices left out, as in
      Kaplan et al. 2020). It is a lower bound on a real c: per-step overhead (kernel launches,
      Python) and the vocabulary projection do not shrink with the draft.
    - ``eagle3:…`` / ``medusa:…`` → ``c = P_head / P_target``: every parameter of the head
      (``head_parameters``: its own output projections included, since a draft step multiplies by
      them; an embedding table excluded) over the target's non-embedding parameters.
    - ``ngram:…`` → ``c = 0``: a prompt lookup runs no forward (the measured c is 0 too).

    Pure: counts in, ratio out; ``kind`` is ``DraftSpec.kind``."""
    if kind == "ngram":
        return 0.0
    if kind == "early-exit":
        return draft_layers / target_layers if draft_layers and target_layers else None
    if kind in ("model", "eagle3", "medusa"):
        return draft_params / target_params if draft_params and target_params else None
    return None


def non_embedding_parameters(model) -> int:
    """Parameters of a causal LM but its input embedding and output head matrices (tied or not)."""
    skip = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, get, lambda: None)()
        if module is not None:
            skip.update(id(parameter) for parameter in module.parameters())
    return sum(parameter.numel() for parameter in model.parameters() if id(parameter) not in skip)


def head_parameters(module) -> int:
    """Parameters of a draft head but those of its embedding tables (a lookup reads one row a step)."""
    skip = {id(parameter) for sub in module.modules() if isinstance(sub, torch.nn.Embedding) for parameter in sub.parameters()}
    return sum(parameter.numel() for parameter in module.parameters() if id(parameter) not in skip)


def _millions(count: int) -> str:
    return f"{count / 1e6:.3g}M"


def pair_analytic_cost(draft_spec: str, target: LoadedModel | None = None, drafter=None,
                       target_layers: int | None = None) -> AnalyticCost | None:
    """``analytic_cost_ratio`` for a drafter spec, from what is at hand: the loaded target (or only
    its layer count, read without loading it) and, for a model or a head, the loaded drafter.
    ``None`` for plain decoding, an unknown drafter, or counts that are not at hand."""
    from diagnostics.models import ModelError, parse_draft

    try:
        draft = parse_draft(str(draft_spec))
    except ModelError:
        return None
    if draft.kind == "ngram":
        return AnalyticCost(0.0, "an n-gram lookup runs no forward")
    if draft.kind == "early-exit":
        total = target.num_layers if target is not None else target_layers
        ratio = analytic_cost_ratio("early-exit", draft_layers=int(draft.value), target_layers=total)
        return None if ratio is None else AnalyticCost(ratio, f"L/N: {int(draft.value)} of the target's {total} layers")
    if target is None or drafter is None:
        return None
    target_params = non_embedding_parameters(target.model)
    if is_draft_head(drafter):
        params, what = head_parameters(drafter.module), "head parameters"
    elif isinstance(drafter, LoadedModel):
        params, what = non_embedding_parameters(drafter.model), "non-embedding parameters"
    else:
        return None
    ratio = analytic_cost_ratio(draft.kind, draft_params=params, target_params=target_params)
    return None if ratio is None else AnalyticCost(
        ratio, f"{what}: {_millions(params)} over the target's {_millions(target_params)} non-embedding")


@dataclass(frozen=True)
class CostMeasurement:
    """A measured c: ``ratio``, the median of ``ratios`` (one per paired draft/target timing)."""

    ratio: float
    ratios: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """Relative interquartile range of the repeats' ratios, ``(Q3 − Q1) / median``; 0 for fewer
        than two repeats or a zero median."""
        if len(self.ratios) < 2 or self.ratio <= 0:
            return 0.0
        first, _, third = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return (third - first) / self.ratio


class _Stepper:
    """One model's cache, prefilled once: ``seconds(steps)`` is the median wall time of ``steps``
    cached single-token forwards (the cache grows by one token a step)."""

    def __init__(self, loaded: LoadedModel, context: list[int]) -> None:
        from transformers import DynamicCache

        self.loaded, self.cache = loaded, DynamicCache()
        ids = torch.tensor([context], device=loaded.device)
        with torch.inference_mode():
            loaded.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.token = ids[:, -1:]

    @torch.inference_mode()
    def seconds(self, steps: int) -> float:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.loaded.model(input_ids=self.token, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            if self.loaded.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def measure_cost(target: LoadedModel, drafter, context: list[int], repeats: int = COST_REPEATS, steps: int = 3) -> CostMeasurement:
    """``c = t_draft / t_target`` at ``context``, ``repeats`` times: each repeat times ``steps``
    draft steps and ``steps`` target steps back to back (medians; the order alternates), so a burst
    of load on a busy machine spoils one ratio, not the median, and shows in the spread. Each model
    is prefilled once. 0 for an n-gram drafter (no forward); a head's own step for EAGLE-3 and
    Medusa (``head_step_seconds``)."""
    if drafter is None:
        return CostMeasurement(0.0, (0.0,))
    context = list(context)[-32:] or [0]
    target_steps = _Stepper(target, context)
    if is_draft_head(drafter):
        def draft_time(count: int) -> float:
            return head_step_seconds(drafter, target, count)
    else:
        draft_time = _Stepper(drafter, context).seconds
    draft_time(1)  # warm-up: first calls pay for allocation
    target_steps.seconds(1)
    ratios = []
    for repeat in range(max(1, repeats)):
        if repeat % 2:
            target_time = target_steps.seconds(steps)
            ratios.append(draft_time(steps) / target_time)
        else:
            draft = draft_time(steps)
            ratios.append(draft / target_steps.seconds(steps))
    return CostMeasurement(statistics.median(ratios), tuple(ratios))


def cost_flag(kind: str, measured: float, analytic: AnalyticCost | None = None, spread: float | None = None) -> str | None:
    """A short plain message when a measured c is implausible, saying why and what to do; ``None``
    when it is plausible. ``kind``: ``DraftSpec.kind``. The rule:

    - early exit with ``c > 1``: impossible in principle, the draft's step is a prefix of the target's;
    - early exit with ``c`` more than ``FLAG_FACTOR`` (1.5) times from ``L/N``, either way, and
      more than ``FLAG_FLOOR`` (0.1) from it: the draft runs the target's own layer kernels on the
      same device, so its time is ``L/N`` of the layers' plus what they share (embedding, final
      norm, head, per-call overhead). Measured on the embedded 30-layer model on 2 busy CPU cores,
      L = 8, 15, 26 came within 0.75–1.25× of L/N; L = 1 at c ≈ 0.1, 3× its 1/30 but only 0.07
      above it (the shared head is real there), hence the floor;
    - a draft model or head measured ``c ≥ 1`` though its parameters are fewer: no speed-up is
      possible at that c. Not flagged by the factor: its analytic c is a lower bound, and a small
      draft on a GPU is launch-bound, several times its parameter ratio in honest timings;
    - ``spread`` (the relative IQR of the repeats) above ``FLAG_SPREAD`` (0.25): on an idle machine
      repeats agree within a few percent, and on 2 CPU cores at load 12 they spread by 0.10–0.23:
      above a quarter the load changed under the timing."""
    reasons = []
    take = f"take the analytic c = {analytic.ratio:.3g} ({analytic.basis})" if analytic is not None else None
    if kind == "early-exit" and measured > 1:
        reasons.append(f"c = {measured:.3g} is impossible for an early exit: its step runs a part of the target's layers, "
                       "so it cannot cost more than the target's step.")
    elif kind == "early-exit" and analytic is not None and analytic.ratio > 0 and measured >= 0 and \
            not analytic.ratio / FLAG_FACTOR <= measured <= analytic.ratio * FLAG_FACTOR and \
            abs(measured - analytic.ratio) > FLAG_FLOOR:
        factor = measured / analytic.ratio
        reasons.append(f"c = {measured:.3g} is {factor:.2g}× the layer ratio {analytic.ratio:.3g}; "
                       f"more than {FLAG_FACTOR:g}× away is implausible for the target's own layers.")
    elif kind in ("model", "eagle3", "medusa") and analytic is not None and analytic.ratio < 1 <= measured:
        reasons.append(f"c = {measured:.3g}: the draft step measured as slow as the target's though the draft is smaller; "
                       "no speed-up is possible at this c.")
    if spread is not None and spread > FLAG_SPREAD:
        reasons.append(f"Its repeated timings spread widely (relative IQR {spread:.0%}, above {FLAG_SPREAD:.0%}).")
    if not reasons:
        return None
    advice = "The machine was probably busy: measure again when it is idle" + (f", or {take}." if take else ".")
    return " ".join(reasons) + " " + advice
