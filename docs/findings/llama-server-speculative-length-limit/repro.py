#!/usr/bin/env python3
"""Standalone reproduction: llama.cpp's llama-server with a draft model (-md) returns fewer tokens
than n_predict, without EOS or a stop string, while its own count says n_predict.

    python3 repro.py LLAMA_SERVER TARGET.gguf [DRAFT.gguf] [--requests 32] [--n-predict 32]

Python standard library only. It starts LLAMA_SERVER with draft-model speculation (the target is
its own draft when DRAFT.gguf is left out; draft-max 4, draft-p-min 0), then asks it:

1. sampled: --requests generations at temperature 1 (seeds --seed, --seed+1, ...) on /completion
   with return_tokens, n_predict --n-predict;
2. greedy: one generation (temperature 0) for each n_predict in --n-predict-5 .. --n-predict: six
   consecutive limits, so that the last speculative step lands on the limit for some of them;
3. routes: greedy on /completion streamed, on /v1/completions and on /v1/chat/completions, each
   n_predict of the same window until one comes back short (text counted with /tokenize).

A generation is "short" when it holds fewer than n_predict tokens, the server says it stopped at
the limit (not EOS, not a stop word), and the server's own count (tokens_predicted, or
usage.completion_tokens) says n_predict. Prints the figures and BROKEN (exit 1) when any
generation is short, OK (exit 0) when none is and the draft was accepted at least once, or
INCONCLUSIVE (exit 2) when the server never speculated. Bad arguments or a server that does not
start: one line on stderr, exit 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

PROMPT = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"
CHAT = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]
START_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 120


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as JSON, return the JSON answer."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        return json.loads(answer.read())


def post_stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST ``body`` with stream on, return the server-sent events' JSON payloads."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        for raw in answer:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


def speculation_flags(binary: Path, draft: Path, draft_max: int) -> list[str]:
    """The flags for draft-model speculation of at most ``draft_max`` tokens a step, drafts always as
    long as allowed (p-min 0), in the spelling ``binary`` takes (read from its --help): ``--draft-max``
    and ``--draft-min`` (llama.cpp 4227c9be4) were later refused for ``--spec-draft-n-max`` and
    ``--spec-draft-n-min`` (7d442abf), and later still a draft model also wants ``--spec-type
    draft-simple`` (0c1e57098), a type the servers in between refuse."""
    try:
        usage = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
        text = usage.stdout + usage.stderr
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"{binary} --help failed ({error.__class__.__name__}): pass a llama-server binary") from None
    if "--spec-draft-n-max" not in text:
        return ["-md", str(draft), "--draft-max", str(draft_max), "--draft-min", "0", "--draft-p-min", "0"]
    flags = ["-md", str(draft), "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    return flags + (["--spec-type", "draft-simple"] if "draft-simple" in text else [])


def start_server(binary: Path, target: Path, draft: Path, threads: int, draft_max: int, log: Path,
                 spec_type: str | None = None) -> tuple[subprocess.Popen, str]:
    """llama-server with draft-model speculation (or, with ``spec_type``, that model-free kind, e.g.
    ngram-simple, where the build has it) on a free port; returns the process and URL once /health
    answers. Raises RuntimeError (one line) when it exits or does not answer."""
    port = free_port()
    speculation = ["--spec-type", *shlex.split(spec_type)] if spec_type else speculation_flags(binary, draft, draft_max)
    command = [str(binary), "-m", str(target), *speculation, "--host", "127.0.0.1",
               "--port", str(port), "-c", "512", "-np", "1", "-t", str(threads), "-tb", str(threads), "-td", str(threads),
               "-tbd", str(threads), "--no-webui"]
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return process, url
        except OSError:  # refused, or 503 while the models load
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited (status {process.returncode}) before answering; its log: {log}") from None
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"llama-server did not answer /health in {START_TIMEOUT_S} s; its log: {log}") from None
            time.sleep(0.2)


def completion(url: str, n_predict: int, temperature: float, seed: int) -> dict[str, Any]:
    """One /completion with the ids it generated (return_tokens) and no sampler but temperature."""
    return post(url + "/completion", {"prompt": PROMPT, "n_predict": n_predict, "temperature": temperature,
                                      "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed, "return_tokens": True})


def is_short(n_tokens: int, n_predict: int, stopped_at_limit: bool, reported: int) -> bool:
    """Fewer tokens than n_predict, stopped by the length limit (no EOS, no stop word), while the
    server's own count says n_predict."""
    return n_tokens < n_predict and stopped_at_limit and reported == n_predict


