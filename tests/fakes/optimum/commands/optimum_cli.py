"""A fake ``optimum-cli export openvino`` for tests/test_openvino_worker.py: it writes the IR files
the worker checks for (and the model's config.json), records each export in ``$FAKE_OV_LOG``, prints
on its stdout like the real exporter, and fails with status 3 when ``$FAKE_OV_EXPORT_FAIL`` is set."""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["export"])
    parser.add_argument("backend", choices=["openvino"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--weight-format", required=True)
    parser.add_argument("--library", required=True)
    parser.add_argument("output")
    args = parser.parse_args()
    print("fake exporter: loading weights")
    if os.environ.get("FAKE_OV_LOG"):
        with open(os.environ["FAKE_OV_LOG"], "a") as log:
            log.write(json.dumps({"event": "export", "model": args.model, "task": args.task,
                                  "weight_format": args.weight_format, "hub_offline": os.environ.get("HF_HUB_OFFLINE")}) + "\n")
    if os.environ.get("FAKE_OV_EXPORT_FAIL"):
        print("fake exporter: planted failure", file=sys.stderr)
        return 3
    out = Path(args.output)
    out.mkdir(parents=True)
    for name in ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml"):
        (out / name).write_text("fake IR")
    shutil.copyfile(Path(args.model) / "config.json", out / "config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
