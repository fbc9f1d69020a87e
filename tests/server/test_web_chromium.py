"""The web chat page at GET /, driven in headless Chromium over the Chrome DevTools Protocol: the model's name shows,
a typed message gets a reply that streams in (seen growing), Stop ends a reply early, and a server with an API key
makes the page ask for it. Skipped when Debian's chromium is not installed (scripts/deps.sh installs it with
KILN_WITH_BROWSER=1)."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from live_server import KilnServer, default_model

websocket = pytest.importorskip("websocket", reason="python websocket-client not installed (scripts/deps.sh)")

CHROMIUM = os.environ.get("KILN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM:
    pytest.skip("chromium not installed (KILN_WITH_BROWSER=1 scripts/deps.sh installs it)", allow_module_level=True)


class Browser:
    """One headless Chromium with one page, spoken to over CDP's websocket."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="kiln-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--window-size=900,700", "--remote-debugging-port=0",
             "--user-data-dir=" + self.profile, "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._devtools_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        # Chromium refuses DevTools websockets that carry an Origin header it was not told to allow.
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.next_id = 0
        self.exceptions = []
        self.call("Runtime.enable")

    def _devtools_port(self):
        # With --remote-debugging-port=0 Chromium picks a free port and writes it to DevToolsActivePort.
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(path):
                with open(path) as f:
                    first = f.readline().strip()
                if first:
                    return int(first)
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port in 30 s")

    def call(self, method, **params):
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Runtime.exceptionThrown":
                self.exceptions.append(msg["params"]["exceptionDetails"])
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def js(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")

    def open(self, url):
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && !!document.getElementById('input')")

    def click(self, element_id):
        box = self.js(f"(() => {{ const r = document.getElementById('{element_id}').getBoundingClientRect();"
                      " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type_into(self, element_id, text):
        self.js(f"document.getElementById('{element_id}').focus()")
        self.call("Input.insertText", text=text)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


LAST_REPLY = ("(() => { const m = document.querySelectorAll('.msg.assistant');"
              " return [m.length ? m[m.length - 1].textContent : '', document.body.dataset.state]; })()")


def watch_reply(browser, timeout=120):
    """Polls the newest reply until the page is idle again; returns the distinct texts seen while streaming."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text, state = browser.js(LAST_REPLY)
        if text and (not seen or seen[-1] != text):
            seen.append(text)
        if state == "idle":
            return seen
    raise AssertionError(f"reply still streaming after {timeout} s; seen {seen[-1:]}")


@pytest.fixture(scope="module")
def kiln_bin():
    b = os.environ.get("KILN_BIN")
    if not b or not os.path.exists(b):
        pytest.skip("KILN_BIN not set (run through ctest)")
    return b


@pytest.fixture(scope="module")
def server(kiln_bin):
    with KilnServer(kiln_bin, default_model(), ["--parallel", "2"]) as s:
        yield s


@pytest.fixture()
def browser():
    b = Browser()
    yield b
    b.close()


def model_id(server, key=None):
    auth = {"Authorization": "Bearer " + key} if key else {}
    with urllib.request.urlopen(urllib.request.Request(server.url + "/v1/models", headers=auth), timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def running_sequences(server):
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("kiln_running_sequences "):
                return float(line.split()[1])
    raise AssertionError("no kiln_running_sequences in /metrics")


def send(browser, text, max_tokens):
    browser.js(f"document.getElementById('max-tokens').value = {max_tokens}")
    browser.type_into("input", text)
    browser.click("send")
    browser.wait_for("document.body.dataset.state === 'streaming'", timeout=10)


def test_page_streams_a_reply(server, browser):
    browser.open(server.url + "/")
    assert browser.wait_for(f"document.getElementById('model-name').textContent === {json.dumps(model_id(server))}")
    send(browser, "Tell me a short story about a cat.", 48)
    seen = watch_reply(browser)
    assert len(seen) >= 2, f"the reply did not grow while streaming: {seen}"
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:])), seen
    assert browser.js("document.querySelectorAll('.msg.error').length") == 0
    assert browser.js("document.getElementById('input').value") == ""
    # A second turn: the page keeps the history, so there are two exchanges on screen afterwards.
    send(browser, "Give it a title.", 16)
    assert watch_reply(browser)
    assert browser.js("document.querySelectorAll('.msg.user').length") == 2
    assert browser.js("document.querySelectorAll('.msg.assistant').length") == 2
    assert browser.js("document.querySelectorAll('.msg.error').length") == 0
    if os.environ.get("KILN_BUILD_DIR"):
        browser.screenshot(os.path.join(os.environ["KILN_BUILD_DIR"], "web_chat.png"))
    assert browser.exceptions == []


def test_stop_ends_the_reply(server, browser):
    browser.open(server.url + "/")
    browser.wait_for("document.getElementById('model-name').textContent !== 'connecting…'")
    # Greedy, this prompt runs to the token limit (2000), so the reply is still streaming when Stop is clicked.
    browser.js("document.getElementById('temperature').value = 0")
    send(browser, "Write a long essay about the history of pottery.", 2000)
    browser.wait_for(LAST_REPLY + "[0].length > 0", timeout=60)
    browser.click("stop")
    browser.wait_for("document.body.dataset.state === 'idle'", timeout=10)
    assert browser.js(LAST_REPLY)[0].endswith("(stopped)")
    assert browser.js("document.querySelectorAll('.msg.error').length") == 0
    # The aborted fetch closed the connection, and the server cancelled the generation (not 2000 tokens later).
    deadline = time.monotonic() + 10
    while running_sequences(server) != 0:
        assert time.monotonic() < deadline, "the server kept generating after Stop"
        time.sleep(0.1)
    # The server is still there for the next message.
    send(browser, "Hi", 8)
    assert watch_reply(browser)
    assert browser.js("document.querySelectorAll('.msg.error').length") == 0


def test_page_asks_for_the_api_key(kiln_bin, browser):
    with KilnServer(kiln_bin, default_model(), ["--api-key", "web-secret"]) as keyed:
        browser.open(keyed.url + "/")
        browser.wait_for("document.body.classList.contains('needs-key')")
        browser.type_into("api-key", "web-secret")
        browser.js("document.getElementById('key-form').requestSubmit()")
        name = json.dumps(model_id(keyed, "web-secret"))
        browser.wait_for(f"document.getElementById('model-name').textContent === {name}")
        assert not browser.js("document.body.classList.contains('needs-key')")
        send(browser, "Hello", 8)
        assert watch_reply(browser)
        assert browser.js("document.querySelectorAll('.msg.error').length") == 0

