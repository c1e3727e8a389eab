"""``audit --endpoint`` against hostile and broken servers (issue 31): every one a one-line
``error:`` with exit status 2, nothing stored, in bounded time; and the server-scores oracle's
verdict says what it rests on, and with ``--target`` checks it.

Every server here listens on 127.0.0.1. The raw-socket ones write bytes no HTTP library would
(an endless header, a broken chunk, one byte at a time), so what is tested is the collector's
reading of the wire, not a library's politeness."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from diagnostics.audit import collect as collect_module
from diagnostics.audit.collect import collect
from diagnostics.audit.completions import MAX_RAW_BYTES, Sampling
from diagnostics.audit.endpoint_client import Client, EndpointError
from diagnostics.audit.external import audit_scored_samples
from diagnostics.audit.reporting import evidence_problem, summary_line
from diagnostics.audit.samples import MAX_FILE_BYTES, Sample, load_samples, write_samples
from diagnostics.audit.server_scores import TRUST_CAVEAT, PositionScores
from diagnostics.audit.suite import tiny_setup
from diagnostics.cli import main

KEY = "sk-secret-of-the-test"


# -- servers ---------------------------------------------------------------------------------

class RawServer:
    """Accepts connections on 127.0.0.1 and, per request, calls ``reply(socket, request_bytes)``;
    records every request's head (so a test can say who saw the key)."""

    def __init__(self, reply: Callable[[socket.socket, bytes], None]) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                self.requests.append(data)
                self.reply(connection, data)
            except OSError:
                pass  # the client gave up: what the slow servers are for

    def saw_key(self) -> bool:
        return any(KEY.encode() in request for request in self.requests)

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


@pytest.fixture
def servers():
    made: list[RawServer] = []

    def make(reply: Callable[[socket.socket, bytes], None]) -> RawServer:
        made.append(RawServer(reply))
        return made[-1]

    yield make
    for server in made:
        server.close()


def answer(status: str, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Content-Type: application/json", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def send(data: bytes) -> Callable[[socket.socket, bytes], None]:
    return lambda connection, _request: connection.sendall(data)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "1 2 3"}) + "\n")
    return path


def run_audit(capsys, url: str, prompts, out, *extra: str) -> tuple[int, str, float]:
    """``audit --endpoint`` with --oracle server (no weights needed): exit status, stderr, seconds."""
    started = time.monotonic()
    code = main(["audit", "--endpoint", url, "--model", "m", "--prompts", str(prompts), "--n", "2", "--max-tokens", "2",
                 "--rate", "10000", "--oracle", "server", "--out", str(out), *extra])
    return code, capsys.readouterr().err, time.monotonic() - started


PROGRESS = re.compile(r"^[\w ]+: generation \d+/\d+$")  # a long command's progress (``cli.audit._progress``), not an error


def assert_one_line_error(code: int, err: str, *phrases: str) -> str:
    """The command failed with one ``error:`` line and no traceback; progress lines before it are allowed."""
    lines = [line for line in err.strip().splitlines() if not PROGRESS.match(line)]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


# -- 1. credentials never go to another origin ----------------------------------------------------

