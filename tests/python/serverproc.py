"""Start and stop `orchid serve` for tests.

    with Server(mock=True, args=["--parallel", "8"]) as srv:
        srv.url      # http://127.0.0.1:PORT
        srv.client() # openai.OpenAI bound to it (no retries)
        srv.log()    # stderr so far (request log lines)

The server binds 127.0.0.1 port 0 (a free port the kernel picks); the port is
read from its "listening on" line. stderr goes to a temp file (never a pipe,
so a chatty server cannot block). On exit the server gets SIGTERM and must
exit 0 within the timeout; otherwise it is killed and the test fails.

Binary: $ORCHID_BIN, else build/orchid. asan=True prefers build/asan/orchid
(ASan + UBSan) when it exists.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = "Qwen3.6-35B-A3B"


def orchid_bin(asan=False):
    env = os.environ.get("ORCHID_ASAN_BIN" if asan else "ORCHID_BIN")
    if env:
        return env
    if asan and (REPO / "build" / "asan" / "orchid").exists():
        return str(REPO / "build" / "asan" / "orchid")
    if os.environ.get("ORCHID_BIN"):
        return os.environ["ORCHID_BIN"]
    return str(REPO / "build" / "orchid")


def run_together(jobs, timeout=None):
    """Calls every job (name -> callable with no arguments) on its own thread, all released
    at once by a barrier so their requests overlap in the server's batches; returns
    name -> result. Fails the test with every job's exception if any raised."""
    out, errors = {}, []
    barrier = threading.Barrier(len(jobs))

    def one(name):
        try:
            barrier.wait()
            out[name] = jobs[name]()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=one, args=(n,)) for n in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return out


class Server:
    def __init__(self, mock=True, model=None, args=(), env=None, asan=False, wait_ready=True, timeout=60):
        self.cmd = [orchid_bin(asan), "serve", "--port", "0"]
        if mock:
            self.cmd.append("--mock")
        if model:
            self.cmd += ["--model", str(model)]
        self.cmd += list(args)
        self.env = dict(os.environ)
        self.env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        self.env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        self.env.update(env or {})
        self.wait_ready = wait_ready
        self.timeout = timeout
        self.proc = None
        self.port = None
        self.returncode = None

    # -- lifecycle --
    def __enter__(self):
        self.errf = tempfile.NamedTemporaryFile(prefix="orchid-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.errf, env=self.env)
        deadline = time.time() + self.timeout
        while self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"orchid serve exited {self.proc.returncode}:\n{self.log()}")
            m = re.search(r"listening on http://[\d.]+:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                self.kill()
                raise RuntimeError("orchid serve did not start:\n" + self.log())
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        if self.wait_ready:
            while True:
                st, _, _ = self.request("GET", "/health")
                if st == 200:
                    break
                if self.proc.poll() is not None or time.time() > deadline:
                    self.kill()
                    raise RuntimeError("orchid serve never became healthy:\n" + self.log())
                time.sleep(0.05)
        return self

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            self.returncode = self.proc.returncode if self.proc else None
            return self.returncode
        self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("orchid serve did not exit after signal:\n" + self.log()[-4000:])
        return self.returncode

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __exit__(self, et, ev, tb):
        rc = self.stop()
        log = self.log()
        try:
            os.unlink(self.errf.name)
        except OSError:
            pass
        if et is None:
            assert rc == 0, f"orchid serve exited {rc}:\n{log[-6000:]}"
            assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, log[-6000:]
        return False

    # -- helpers --
    def log(self):
        with open(self.errf.name, "r", errors="replace") as f:
            return f.read()

    def client(self, **kw):
        import openai

        kw.setdefault("api_key", "none")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60)
        return openai.OpenAI(base_url=self.url + "/v1", **kw)

    def request(self, method, path, body=None, headers=None, timeout=30):
        """Raw HTTP: returns (status, headers dict, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def metric(self, name):
        st, _, body = self.request("GET", "/metrics")
        assert st == 200
        total = 0.0
        found = False
        for line in body.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        return total if found else None
