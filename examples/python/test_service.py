"""End-to-end test of ratelimit_service.py against a real redis-server.

Starts its own redis-server with the module on a free port
(``redis-server --port P --loadmodule <so> --save ""``), starts the service
(a subprocess, ``--port 0``), sends requests until it sees the 429 and checks
every header. Run with either of:

    python -m unittest -v test_service.py
    python -m pytest test_service.py

Environment: ``RL_MODULE`` (module .so; a relative path is taken from the repo
root; default target/release/libredis_ratelimit.so), ``RL_REDIS_SERVER``
(default ``redis-server`` on PATH).
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

import redis

from ratelimit_service import Decision, TokenBucketMiddleware, ceil_seconds, rate_limit_headers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def module_path() -> Path:
    p = Path(os.environ.get("RL_MODULE") or "target/release/libredis_ratelimit.so")
    if not p.is_absolute():
        p = REPO / p
    if not p.is_file():
        raise FileNotFoundError(
            f"module not found at {p}: run `cargo build --release` in {REPO} (or set RL_MODULE)"
        )
    return p.resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server with the module, on a free port, in its own temp dir."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rl-example-py-")
        self.proc = None
        so = module_path()
        binary = os.environ.get("RL_REDIS_SERVER", "redis-server")
        last = ""
        for _ in range(5):  # retry if someone grabbed the port meanwhile
            self.port = free_port()
            logfile = os.path.join(self.dir, f"redis-{self.port}.log")
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--logfile", logfile,
                 "--loadmodule", str(so)],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if redis.Redis(port=self.port, socket_timeout=1).ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
            self.proc.kill()
            self.proc.wait()
            last = Path(logfile).read_text() if os.path.exists(logfile) else ""
            if "Address already in use" not in last:
                break
        self.stop()
        raise RuntimeError(f"redis-server did not start:\n{last}")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Service:
    """ratelimit_service.py in a subprocess, on a port it picks itself."""

    def __init__(self, redis_url: str, *args: str):
        self.errlog = tempfile.NamedTemporaryFile(prefix="rl-example-svc-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "ratelimit_service.py"), "--port", "0",
             "--redis", redis_url, *args],
            stdout=subprocess.PIPE, stderr=self.errlog, text=True,
        )
        line = self.proc.stdout.readline()  # "listening on http://127.0.0.1:PORT"
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"service did not start: {line!r}\n{self.stderr()}")
        self.port = int(line.rsplit(":", 1)[1])

    def get(self, path="/hello", api_key=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path, headers={"X-API-Key": api_key} if api_key else {})
            r = conn.getresponse()
            r.read()
            return r
        finally:
            conn.close()

    def stderr(self) -> str:
        self.errlog.flush()
        return Path(self.errlog.name).read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self.proc.stdout.close()
        self.errlog.close()
        os.unlink(self.errlog.name)


def ints(resp, *names):
    return [int(resp.getheader(n)) for n in names]


class HeaderMappingTest(unittest.TestCase):
    """The reply-to-headers mapping on literal replies (no server needed)."""

    def test_admitted(self):
        h = dict(rate_limit_headers(Decision.from_reply([1, 20, 19, -1, 100])))
        self.assertEqual(h, {"RateLimit-Limit": "20", "RateLimit-Remaining": "19", "RateLimit-Reset": "1"})

    def test_limited(self):
        h = dict(rate_limit_headers(Decision.from_reply([0, 5, 0, 1001, 5000])))
        self.assertEqual(h["Retry-After"], "2")  # 1001 ms -> 2 s: never early
        self.assertEqual(h["RateLimit-Reset"], "5")
        self.assertEqual(h["RateLimit-Remaining"], "0")

    def test_never(self):
        # COST above the capacity: limited, retry_after -1 -> no Retry-After
        h = dict(rate_limit_headers(Decision.from_reply([0, 5, 5, -1, 0])))
        self.assertNotIn("Retry-After", h)
        self.assertEqual(h["RateLimit-Reset"], "0")

    def test_resp3_map(self):
        d = Decision.from_reply({b"allowed": 1, b"limit": 3, b"remaining": 2,
                                 b"retry_after_ms": -1, b"reset_after_ms": 2000})
        self.assertEqual(d, Decision(1, 3, 2, -1, 2000))

    def test_ceil_seconds(self):
        self.assertEqual([ceil_seconds(v) for v in (-1, 0, 1, 999, 1000, 1001, 5968)], [0, 0, 1, 1, 1, 2, 6])


class ServiceTest(unittest.TestCase):
    # 1 token per 2 s, bucket of 3: three requests pass, the 4th is limited
    # with Retry-After 2; a refill of one token takes 2 s, so after n requests
    # in quick succession RateLimit-Reset is 2n.
    LIMIT, PERIOD, BURST, INTERVAL_S = 1, "2s", 3, 2

    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        try:
            cls.svc = Service(f"redis://127.0.0.1:{cls.redis.port}/0", "--limit", str(cls.LIMIT),
                              "--period", cls.PERIOD, "--burst", str(cls.BURST))
        except Exception:
            cls.redis.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.svc.stop()
        cls.redis.stop()

    def test_until_429(self):
        responses = []
        for _ in range(10):
            r = self.svc.get(api_key="alice")
            responses.append(r)
            if r.status == 429:
                break
        statuses = [r.status for r in responses]
        self.assertEqual(statuses, [200] * self.BURST + [429], self.svc.stderr())

        for n, r in enumerate(responses[:-1], start=1):
            limit, remaining, reset = ints(r, "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
            self.assertEqual((limit, remaining), (self.BURST, self.BURST - n))
            # reset_after = n refill intervals minus the few ms elapsed, rounded up
            self.assertIn(reset, (n * self.INTERVAL_S - 1, n * self.INTERVAL_S))
            self.assertIsNone(r.getheader("Retry-After"))

        limited = responses[-1]
        self.assertEqual(limited.getheader("Content-Type"), "application/json")
        limit, remaining, reset, retry = ints(
            limited, "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After")
        self.assertEqual((limit, remaining), (self.BURST, 0))
        self.assertIn(reset, (self.BURST * self.INTERVAL_S - 1, self.BURST * self.INTERVAL_S))
        self.assertIn(retry, (self.INTERVAL_S - 1, self.INTERVAL_S))
        self.assertGreaterEqual(retry, 1)

        # The headers agree with the limiter's own view of the key.
        info = self.redis.client().execute_command("RL.INFO", "apikey:alice")
        if isinstance(info, list):  # RESP2: flat field/value array; RESP3: a map
            info = dict(zip(info[::2], info[1::2]))
        self.assertEqual(info[b"algorithm"], b"tokenbucket")
        self.assertEqual(int(info[b"available"]), 0)

        # A limited request consumes nothing: still limited, same numbers.
        again = self.svc.get(api_key="alice")
        self.assertEqual(again.status, 429)
        self.assertEqual(int(again.getheader("RateLimit-Remaining")), 0)

        # Honour Retry-After: after waiting that long the request passes.
        time.sleep(retry)
        ok = self.svc.get(api_key="alice")
        self.assertEqual(ok.status, 200, f"still limited after Retry-After={retry}s")
        self.assertEqual(int(ok.getheader("RateLimit-Remaining")), 0)

    def test_keys_are_independent(self):
        r = self.svc.get(api_key="bob")
        self.assertEqual(r.status, 200)
        self.assertEqual(ints(r, "RateLimit-Limit", "RateLimit-Remaining"), [self.BURST, self.BURST - 1])
        ttl = self.redis.client().pttl("apikey:bob")
        # The key TTL covers reset_after_ms (2000 here), extended in steps of 1.5 x.
        self.assertTrue(0 < ttl <= 3000, ttl)

    def test_check_resp2_and_resp3(self):
        # redis-py 8 speaks RESP3 by default (the reply is a map), older ones
        # RESP2 (an array): Decision.from_reply takes both, with equal results.
        decisions = []
        for protocol in (2, 3):
            client = redis.Redis(port=self.redis.port, protocol=protocol, socket_timeout=5)
            mw = TokenBucketMiddleware(None, client, 10, "1m", 5, key_prefix=f"resp{protocol}:")
            decisions.append([mw.check("k") for _ in range(7)])
        resp2, resp3 = decisions
        self.assertEqual([d.allowed for d in resp2], [1] * 5 + [0] * 2)
        self.assertEqual([d.remaining for d in resp2], [4, 3, 2, 1, 0, 0, 0])
        self.assertEqual([d.retry_after_ms for d in resp2][:5], [-1] * 5)
        for a, b in zip(resp2, resp3):  # equal up to the ms that passed between them
            self.assertEqual(a[:3], b[:3])

    def test_missing_api_key(self):
        r = self.svc.get()
        self.assertEqual(r.status, 401)
        self.assertIsNone(r.getheader("RateLimit-Limit"))


class RedisDownTest(unittest.TestCase):
    def test_fail_closed_and_open(self):
        dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        closed = Service(dead)
        try:
            self.assertEqual(closed.get(api_key="k").status, 503)
        finally:
            closed.stop()
        open_ = Service(dead, "--fail-open")
        try:
            r = open_.get(api_key="k")
            self.assertEqual(r.status, 200)
            self.assertIsNone(r.getheader("RateLimit-Limit"))
        finally:
            open_.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
