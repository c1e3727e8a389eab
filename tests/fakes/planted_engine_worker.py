"""A planted engine behind the worker protocol (``diagnostics.verdicts.workers``), for the tests of
the lab's side of it (``verdicts.venv_engine``): it samples the set-up's model with transformers'
plain sampling, seeded per seed, so an honest planted engine passes the audit, and its mode
(``$PLANTED_MODE``) plants each way an engine or a worker can go wrong:

honest · inactive (reports 0 accepted) · silent (reports no counters) · start-error · raise
(answers an error for sampled requests with top_k) · die (exits mid-request) · out-of-vocab ·
too-long · not-json (prints text on its stdout) · hang (never answers)
"""

import json
import os
import sys
import time

MODE = os.environ.get("PLANTED_MODE", "honest")
protocol = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # whatever the engine prints goes to the log, never into the answers


def answer(message):
    protocol.write(json.dumps(message) + "\n")
    protocol.flush()


def main():
    setup = json.loads(sys.stdin.readline())
    if MODE == "start-error":
        answer({"error": "planted: the engine refused its set-up"})
        return 1
    print("planted engine loading", setup["model"])  # engines print: this must not reach the lab as an answer
    model = None
    if MODE not in ("hang", "die", "not-json", "too-long"):  # the protocol's failures need no model (and start fast)
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(setup["model"], dtype=torch.float64)
    answer({"ready": True, "engine": "planted 1.0", "settings": {"mode": MODE, "speculative": json.dumps(setup["speculative"]),
                                                                  "threads": setup["threads"]}})
    for line in sys.stdin:
        request = json.loads(line)
        if MODE == "hang":
            time.sleep(3600)
        if MODE == "die":
            os._exit(3)
        if MODE == "raise" and request["top_k"]:
            answer({"error": "planted: index -188010736 is out of bounds for dimension 1 with size 49152"})
            continue
        if MODE == "not-json":
            protocol.write("INFO engine says hello\n")
            protocol.flush()
            continue
        if MODE == "too-long":
            answer({"outputs": [[0] * (request["max_tokens"] + 1) for _ in request["seeds"]], "drafted": None, "accepted": None})
            continue
        outputs = []
        for seed in request["seeds"]:
            torch.manual_seed(seed)
            ids = torch.tensor([request["prompt_ids"]])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=request["temperature"],
                                 top_k=request["top_k"] or 0, top_p=request["top_p"] or 1.0,
                                 max_new_tokens=request["max_tokens"], eos_token_id=request["eos_ids"],
                                 pad_token_id=request["eos_ids"][0])
            tokens = out[0, ids.shape[1]:].tolist()
            if request["eos_ids"][0] in tokens:  # generate pads after EOS: keep up to the first
                tokens = tokens[: tokens.index(request["eos_ids"][0]) + 1]
            outputs.append(tokens)
        if MODE == "out-of-vocab":
            outputs[0] = [1_000_000] + outputs[0][1:]
        speculating = setup["speculative"] is not None
        drafted = 4 * len(outputs) if speculating and MODE != "silent" else None
        accepted = (0 if MODE == "inactive" else 2 * len(outputs)) if drafted is not None else None
        answer({"outputs": outputs, "drafted": drafted, "accepted": accepted})
    return 0


if __name__ == "__main__":
    sys.exit(main())
