"""ASGI middleware: checks each HTTP request before the app sees it (Starlette, FastAPI,
Django's ASGI, any ASGI app).

    app.add_middleware(SpillwayMiddleware, client=spillway, policy="api",
                       identify=lambda scope: {"user": header(scope, "x-user")})

``client`` is a ``Spillway``, or a ``spillway.testing.FakeSpillway`` in a service's tests.

An allowed request goes on and its response carries ``RateLimit-Policy`` and ``RateLimit``;
the leases of a ``concurrency`` rule are released when the app is done with the request,
however it ends. A refused one is answered by the middleware with an RFC 9457 problem
(429 with ``Retry-After``, 422, or 503 for a check failing closed).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Awaitable, Callable, Mapping, Optional, Union

from .client import SpillwayClient

Identify = Callable[[dict], Union[Optional[Mapping[str, str]], Awaitable[Optional[Mapping[str, str]]]]]


def header(scope: dict, name: str) -> Optional[str]:
    """A request header of an ASGI scope (the first, decoded as Latin-1), or None."""
    wanted = name.lower().encode("latin-1")
    for key, value in scope.get("headers") or []:
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


def present(named: Optional[Mapping[str, Optional[str]]]) -> dict:
    """The identifiers that have a value (not None, not empty)."""
    return {k: v for k, v in (named or {}).items() if v}


class SpillwayMiddleware:
    def __init__(
        self,
        app: Any,
        client: SpillwayClient,
        policy: str,
        identify: Identify,
        cost: Optional[Callable[[dict], int]] = None,
    ):
        self.app = app
        self.client = client
        self.policy = policy
        self.identify = identify
        self.cost = cost

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        identifiers = self.identify(scope)
        if inspect.isawaitable(identifiers):
            identifiers = await identifiers
        # A dimension without a value is left out (an anonymous caller is still limited by
        # the others); a request with none goes on unchecked.
        identifiers = present(identifiers)
        if not identifiers:
            await self.app(scope, receive, send)
            return
        cost = self.cost(scope) if self.cost else 1
        decision = await self.client.check(self.policy, identifiers, cost)
        if not decision.allowed:
            status, problem = decision.problem()
            body = json.dumps(problem).encode()
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in decision.response_headers()]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in decision.headers]

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start" and extra:
                message = dict(message)
                message["headers"] = list(message.get("headers") or []) + extra
            await send(message)

        # Renewed while the app answers; released when it is done, however it ends.
        held = self.client.hold(decision)
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            await held.close()
