"""The Python client against a real Spillway (started by tests/it/clients.rs): failure modes,
the denial cache, leases, reserve-then-report, the ASGI middleware and the FastAPI
dependency; caller limits, batches, peeks, the admin helpers, the bounded wait, the circuit
breaker, errors that name their cause, and the in-memory fake. Prints one line per part; any
failure is an exception (exit status 1)."""

import asyncio
import logging
import os
import socket
import threading
import time

import httpx
from fastapi import Depends, FastAPI

from spillway import Admin, FailMode, Refused, Spillway, SpillwayError
from spillway.asgi import SpillwayMiddleware, header
from spillway.fastapi import install, rate_limit
from spillway.testing import FakeSpillway

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
        "py-tokens": {
            "rules": [
                hourly(1000),
                {"name": "one-at-a-time", "algorithm": "concurrency", "limit": 1, "lease_ms": 60000},
            ]
        },
        "py-shadow": {"mode": "shadow", "rules": [hourly(100)]},
        "py-strict": {"rules": [hourly(5, dimensions=["user"])]},
        "py-lenient": {"strict": False, "rules": [hourly(5, dimensions=["user"])]},
        "py-asgi": {
            "rules": [hourly(2), {"name": "in-flight", "algorithm": "concurrency", "limit": 5, "lease_ms": 30000}]
        },
        "py-fastapi": {"rules": [hourly(1)]},
        "py-slow": {"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}]},
        "py-budget": {
            "rules": [hourly(1000), {"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 1000}]
        },
        "py-limits": {"rules": [hourly(2, caller_max={"limit": 1000})]},
        "py-batch": {"rules": [hourly(1)]},
        "py-many": {"rules": [hourly(1)]},
        "py-peek": {"rules": [hourly(3)]},
        "py-admin": {"rules": [hourly(1)]},
        "py-wait-long": {
            "rules": [{"name": "sliding", "algorithm": "sliding_window", "limit": 1, "window_ms": 3600000}]
        },
        "py-wait": {"rules": [{"name": "second", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]},
        "py-wait-lease": {"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 30000}]},
        "py-export": {"rules": [{"name": "one", "algorithm": "concurrency", "limit": 1, "lease_ms": 30000}]},
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

    limited = SpillwayMiddleware(
        app, client=spillway, policy="py-asgi", identify=lambda scope: {"user": header(scope, "x-user")}
    )
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

    slow = SpillwayMiddleware(
        slow_app, client=spillway, policy="py-slow", identify=lambda scope: {"user": header(scope, "x-user")}
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=slow), base_url="http://service", timeout=10
    ) as http:
        first = asyncio.ensure_future(http.get("/slow", headers={"x-user": "sam"}))
        await asyncio.sleep(1.5)
        second = await http.get("/slow", headers={"x-user": "sam"})
        assert second.status_code == 429, "the slow request's lease ran out"
        assert (await first).status_code == 200
    # A caller that goes away does not free the slot while the app still works: the export
    # below hears http.disconnect at once, keeps working 2.5 s, and holds the one slot until
    # it is done.
    exporting = []

    async def export_app(scope, receive, send):
        exporting.append(await receive())
        await asyncio.sleep(2.5)
        await app(scope, receive, send)

    export = SpillwayMiddleware(
        export_app, client=spillway, policy="py-export", identify=lambda scope: {"user": header(scope, "x-user")}
    )
    scope = {"type": "http", "method": "GET", "path": "/export", "headers": [(b"x-user", b"eve")], "query_string": b""}

    async def gone():
        return {"type": "http.disconnect"}

    async def nowhere(message):
        pass

    running = asyncio.ensure_future(export(scope, gone, nowhere))
    await asyncio.sleep(1.0)
    assert exporting == [{"type": "http.disconnect"}], exporting
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=export), base_url="http://service") as http:
        r = await http.get("/export", headers={"x-user": "eve"})
        assert r.status_code == 429, "a disconnect freed the slot of work still running"
    await running
    assert await remaining(admin, "py-export", "eve", "one") == 1, "the export's lease was not released when it ended"
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


def closed_port_url():
    """A URL nothing listens on (a port bound, then let go)."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{free.getsockname()[1]}"
    free.close()
    return url


async def caller_limits():
    ada = {"user": "ada"}
    plan = {"hourly": {"limit": 5}}
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        for _ in range(5):
            d = await spillway.check("py-limits", ada, 1, limits=plan)
            assert d.allowed and d.answer["limit"] == 5, d
        # The headers describe the limit applied.
        assert "q=5" in dict(d.headers)["ratelimit-policy"], d.headers
        denied = await spillway.check("py-limits", ada, limits=plan)
        assert denied.outcome == "limited" and denied.answer["limit"] == 5, denied
        # Each set of numbers is a counter of its own, and so is its remembered denial: the
        # rule's own numbers still let ada through.
        own = await spillway.check("py-limits", ada)
        assert own.allowed and not own.from_cache and own.answer["limit"] == 2, own
        assert (await spillway.check("py-limits", ada, limits=plan)).from_cache
        bigger = await spillway.check("py-limits", ada, limits={"hourly": {"limit": 10}})
        assert bigger.allowed and bigger.answer["remaining"] == 9, bigger
        # Over the rule's caller_max: a configuration error naming the field.
        over = await spillway.check("py-limits", ada, limits={"hourly": {"limit": 5000}})
        assert over.outcome == "misconfigured" and over.status == 400 and "limits.hourly.limit" in over.detail, over
    print("caller limits: ok")


async def batch():
    ada, bob = {"user": "ada"}, {"user": "bob"}
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        decisions = await spillway.check_batch(
            [
                {"policy": "py-batch", "identifiers": ada},
                {"policy": "py-batch", "identifiers": bob, "cost": 1},
                {"policy": "py-batch", "identifiers": ada},  # ada's second of 1 an hour
                {"policy": "py-missing", "identifiers": ada},
                {"policy": "py-batch", "identifiers": {"user": "cy"}, "cost": 5},
                {"policy": "py-limits", "identifiers": {"user": "dee"}, "limits": {"hourly": {"limit": 3}}},
            ]
        )
        outcomes = [d.outcome for d in decisions]
        assert outcomes == ["allowed", "allowed", "limited", "misconfigured", "too_costly", "allowed"], decisions
        denied, missing, costly, planned = decisions[2], decisions[3], decisions[4], decisions[5]
        assert 1 <= denied.retry_after_secs <= 3600 and dict(denied.headers)["retry-after"] == str(
            denied.retry_after_secs
        )
        assert not denied.allowed and not missing.allowed and missing.status == 404 and "py-missing" in missing.detail
        assert costly.status == 422 and "hourly" in costly.detail, costly
        assert planned.answer["limit"] == 3 and planned.answer["remaining"] == 2, planned
        # The denial is remembered: neither a batch nor a check sends it again.
        calls = await denied_count("py-batch")
        assert (await spillway.check_batch([{"policy": "py-batch", "identifiers": ada}]))[0].from_cache
        assert (await spillway.check("py-batch", ada)).from_cache
        assert await denied_count("py-batch") == calls
        # More than a batch call takes (100): sent in parts, answered in order.
        many = await spillway.check_batch([{"policy": "py-many", "identifiers": {"user": f"u{i}"}} for i in range(150)])
        assert [d.answer["results"][0]["identifier"] for d in many] == [f"user=u{i}" for i in range(150)]
        assert all(d.allowed for d in many)
        assert await spillway.check_batch([]) == []
    # The failure modes apply to each check: nothing listening, and a wrong key.
    down_url = closed_port_url()
    for mode, goes_on in ((OPEN, True), (CLOSED, False)):
        async with Spillway(down_url, KEY, on_unavailable=mode, on_misconfigured=CLOSED, timeout=TIMEOUT) as down:
            ds = await down.check_batch(
                [{"policy": "py-batch", "identifiers": ada}, {"policy": "py-many", "identifiers": bob}]
            )
            assert [(d.outcome, d.allowed) for d in ds] == [("unavailable", goes_on)] * 2, ds
        async with Spillway(
            URL, "spw_svc_wrong", on_unavailable=CLOSED, on_misconfigured=mode, timeout=TIMEOUT
        ) as wrong:
            ds = await wrong.check_batch(
                [{"policy": "py-batch", "identifiers": ada}, {"policy": "py-many", "identifiers": bob}]
            )
            assert [(d.outcome, d.status, d.allowed) for d in ds] == [("misconfigured", 401, goes_on)] * 2, ds
    print("batch: ok")


async def peek(admin):
    ada = {"user": "ada"}
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        for _ in range(3):
            p = await spillway.peek("py-peek", ada)
            assert p.allowed and p.answer["remaining"] == 3, p
        assert (await spillway.check("py-peek", ada, 2)).allowed
        assert (await spillway.peek("py-peek", ada)).answer["remaining"] == 1
        assert await remaining(admin, "py-peek", "ada", "hourly") == 1
        # A peek holds no lease.
        p = await spillway.peek("py-wait-lease", ada)
        assert p.allowed and p.leases == [], p
        held = await spillway.check("py-wait-lease", ada)
        assert held.allowed and len(held.leases) == 1, held
        await spillway.release(held.leases)
    print("peek: ok")


async def admin_helpers():
    ada, vip = {"user": "ada"}, {"user": "vip"}
    async with (
        Admin(URL, os.environ["SPILLWAY_ADMIN_KEY"], timeout=TIMEOUT) as admin,
        Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway,
    ):
        assert (await spillway.check("py-admin", ada)).allowed
        assert not (await spillway.check("py-admin", ada)).allowed
        done = await admin.reset("user", "ada", policy="py-admin", reason="the Python client's test")
        assert done["identifier"] == "user=ada" and done["policies"] == ["py-admin"], done
        assert done["deleted_keys"] >= 1 and done["undo"]["token"], done
        assert (await spillway.peek("py-admin", ada)).answer["remaining"] == 1
        # Only that policy: ada's other counters are as they were.
        assert await remaining(admin_http(), "py-cache", "ada", "hourly") == 0
        await admin.undo_reset(done["undo"]["token"])
        assert (await spillway.peek("py-admin", ada)).answer["remaining"] == 0
        # A value with a slash and a space is one path segment.
        assert (await spillway.check("py-admin", {"user": "a/b c"})).allowed
        odd = await admin.reset("user", "a/b c", reason="a value with a slash")
        assert odd["identifier"] == "user=a/b c" and "py-admin" in odd["policies"], odd
        # Overrides: added, in force at once, removed by their match.
        added = await admin.add_override("py-admin", "user=vip", "unlimited", reason="a partner")
        assert [o["match"] for o in added["overrides"]] == ["user=vip"], added
        for _ in range(3):
            assert (await spillway.check("py-admin", vip)).allowed
        removed = await admin.remove_override("py-admin", "user=vip")
        assert removed["overrides"] == [] and await admin.overrides("py-admin") == []
        assert (await spillway.check("py-admin", vip)).allowed
        assert not (await spillway.check("py-admin", vip)).allowed
        # Refusals raise, naming the call and Spillway's reason.
        for call, status, words in (
            (admin.remove_override("py-admin", 0), 404, "overrides/0"),
            (admin.remove_override("py-admin", "user=nobody"), 404, "user=nobody"),
            (admin.reset("user", "ada", policy="py-missing", reason="no such policy"), 404, "py-missing"),
        ):
            try:
                await call
                raise AssertionError(f"{words}: not refused")
            except SpillwayError as e:
                assert e.status == status and words in str(e), (e, e.status)
    async with Admin(URL, KEY, timeout=TIMEOUT) as not_admin:
        try:
            await not_admin.reset("user", "ada", reason="with a service key")
            raise AssertionError("a service key reset an identifier")
        except SpillwayError as e:
            assert e.status in (401, 403) and "DELETE" in str(e) and e.problem["status"] == e.status, e
    print("admin reset and overrides: ok")


def admin_http():
    return httpx.AsyncClient(base_url=URL, headers=ADMIN)


async def waiting():
    ada = {"user": "ada"}
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        # Denied for up to an hour (a sliding window: no clock-aligned window ends meanwhile):
        # a wait of at most 1 s returns the denial within it (the outer bound turns a wait past
        # it into a failure).
        assert (await spillway.check("py-wait-long", ada)).allowed
        started = time.monotonic()
        d = await asyncio.wait_for(spillway.wait_until_allowed("py-wait-long", ada, max_wait=1.0), 30)
        waited = time.monotonic() - started
        assert d.outcome == "limited" and d.retry_after > 1, d
        assert waited < 1.0 + 5, f"waited {waited:.1f} s past a max_wait of 1 s"
        # A denial of a 1 s window is waited out.
        await spillway.check("py-wait", ada)
        d = await asyncio.wait_for(spillway.wait_until_allowed("py-wait", ada, max_wait=20), 30)
        assert d.allowed, d
        # A concurrency rule's slot may free at any moment: waited for in hints of at most 1 s.
        other = Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT)
        held = await other.check("py-wait-lease", ada)
        assert held.allowed, held
        short = await asyncio.wait_for(spillway.wait_until_allowed("py-wait-lease", ada, max_wait=0.3), 30)
        assert short.outcome == "limited", short

        async def release_soon():
            await asyncio.sleep(0.5)
            await other.release(held.leases)

        freeing = asyncio.ensure_future(release_soon())
        d = await asyncio.wait_for(spillway.wait_until_allowed("py-wait-lease", ada, max_wait=20), 30)
        await freeing
        assert d.allowed, d
        await spillway.release(d.leases)
        await other.aclose()
        # An unavailable check is answered as it came, with no wait.
    async with Spillway(closed_port_url(), KEY, on_unavailable=OPEN, on_misconfigured=CLOSED, timeout=TIMEOUT) as down:
        d = await asyncio.wait_for(down.wait_until_allowed("py-wait", ada, max_wait=60), 30)
        assert d.outcome == "unavailable" and d.allowed, d
    print("wait until allowed: ok")


class HungServer:
    """A socket server that accepts connections and answers nothing, until ``answer`` is set
    (then it answers each request a 200 allowed check). It records each connection's peer port
    in the order accepted, and counts the requests it answered."""

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.peers = []
        self.answer = False
        self.answered = 0
        self._markers = set()
        self._held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, (_, port) = self._sock.accept()
            except OSError:
                return
            self.peers.append(port)
            if self.answer and port not in self._markers:
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()
            else:
                self._held.append(conn)

    def _answer(self, conn):
        body = b'{"allowed": true, "policy": "py-hung", "degraded": false, "unmatched": false, "results": []}'
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(data) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                data = data[length:]
                self.answered += 1
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )

    async def reached(self):
        """How many connections the clients made so far: a connection of our own, made now,
        is accepted after every earlier one (the listen queue is in order), so once it is
        seen, every earlier one is counted."""
        marker = socket.create_connection(self._sock.getsockname())
        port = marker.getsockname()[1]
        self._markers.add(port)
        deadline = time.monotonic() + 30
        while port not in self.peers:
            assert time.monotonic() < deadline, "the hung server accepted nothing for 30 s"
            await asyncio.sleep(0.01)
        marker.close()
        before = self.peers[: self.peers.index(port)]
        return sum(1 for p in before if p not in self._markers)

    def close(self):
        self._sock.close()
        for conn in self._held:
            conn.close()


async def circuit_breaker():
    ada = {"user": "ada"}
    hung = HungServer()
    period = 2.0
    spillway = Spillway(
        hung.url,
        KEY,
        on_unavailable=OPEN,
        on_misconfigured=CLOSED,
        timeout=0.1,
        breaker_failures=3,
        breaker_period=period,
    )
    # Three timeouts in a row: each a call to the hung server.
    for _ in range(3):
        d = await spillway.check("py-hung", ada)
        assert d.outcome == "unavailable" and d.allowed and not d.from_breaker and "timed out" in d.detail, d
    # Each connected (a call the timeout cut before its connection, on a machine stalled for
    # 100 ms, would not have: the count is an upper bound, the decisions say the rest).
    failed = await hung.reached()
    assert 1 <= failed <= 3, failed
    # Open: answered at once as the failure mode says, saying why, and nothing is sent.
    for _ in range(20):
        d = await spillway.check("py-hung", ada)
        assert d.outcome == "unavailable" and d.allowed and d.from_breaker, d
        assert "circuit breaker open after 3 failures" in d.detail and "timed out after 0.1 s" in d.detail, d.detail
    try:
        await spillway.report("py-hung", ada, 1)
        raise AssertionError("a report went through an open breaker")
    except SpillwayError as e:
        assert "circuit breaker open" in str(e), e
    closed_mode = Spillway(
        hung.url, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=0.1, breaker_failures=1
    )
    d = await closed_mode.check("py-hung", ada)
    assert not d.from_breaker and not d.allowed, d
    d = await closed_mode.check("py-hung", ada)
    assert d.from_breaker and not d.allowed and d.problem()[0] == 503, d
    await closed_mode.aclose()
    assert await hung.reached() == failed + 1, "an open breaker let a call through"
    failed += 1
    # The period over: one trial call, the others answered by the breaker meanwhile.
    await asyncio.sleep(period + 0.2)
    tried = await asyncio.gather(*(spillway.check("py-hung", ada) for _ in range(5)))
    assert sum(1 for d in tried if not d.from_breaker) == 1, tried
    assert all(d.outcome == "unavailable" and d.allowed for d in tried), tried
    assert any("a trial call is under way" in (d.detail or "") for d in tried), tried
    trial = await hung.reached() - failed
    assert trial <= 1, f"{trial} calls reached the hung server during the trial"
    failed += trial
    # The trial failed: open again for a period.
    d = await spillway.check("py-hung", ada)
    assert d.from_breaker and "not calling Spillway for another" in d.detail, d
    assert await hung.reached() == failed
    # Spillway answers again: the next trial succeeds and closes the breaker.
    hung.answer = True
    await asyncio.sleep(period + 0.2)
    d = await spillway.check("py-hung", ada)
    assert d.outcome == "allowed" and not d.from_breaker, d
    for _ in range(3):
        assert (await spillway.check("py-hung", ada)).outcome == "allowed"
    assert hung.answered == 4, hung.answered
    # Off: every call is made.
    off = Spillway(hung.url, KEY, on_unavailable=OPEN, on_misconfigured=CLOSED, timeout=0.1, breaker_failures=None)
    hung.answer = False
    for _ in range(4):
        d = await off.check("py-hung", ada)
        assert d.outcome == "unavailable" and not d.from_breaker, d
    await off.aclose()
    await spillway.aclose()
    hung.close()
    print("circuit breaker: ok")


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


async def error_causes():
    ada = {"user": "ada"}
    lines = Lines()
    logging.getLogger("spillway").addHandler(lines)
    down = closed_port_url()
    async with Spillway(
        down, KEY, on_unavailable=OPEN, on_misconfigured=CLOSED, timeout=TIMEOUT, breaker_failures=None
    ) as spillway:
        d = await spillway.check("py-cause", ada)
        refused = f"ConnectError: [Errno 111] Connection refused calling {down}/api/v1/check"
        assert d.outcome == "unavailable" and d.detail == refused, d.detail
        try:
            await spillway.report("py-cause", ada, 1)
            raise AssertionError("a report to nothing succeeded")
        except SpillwayError as e:
            assert (
                str(e)
                == f"Spillway is unavailable: ConnectError: [Errno 111] Connection refused calling {down}/api/v1/report"
            ), e
            assert e.status is None
    hung = HungServer()
    async with Spillway(
        hung.url, KEY, on_unavailable=OPEN, on_misconfigured=CLOSED, timeout=0.1, breaker_failures=None
    ) as spillway:
        d = await spillway.check("py-cause", ada)
        timed_out = f"timed out after 0.1 s calling {hung.url}/api/v1/check"
        assert d.detail == timed_out, d.detail
        try:
            await spillway.release(["a-lease"])
            raise AssertionError("a release to a hung server succeeded")
        except SpillwayError as e:
            assert f"timed out after 0.1 s calling {hung.url}/api/v1/leases/release" in str(e), e
    hung.close()
    # A refusal names the call and Spillway's reason.
    async with Spillway(URL, KEY, on_unavailable=CLOSED, on_misconfigured=CLOSED, timeout=TIMEOUT) as spillway:
        try:
            await spillway.report("py-missing", ada, 1)
            raise AssertionError("a report of no policy succeeded")
        except SpillwayError as e:
            assert e.status == 404 and f"POST {URL}/api/v1/report (404)" in str(e) and "py-missing" in str(e), e
            assert e.problem["type"].endswith("unknown-policy"), e.problem
    logging.getLogger("spillway").removeHandler(lines)
    # The warning lines say the same.
    assert any(refused in line for line in lines.lines), lines.lines
    assert any(timed_out in line for line in lines.lines), lines.lines
    print("error causes: ok")


async def fake_under_middleware():
    fake = FakeSpillway({"py-fake": {"limit": 2, "window": 60, "concurrency": 5}}, on_unavailable=CLOSED)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"done"})

    limited = SpillwayMiddleware(
        app, client=fake, policy="py-fake", identify=lambda scope: {"user": header(scope, "x-user")}
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limited), base_url="http://service") as http:

        async def get(who=None):
            return await http.get("/work", headers={"x-user": who} if who else {})

        for _ in range(2):
            r = await get("ada")
            assert r.status_code == 200 and r.text == "done", r
            assert (
                '"window";q=2;w=60' in r.headers["ratelimit-policy"] and "in-flight" in r.headers["ratelimit-policy"]
            ), r.headers
            assert "ratelimit" in r.headers
        r = await get("ada")
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json", r
        assert 1 <= int(r.headers["retry-after"]) <= 60 and r.json()["retry_after"] == int(r.headers["retry-after"])
        # Each allowed request's lease was released when it was answered.
        assert fake.in_flight("py-fake", {"user": "ada"}) == 0
        assert sum(1 for c in fake.calls if c.method == "release") == 2
        # Told to deny, once.
        fake.deny("py-fake", retry_after=30, times=1)
        r = await get("bob")
        assert r.status_code == 429 and r.headers["retry-after"] == "30", r.headers
        assert (await get("bob")).status_code == 200
        # Told Spillway is unavailable: the failure mode answers.
        fake.unavailable()
        assert (await get("cy")).status_code == 503
        fake.restore()
        assert (await get("cy")).status_code == 200
        assert (await get()).status_code == 200  # no identifiers: unchecked
        # The window ends.
        fake.advance(61)
        assert (await get("ada")).status_code == 200
    assert [c.identifiers["user"] for c in fake.checks("py-fake")] == ["ada"] * 3 + ["bob"] * 2 + ["cy"] * 2 + ["ada"]
    # The rest of the interface behaves as the client's.
    ada = {"user": "ada"}
    assert (await fake.peek("py-fake", ada)).answer["remaining"] == 1
    batch = await fake.check_batch(
        [
            {"policy": "py-fake", "identifiers": ada},
            {"policy": "py-fake", "identifiers": ada},
            {"policy": "nope", "identifiers": ada},
        ]
    )
    assert [d.outcome for d in batch] == ["allowed", "limited", "misconfigured"], batch
    await fake.release(batch[0].leases)
    planned = await fake.check("py-fake", ada, limits={"window": {"limit": 10}})
    window = [x for x in planned.answer["results"] if x["rule"] == "window"][0]
    assert planned.allowed and window["limit"] == 10 and window["identifier"] == "user=ada", planned
    await fake.release(planned.leases)
    fake.advance(61)
    async with fake.reserve("py-fake", ada, 2) as r:
        assert fake.in_flight("py-fake", ada) == 1
        r.used(1)
    assert [(c.method, c.cost) for c in fake.calls[-2:]] == [("release", None), ("report", -1)], fake.calls[-2:]
    assert fake.in_flight("py-fake", ada) == 0
    async with fake.lease("py-fake", ada) as d:
        assert d.allowed and len(d.leases) == 1
    fake.deny("py-fake", retry_after=0.2, times=1)
    d = await asyncio.wait_for(fake.wait_until_allowed("py-fake", {"user": "dee"}, max_wait=10), 30)
    assert d.allowed and len(fake.checks()) and fake.checks()[-2].identifiers == {"user": "dee"}, d
    await fake.release(d.leases)
    # And the FastAPI dependency takes it too.
    api = FastAPI()
    install(api)

    @api.get(
        "/work",
        dependencies=[Depends(rate_limit(fake, "py-fake", lambda request: {"user": request.headers.get("x-user")}))],
    )
    async def work():
        return {"done": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://service") as http:
        assert (await http.get("/work", headers={"x-user": "eve"})).status_code == 200
        assert (await http.get("/work", headers={"x-user": "eve"})).status_code == 200
        assert (await http.get("/work", headers={"x-user": "eve"})).status_code == 429
    print("fake under the ASGI middleware: ok")


async def main():
    async with httpx.AsyncClient(base_url=URL, headers=ADMIN) as admin:
        await setup(admin)
        await the_denial_cache()
        await leases()
        await reserve(admin)
        await failure_modes()
        await asgi_middleware(admin)
        await fastapi_dependency()
        await caller_limits()
        await batch()
        await peek(admin)
        await admin_helpers()
        await waiting()
        await circuit_breaker()
        await error_causes()
        await fake_under_middleware()


asyncio.run(main())
