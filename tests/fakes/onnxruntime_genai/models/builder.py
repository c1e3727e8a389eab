"""The fake model builder (``python -m onnxruntime_genai.models.builder -i HF -o OUT -p P -e cpu -c C``):
writes an export the fake ``Model`` loads (genai_config.json, model.onnx, model.onnx.data; EOS 2,
the vocabulary from the Hugging Face config's ``vocab_size``, default 1000), prints to stdout, and
appends one line per run to ``$FAKE_ORTGENAI_BUILDS`` when set (so a test counts exports). A Hugging
Face config with ``"fake_export_fails": true`` makes it exit 3 after writing half an export."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag, name in (("-i", "--input"), ("-o", "--output"), ("-p", "--precision"), ("-e", "--execution_provider"),
                       ("-c", "--cache_dir")):
        parser.add_argument(flag, name, required=True)
    args = parser.parse_args()
    print(f"fake builder: exporting {args.input} (a print to stdout)")
    if os.environ.get("FAKE_ORTGENAI_BUILDS"):
        with open(os.environ["FAKE_ORTGENAI_BUILDS"], "a", encoding="utf-8") as handle:
            handle.write(f"{args.input} {args.precision} {args.execution_provider}\n")
    hf = json.loads((Path(args.input) / "config.json").read_text())
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.onnx").write_bytes(b"fake onnx graph")
    if hf.get("fake_export_fails"):
        print("fake builder: failing halfway", file=sys.stderr)
        return 3
    (out / "model.onnx.data").write_bytes(b"\0" * 64)
    decoder = {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": "model.onnx",
               "num_hidden_layers": hf.get("num_hidden_layers", 2)}
    config = {"model": {"bos_token_id": 1, "context_length": 64, "decoder": decoder, "eos_token_id": 2, "pad_token_id": 2,
                        "type": "llama", "vocab_size": hf.get("vocab_size", 1000)},
              "search": {"do_sample": False, "max_length": 64, "top_k": 50, "top_p": 1.0}}
    (out / "genai_config.json").write_text(json.dumps(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
