"""A fake vLLM/SGLang server over a tiny target, for tests: vLLM's ``/v1/completions`` (sampling
the exact law; scoring with ``prompt_logprobs``) and ``/tokenize`` (space-separated integers), and
SGLang's ``/generate`` scoring, and llama.cpp's own ``/completion`` (with ``return_tokens``).
``FakeVllm.bug`` plants a score or sampling bug; "drop" is llama-server's speculative bookkeeping
slip: the count says n_predict while the last token of every third generation is not returned."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from diagnostics.policy import Policy, probabilities


class FakeVllm(BaseHTTPRequestHandler):
    """vLLM's /v1/completions (generation; scoring with prompt_logprobs) and /tokenize, and SGLang's /generate."""

    target = None
    bug: str | None = None  # "shift": a token scored with the next position's law (llama.cpp's echo); "placeholder"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, payload: dict) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._answer({"data": [{"id": "tiny"}]})

    @torch.inference_mode()
    def _raw_laws(self, ids: list[int]) -> torch.Tensor:
        logits = self.target.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()
        laws = torch.log_softmax(logits, -1)  # row i predicts token i + 1
        if self.bug == "shift":
            laws = torch.cat([laws[1:], laws[-1:]])
        if self.bug == "placeholder":
            laws = torch.zeros_like(laws)
        return laws

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path not in ("/tokenize", "/generate", "/v1/completions", "/completion") or (self.path == "/tokenize" and "prompt" not in body):
            self.send_error(404 if self.path != "/tokenize" else 400)  # vLLM's /tokenize reads "prompt" only
            return None
        if self.path == "/tokenize":
            return self._answer({"tokens": [int(word) for word in body["prompt"].split()]})
        if self.path == "/generate":
            ids, k = body["input_ids"], body["top_logprobs_num"]
            laws = self._raw_laws(ids)
            own = [[None, ids[0], None]] + [[float(laws[i - 1, ids[i]]), ids[i], None] for i in range(1, len(ids))]
            tops = [None] + [[[float(laws[i - 1, v]), int(v), None] for v in torch.argsort(-laws[i - 1])[:k].tolist()]
                             for i in range(1, len(ids))]
            return self._answer({"text": "", "meta_info": {"input_token_logprobs": own, "input_top_logprobs": tops}})
        if "prompt_logprobs" in body:
            ids, k = body["prompt"], body["prompt_logprobs"]
            laws = self._raw_laws(ids)
            entries = [None]
            for i in range(1, len(ids)):
                ranks = torch.argsort(-laws[i - 1]).tolist()
                entry = {str(v): {"logprob": float(laws[i - 1, v]), "rank": rank + 1} for rank, v in enumerate(ranks[:k])}
                entry[str(ids[i])] = {"logprob": float(laws[i - 1, ids[i]]), "rank": ranks.index(ids[i]) + 1}
                entries.append(entry)
            return self._answer({"choices": [{"text": "", "prompt_logprobs": entries}]})
        native = self.path == "/completion"
        length = body["n_predict"] if native else body["max_tokens"]
        ids = [int(word) for word in body["prompt"].split()]
        generator = torch.Generator().manual_seed(body["seed"])
        policy = Policy(temperature=body["temperature"], top_k=body["top_k"] or None,
                        top_p=None if body["top_p"] >= 1 else body["top_p"], min_p=body["min_p"] or None)
        if self.bug == "hot":
            policy = Policy(temperature=body["temperature"] * 1.5, top_k=policy.top_k)
        new = []
        with torch.inference_mode():
            for _ in range(length):
                logits = self.target.model(input_ids=torch.tensor([ids + new]), use_cache=False).logits[0, -1:].double()
                new.append(int(torch.multinomial(probabilities(logits, policy)[0], 1, generator=generator)))
        if native:
            returned = new[:-1] if self.bug == "drop" and body["seed"] % 3 == 0 else new
            return self._answer({"content": " " + " ".join(map(str, returned)), "stop_type": "limit",
                                 "tokens_predicted": len(new), **({"tokens": returned} if body.get("return_tokens") else {})})
        self._answer({"choices": [{"text": " " + " ".join(map(str, new)), "token_ids": new, "finish_reason": "length"}],
                      "usage": {"completion_tokens": len(new)}})


@contextmanager
def fake_vllm_server(target) -> Iterator[str]:
    """The fake server over ``target`` on a free local port; yields its URL."""
    FakeVllm.target = target
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
