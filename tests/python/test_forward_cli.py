"""The model commands end to end: run, chat, perplexity, bench (output shape, errors, help)."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

KILN = os.environ.get("KILN_BIN", "build/kiln")
SOURCE = os.environ.get("KILN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def model():
    return subprocess.run([os.path.join(SOURCE, "scripts", "fetch-model.sh")], check=True, capture_output=True,
                          text=True).stdout.strip()


def kiln(*args, **kw):
    return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("cmd", ["run", "chat", "perplexity", "bench"])
def test_help(cmd):
    r = kiln(cmd, "--help")
    assert r.returncode == 0 and "usage: kiln " + cmd in r.stdout


def test_run_prints_only_the_continuation(model):
    r = kiln("run", "-m", model, "-p", "The capital of France is", "-n", "3", "--temp", "0", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout == " Paris.\n"  # greedy ids 7042 30 198 (numpy reference)
    assert "tok/s" in r.stderr
    # where it ran and what its context holds there, first; the timings name the place again
    assert re.search(r"on the CPU, 1 thread: weights 92\.1 MiB, KV cache [0-9.]+ MiB \([0-9]+ positions\)", r.stderr)
    assert r.stderr.rstrip().endswith("on the CPU, 1 thread")


def test_run_chat_and_seeds(model):
    args = ["run", "-m", model, "--chat", "-p", "Name a color.", "-n", "12", "--temp", "0.9", "-t", "1"]
    a = kiln(*args, "--seed", "5")
    b = kiln(*args, "--seed", "5")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.strip()


def test_context_overflow_is_a_clear_error(model):
    r = kiln("run", "-m", model, "-p", "Hello", "-n", "100", "--ctx", "32")
    assert r.returncode == 1 and "exceed the context of 32 tokens" in r.stderr and r.stdout == ""


def test_bad_options_fail(model):
    assert kiln("run", "-m", model, "-p", "x", "--temp", "hot").returncode == 1
    assert kiln("run", "-p", "x").returncode == 1
    assert "cannot open" in kiln("run", "-m", "/nonexistent.gguf", "-p", "x").stderr


def test_chat_keeps_history_and_exits_on_eof(model):
    r = kiln("chat", "-m", model, "--temp", "0", "-n", "8", "-t", "1", input="Hi\nAnd again?\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) >= 2


def test_chat_ctrl_c_stops_a_reply(model):
    p = subprocess.Popen([KILN, "chat", "-m", model, "-n", "-1", "--ctx", "4096", "-t", "1",
                          "--system", "Write very long answers."], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdin.write("Tell me a very long story about a dragon.\n")
    p.stdin.flush()
    # the reply's first bytes, then Ctrl-C while it streams: a fixed wait let a short sampled reply end first, and the
    # signal then came at the prompt (where it ends the session, as it should)
    first = p.stdout.read(1)
    assert first
    p.send_signal(signal.SIGINT)  # stops the reply; the session goes on
    time.sleep(0.5)
    assert p.poll() is None
    out, _ = p.communicate("", timeout=60)  # end of input ends it
    assert p.returncode == 0 and (first + out).strip()


def test_perplexity_last_line(model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    r = kiln("perplexity", "-m", model, "-f", str(text), "--ctx", "64", "--chunks", "2", "-t", "1")
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("perplexity: ") and float(last.split()[1]) < 5  # the text repeats: easy to predict
    assert kiln("perplexity", "-m", model, "-f", str(text), "--ctx", "4096").returncode == 1


def test_bench_json(model):
    r = kiln("bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    for key in ("pp_tok_s", "tg_tok_s", "bandwidth_fraction", "ttft_ms", "bytes_per_token", "bandwidth_gbs",
                "weights_bytes", "kv_cache_bytes", "workspace_bytes", "peak_rss_bytes"):
        assert j[key] > 0
    assert j["device"] == "cpu"
    # the whole file's weights (tied head once) against those a token reads (the head, one embedding row)
    assert abs(j["weights_bytes"] - j["bytes_per_token"]) < 0.01 * j["bytes_per_token"]
    # SmolLM2-135M (30 layers, 3 KV heads of 64): F16 keys and values of the p + 2 positions bench asks for
    assert j["kv_cache_bytes"] == 2 * 2 * 30 * 3 * 64 * (16 + 2)


def test_bench_text_reports_memory(model):
    r = kiln("bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert "time to first token" in r.stdout
    assert re.search(r"memory \(host\): weights [0-9.]+ MiB, KV cache [0-9.]+ MiB \(18 positions\)", r.stdout)