@pytest.mark.parametrize("status", ["301 Moved Permanently", "302 Found", "307 Temporary Redirect", "308 Permanent Redirect"])
def test_a_cross_origin_redirect_is_refused_and_the_key_stays_home(servers, prompts, tmp_path, capsys, monkeypatch, status) -> None:
    """The endpoint redirects to another port on the same host (another origin): the second server
    never sees a request, so never the key. Negative control: urllib, which the collector used,
    follows the same redirect and hands the second server the key."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    elsewhere = servers(send(answer("200 OK", b'{"data": []}')))
    endpoint = servers(send(answer(status, b"", f"Location: {elsewhere.url}/v1/models")))
    code, err, _ = run_audit(capsys, endpoint.url, prompts, tmp_path / "s.jsonl")
    assert_one_line_error(code, err, "redirected to another origin", f"127.0.0.1:{elsewhere.port}", "API key")
    assert endpoint.saw_key() and elsewhere.requests == []
    assert not (tmp_path / "s.jsonl").exists()
    old = urllib.request.Request(endpoint.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    urllib.request.urlopen(old, timeout=5).read()
    assert elsewhere.saw_key()


def test_a_same_origin_redirect_is_followed_with_the_key(servers) -> None:
    def reply(connection: socket.socket, request: bytes) -> None:
        moved = request.startswith(b"GET /v1/models ")
        connection.sendall(answer("308 Permanent Redirect", b"", "Location: /v2/models") if moved else
                           answer("200 OK", b'{"data": [{"id": "m"}]}'))

    endpoint = servers(reply)
    assert Client(endpoint.url, api_key=KEY).get("/v1/models") == {"data": [{"id": "m"}]}
    assert len(endpoint.requests) == 2 and all(KEY.encode() in request for request in endpoint.requests)


def test_a_redirect_loop_ends(servers) -> None:
    endpoint = servers(send(answer("302 Found", b"", "Location: /v1/models")))
    with pytest.raises(EndpointError, match="redirected more than 5 times"):
        Client(endpoint.url).get("/v1/models")
    assert len(endpoint.requests) == 6


# -- 5. malformed HTTP --------------------------------------------------------------------------------

MALFORMED = {
    "header over 64 KiB": (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n{}", "over 64 KiB"),
    "101 headers": (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n{}", "more than 100 headers"),
    "bad status line": (b"HELLO THERE\r\n\r\n", "bad status line"),
    "bad chunk": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", "body ended"),
    "truncated body": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"data\": [", "body ended after 10 bytes"),
    "deeply nested JSON": (answer("200 OK", b"[" * 100_000 + b"]" * 100_000), "nested 100000 deep"),
    "not JSON": (answer("200 OK", b"<html>hello</html>"), "not valid JSON"),
    "NaN in JSON": (answer("200 OK", b'{"data": NaN}'), "NaN is not a JSON number"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_http_is_a_one_line_error(servers, prompts, tmp_path, capsys, name) -> None:
    """Each once raised http.client's LineTooLong, HTTPException, BadStatusLine, IncompleteRead
    (or json's RecursionError) as a traceback; now one line, not retried, and no file."""
    raw, phrase = MALFORMED[name]
    endpoint = servers(send(raw))
    code, err, seconds = run_audit(capsys, endpoint.url, prompts, tmp_path / "s.jsonl")
    assert_one_line_error(code, err, phrase)
    assert len(endpoint.requests) == 1 and seconds < 5
    assert not (tmp_path / "s.jsonl").exists()


def test_a_server_that_hangs_up_is_retried_then_one_line(servers) -> None:
    endpoint = servers(lambda connection, _request: connection.shutdown(socket.SHUT_RDWR))
    with pytest.raises(EndpointError, match="closed the connection without an answer.*after 2 attempts"):
        Client(endpoint.url).get("/v1/models", retries=1)
    assert len(endpoint.requests) == 2


# -- 10. deadlines that hold while bytes trickle ----------------------------------------------------

def drip(prefix: bytes, every_s: float = 0.2, total_s: float = 4.0) -> Callable[[socket.socket, bytes], None]:
    """``prefix`` at once, then one byte every ``every_s`` (well inside any socket timeout) for ``total_s``."""

    def reply(connection: socket.socket, _request: bytes) -> None:
        connection.sendall(prefix)
        ends = time.monotonic() + total_s
        while time.monotonic() < ends:
            time.sleep(every_s)
            connection.sendall(b"a")

    return reply


@pytest.mark.parametrize("where,prefix", [("status line", b"HTTP/1.1 200 "), ("header", b"HTTP/1.1 200 OK\r\nX-Slow: "),
                                          ("body", b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")])
def test_a_dripping_server_meets_the_deadline(servers, prompts, tmp_path, capsys, where, prefix) -> None:
    """A byte every 0.2 s keeps a socket timeout from ever firing; --timeout 1 still ends the request at ~1 s."""
    endpoint = servers(drip(prefix))
    code, err, seconds = run_audit(capsys, endpoint.url, prompts, tmp_path / "s.jsonl", "--timeout", "1")
    assert_one_line_error(code, err, "did not answer within --timeout 1 s")
    assert 0.9 <= seconds < 2.5, seconds
    assert len(endpoint.requests) == 1  # a timeout is not retried
    assert not (tmp_path / "s.jsonl").exists()


def test_without_an_overall_deadline_a_drip_holds_the_reader(servers) -> None:
    """Negative control: urllib with a 1 s socket timeout (the collector's old reader) is still
    reading when the dripping server stops after 3 s."""
    endpoint = servers(drip(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", total_s=3.0))
    started = time.monotonic()
    with pytest.raises(Exception):
        with urllib.request.urlopen(endpoint.url + "/v1/models", timeout=1) as response:
            response.read()
    assert time.monotonic() - started > 2.8


def test_a_silent_server_and_retries_are_bounded(servers, prompts, tmp_path, capsys) -> None:
    """Silence: one --timeout, not 6 (the old 120 s × 6 attempts). 503 for ever: the attempts and
    their back-off end within 2 × --timeout."""
    silent = servers(lambda connection, _request: time.sleep(4))
    code, err, seconds = run_audit(capsys, silent.url, prompts, tmp_path / "s.jsonl", "--timeout", "0.8")
    assert_one_line_error(code, err, "did not answer within --timeout 0.8 s")
    assert seconds < 2 and len(silent.requests) == 1
    busy = servers(send(answer("503 Service Unavailable", b"busy")))
    code, err, seconds = run_audit(capsys, busy.url, prompts, tmp_path / "s.jsonl", "--timeout", "0.8")
    assert_one_line_error(code, err, "HTTP 503: busy", "within 2 × --timeout 0.8 s")
    assert seconds < 2.5 and 2 <= len(busy.requests) <= 4


class _Completions(BaseHTTPRequestHandler):
    """A well-formed OpenAI-compatible server whose completions are set per test."""

    completion: Callable[[dict], dict] = staticmethod(lambda body: {})
    seen: list[dict] = []
    delay_s = 0.0

    def log_message(self, *args) -> None:
        pass

    def _answer(self, payload: dict) -> None:
        raw = json.dumps(payload).encode()
        type(self).last_bytes = raw
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._answer({"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "tokenize" in self.path:
            return self._answer({"tokens": [1, 2, 3]})
        if "prompt_logprobs" in body:  # --oracle server's scoring request (vLLM's form)
            entries = [None] + [{str(token): {"logprob": 0.0, "rank": 1}} for token in body["prompt"][1:]]
            return self._answer({"choices": [{"text": "", "prompt_logprobs": entries}]})
        time.sleep(self.delay_s)
        type(self).seen.append(body)
        return self._answer(self.completion(body))


@pytest.fixture
def completions():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Completions.seen, _Completions.delay_s = [], 0.0
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def honest(body: dict) -> dict:
    return {"choices": [{"text": " 4 5", "token_ids": [4, 5][: body["max_tokens"]], "finish_reason": "length"}],
            "usage": {"completion_tokens": min(2, body["max_tokens"])}}


def test_the_whole_collection_has_a_deadline(completions, prompts, tmp_path, capsys) -> None:
    """Each answer within --timeout (0.3 s each), but 2 × 10 of them pass --collect-timeout 1: stopped at ~1 s, what came is kept."""
    _Completions.completion, _Completions.delay_s = staticmethod(honest), 0.3
    out = tmp_path / "s.jsonl"
    code, err, seconds = run_audit(capsys, completions, prompts, out, "--n", "10", "--timeout", "5", "--collect-timeout", "1")
    assert_one_line_error(code, err, "ran past --collect-timeout 1 s", "what was collected is kept")
    assert seconds < 2.5
    kept = load_samples(out)  # whole lines only: the file stays auditable
    assert 1 <= len(kept) <= 4


@pytest.mark.parametrize("option,value", [("--timeout", "0"), ("--timeout", "nan"), ("--collect-timeout", "-1"),
                                          ("--timeout", "1e12")])
def test_bad_deadlines_are_refused(completions, prompts, tmp_path, capsys, option, value) -> None:
    code, err, _ = run_audit(capsys, completions, prompts, tmp_path / "s.jsonl", option, value)
    assert_one_line_error(code, err, f"{option} must be a number of seconds in (0, ")
    assert _Completions.seen == [] and not (tmp_path / "s.jsonl").exists()


# -- low items: raw answers, the file's size, usage that lies, --out symlinks ---------------------------

def test_a_huge_answer_keeps_its_head_and_sha256_and_the_file_stays_auditable(completions, tmp_path) -> None:
    """A 2 MB answer (a padding field) per generation: the file keeps each whole up to 64 KiB, else its
    head and the sha256 of the bytes received; ten of them make a file of kilobytes, not 20 MB."""
    _Completions.completion = staticmethod(lambda body: {**honest(body), "padding": "x" * 2_000_000})
    out = collect(completions, "m", ["1 2 3"], tmp_path / "s.jsonl", n=10, sampling=Sampling(max_tokens=2), rate=10_000,
                  tokenize=lambda text: [1, 2, 3])
    assert out.stat().st_size < 10 * (MAX_RAW_BYTES // 8)
    samples = load_samples(out)
    raw = samples[0].raw
    assert raw["truncated"] is True and raw["bytes"] == len(_Completions.last_bytes) > 2_000_000
    assert raw["sha256"] == hashlib.sha256(_Completions.last_bytes).hexdigest() and len(raw["head"]) == 4096
    assert samples[0].token_ids == [4, 5]
    _Completions.completion = staticmethod(honest)
    small = collect(completions, "m", ["1 2 3"], tmp_path / "t.jsonl", n=1, sampling=Sampling(max_tokens=2), rate=10_000,
                    tokenize=lambda text: [1, 2, 3])
    assert load_samples(small)[0].raw == honest({"max_tokens": 2})  # a small answer is kept whole


def test_the_file_stops_before_the_loaders_limit(completions, tmp_path, monkeypatch) -> None:
    """With the limit lowered to 3 lines' worth, the collector stops before passing it and says so; the file loads."""
    _Completions.completion = staticmethod(honest)
    out = collect(completions, "m", ["1 2 3"], tmp_path / "probe.jsonl", n=1, sampling=Sampling(max_tokens=2), rate=10_000,
                  tokenize=lambda text: [1, 2, 3])
    line = out.stat().st_size
    monkeypatch.setattr(collect_module, "MAX_FILE_BYTES", 3 * line + line // 2)
    with pytest.raises(EndpointError, match=r"would pass 0 MiB, the most a samples file may be: 3 generations are kept.*--seed 3"):
        collect(completions, "m", ["1 2 3"], tmp_path / "s.jsonl", n=10, sampling=Sampling(max_tokens=2), rate=10_000,
                tokenize=lambda text: [1, 2, 3])
    assert len(load_samples(tmp_path / "s.jsonl")) == 3 and (tmp_path / "s.jsonl").stat().st_size <= 3.5 * line
    assert collect_module.MAX_FILE_BYTES <= MAX_FILE_BYTES


LIES = {
    "ids": (lambda body: {"choices": [{"text": " 4 5", "token_ids": [4, 5], "finish_reason": "length"}],
                          "usage": {"completion_tokens": 1}}, "disagrees with the 2 token_ids it returned"),
    "over max_tokens": (lambda body: {"choices": [{"text": " 4 5", "finish_reason": "length"}],
                                      "usage": {"completion_tokens": 9}}, "disagrees with more than the max_tokens 2 asked for"),
    "zero": (lambda body: {"choices": [{"text": " 4 5", "finish_reason": "stop"}], "usage": {"completion_tokens": 0}},
             "disagrees with a non-empty text"),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_usage_count_is_named_as_the_servers_error(completions, prompts, tmp_path, capsys, lie) -> None:
    """Before: left out as 'a non-canonical split was sampled' (or not noticed at all, with ids)."""
    _Completions.completion = staticmethod(LIES[lie][0])
    code, err, _ = run_audit(capsys, completions, prompts, tmp_path / "s.jsonl")
    assert_one_line_error(code, err, "usage.completion_tokens", LIES[lie][1], "not a tokenisation difference")
    assert "non-canonical" not in err and not (tmp_path / "s.jsonl").exists()


def test_a_symlink_out_is_refused(completions, prompts, tmp_path, capsys) -> None:
    """A dangling link is not written through (its target stays absent); a link to a file leaves it byte-identical."""
    _Completions.completion = staticmethod(honest)
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "elsewhere.jsonl")
    code, err, _ = run_audit(capsys, completions, prompts, dangling)
    assert_one_line_error(code, err, "is a symlink")
    assert not (tmp_path / "elsewhere.jsonl").exists() and _Completions.seen == []
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    linked = tmp_path / "linked.jsonl"
    linked.symlink_to(victim)
    assert_one_line_error(*run_audit(capsys, completions, prompts, linked)[:2], "is a symlink")
    assert victim.read_bytes() == b"precious\n"
    assert_one_line_error(*run_audit(capsys, completions, prompts, victim)[:2], "exists: give another --out")  # never overwritten
    assert_one_line_error(*run_audit(capsys, completions, prompts, tmp_path)[:2], "not a regular file")  # a folder
    assert victim.read_bytes() == b"precious\n" and _Completions.seen == []
    with pytest.raises(EndpointError, match="is a symlink or not a regular file"):  # the library refuses too
        collect(completions, "m", ["1"], dangling, n=1, tokenize=lambda text: [1])
    assert not (tmp_path / "elsewhere.jsonl").exists()


# -- 8. the server-scores oracle says what it rests on, and --target checks it ------------------------

@pytest.fixture(scope="module")
def setup():
    return tiny_setup()


GENERATIONS, TOKENS, TOP = 150, 12, 6  # 1,800 tokens: --detect-tv 0.1 needs 1,178


@pytest.fixture(scope="module")
@torch.inference_mode()
def honest_file(setup, tmp_path_factory):
    """Generations drawn from the target's law (batched, no cache) with the target's true raw scores
    (top 6 and the token's own): what an honest vLLM stores."""
    generator = torch.Generator().manual_seed(11)
    ids = torch.tensor([setup.prompt_ids] * GENERATIONS)
    for _ in range(TOKENS):
        law = torch.softmax(setup.target.model(input_ids=ids, use_cache=False).logits[:, -1].double(), -1)
        ids = torch.cat([ids, torch.multinomial(law, 1, generator=generator)], dim=1)
    laws = torch.log_softmax(setup.target.model(input_ids=ids, use_cache=False).logits.double(), -1)
    start = len(setup.prompt_ids)
    samples = []
    for row in range(GENERATIONS):
        tokens = ids[row, start:].tolist()
        scores = []
        for position, token in enumerate(tokens):
            law = laws[row, start - 1 + position]
            top = torch.argsort(-law)[:TOP].tolist()
            scores.append(PositionScores(float(law[token]), tuple((v, float(law[v])) for v in top)))
        samples.append(Sample(prompt="", prompt_ids=list(setup.prompt_ids), token_ids=tokens, temperature=1.0, scores=scores))
    return write_samples(tmp_path_factory.mktemp("scored") / "honest.jsonl", samples)


@pytest.fixture(scope="module")
def forged_file(setup, honest_file, tmp_path_factory):
    """A biased engine (token 5, always) whose scores are forged to match: 'token 5 has probability 1'."""
    samples = load_samples(honest_file)
    for sample in samples:
        sample.token_ids = [5] * TOKENS
        sample.scores = [PositionScores(0.0, ((5, 0.0),)) for _ in range(TOKENS)]
    return write_samples(tmp_path_factory.mktemp("forged") / "forged.jsonl", samples)


def test_forged_scores_pass_alone_but_the_verdict_says_what_it_rests_on(forged_file, capsys) -> None:
    assert main(["audit", "--samples", str(forged_file), "--oracle", "server", "--detect-tv", "0.1"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["verdict"] == "pass"  # what the scores alone can say: the forgery is self-consistent
    assert result["rests_on"] == TRUST_CAVEAT and TRUST_CAVEAT in result["reasons"]
    assert f"note: {TRUST_CAVEAT}" in captured.err
    assert "rests on the server's scores being true, unchecked" in summary_line(result)
    assert evidence_problem(result) is None


def test_target_cross_check_fails_forged_scores(forged_file, capsys) -> None:
    assert main(["audit", "--samples", str(forged_file), "--oracle", "server", "--target", "tiny", "--detect-tv", "0.1"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["verdict"] == "fail"
    check = result["score_check"]
    assert check["positions"] == 200 and check["disagreeing"] > 100 and check["max_difference"] > 1.0
    assert any(reason.startswith("server scores disagree with --target: max |Δ log p| = ") for reason in result["reasons"])
    assert "note: server scores disagree with --target" in captured.err
    assert "cross-checked against --target at 200 positions" in summary_line(result)


def test_target_cross_check_passes_honest_scores(honest_file, setup, capsys) -> None:
    assert main(["audit", "--samples", str(honest_file), "--oracle", "server", "--target", "tiny", "--detect-tv", "0.1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "pass", result["reasons"]
    check = result["score_check"]
    assert check["positions"] == 200 and check["disagreeing"] == 0 and check["max_difference"] < 1e-4
    # Negative control: the same honest scores shifted by 0.1 nats at one position in ten are caught.
    samples = load_samples(honest_file)
    for sample in samples:
        sample.scores = [PositionScores(entry.token_logprob - 0.1, tuple((v, lp - 0.1) for v, lp in entry.top))
                         if position % 10 == 3 else entry for position, entry in enumerate(sample.scores)]
    shifted = audit_scored_samples(samples, detect_tv=0.1, target=setup.target)
    assert shifted.verdict == "fail" and 0.09 < shifted.score_check["max_difference"] < 0.11


def test_endpoint_with_a_target_loads_it_once(completions, prompts, tmp_path, capsys, monkeypatch) -> None:
    """``audit --endpoint --target``: the collector's tokenizer and the audit's law come from one load
    of the target (the CLI loaded it twice: once for the tokenizer, again for the audit)."""
    import diagnostics.models

    loads: list[str] = []

    def load(spec: str, **_kwargs):
        loads.append(spec)
        return tiny_setup().target

    monkeypatch.setattr(diagnostics.models, "load_model", load)
    _Completions.completion = staticmethod(honest)
    code = main(["audit", "--endpoint", completions, "--model", "m", "--prompts", str(prompts), "--n", "2", "--max-tokens", "2",
                 "--rate", "10000", "--target", "served/model", "--out", str(tmp_path / "s.jsonl"), "--detect-tv", "0.5"])
    assert code == 0, capsys.readouterr().err
    assert loads == ["served/model"]
