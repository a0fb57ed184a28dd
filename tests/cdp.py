"""A small Chrome DevTools Protocol client: one headless Chromium, one page, driven by the tests.

`--dump-dom` (tests/test_report.py) reads a static page once; JupyterLab needs more: a live server,
a page that keeps loading after the first paint, kernels, and several documents in one session.
So the notebook tests start Chromium with a DevTools port, navigate one page, evaluate JavaScript
in it until a condition holds, and record every request the page makes (to prove offline pages
fetch nothing from the network).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import websocket

from tests.test_report import CHROMIUM_FLAGS, chromium

# Every host name fails to resolve except the loopback: a page that needs the network cannot get it.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


class BrowserError(AssertionError):
    pass


class Browser:
    """Headless Chromium with one page tab; `evaluate` runs JavaScript in it, `requests` lists every URL it fetched."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000, timeout: float = 90):
        flags = [f for f in CHROMIUM_FLAGS if not f.startswith("--virtual-time-budget")]
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a stale one names a dead browser's port
        self.proc = subprocess.Popen(
            [chromium(), *flags, OFFLINE, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self._id = 0
        try:
            port = self._port(profile / "DevToolsActivePort", timeout)
            pages = self._wait(lambda: [t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
                                        if t["type"] == "page"], timeout, "a page target")
            self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout,
                                                  suppress_origin=True, enable_multithread=False)
            for domain in ("Page", "Runtime", "Network"):
                self.send(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _port(self, active: Path, timeout: float) -> int:
        def read():
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode} before opening its DevTools port")
            text = active.read_text() if active.exists() else ""
            return int(text.split()[0]) if text.strip() else None
        return self._wait(read, timeout, "Chromium's DevTools port")

    @staticmethod
    def _wait(probe, timeout: float, what: str, every: float = 0.25):
        """Calls `probe` until it returns something truthy; errors count as "not yet" until the timeout."""
        end, last = time.monotonic() + timeout, None
        while True:
            try:
                value = probe()
            except (OSError, ValueError, BrowserError) as err:  # not listening yet; a page still navigating
                value, last = None, err
            if value:
                return value
            if time.monotonic() > end:
                raise BrowserError(f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last: {last})" if last else ""))
            time.sleep(every)

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append((details.get("exception") or {}).get("description") or details.get("text", "?"))

    def send(self, method: str, params: dict | None = None) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def evaluate(self, expression: str):
        """Returns the JSON value of `expression` (promises are awaited); a thrown error fails the test."""
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:80]!r} threw: {res['exceptionDetails'].get('exception', {}).get('description')}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str):
        """Evaluates `expression` until it is truthy; returns that value."""
        return self._wait(lambda: self.evaluate(expression), timeout, what, every=0.5)

    def goto(self, url: str) -> None:
        self.requests.clear()
        self.errors.clear()
        self.send("Page.navigate", {"url": url})

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
