#!/usr/bin/env python3
"""Standalone reproduction: transformers' universal assisted decoding (an assistant with ANOTHER tokenizer,
``UniversalSpeculativeDecodingGenerator``) hands the verification a ``q`` that belongs to another token, so
``do_sample=True`` output does not follow the target model's law.

Needs only transformers (and torch); runs offline in well under two minutes on a laptop CPU.

Setup, all local and deterministic (seed 0):
- real tokenizers: Llama-3 (target) and Qwen2 (assistant), the vocabularies llama.cpp ships as
  ``models/ggml-vocab-llama-bpe.gguf`` / ``ggml-vocab-qwen2.gguf``, converted once by transformers' GGUF
  loader and stored next to this file as xz-compressed ``tokenizer.json``;
- two tiny "context-free" models with random-free weights: a LlamaForCausalLM on the Llama-3 vocabulary and
  a Qwen2ForCausalLM on the Qwen2 vocabulary whose next-token law is the same at every position
  (embeddings constant, layers zeroed, the law written into the LM head). The target prefers
  " the" > " of" > " and" > " to" > " in" > " is"; the assistant prefers the reverse order.
  Because the law does not depend on the context, every emitted token must be an independent draw from
  the target's law ``p``: a one-line chi-square test checks it.

What is printed (each from transformers' own objects, captured while ``generate`` runs):
1. misfiled rows: for every row ``i`` of the assistant's (pruned) head, ``get_target_ids`` says which target
   token row ``i`` becomes; ``get_target_logits`` must file row ``i``'s logit under that same token.
   We count rows it files elsewhere.
2. drafted tokens whose reported ``q`` differs from the probability the assistant drew them with.
3. the acceptance rate seen vs. the lossless closed form sum_x min(p(x), q(x)) and vs. what the engine's
   misfiled ``q'`` predicts, sum_x q(x) min(1, p(x)/q'(x)).
4. the law of the emitted tokens vs. ``p`` (Pearson chi-square over the six words + "anything else").

Exit status: 0 and "OK" when the law holds; 1 and "BROKEN" when it does not; 2 when the check cannot run
on this transformers (the reason on one line).
Usage: ``python repro.py`` (``PYTHONPATH=/path/to/other/transformers python repro.py`` to test another copy).
"""

from __future__ import annotations

import argparse
import inspect
import lzma
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = ["Ġthe", "Ġof", "Ġand", "Ġto", "Ġin", "Ġis"]  # byte-level BPE spelling of " the", " of", ...
TARGET_LOGITS = [14.0, 13.5, 13.0, 12.5, 12.0, 11.5]  # every other token: logit 0
ASSISTANT_LOGITS = TARGET_LOGITS[::-1]
LAW_LEVEL = 1e-4  # chi-square p-value under which the emitted law is declared not the target's


def fail(message: str) -> None:
    """One line, exit status 2: the check could not run (not a verdict)."""
    print(f"CANNOT RUN: {message}")
    sys.exit(2)


def load_tokenizer(name: str, folder: str):
    """A fast tokenizer from ``<name>-tokenizer.json.xz`` next to this script (decompressed into ``folder``)."""
    from transformers import PreTrainedTokenizerFast

    source = os.path.join(HERE, f"{name}-tokenizer.json.xz")
    if not os.path.isfile(source):
        fail(f"{source} is missing: keep the two *-tokenizer.json.xz files next to repro.py")
    path = os.path.join(folder, f"{name}-tokenizer.json")
    with lzma.open(source) as packed, open(path, "wb") as out:
        out.write(packed.read())
    return PreTrainedTokenizerFast(tokenizer_file=path)


def context_free_model(architecture: str, vocab_size: int, logits):
    """A 1-layer model whose next-token logits are ``logits`` at every position, whatever the input:
    constant input embeddings, attention and MLP outputs zeroed, unit norms, the logits in the head's
    first column (the normed hidden state is all ones)."""
    import torch
    import transformers

    config_class = getattr(transformers, f"{architecture}Config")
    model_class = getattr(transformers, f"{architecture}ForCausalLM")
    config = config_class(vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                          tie_word_embeddings=False, rms_norm_eps=1e-6)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0 if ("norm" in name or "embed_tokens" in name) else 0.0)
        model.get_output_embeddings().weight[:, 0] = logits
    model.requires_grad_(False)
    return model


def word_logits(tokenizer, values, size: int):
    """Logit 0 everywhere, ``values[k]`` at ``WORDS[k]``'s id."""
    import torch

    vocab = tokenizer.get_vocab()
    missing = [word for word in WORDS if word not in vocab]
    if missing:
        fail(f"the bundled tokenizer lacks {missing}")
    logits = torch.zeros(size)
    for word, value in zip(WORDS, values):
        logits[vocab[word]] = value
    return logits


