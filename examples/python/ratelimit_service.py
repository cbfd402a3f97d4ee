"""A small HTTP API rate-limited per API key with redis-ratelimit.

The interesting part is ``TokenBucketMiddleware``: a WSGI middleware (so it
also wraps a Flask or Django app unchanged) that, for every request, calls

    RL.TOKENBUCKET apikey:<X-API-Key> <limit> <period> BURST <burst>

through redis-py and maps the reply ``[allowed, limit, remaining,
retry_after_ms, reset_after_ms]`` to HTTP:

* admitted: the app's response, plus ``RateLimit-Limit``,
  ``RateLimit-Remaining`` and ``RateLimit-Reset``;
* limited: ``429 Too Many Requests`` with the same three headers and
  ``Retry-After`` (seconds, rounded up from ``retry_after_ms``; omitted when
  the request can never pass, i.e. ``retry_after_ms == -1``);
* no ``X-API-Key`` header: ``401``;
* Redis unreachable or erroring: ``503`` (or, with ``fail_open=True``, the
  request goes through without RateLimit headers).

Durations are reported in whole seconds rounded *up*, so a client that waits
``Retry-After`` seconds is never early. See docs/http-headers.md.

Run it (standard library server, no framework needed):

    pip install -r requirements.txt
    python ratelimit_service.py --port 8080 --redis redis://127.0.0.1:6379/0 \\
        --limit 10 --period 1s --burst 20
    curl -i -H 'X-API-Key: alice' http://127.0.0.1:8080/hello

``--port 0`` picks a free port; the first line printed on stdout is always
``listening on http://127.0.0.1:<port>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from socketserver import ThreadingMixIn
from typing import Callable, Iterable, List, NamedTuple, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis

log = logging.getLogger("ratelimit_service")

Headers = List[Tuple[str, str]]


class Decision(NamedTuple):
    """One limiter reply (the first five fields of any RL.* limiter reply)."""

    allowed: int
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int

    @classmethod
    def from_reply(cls, reply) -> "Decision":
        """Parse a RESP2 array reply (RESP3 maps are accepted too)."""
        if isinstance(reply, dict):  # RESP3 (protocol=3): a map
            get = lambda k: reply.get(k, reply.get(k.encode()))  # noqa: E731
            return cls(*(int(get(k)) for k in cls._fields))
        if not isinstance(reply, (list, tuple)) or len(reply) < 5:
            raise ValueError(f"unexpected limiter reply: {reply!r}")
        return cls(*(int(v) for v in reply[:5]))

    @property
    def admitted(self) -> bool:
        return self.allowed > 0


def ceil_seconds(ms: int) -> int:
    """Milliseconds to whole seconds, rounded up (never early); 0 for ms <= 0."""
    return -(-ms // 1000) if ms > 0 else 0


def rate_limit_headers(d: Decision) -> Headers:
    """The RateLimit-* headers (IETF draft-ietf-httpapi-ratelimit-headers,
    separate-field form) for a decision, plus Retry-After when it is limited
    and can pass later."""
    headers = [
        ("RateLimit-Limit", str(d.limit)),
        ("RateLimit-Remaining", str(d.remaining)),
        ("RateLimit-Reset", str(ceil_seconds(d.reset_after_ms))),
    ]
    if not d.admitted and d.retry_after_ms >= 0:
        headers.append(("Retry-After", str(ceil_seconds(d.retry_after_ms))))
    return headers


def _json(start_response, status: str, body: dict, headers: Headers = ()) -> List[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status,
        [("Content-Type", "application/json"), ("Content-Length", str(len(data)))] + list(headers),
    )
    return [data]


class TokenBucketMiddleware:
    """WSGI middleware: a token bucket per API key, kept in Redis."""

    def __init__(
        self,
        app: Callable,
        client: redis.Redis,
        limit: int,
        period: str,
        burst: int,
        key_prefix: str = "apikey:",
        fail_open: bool = False,
    ):
        self.app = app
        self.client = client
        self.limit = limit
        self.period = period
        self.burst = burst
        self.key_prefix = key_prefix
        self.fail_open = fail_open

    def check(self, api_key: str) -> Decision:
        reply = self.client.execute_command(
            "RL.TOKENBUCKET",
            self.key_prefix + api_key,
            self.limit,
            self.period,
            "BURST",
            self.burst,
        )
        return Decision.from_reply(reply)

    def __call__(self, environ, start_response) -> Iterable[bytes]:
        api_key = environ.get("HTTP_X_API_KEY", "").strip()
        if not api_key:
            return _json(
                start_response,
                "401 Unauthorized",
                {"error": "missing X-API-Key header"},
                [("WWW-Authenticate", 'ApiKey header="X-API-Key"')],
            )
        try:
            decision = self.check(api_key)
        except (redis.RedisError, ValueError) as e:
            log.warning("rate limiter unavailable: %s", e)
            if self.fail_open:
                return self.app(environ, start_response)
            return _json(start_response, "503 Service Unavailable", {"error": "rate limiter unavailable"})

        headers = rate_limit_headers(decision)
        if not decision.admitted:
            body = {"error": "rate limit exceeded", "retry_after_ms": decision.retry_after_ms}
            return _json(start_response, "429 Too Many Requests", body, headers)

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, list(response_headers) + headers, exc_info)

        return self.app(environ, start_with_headers)


def hello_app(environ, start_response) -> List[bytes]:
    """The protected application: echoes the path."""
    return _json(start_response, "200 OK", {"ok": True, "path": environ.get("PATH_INFO", "/")})


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (stdlib signature)
        if log.isEnabledFor(logging.DEBUG):
            super().log_message(format, *args)


def build_app(args) -> Callable:
    client = redis.Redis.from_url(
        args.redis, socket_timeout=args.redis_timeout, socket_connect_timeout=args.redis_timeout
    )
    return TokenBucketMiddleware(
        hello_app, client, args.limit, args.period, args.burst, fail_open=args.fail_open
    )


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="redis URL")
    p.add_argument("--redis-timeout", type=float, default=1.0, help="seconds")
    p.add_argument("--limit", type=int, default=10, help="tokens per period")
    p.add_argument("--period", default="1s", help="e.g. 1s, 500ms, 1m")
    p.add_argument("--burst", type=int, default=20, help="bucket size")
    p.add_argument("--fail-open", action="store_true", help="let requests through when Redis fails")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr)

    httpd = make_server(args.host, args.port, build_app(args), ThreadingWSGIServer, QuietHandler)
    print(f"listening on http://{args.host}:{httpd.server_port}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


if __name__ == "__main__":
    main()
