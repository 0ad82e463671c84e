"""A FastAPI dependency: rate limit one route (or a router) rather than the whole app.

    from spillway.fastapi import rate_limit, install
    install(app)  # renders refusals as RFC 9457 problems
    limited = rate_limit(spillway, "api", lambda request: {"user": request.headers.get("x-user")})

    @app.get("/work", dependencies=[Depends(limited)])
    async def work(): ...

An allowed request's response carries ``RateLimit-Policy`` and ``RateLimit`` (when the route
returns a Response of its own, FastAPI does not merge them: use the ASGI middleware); the
leases of a ``concurrency`` rule are released once the route is done, however it ends.
"""

from __future__ import annotations

import inspect
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from .asgi import present
from .client import Decision, Refused, SpillwayClient


def install(app: FastAPI) -> None:
    """Answers the dependency's refusals (``Refused``) with an RFC 9457 problem and the
    rate-limit headers."""

    async def refused(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Refused)
        return problem_response(exc.decision)

    app.add_exception_handler(Refused, refused)


def problem_response(decision: Decision) -> JSONResponse:
    status, problem = decision.problem()
    response = JSONResponse(problem, status_code=status, media_type="application/problem+json")
    for name, value in decision.response_headers():
        if name != "content-type":
            response.headers.append(name, value)
    return response


def rate_limit(
    client: SpillwayClient,
    policy: str,
    identify: Callable[[Request], Any],
    cost: Optional[Callable[[Request], int]] = None,
) -> Callable[..., AsyncIterator[Decision]]:
    """A dependency checking ``policy`` for the identifiers ``identify`` names (None: the
    request goes on unchecked). It yields the Decision, so a route may read it. ``client`` is
    a ``Spillway`` or a ``spillway.testing.FakeSpillway``."""

    async def dependency(request: Request, response: Response) -> AsyncIterator[Optional[Decision]]:
        identifiers = identify(request)
        if inspect.isawaitable(identifiers):
            identifiers = await identifiers
        identifiers = present(identifiers)
        if not identifiers:
            yield None
            return
        decision = await client.check(policy, identifiers, cost(request) if cost else 1)
        if not decision.allowed:
            raise Refused(decision)
        for name, value in decision.headers:
            response.headers.append(name, value)
        held = client.hold(decision)
        try:
            yield decision
        finally:
            await held.close()

    return dependency