def chi_square_p(counts, probabilities) -> tuple[float, float]:
    """Pearson's statistic and its upper-tail p-value (``torch.special.gammaincc``)."""
    import torch

    total = sum(counts)
    expected = [total * p for p in probabilities]
    statistic = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    dof = len(counts) - 1
    return statistic, float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                                    torch.tensor(statistic / 2.0, dtype=torch.float64)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12, help="generate calls (default 12)")
    parser.add_argument("--max-new-tokens", type=int, default=30, help="tokens per call (default 30)")
    parser.add_argument("--draft-tokens", type=int, default=5, help="num_assistant_tokens (default 5)")
    args = parser.parse_args()
    started = time.time()

    import torch
    import transformers
    from transformers.generation import candidate_generator, utils as generation_utils

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()  # its deprecation notices are not the finding
    print(f"transformers {transformers.__version__} ({os.path.dirname(transformers.__file__)}), torch {torch.__version__}")
    generator_class = getattr(candidate_generator, "UniversalSpeculativeDecodingGenerator", None)
    if generator_class is None or not hasattr(generation_utils, "_speculative_sampling"):
        fail(f"transformers {transformers.__version__} has no UniversalSpeculativeDecodingGenerator")

    with tempfile.TemporaryDirectory() as folder:
        target_tokenizer = load_tokenizer("llama3", folder)
        assistant_tokenizer = load_tokenizer("qwen2", folder)
    target_size, assistant_size = len(target_tokenizer), len(assistant_tokenizer)
    target = context_free_model("Llama", target_size, word_logits(target_tokenizer, TARGET_LOGITS, target_size))
    assistant = context_free_model("Qwen2", assistant_size,
                                   word_logits(assistant_tokenizer, ASSISTANT_LOGITS, assistant_size))
    assistant.generation_config.num_assistant_tokens = args.draft_tokens
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    print(f"target: Llama-3 vocabulary ({target_size} tokens); assistant: Qwen2 vocabulary ({assistant_size} tokens)")

    # Capture, per drafting block, what the assistant drew (and with which law) and what the verification got.
    # Only per-token figures are kept (a block's full rows are ~1 MB each), plus the first block's rows for the closed forms.
    drafts: list = []  # per block: the probability each new draft was drawn with (the assistant's own scores)
    verifications: list[tuple] = []  # per block: (target ids of the drafts, the q reported for each, n_matches)
    first: dict = {}  # the first block's assistant scores row, reported candidate logits row and target logits row
    translators: list = []
    original_generate_candidates = generator_class._generate_candidates
    original_sampling = generation_utils._speculative_sampling
    sampling_signature = inspect.signature(original_sampling)

    def generate_candidates(self, generation_args):
        ids, scores = original_generate_candidates(self, generation_args)
        if scores is not None:
            new_ids = ids[0, -scores.shape[1]:]
            drafts.append(scores[0].float().softmax(-1).gather(-1, new_ids[:, None])[:, 0])
            first.setdefault("scores", scores[0, 0].float().clone())
        if not translators:
            translators.append(self._atm_translator)
        return ids, scores

    def speculative_sampling(*call_args, **call_kwargs):
        bound = sampling_signature.bind(*call_args, **call_kwargs).arguments
        valid_tokens, n_matches = original_sampling(*call_args, **call_kwargs)
        length = int(bound["candidate_length"])
        target_ids = bound["candidate_input_ids"][0, -length:].clone()
        candidate_logits = bound["candidate_logits"][0].float()
        verifications.append((target_ids, candidate_logits.softmax(-1).gather(-1, target_ids[:, None])[:, 0], int(n_matches)))
        first.setdefault("candidate_logits", candidate_logits[0].clone())
        first.setdefault("new_logits", bound["new_logits"][0, 0].float().clone())
        return valid_tokens, n_matches

    generator_class._generate_candidates = generate_candidates
    generation_utils._speculative_sampling = speculative_sampling
    emitted: list[int] = []
    try:
        prompt = target_tokenizer("Once upon a time", add_special_tokens=False, return_tensors="pt")["input_ids"]
        eos = target_tokenizer.convert_tokens_to_ids("<|end_of_text|>")
        for seed in range(args.calls):
            torch.manual_seed(seed)
            with torch.no_grad():
                output = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant,
                                         tokenizer=target_tokenizer, assistant_tokenizer=assistant_tokenizer,
                                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                         max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=eos)
            emitted.extend(output[0, prompt.shape[1]:].tolist())
    finally:
        generator_class._generate_candidates = original_generate_candidates
        generation_utils._speculative_sampling = original_sampling
    if not translators or not verifications or len(drafts) != len(verifications):
        fail(f"generate did not go through UniversalSpeculativeDecodingGenerator's speculative sampling "
             f"({len(drafts)} drafting blocks, {len(verifications)} verifications)")
    translator = translators[0]

    # 1. Misfiled rows: row i of the assistant's head becomes target token get_target_ids(i); its logit must be
    #    filed there by get_target_logits.
    rows = first["scores"].shape[-1]
    empty = torch.zeros((1, 0), dtype=torch.long)
    row_target = translator.get_target_ids(empty, empty, torch.arange(rows)[None, :])[0]
    probe = translator.get_target_logits(torch.arange(rows, dtype=torch.float32)[None, None, :])[0, 0]
    shared = row_target >= 0
    misfiled = int((probe[row_target[shared]] != torch.arange(rows)[shared].float()).sum())
    pruned = bool(getattr(translator, "assistant_prune_lm_head", False)) and hasattr(translator, "assistant_overlap_token_ids")
    print(f"1. assistant head rows (pruned to the shared vocabulary: {pruned}): {rows}; "
          f"filed under another token's id by get_target_logits: {misfiled}")

    # 2. Reported q vs the probability each drafted token was drawn with.
    drafted = wrong_q = 0
    example = None
    for drawn, (target_ids, reported, _) in zip(drafts, verifications):
        bad = ~torch.isclose(drawn, reported, rtol=1e-4, atol=1e-9)
        drafted += len(drawn)
        wrong_q += int(bad.sum())
        if example is None and bool(bad.any()):
            k = int(bad.nonzero()[0])
            example = (target_tokenizer.convert_ids_to_tokens(int(target_ids[k])), float(drawn[k]), float(reported[k]))
    line = f"2. drafted tokens: {drafted}; verified with a q that is not the probability they were drawn with: {wrong_q}"
    if example:
        line += f" (e.g. {example[0]!r} drawn with q={example[1]:.3g}, verified with q={example[2]:.3g})"
    print(line)

    # 3. Acceptance: the models are context-free, so p, q and q' are the same at every drafted position.
    p = first["new_logits"].softmax(-1)
    q = torch.zeros_like(p)
    q[row_target[shared]] = first["scores"].softmax(-1)[shared]  # the law the assistant drafts from, per target token
    q_reported = first["candidate_logits"].softmax(-1)
    ratio = torch.where(q_reported > 0, p / q_reported, torch.full_like(p, float("inf"))).clamp(max=1.0)
    accept_engine = float((q * ratio).sum())
    accept_lossless = float(torch.minimum(p, q).sum())
    residual = (p - q_reported).clamp(min=0)
    residual = residual / residual.sum() if float(residual.sum()) > 0 else p
    engine_law = q * ratio + (1.0 - accept_engine) * residual
    accepted = sum(v[2] for v in verifications)
    evaluated = sum(v[2] + (1 if v[2] < len(v[0]) else 0) for v in verifications)
    print(f"3. drafts accepted: {accepted} of {evaluated} verified ({accepted / evaluated:.3f}); lossless "
          f"verification accepts sum min(p,q) = {accept_lossless:.3f}; with the q' transformers reports: "
          f"{accept_engine:.3f}")

    # 4. The emitted law vs the target's p (every position, context-free).
    vocab = target_tokenizer.get_vocab()
    word_ids = [vocab[word] for word in WORDS]
    counts = [emitted.count(token) for token in word_ids]
    counts.append(len(emitted) - sum(counts))
    probabilities = [float(p[token]) for token in word_ids]
    probabilities.append(1.0 - sum(probabilities))
    statistic, p_value = chi_square_p(counts, probabilities)
    empirical = [c / len(emitted) for c in counts]
    tv = 0.5 * sum(abs(a - b) for a, b in zip(empirical, probabilities))
    engine_tv = 0.5 * float((engine_law - p).abs().sum())
    names = [w.replace("Ġ", " ") for w in WORDS] + ["other"]
    print(f"4. emitted {len(emitted)} tokens; counts {dict(zip(names, counts))}")
    print(f"   target law p: {dict(zip(names, [round(x, 3) for x in probabilities]))}")
    print(f"   chi-square {statistic:.1f} (df {len(counts) - 1}), p-value {p_value:.3g}; TV(emitted, p) = {tv:.3f}; "
          f"closed-form TV of a drafted position's law from p with the reported q' = {engine_tv:.3f}")

    broken = misfiled > 0 or wrong_q > 0 or p_value < LAW_LEVEL
    seconds = time.time() - started
    if broken:
        print(f"BROKEN: transformers {transformers.__version__} universal assisted decoding does not sample from the "
              f"target's law (misfiled rows {misfiled}, wrong q {wrong_q}/{drafted}, law p-value {p_value:.3g}; {seconds:.0f} s)")
        return 1
    print(f"OK: transformers {transformers.__version__} universal assisted decoding keeps the target's law "
          f"(misfiled rows 0, wrong q 0/{drafted}, law p-value {p_value:.3g}; {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