def n_tokens_of(url: str, text: str) -> int:
    """How many tokens the server's tokenizer makes of ``text`` (no BOS)."""
    return len(post(url + "/tokenize", {"content": text, "add_special": False})["tokens"])


GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}


def ask_streamed(url: str, n_predict: int) -> tuple[int, int, str]:
    """Greedy /completion streamed: (tokens in the chunks, the server's count, its stop_type)."""
    events = post_stream(url + "/completion", {"prompt": PROMPT, "n_predict": n_predict, **GREEDY})
    final = events[-1] if events else {}
    return sum(len(event.get("tokens", [])) for event in events), final.get("tokens_predicted", -1), final.get("stop_type", "")


def ask_completions(url: str, n_predict: int) -> tuple[int, int, str]:
    """Greedy /v1/completions: (tokens of its text, usage.completion_tokens, finish_reason)."""
    answer = post(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": n_predict, **GREEDY})
    choice = answer["choices"][0]
    return n_tokens_of(url, choice["text"]), answer["usage"]["completion_tokens"], choice["finish_reason"]


def ask_chat(url: str, n_predict: int) -> tuple[int, int, str]:
    """Greedy /v1/chat/completions: (tokens of its content, usage.completion_tokens, finish_reason)."""
    answer = post(url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": n_predict, **GREEDY})
    choice = answer["choices"][0]
    return n_tokens_of(url, choice["message"].get("content") or ""), answer["usage"]["completion_tokens"], choice["finish_reason"]


def main(argv: list[str] | None = None) -> int:
    """Run the reproduction; returns the exit status (0 OK, 1 BROKEN, 2 INCONCLUSIVE, 3 error)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("llama_server", type=Path)
    parser.add_argument("target", type=Path, help="target GGUF")
    parser.add_argument("draft", type=Path, nargs="?", help="draft GGUF (default: the target itself)")
    parser.add_argument("--requests", type=int, default=32, help="sampled generations (default 32)")
    parser.add_argument("--n-predict", type=int, default=32, help="n_predict of the sampled ones (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--draft-max", type=int, default=4, help="--draft-max (default 4)")
    # one thread: llama.cpp's threads spin at each barrier, so two on a busy 2-core machine ran 20x slower
    parser.add_argument("--threads", type=int, default=1, help="threads of the target and of the draft (default 1)")
    parser.add_argument("--spec-type", help="instead of a draft model, this model-free speculation and its flags, e.g. "
                                            "'ngram-simple --spec-ngram-simple-size-n 3' (llama.cpp builds of 2026)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    draft = args.draft or args.target
    for name, path in (("llama-server", args.llama_server), ("target GGUF", args.target), ("draft GGUF", draft)):
        if not path.is_file():
            print(f"error: {name} {path} is not a file: pass the path of an existing file", file=sys.stderr)
            return 3
    if not os.access(args.llama_server, os.X_OK):
        print(f"error: {args.llama_server} is not executable: pass the llama-server binary", file=sys.stderr)
        return 3
    if args.requests < 1 or args.n_predict < 7 or args.draft_max < 1:
        print("error: --requests must be >= 1, --n-predict >= 7 and --draft-max >= 1", file=sys.stderr)
        return 3

    # a SIGTERM (a test's timeout, a CI cancel) unwinds through the finally below, which stops the server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    log = Path(tempfile.mkstemp(prefix="llama-server-repro-", suffix=".log")[1])
    try:
        process, url = start_server(args.llama_server, args.target, draft, args.threads, args.draft_max, log, args.spec_type)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    figures: dict[str, Any] = {"server": str(args.llama_server), "target": str(args.target),
                               "draft": args.spec_type or str(draft), "draft_max": None if args.spec_type else args.draft_max,
                               "prompt": PROMPT}
    try:
        drafted = accepted = 0

        # 1. sampled, seeded
        short = []
        eos = eos_overcounted = 0
        for index in range(args.requests):
            seed = args.seed + index
            answer = completion(url, args.n_predict, 1.0, seed)
            tokens, reported = answer.get("tokens", []), answer["tokens_predicted"]
            drafted += answer.get("timings", {}).get("draft_n", 0)
            accepted += answer.get("timings", {}).get("draft_n_accepted", 0)
            eos += answer["stop_type"] == "eos"
            # a secondary symptom of the same counting: tokens accepted after an EOS are dropped (rightly)
            # but were counted
            eos_overcounted += answer["stop_type"] == "eos" and reported > len(tokens)
            if is_short(len(tokens), args.n_predict, answer["stop_type"] == "limit", reported):
                short.append({"seed": seed, "returned": len(tokens), "reported": reported})
        figures["sampled"] = {"route": "/completion", "temperature": 1.0, "n_predict": args.n_predict,
                              "requests": args.requests, "short": len(short), "ended_by_eos": eos,
                              "ended_by_eos_and_overcounted": eos_overcounted,
                              "returned_when_short": sorted({item["returned"] for item in short}), "examples": short[:5]}

        # 2. greedy, six consecutive n_predict values
        greedy = []
        for n_predict in range(args.n_predict - 5, args.n_predict + 1):
            answer = completion(url, n_predict, 0.0, 0)
            drafted += answer.get("timings", {}).get("draft_n", 0)
            accepted += answer.get("timings", {}).get("draft_n_accepted", 0)
            greedy.append({"n_predict": n_predict, "returned": len(answer.get("tokens", [])),
                           "reported": answer["tokens_predicted"], "stop_type": answer["stop_type"],
                           "short": is_short(len(answer.get("tokens", [])), n_predict, answer["stop_type"] == "limit",
                                             answer["tokens_predicted"])})
        figures["greedy"] = {"route": "/completion", "temperature": 0.0, "runs": greedy,
                             "short": sum(run["short"] for run in greedy)}

        # 3. greedy on the other routes: each n_predict of the same window until one comes back short
        routes: dict[str, Any] = {}
        for route, ask in (("/completion stream", ask_streamed), ("/v1/completions", ask_completions),
                           ("/v1/chat/completions", ask_chat)):
            tried = []
            for n_predict in range(args.n_predict - 5, args.n_predict + 1):
                returned, reported, finish = ask(url, n_predict)
                tried.append({"n_predict": n_predict, "returned": returned, "reported": reported, "finish": finish,
                              "short": is_short(returned, n_predict, finish in ("limit", "length"), reported)})
                if tried[-1]["short"]:
                    break
            routes[route] = {"tried": tried, "short": sum(run["short"] for run in tried)}
        figures["routes"] = routes
        figures["draft_tokens"] = {"drafted": drafted, "accepted": accepted}
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:  # urllib errors are OSErrors
        print(f"error: the server's answer broke off or was not as expected ({error.__class__.__name__}: {error}); "
              f"its log: {log}", file=sys.stderr)
        return 3
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    figures["seconds"] = round(time.monotonic() - started, 1)
    log.unlink(missing_ok=True)  # kept only when something went wrong (named in the error above)

    sampled, greedy_figures = figures["sampled"], figures["greedy"]
    print(f"llama-server: {args.llama_server}")
    print(f"target {args.target.name}, " + (f"speculation {args.spec_type}" if args.spec_type else
                                             f"draft {draft.name}, draft-max {args.draft_max}") + "; "
          f"drafted {drafted} tokens, accepted {accepted}")
    print(f"sampled (t=1, seeds {args.seed}..{args.seed + args.requests - 1}, n_predict {args.n_predict}, /completion): "
          f"{sampled['short']} of {args.requests} short (returned {sampled['returned_when_short'] or '-'} tokens, "
          f"server reported {args.n_predict}, stop_type limit); {sampled['ended_by_eos']} ended by EOS, "
          f"{sampled['ended_by_eos_and_overcounted']} of them reported more tokens than returned")
    print("greedy (t=0, /completion): " + ", ".join(
        f"n_predict {run['n_predict']}: {run['returned']}/{run['reported']}{' SHORT' if run['short'] else ''}"
        for run in greedy_figures["runs"]) + "  (returned/reported)")
    for route, result in figures["routes"].items():
        print(f"greedy on {route}: " + ", ".join(
            f"n_predict {run['n_predict']}: {run['returned']}/{run['reported']} {run['finish']}{' SHORT' if run['short'] else ''}"
            for run in result["tried"]) + "  (returned/reported)")
    print(f"{figures['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    broken = sampled["short"] + greedy_figures["short"] + sum(r["short"] for r in figures["routes"].values())
    if broken:
        print("BROKEN")
        return 1
    if accepted == 0:
        print("INCONCLUSIVE: the server never accepted a drafted token, so no speculative step could reach the limit")
        return 2
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
