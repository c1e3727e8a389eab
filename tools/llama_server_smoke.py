"""Smoke run of llama.cpp's llama-server with the early-exit draft through the endpoint collector:
``python tools/llama_server_smoke.py [--n 4] [--max-tokens 16] [--no-draft]`` prints each
generation's ids and the server's timings (tokens/s, drafted and accepted)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from diagnostics.audit.collect import collect
from diagnostics.audit.completions import Sampling
from diagnostics.audit.samples import load_samples
from diagnostics.models import embedded_gguf_path, embedded_tokenizer
from diagnostics.verdicts.llama_server import draft_gguf, llama_server, llama_server_version


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--draft-max", type=int, default=4)
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--no-draft", action="store_true")
    args = parser.parse_args()
    tokenizer = embedded_tokenizer()
    draft = None if args.no_draft else draft_gguf()
    print(llama_server_version(), "| draft:", draft)
    with tempfile.TemporaryDirectory() as folder:
        log, out = Path(folder) / "server.log", Path(folder) / "samples.jsonl"
        with llama_server(embedded_gguf_path(), draft, log, draft_max=args.draft_max) as url:
            collect(url, "smollm2", [args.prompt], out, n=args.n, sampling=Sampling(max_tokens=args.max_tokens, temperature=1.0),
                    first_seed=0, speculative=draft is not None,
                    tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], eos_id=tokenizer.eos_token_id)
        for sample in load_samples(out):
            timings = sample.raw.get("timings", {}) if isinstance(sample.raw, dict) else {}
            print(f"seed {sample.seed}: {sample.token_ids} ({sample.ids_source}, {sample.finish_reason}) "
                  f"{timings.get('predicted_per_second', 0):.1f} tok/s, drafted {timings.get('draft_n', 0)} "
                  f"accepted {timings.get('draft_n_accepted', 0)} | {sample.text!r}")
        print("server log tail:", " / ".join(line for line in log.read_text().splitlines() if "draft acceptance" in line)[-400:])


if __name__ == "__main__":
    main()
