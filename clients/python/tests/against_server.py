"""The Python client against a real Spillway (started by tests/it/clients.rs): failure modes,
the denial cache, leases, reserve-then-report, the ASGI middleware and the FastAPI
dependency. Prints one line per part; any failure is an exception (exit status 1)."""

import asyncio
import os
import socket
import time

import httpx
from fastapi import Depends, FastAPI

from spillway import FailMode, Refused, Spillway
from spillway.asgi import SpillwayMiddleware, header
from spillway.fastapi import install, rate_limit

URL = os.environ["SPILLWAY_URL"]
ADMIN = {"authorization": f"Bearer {os.environ['SPILLWAY_ADMIN_KEY']}"}
KEY = os.environ["SPILLWAY_SERVICE_KEY"]
OPEN, CLOSED = FailMode.OPEN, FailMode.CLOSED
# The server under test is a debug build on a machine shared with other tests: a timeout that
# fits it, except where the timeout itself is tested (the client's default is 100 ms).
TIMEOUT = 5.0


def hourly(limit, **more):
    return {"name": "hourly", "algorithm": "fixed_window", "limit": limit, "window_ms": 3600000, **more}


async def setup(admin):
    policies = {
        "py-cache": {"rules": [hourly(2)]},
        "py-lease": {"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 2000}]},
        "py-tokens": {"rules": [hourly(1000), {"name": "one-at-a-time", "algorithm": "concurrency", "limit": 1, "lease_ms": 60000}]},
        "py-shadow": {"mode": "shadow", "rules": [hourly(100)]},
        "py-strict": {"rules": [hourly(5, dimensions=["user"])]},
        "py-lenient": {"strict": False, "rules": [hourly(5, dimensions=["user"])]},
        "py-asgi": {"rules": [hourly(2), {"name": "in-flight", "algorithm": "concurrency", "limit": 5, "lease_ms": 30000}]},
        "py-fastapi": {"rules": [hourly(1)]},
        "py-slow": {"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}]},
        "py-budget": {"rules": [hourly(1000), {"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}]},
    }
    for name, doc in policies.items():
        r = await admin.put(f"/api/v1/policies/{name}", json=doc)
        assert r.status_code in (200, 201), r.text


async def remaining(admin, policy, user, rule):
    state = (await admin.get(f"/api/v1/identifiers/user/{user}")).json()
    for p in state["policies"]:
        for r in p["rules"]:
            if p["policy"] == policy and r["rule"] == rule:
                return r["remaining"]
    raise AssertionError(f"no {policy}/{rule} for {user}: {state}")


async def denied_count(policy):
    text = (await httpx.AsyncClient().get(f"{URL}/metrics")).text
    for line in text.splitlines():
        if line.startswith("spillway_checks_total") and f'policy="{policy}"' in line and 'outcome="denied"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def the_denial_cache():
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        first = await spillway.check("py-cache", {"user": "ada"})
        assert first.allowed and first.outcome == "allowed" and not first.unmatched
        names = [k for k, _ in first.headers]
        assert "ratelimit-policy" in names and "ratelimit" in names and "retry-after" not in names, names
        await spillway.check("py-cache", {"user": "ada"})
        denied = await spillway.check("py-cache", {"user": "ada"})
        assert not denied.allowed and denied.outcome == "limited" and not denied.from_cache
        retry = dict(denied.headers)["retry-after"]
        assert int(retry) == denied.retry_after_secs and 1 <= int(retry) <= 3600, (retry, denied)
        status, problem = denied.problem()
        assert status == 429 and problem["title"] == "Too Many Requests" and problem["retry_after"] == int(retry)
        assert await denied_count("py-cache") == 1
        again = await spillway.check("py-cache", {"user": "ada"})
        assert again.from_cache and not again.allowed and "retry-after" in dict(again.headers)
        assert await denied_count("py-cache") == 1, "a remembered denial still called"
        assert (await spillway.check("py-cache", {"user": "bob"})).allowed
    print("denial cache: ok")


async def leases():
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        other = Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT)
        denied = allowed = 0
        async with spillway.lease("py-lease", {"user": "ada"}) as decision:
            assert len(decision.leases) == 1
            started = time.monotonic()
            while time.monotonic() - started < 5:
                d = await other.check("py-lease", {"user": "ada"})
                assert not d.from_cache, "a concurrency denial was cached"
                if d.allowed:
                    allowed += 1
                    await other.release(d.leases)
                else:
                    assert d.retry_after_secs == 1, d
                    denied += 1
                await asyncio.sleep(0.1)
        # Renewed past its 2 s while held; released when the block ended.
        assert allowed == 0 and denied >= 3, (allowed, denied)
        after = await other.check("py-lease", {"user": "ada"})
        assert after.allowed, after
        await other.release(after.leases)
        # A block that raises still releases.
        try:
            async with spillway.lease("py-lease", {"user": "ada"}):
                raise RuntimeError("the work failed")
        except RuntimeError:
            pass
        freed = await other.check("py-lease", {"user": "ada"})
        assert freed.allowed, freed
        # Held: the next is refused with the decision.
        try:
            async with spillway.lease("py-lease", {"user": "ada"}):
                raise AssertionError("let through past the limit")
        except Refused as refused:
            assert refused.decision.outcome == "limited"
        await other.release(freed.leases)
        await other.aclose()
    print("leases: ok")


async def reserve(admin):
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        async with spillway.reserve("py-tokens", {"user": "ada"}, 300) as r:
            tokens = [x for x in r.decision.answer["results"] if x["rule"] == "hourly"][0]
            assert tokens["remaining"] == 700, r.decision.answer
            r.used(120)
        assert await remaining(admin, "py-tokens", "ada", "hourly") == 880
        try:
            async with spillway.reserve("py-tokens", {"user": "ada"}, 500):
                raise ValueError("upstream failed")
        except ValueError:
            pass
        assert await remaining(admin, "py-tokens", "ada", "hourly") == 880
        # Each reserve released its lease; a shadow-denied check gives nothing back.
        assert await remaining(admin, "py-tokens", "ada", "one-at-a-time") == 1
        assert (await spillway.check("py-shadow", {"user": "ada"}, 60)).allowed
        try:
            async with spillway.reserve("py-shadow", {"user": "ada"}, 50) as r:
                assert r.decision.answer["shadow_denied"] is True
                raise ValueError("upstream failed")
        except ValueError:
            pass
        assert await remaining(admin, "py-shadow", "ada", "hourly") == 40
        too_much = await spillway.check("py-tokens", {"user": "ada"}, 5000)
        assert too_much.outcome == "too_costly" and "hourly" in too_much.detail and too_much.problem()[0] == 422
        # Work that outlasts the lease keeps its slot (renewed): another check at 1.5 s of a
        # 1 s lease is refused; released when the work ends.
        async with spillway.reserve("py-budget", {"user": "ada"}, 10) as r:
            await asyncio.sleep(1.5)
            during = await spillway.check("py-budget", {"user": "ada"})
            await asyncio.sleep(1.0)
            r.used(10)
        assert not during.allowed, "the reservation's lease ran out while its work ran"
        assert [x["rule"] for x in during.answer["results"] if not x["allowed"]] == ["one"], during.answer
        after = await spillway.check("py-budget", {"user": "ada"})
        assert after.allowed, "released when the work ended"
        await spillway.release(after.leases)
    print("reserve then report: ok")


async def failure_modes():
    ip = {"ip": "10.0.0.7"}
    for mode, goes_on in ((OPEN, True), (CLOSED, False)):
        async with Spillway(URL, KEY, on_unavailable=mode, on_misconfigured=mode, timeout=TIMEOUT) as spillway:
            for policy, status in (("py-strict", 400), ("py-missing", 404)):
                d = await spillway.check(policy, ip)
                assert d.outcome == "misconfigured" and d.status == status and d.allowed == goes_on, d
            lenient = await spillway.check("py-lenient", ip)
            assert lenient.allowed and lenient.unmatched
        async with Spillway(URL, "spw_svc_wrong", on_unavailable=mode, on_misconfigured=mode, timeout=TIMEOUT) as wrong:
            d = await wrong.check("py-strict", {"user": "ada"})
            assert d.outcome == "misconfigured" and d.status == 401 and d.allowed == goes_on, d
            if not goes_on:
                assert d.problem()[0] == 503
    # Nothing listening, and a listener that never answers: unavailable within the timeout.
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    closed_url = f"http://127.0.0.1:{free.getsockname()[1]}"
    free.close()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    for url in (closed_url, silent_url):
        for mode, goes_on in ((OPEN, True), (CLOSED, False)):
            async with Spillway(url, KEY, on_unavailable=mode, on_misconfigured=mode, timeout=0.2) as spillway:
                started = time.monotonic()
                d = await spillway.check("py-strict", {"user": "ada"})
                assert d.outcome == "unavailable" and d.allowed == goes_on, d
                assert time.monotonic() - started < 3, "the timeout did not hold"
    silent.close()
    try:
        Spillway(URL, KEY, on_unavailable="open", on_misconfigured=CLOSED)
        raise AssertionError("a failure mode that is not a FailMode was taken")
    except TypeError:
        pass
    print("failure modes: ok")


async def asgi_middleware(admin):
    spillway = Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"done"})

    limited = SpillwayMiddleware(app, client=spillway, policy="py-asgi", identify=lambda scope: {"user": header(scope, "x-user")})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limited), base_url="http://service") as http:
        for _ in range(2):
            r = await http.get("/work", headers={"x-user": "ada"})
            assert r.status_code == 200 and r.text == "done", r
            assert "hourly" in r.headers["ratelimit-policy"] and "ratelimit" in r.headers
        r = await http.get("/work", headers={"x-user": "ada"})
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json", r
        retry = int(r.headers["retry-after"])
        assert r.json()["status"] == 429 and r.json()["retry_after"] == retry
        assert (await http.get("/work")).status_code == 200  # no identifiers: unchecked
    # Every allowed request's lease was released.
    assert await remaining(admin, "py-asgi", "ada", "in-flight") == 5
    # A request longer than its 1 s lease keeps its slot (renewed): another at 1.5 s is refused.

    async def slow_app(scope, receive, send):
        await asyncio.sleep(2.5)
        await app(scope, receive, send)

    slow = SpillwayMiddleware(slow_app, client=spillway, policy="py-slow", identify=lambda scope: {"user": header(scope, "x-user")})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=slow), base_url="http://service", timeout=10) as http:
        first = asyncio.ensure_future(http.get("/slow", headers={"x-user": "sam"}))
        await asyncio.sleep(1.5)
        second = await http.get("/slow", headers={"x-user": "sam"})
        assert second.status_code == 429, "the slow request's lease ran out"
        assert (await first).status_code == 200
    await spillway.aclose()
    print("ASGI middleware: ok")


async def fastapi_dependency():
    spillway = Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT)
    app = FastAPI()
    install(app)
    limited = rate_limit(spillway, "py-fastapi", lambda request: {"user": request.headers.get("x-user")})

    @app.get("/work", dependencies=[Depends(limited)])
    async def work():
        return {"done": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://service") as http:
        r = await http.get("/work", headers={"x-user": "ada"})
        assert r.status_code == 200 and r.json() == {"done": True}, r.text
        assert "hourly" in r.headers["ratelimit-policy"] and "ratelimit" in r.headers, r.headers
        r = await http.get("/work", headers={"x-user": "ada"})
        assert r.status_code == 429, r.text
        assert r.headers["content-type"] == "application/problem+json", r.headers
        assert r.json()["status"] == 429 and int(r.headers["retry-after"]) == r.json()["retry_after"]
    await spillway.aclose()
    print("FastAPI dependency: ok")


async def main():
    async with httpx.AsyncClient(base_url=URL, headers=ADMIN) as admin:
        await setup(admin)
        await the_denial_cache()
        await leases()
        await reserve(admin)
        await failure_modes()
        await asgi_middleware(admin)
        await fastapi_dependency()


asyncio.run(main())
