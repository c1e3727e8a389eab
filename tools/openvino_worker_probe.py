"""Drive the OpenVINO GenAI worker by hand: one set-up, a sequence of requests, what each answers.

    .venv/bin/python tools/openvino_worker_probe.py --mode draft --calls s,k,g --seeds 4
    .venv/bin/python tools/openvino_worker_probe.py --mode lookup --calls g,s --prompt "Repeat: a b c a b c"

``--mode``: control, draft (``--draft`` HF folder, default data/engines/drafts/early-exit-26) or
lookup. ``--calls``: one request per letter: g greedy, s t=1, k t=1 top_k 20. Each line printed is
one answer: its time, tokens/s, the engine's counters and the first seeds' outputs (or the error).
With ``--json FILE`` every answer is also written there. Needs ``tools/build-openvino.sh`` first.
Runs with this lab's .venv (it tokenizes the prompt with the target's chat template).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "diagnostics" / "verdicts" / "workers" / "openvino_worker.py"
KINDS = {"g": (0.0, None), "s": (1.0, None), "k": (1.0, 20)}


def prompt_ids(model: Path, text: str) -> list[int]:
    """The prompt with the target's chat template (as the lab encodes it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(token) for token in ids]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["control", "draft", "lookup"], default="draft")
    parser.add_argument("--model", type=Path, default=ROOT / "data" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--draft", type=Path, default=ROOT / "data" / "engines" / "drafts" / "early-exit-26")
    parser.add_argument("--cache", type=Path, default=ROOT / "data" / "engines" / "openvino")
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("OPENVINO_VENV", ROOT / "data" / "openvino" / "venv")))
    parser.add_argument("--calls", default="g,s,k")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--assistant", type=int, default=4, help="num_assistant_tokens")
    parser.add_argument("--ngram", type=int, default=3, help="max_ngram_size (prompt lookup)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", default="Write a short story about a robot who learns to paint.")
    parser.add_argument("--json", type=Path, help="write every answer here, one JSON object a line")
    parser.add_argument("--show", type=int, default=2, help="outputs shown per answer")
    args = parser.parse_args()

    speculative = None
    if args.mode == "draft":
        speculative = {"draft_model": str(args.draft.resolve()), "num_assistant_tokens": args.assistant}
    elif args.mode == "lookup":
        speculative = {"prompt_lookup": True, "num_assistant_tokens": args.assistant, "max_ngram_size": args.ngram}
    setup = {"model": str(args.model.resolve()), "speculative": speculative, "cache": str(args.cache.resolve()), "threads": args.threads}
    ids = prompt_ids(args.model, args.prompt)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    record = args.json.open("w") if args.json else None
    process = subprocess.Popen([str(args.venv / "bin" / "python"), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL if record is None else open(str(args.json) + ".stderr", "w"), text=True)

    def exchange(message: dict) -> tuple[dict, float]:
        begin = time.monotonic()
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"the worker died (status {process.wait()})")
        answer = json.loads(line)
        if record:
            record.write(json.dumps({"request": message, "answer": answer, "seconds": time.monotonic() - begin}) + "\n")
        return answer, time.monotonic() - begin

    ready, seconds = exchange(setup)
    print(f"set-up {args.mode}: {seconds:.1f} s: {json.dumps(ready)[:2000]}")
    if "error" in ready:
        return 1
    print(f"prompt: {len(ids)} ids; seeds {seeds[0]}..{seeds[-1]}; max_tokens {args.max_tokens}")
    for number, kind in enumerate(args.calls.split(",")):
        temperature, top_k = KINDS[kind]
        answer, seconds = exchange({"prompt_ids": ids, "seeds": seeds, "max_tokens": args.max_tokens, "temperature": temperature,
                                    "top_k": top_k, "top_p": None, "min_p": None, "eos_ids": [2]})
        if "error" in answer:
            print(f"call {number} {kind}: {seconds:.1f} s ERROR {answer['error']}")
            continue
        tokens = sum(len(output) for output in answer["outputs"])
        print(f"call {number} {kind}: {seconds:.1f} s, {tokens} tokens, {tokens / seconds:.1f} tok/s, "
              f"drafted {answer['drafted']} accepted {answer['accepted']}; "
              + "; ".join(str(output[:12]) + ("…" if len(output) > 12 else "") for output in answer["outputs"][:args.show]))
    process.stdin.close()
    return process.wait()


if __name__ == "__main__":
    sys.exit(main())
