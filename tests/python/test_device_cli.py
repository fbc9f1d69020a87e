"""--device on the command line: cuda runs where a GPU answers and otherwise fails with a message naming CUDA (never a
crash), auto always runs (the CPU's output when there is no GPU), and a bad value is refused."""
import subprocess

import pytest


def run(kiln_bin, model, device):
    return subprocess.run([kiln_bin, "run", "-m", model, "-p", "Hello", "-n", "4", "--temp", "0", "--device", device],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def runs(kiln_bin, default_model):
    return {d: run(kiln_bin, default_model, d) for d in ("cuda", "auto", "cpu")}


def test_cuda_runs_or_says_why(runs):
    r = runs["cuda"]
    if r.returncode != 0:
        assert "CUDA" in r.stderr, r.stderr
        assert r.returncode > 0  # an error exit, not a signal


def test_auto_runs_and_is_the_cpu_without_gpu(runs):
    assert runs["auto"].returncode == 0, runs["auto"].stderr
    assert runs["cpu"].returncode == 0, runs["cpu"].stderr
    if runs["cuda"].returncode != 0:
        assert runs["auto"].stdout == runs["cpu"].stdout


def test_bad_value(kiln_bin, default_model):
    r = subprocess.run([kiln_bin, "run", "-m", default_model, "-p", "Hi", "--device", "tpu"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "--device expects cpu, cuda or auto" in r.stderr


def test_serve_gpu_f16_bad_value(kiln_bin, default_model):
    r = subprocess.run([kiln_bin, "serve", "-m", default_model, "--gpu-f16", "yes"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "--gpu-f16 expects on, off or auto" in r.stderr
