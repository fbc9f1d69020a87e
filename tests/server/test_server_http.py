"""kiln serve over raw HTTP: every route, every kind of bad request (status code and OpenAI's error shape), the SSE
stream's exact framing, the API key, the body limit, a client that leaves mid-stream, and SIGTERM. One server on
the default model for most of the file; the key and shutdown tests start their own."""
import http.client
import json
import os
import signal
import socket
import time

import pytest

from live_server import KilnServer, default_model

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def kiln_bin():
    b = os.environ.get("KILN_BIN")
    if not b or not os.path.exists(b):
        pytest.skip("KILN_BIN not set (run through ctest)")
    return b


@pytest.fixture(scope="module")
def model_path():
    return default_model()


@pytest.fixture(scope="module")
def server(kiln_bin, model_path):
    with KilnServer(kiln_bin, model_path, ["--parallel", "2", "--ctx", "1024", "--max-body", "1"]) as s:
        yield s


def request(server, method, path, body=None, headers=None, timeout=120):
    """(status, headers, body bytes); body may be bytes, str, or an object sent as JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, r.headers, data


def error_of(status, headers, data, want_status):
    assert status == want_status, data
    assert headers["Content-Type"] == "application/json"
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("server_error" if want_status >= 500 else "invalid_request_error")
    return err


def sse_events(data):
    """The data: payloads of an SSE body, in order, checking the framing."""
    text = data.decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), text
    return [e[len("data: "):] for e in events]


def test_health_and_models(server):
    status, headers, data = request(server, "GET", "/health")
    assert status == 200 and json.loads(data) == {"status": "ok"}
    status, _, data = request(server, "GET", "/v1/models")
    body = json.loads(data)
    assert status == 200 and body["object"] == "list"
    assert body["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1.gguf" or body["data"][0]["id"].endswith(".gguf")


def test_startup_line_says_where_and_how_much(server):
    # --parallel 2 --ctx 1024: a pool of 2 x 64 blocks of 16 positions, F16 keys and values of SmolLM2-135M
    # (30 layers, 3 KV heads of 64): 2 * 2 * 30 * 192 * 2048 bytes = 45 MiB
    log = server.log_tail()
    assert "kiln serve: on the CPU: weights 92.1 MiB, KV cache 45.0 MiB (128 blocks of 16 positions)" in log, log


def test_web_page(server):
    status, headers, data = request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<html" in data.lower()


def test_chat_and_completion_shapes(server):
    status, _, data = request(server, "POST", CHAT, {"messages": HELLO, "max_tokens": 4, "temperature": 0})
    r = json.loads(data)
    assert status == 200 and r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
    status, _, data = request(server, "POST", "/v1/completions", {"prompt": "Once upon", "max_tokens": 3})
    r = json.loads(data)
    assert status == 200 and r["object"] == "text_completion" and r["usage"]["completion_tokens"] <= 3


def test_stream_framing(server):
    body = {"messages": HELLO, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    status, headers, data = request(server, "POST", CHAT, body)
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    with_choices = [c for c in chunks if c["choices"]]
    assert [c["choices"][0]["finish_reason"] for c in with_choices][:-1] == [None] * (len(with_choices) - 1)
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
    assert len([c for c in with_choices if c["choices"][0]["delta"].get("content")]) >= 2
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])


BAD_CHAT = [
    ("{not json", None, "invalid_json"),
    ("[1, 2]", None, "invalid_json"),
    ({}, "messages", "missing_field"),
    ({"messages": "hi"}, "messages", "invalid_type"),
    ({"messages": []}, "messages", "invalid_value"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "invalid_value"),
    ({"messages": HELLO, "temperature": "warm"}, "temperature", "invalid_type"),
    ({"messages": HELLO, "top_p": 2}, "top_p", "invalid_value"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"messages": HELLO, "max_tokens": 10 ** 12}, "max_tokens", "invalid_value"),
    ({"messages": HELLO, "max_completion_tokens": -3}, "max_completion_tokens", "invalid_value"),
    ({"messages": HELLO, "stop": 7}, "stop", "invalid_type"),
    ({"messages": HELLO, "stream": 1}, "stream", "invalid_type"),
    ({"messages": HELLO, "n": 3}, "n", "unsupported_value"),
    ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ({"messages": HELLO, "max_tokens": 1000}, "max_tokens", "context_length_exceeded"),
]


@pytest.mark.parametrize("body,param,code", BAD_CHAT)
def test_bad_chat_request(server, body, param, code):
    err = error_of(*request(server, "POST", CHAT, body), 400)
    assert err["param"] == param and err["code"] == code


def test_prompt_longer_than_context(server):
    err = error_of(*request(server, "POST", "/v1/completions", {"prompt": "hello world " * 2000}), 400)
    assert err["param"] == "prompt" and err["code"] == "context_length_exceeded"


def test_unknown_route_and_method(server):
    err = error_of(*request(server, "GET", "/v2/nothing"), 404)
    assert err["code"] == "unknown_url"
    err = error_of(*request(server, "GET", CHAT), 405)
    assert err["code"] == "method_not_allowed"


def test_body_over_limit(server):
    # this server takes at most 1 MiB; declared length and chunked upload both refused
    big = json.dumps({"prompt": "a" * (1 << 20)})
    err = error_of(*request(server, "POST", "/v1/completions", big), 413)
    assert err["code"] == "request_too_large"

    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536].encode()

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=chunks(), encode_chunked=True)
    r = conn.getresponse()
    error_of(r.status, r.headers, r.read(), 413)
    conn.close()


def metric(server, name):
    _, _, data = request(server, "GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_metrics(server):
    status, headers, data = request(server, "GET", "/metrics")
    text = data.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in ("kiln_requests_total{", "kiln_prompt_tokens_total ", "kiln_completion_tokens_total ",
                 "kiln_queue_depth ", "kiln_running_sequences ", "kiln_kv_cache_usage_ratio ",
                 "kiln_time_to_first_token_seconds_bucket{", "kiln_inter_token_latency_seconds_count "):
        assert name in text, name
    assert 'route="/v1/chat/completions",status="400"' in text


def send_long_completion(port, stream, max_tokens=900):
    """A raw socket that has sent a long completion request."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = json.dumps({"prompt": "Write a very long story about a dragon.", "max_tokens": max_tokens,
                       "temperature": 1.0, "seed": 3, "stream": stream})
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    return s


