"""A `kiln serve` process for tests and benchmarks: started on a free loopback port, ready once GET /health answers
200, stopped with SIGTERM (then SIGKILL) on exit. Its stdout and stderr go to a log file whose tail is shown when it
fails to start."""
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

SOURCE_DIR = os.environ.get("KILN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def default_model():
    """Path of the default model (scripts/fetch-model.sh fetches it once if missing)."""
    script = os.path.join(SOURCE_DIR, "scripts", "fetch-model.sh")
    out = subprocess.run([script], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KilnServer:
    def __init__(self, kiln_bin, model, extra_args=(), startup_s=120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [kiln_bin, "serve", "-m", model, "--port", str(self.port), *extra_args]
        self.startup_s = startup_s
        self.proc = None
        self.log = None

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile(prefix="kiln-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self):
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"kiln serve not ready after {self.startup_s} s:\n{self.log_tail()}")

    def log_tail(self, n=4000):
        with open(self.log.name, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)
        return False
