#!/usr/bin/env python3
"""Load benchmark for `kiln serve`: N concurrent clients, each sending R streamed chat completions one after the
other (varied user prompts behind one shared system prompt, so the server's prefix sharing has something to share).

Reports failures, aggregate completion tok/s, requests/s, time to first token (p50/p99) and inter-token latency
(p50, the gap between consecutive content chunks; a chunk can carry more than one token when text is held back for
stop strings or incomplete UTF-8). Either points at a running server (--host/--port) or starts one (--spawn MODEL).

    bench/load_server.py --spawn "$(scripts/fetch-model.sh)" --parallel 32          # 32 clients x 20 requests
    bench/load_server.py --port 8080 --clients 8 --requests 5 --json result.json

Only loopback addresses are meant as targets; every loop is bounded by --clients x --requests and --timeout."""
import argparse
import contextlib
import http.client
import json
import os
import sys
import threading
import time

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "server"))
from live_server import KilnServer  # noqa: E402  (the same start/stop the server tests use)

SYSTEM = ("You are a helpful assistant running inside a load test. Answer briefly and plainly, in one or two "
          "sentences, without lists or headings.")
TOPICS = ["the moon", "bread", "volcanoes", "the violin", "honeybees", "glass", "rivers", "chess", "copper",
          "owls", "tea", "bridges", "snow", "paper", "whales", "clocks", "salt", "kites", "granite", "lighthouses"]
QUESTIONS = ["Tell me one fact about {}.", "Why do people like {}?", "Describe {} to a child.",
             "What is the history of {}?"]


def prompt_for(client, request):
    topic = TOPICS[(client * 7 + request) % len(TOPICS)]
    return QUESTIONS[(client + request) % len(QUESTIONS)].format(topic)


class Result:
    def __init__(self):
        self.ok = False
        self.error = ""
        self.ttft = None          # seconds from sending to the first content chunk
        self.gaps = []            # seconds between consecutive content chunks
        self.completion_tokens = 0
        self.prompt_tokens = 0


def stream_one(conn, path, body, headers, timeout):
    """Sends one streamed chat completion on conn and reads its SSE stream to [DONE]."""
    res = Result()
    t0 = time.monotonic()
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        res.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
        return res
    last = None
    done = False
    while not done:
        line = resp.readline()
        if not line:
            break
        if time.monotonic() - t0 > timeout:
            res.error = f"no [DONE] within {timeout} s"
            conn.close()
            return res
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            res.error = f"error event: {chunk['error'].get('message')}"
            continue
        if chunk.get("usage"):
            res.completion_tokens = chunk["usage"]["completion_tokens"]
            res.prompt_tokens = chunk["usage"]["prompt_tokens"]
        for choice in chunk.get("choices", []):
            if choice.get("delta", {}).get("content"):
                now = time.monotonic()
                if last is None:
                    res.ttft = now - t0
                else:
                    res.gaps.append(now - last)
                last = now
    resp.read()
    if res.error:
        return res
    if not done:
        res.error = "stream ended without [DONE]"
    elif res.completion_tokens == 0:
        res.error = "no usage chunk (stream_options.include_usage) or no tokens"
    else:
        res.ok = True
    return res


def client_loop(args, client, results):
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
    for r in range(args.requests):
        body = json.dumps({
            "model": args.model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt_for(client, r)}],
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        })
        try:
            results.append(stream_one(conn, "/v1/chat/completions", body, headers, args.timeout))
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
            failed = Result()
            failed.error = f"{type(e).__name__}: {e}"
            results.append(failed)
            conn.close()
            conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
    conn.close()


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def summarize(args, results, wall):
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    tokens = sum(r.completion_tokens for r in ok)
    errors = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "clients": args.clients,
        "requests_per_client": args.requests,
        "max_tokens": args.max_tokens,
        "parallel": args.parallel if args.spawn else None,
        "requests": len(results),
        "failures": len(results) - len(ok),
        "errors": errors,
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "completion_tok_per_s": round(tokens / wall, 1),
        "requests_per_s": round(len(ok) / wall, 2),
        "ttft_p50_ms": round(1000 * percentile(ttfts, 50), 1) if ttfts else None,
        "ttft_p99_ms": round(1000 * percentile(ttfts, 99), 1) if ttfts else None,
        "itl_p50_ms": round(1000 * percentile(gaps, 50), 1) if gaps else None,
        "itl_p99_ms": round(1000 * percentile(gaps, 99), 1) if gaps else None,
    }


def run(args):
    per_client = [[] for _ in range(args.clients)]
    threads = [threading.Thread(target=client_loop, args=(args, c, per_client[c])) for c in range(args.clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarize(args, [r for rs in per_client for r in rs], time.monotonic() - t0)


def model_name(args):
    conn = http.client.HTTPConnection(args.host, args.port, timeout=30)
    headers = {"Authorization": "Bearer " + args.api_key} if args.api_key else {}
    conn.request("GET", "/v1/models", headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        sys.exit(f"GET /v1/models: HTTP {resp.status}: {body[:300].decode(errors='replace')}")
    return json.loads(body)["data"][0]["id"]


def print_report(s):
    print(f"{s['requests']} requests ({s['clients']} clients x {s['requests_per_client']}, "
          f"max_tokens {s['max_tokens']}) in {s['wall_s']:.1f} s: {s['failures']} failed")
    for msg, n in s["errors"].items():
        print(f"  {n} x {msg}")
    print(f"completion tokens {s['completion_tokens']}: {s['completion_tok_per_s']} tok/s aggregate, "
          f"{s['requests_per_s']} requests/s")
    print(f"TTFT p50 {s['ttft_p50_ms']} ms, p99 {s['ttft_p99_ms']} ms; "
          f"inter-token p50 {s['itl_p50_ms']} ms, p99 {s['itl_p99_ms']} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--model", help="model name sent in requests (default: the first of GET /v1/models)")
    ap.add_argument("--api-key")
    ap.add_argument("--spawn", metavar="MODEL", help="start `kiln serve -m MODEL` on a free port, stop it after")
    ap.add_argument("--kiln", default=os.path.join(SOURCE_DIR, "build", "kiln"), help="kiln binary for --spawn")
    ap.add_argument("--parallel", type=int, default=32, help="--parallel for the spawned server")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="another argument for the spawned server (repeat: --server-arg=--gpu-f16 --server-arg=on)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=20, help="requests per client, one after the other")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--timeout", type=float, default=300, help="seconds one request may take")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()

    server_args = ["--parallel", str(args.parallel)] + args.server_arg
    spawned = KilnServer(args.kiln, args.spawn, server_args) if args.spawn else None
    with spawned or contextlib.nullcontext():
        if spawned:
            args.host, args.port = "127.0.0.1", spawned.port
        args.model = args.model or model_name(args)
        summary = run(args)
    summary["model"] = args.model
    print_report(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