def start_stream(port):
    """A raw socket with a long streaming completion under way and its first bytes read."""
    s = send_long_completion(port, True)
    got = b""
    while got.count(b"data: ") < 3:
        part = s.recv(4096)
        assert part, got
        got += part
    return s, got


def test_disconnect_mid_stream_frees_the_sequence(server):
    steps = metric(server, "kiln_scheduler_steps_total")
    s, got = start_stream(server.port)
    assert b"200 OK" in got
    s.close()
    assert wait_idle(server)
    assert metric(server, "kiln_scheduler_steps_total") - steps < 600, "the sequence ran on after its client left"
    assert metric(server, "kiln_kv_blocks_used") == 0
    status, _, _ = request(server, "POST", CHAT, {"messages": HELLO, "max_tokens": 2})
    assert status == 200


def wait_idle(server):
    deadline = time.monotonic() + 20
    while metric(server, "kiln_running_sequences") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return metric(server, "kiln_running_sequences") == 0


def test_disconnect_while_waiting_cancels(server):
    before = metric(server, "kiln_completion_tokens_total")
    steps = metric(server, "kiln_scheduler_steps_total")
    s = send_long_completion(server.port, False)
    deadline = time.monotonic() + 20
    while metric(server, "kiln_running_sequences") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    s.close()
    assert wait_idle(server)
    # a cancelled request is not counted as served; 900 tokens were not generated to the end
    assert metric(server, "kiln_completion_tokens_total") == before
    assert metric(server, "kiln_scheduler_steps_total") - steps < 600, "the sequence ran on after its client left"
    assert request(server, "POST", CHAT, {"messages": HELLO, "max_tokens": 2})[0] == 200


def test_no_cors_unless_asked(server):
    status, headers, _ = request(server, "GET", "/v1/models", headers={"Origin": "https://elsewhere.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_api_key_and_cors(kiln_bin, model_path):
    args = ["--api-key", "s3cret", "--ctx", "512", "--cors", "https://app.example"]
    with KilnServer(kiln_bin, model_path, args) as keyed:
        # a browser's preflight carries no key; the answer lets the real request through
        status, headers, _ = request(keyed, "OPTIONS", CHAT, headers={"Origin": "https://app.example"})
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "Authorization" in headers["Access-Control-Allow-Headers"]
        assert request(keyed, "GET", "/health")[0] == 200  # public, for load balancers
        err = error_of(*request(keyed, "GET", "/v1/models"), 401)
        assert err["code"] == "invalid_api_key"
        error_of(*request(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer s3cre"}), 401)
        error_of(*request(keyed, "GET", "/metrics", headers={"Authorization": "s3cret"}), 401)
        assert request(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})[0] == 200


def test_sigterm_mid_stream_exits_zero(kiln_bin, model_path):
    with KilnServer(kiln_bin, model_path, ["--ctx", "1024"]) as srv:
        s, _ = start_stream(srv.port)
        srv.proc.send_signal(signal.SIGTERM)
        rest = b""
        while True:
            part = s.recv(65536)
            if not part:
                break
            rest += part
        s.close()
        assert srv.proc.wait(timeout=20) == 0
        assert b'"finish_reason":"stop"' in rest and b"data: [DONE]" in rest  # ended, not cut
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
