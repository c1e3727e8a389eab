"""``make-head``: write an EAGLE-3 head or Medusa heads with random weights for a target, in the
layout ``--draft eagle3:DIR`` / ``--draft medusa:DIR`` (and vLLM, SGLang) load."""

from __future__ import annotations

import argparse
from typing import Any

from diagnostics.cli.common import json_line
from diagnostics.heads.bounds import (MAX_CONFIG_BYTES, MAX_HEAD_BYTES, MAX_INTERMEDIATE_FACTOR, MAX_MEDUSA_HEADS,
                                      MAX_MEDUSA_LAYERS, MAX_TENSORS)


def command_make_head(args: argparse.Namespace) -> int:
    from pathlib import Path

    from diagnostics.heads.layout import check_medusa_shape, check_output, load_head, make_head
    from diagnostics.models import load_model

    check_output(Path(args.out))  # the cheap refusals come before the target is loaded
    if args.kind == "medusa":
        check_medusa_shape(args.heads, args.layers)
    target = load_model(args.target, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    out = make_head(args.kind, target, args.out, seed=args.seed, medusa_heads=args.heads, medusa_layers=args.layers,
                    draft_vocab=args.draft_vocab, init=args.init or ("target" if args.kind == "medusa" else "random"))
    head = load_head(args.kind, str(out), target)  # what was written loads back, checked against the target
    print(json_line({"head": f"{args.kind}:{out}", "target": target.name, "taps": list(head.taps),
                      "files": sorted(path.name for path in out.iterdir())}))
    return 0


def add_parser(commands: Any) -> None:
    """The ``make-head`` command's options."""
    make = commands.add_parser(
        "make-head", help="write an untrained EAGLE-3 or Medusa head for a target (to try heads without a checkpoint)",
        description="Random weights in the published on-disk layout: config.json and model.safetensors (EAGLE-3: fc, "
                    "midlayer.*, norm, lm_head, and d2t, t2d for a smaller --draft-vocab) or medusa_lm_head.safetensors. Draft with it by "
                    "--draft eagle3:DIR or --draft medusa:DIR. Medusa heads start where Medusa's training does (--init "
                    "target: residual blocks the identity, each head a copy of the target's lm_head), so they draft the "
                    "target's next-token law a few tokens late; random heads (EAGLE-3, or --init random) draft near "
                    "uniformly and are almost never accepted. "
                    f"Bounds, here and wherever a head is loaded: Medusa at most {MAX_MEDUSA_HEADS} heads of at most "
                    f"{MAX_MEDUSA_LAYERS} residual blocks; EAGLE-3 intermediate_size at most {MAX_INTERMEDIATE_FACTOR} x "
                    f"hidden_size; widths and vocabularies the target's; config.json at most {MAX_CONFIG_BYTES >> 20} MiB; "
                    f"at most {MAX_HEAD_BYTES >> 30} GiB of float32 parameters (and no more than the memory available); "
                    f"weights in safetensors (or a published pickled .pt/.bin, read by torch's weights-only unpickler, which runs no code), at most {MAX_TENSORS:,} tensors.")
    make.add_argument("kind", choices=["eagle3", "medusa"], help="eagle3 (one decoder layer on three tapped states) or medusa (residual heads)")
    make.add_argument("--target", default="default", help="the target the head drafts for (default: the embedded model)")
    make.add_argument("-o", "--out", required=True, metavar="DIR", help="a new folder, or an empty one, for the head (never a file or a symbolic link)")
    make.add_argument("--seed", type=int, default=0, help="seed of the random weights (0 to 2^63 - 1)")
    make.add_argument("--heads", type=int, default=4, help=f"Medusa: number of heads (drafts per block at most), 1 to {MAX_MEDUSA_HEADS}")
    make.add_argument("--layers", type=int, default=1, help=f"Medusa: residual blocks per head, 0 to {MAX_MEDUSA_LAYERS}")
    make.add_argument("--draft-vocab", type=int, default=None, help="EAGLE-3: draft vocabulary size (the target's first ids)")
    make.add_argument("--init", default=None, choices=["random", "target"],
                      help="Medusa: target (default: the target's lm_head in every head, residual blocks zero) or random; "
                           "EAGLE-3: random")
    make.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="dtype the target is loaded in")
    make.add_argument("--trust-remote-code", action="store_true", help="allow the target's own code (off by default)")
    make.set_defaults(handler=command_make_head)
