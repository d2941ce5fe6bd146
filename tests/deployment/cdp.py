"""A small Chrome DevTools Protocol client over a websocket: headless Chromium driven as a user
drives the Dagster UI (open a page, wait for a text, click a button by its label, screenshot).

Only what the browser tests need; every wait is bounded and says what it waited for."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from tests.deployment.support import DeploymentTestError

CHROMIUM = os.environ.get("CUES_CHROMIUM", "/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def chromium_binary() -> str:
    binary = shutil.which(CHROMIUM) or shutil.which("chromium")
    if binary is None:
        raise DeploymentTestError(f"Chromium not found ({CHROMIUM}): install Debian's package "
                                  "(`apt-get install -y chromium`; .ci/run does it)")
    return binary


class Browser:
    """One headless Chromium with one page, controlled over CDP."""

    def __init__(self, profile: Path, *, width: int = 1600, height: int = 1000) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise DeploymentTestError(f"chromium did not open its debugging port: {self._stderr()}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=10) as resp:
            pages = [t for t in json.loads(resp.read()) if t.get("type") == "page"]
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.next_id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")

    def _stderr(self) -> str:
        return "" if self.proc.stderr is None or self.proc.poll() is None else self.proc.stderr.read().decode()[-2000:]

    def send(self, method: str, timeout: float = 60, **params: Any) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise DeploymentTestError(f"CDP {method}: {message['error']}")
                return message.get("result", {})

    def eval(self, expression: str) -> Any:
        out = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise DeploymentTestError(f"page script failed: {out['exceptionDetails']}")
        return out.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_until("document.readyState === 'complete'", f"{url} to load")

    def wait_until(self, expression: str, what: str, *, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.25)  # polling the page for a condition, with a deadline
        raise DeploymentTestError(f"waited {timeout:.0f} s for {what}; the page says: {self.text()[-1500:]}")

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, text: str, *, timeout: float = 120) -> None:
        self.wait_until(f"document.body && document.body.innerText.includes({json.dumps(text)})",
                        f"the text {text!r}", timeout=timeout)

    def click(self, label: str, *, selector: str = "button, a, [role=menuitem], [role=tab]",
              timeout: float = 60) -> None:
        """Click the first visible element matching ``selector`` whose text is ``label``."""
        script = f"""(() => {{
            const want = {json.dumps(label)};
            const sel = {json.dumps(selector)};
            const hit = e => e.offsetParent !== null && !e.disabled && e.innerText.trim() === want;
            // the innermost match: a menu's <li> holds the <a> that has the handler
            const els = [...document.querySelectorAll(sel)]
              .filter(e => hit(e) && ![...e.querySelectorAll(sel)].some(hit));
            if (!els.length) return false;
            els[0].click();
            return true;
        }})()"""
        self.wait_until(script, f"a clickable {label!r}", timeout=timeout)

    def open_menu_beside(self, label: str, *, timeout: float = 60) -> None:
        """Click the (unlabelled) dropdown button right after the button labelled ``label``."""
        script = f"""(() => {{
            const b = [...document.querySelectorAll('button')]
              .find(e => e.offsetParent !== null && e.innerText.trim() === {json.dumps(label)});
            if (!b) return false;
            let next = b.nextElementSibling;
            while (next && next.tagName !== 'BUTTON') next = next.querySelector('button') || next.nextElementSibling;
            if (!next) return false;
            next.click();
            return true;
        }})()"""
        self.wait_until(script, f"the menu beside {label!r}", timeout=timeout)

    def labels(self, selector: str = "button") -> list[str]:
        return self.eval(f"[...document.querySelectorAll({json.dumps(selector)})]"
                         ".filter(e => e.offsetParent !== null).map(e => e.innerText.trim())") or []

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
