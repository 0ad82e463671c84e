"""The client: checks (one, a batch, a peek, a bounded wait) with a timeout, an explicit
failure mode and a circuit breaker, the headers to pass on, an RFC 9457 problem for end users,
a denial cache, leases and reserve-then-report.

``SpillwayClient`` holds what every client does on top of its checks (leases, reserve, peek,
waiting); ``Spillway`` calls a real Spillway, ``spillway.testing.FakeSpillway`` counts in
memory for a service's own tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, List, Mapping, Optional

import httpx

from .breaker import Breaker, BreakerOpen

log = logging.getLogger("spillway")

#: How long a call may take before Spillway counts as unavailable (seconds). Spillway answers
#: from one Redis round trip; keep this well under your own request's budget.
DEFAULT_TIMEOUT = 0.1

_PASSED_ON = ("ratelimit-policy", "ratelimit", "retry-after")
_CACHE_CAPACITY = 10_000
#: A denial is remembered at most this long (seconds): a support reset or a new override
#: then shows soon.
MAX_CACHED = 10.0
#: Most checks in one batch call (the server's limit); longer batches are sent in parts.
MAX_BATCH = 100
#: The circuit breaker's defaults: this many unavailable calls in a row open it, for this long.
DEFAULT_BREAKER_FAILURES = 5
DEFAULT_BREAKER_PERIOD = 5.0


class FailMode(enum.Enum):
    """What a check that could not be decided means for the request."""

    OPEN = "open"  #: let it through (and log): the usual choice for an API
    CLOSED = "closed"  #: refuse it: for a limit guarding money or abuse


class SpillwayError(Exception):
    """A call that is not a check (report, release, renew, the admin helpers) failed. The
    message names the call and the cause; ``status`` and ``problem`` are Spillway's answer
    when it gave one (None for a network error or a timeout)."""

    def __init__(self, message: str, status: Optional[int] = None, problem: Optional[dict] = None):
        super().__init__(message)
        self.status = status
        self.problem = problem


@dataclass
class Decision:
    """What a check decided.

    ``outcome`` is one of ``allowed``, ``limited`` (denied by a limit), ``too_costly`` (a cost
    no rule could ever allow, 422), ``unavailable`` (network error, timeout, 5xx, or the
    circuit breaker open: ``from_breaker``) and ``misconfigured`` (401, 403, 404, 400: a
    configuration error). ``detail`` says why for any but ``allowed`` and ``limited``.
    """

    outcome: str
    allowed: bool
    answer: Optional[dict] = None
    headers: list = field(default_factory=list)
    retry_after: Optional[float] = None
    from_cache: bool = False
    status: Optional[int] = None
    detail: Optional[str] = None
    from_breaker: bool = False

    @property
    def unmatched(self) -> bool:
        """No rule counted the identifiers (a lenient policy let the check through)."""
        return bool(self.answer and self.answer.get("unmatched"))

    @property
    def leases(self) -> list:
        """The leases of the check's ``concurrency`` rules."""
        results = (self.answer or {}).get("results") or []
        return [r["lease"] for r in results if r.get("lease")]

    @property
    def retry_after_secs(self) -> Optional[int]:
        if self.outcome != "limited" or self.retry_after is None:
            return None
        return max(0, math.ceil(self.retry_after - 1e-9))

    def problem(self) -> tuple:
        """The status and RFC 9457 problem to answer an end user who is not let through."""
        if self.outcome == "too_costly":
            status, title = 422, "Unprocessable Content"
            detail = "This request asks for more than the rate limit allows at once."
        elif self.outcome in ("unavailable", "misconfigured"):
            status, title = 503, "Service Unavailable"
            detail = "The request could not be checked against its rate limit; try again shortly."
        else:
            status, title = 429, "Too Many Requests"
            secs = self.retry_after_secs
            detail = (
                f"Too many requests: try again in {secs} s."
                if secs is not None
                else "Too many requests: try again later."
            )
        problem: dict = {"type": "about:blank", "title": title, "status": status, "detail": detail}
        if status == 429 and self.retry_after_secs is not None:
            problem["retry_after"] = self.retry_after_secs
        return status, problem

    def response_headers(self) -> list:
        """Headers for the end user's answer: the rate-limit headers, and for a refusal the
        problem's content type (and ``Retry-After: 1`` for a 503)."""
        headers = list(self.headers)
        if not self.allowed:
            headers.append(("content-type", "application/problem+json"))
            if self.problem()[0] == 503:
                headers.append(("retry-after", "1"))
        return headers


class Refused(Exception):
    """Raised by the helpers when a check does not let the work go on."""

    def __init__(self, decision: Decision):
        super().__init__(decision.outcome)
        self.decision = decision


#: Caller-supplied limits: ``{"<rule>": {"limit": 500}}`` (each at most the rule's ``caller_max``).
Limits = Mapping[str, Mapping[str, int]]


def _cache_key(policy: str, identifiers: Mapping[str, str], cost: int, limits: Optional[Limits] = None) -> tuple:
    # Each set of caller limits is a counter of its own: so is its denial.
    numbers = tuple(sorted((rule, tuple(sorted(n.items()))) for rule, n in (limits or {}).items()))
    return (policy, cost, tuple(sorted(identifiers.items())), numbers)


def _check_body(policy: str, identifiers: Mapping[str, str], cost: int, limits: Optional[Limits]) -> dict:
    body: dict = {"policy": policy, "identifiers": dict(identifiers), "cost": cost}
    if limits:
        body["limits"] = {rule: dict(numbers) for rule, numbers in limits.items()}
    return body


def denied_by_concurrency_only(answer: Optional[dict]) -> bool:
    """Every rule that denied is a ``concurrency`` rule: a release may free a slot at any
    moment, so its Retry-After is only a hint (and such denials are never cached)."""
    denied = [r for r in (answer or {}).get("results") or [] if not r.get("allowed")]
    return bool(denied) and all(r.get("algorithm") == "concurrency" for r in denied)


class SpillwayClient:
    """What every Spillway client offers on top of ``check``, ``report``, ``release`` and
    ``renew``: peeks, batches, a bounded wait, leases and reserve-then-report. ``Spillway``
    and ``spillway.testing.FakeSpillway`` are the two; the middleware takes either."""

    async def check(
        self, policy: str, identifiers: Mapping[str, str], cost: int = 1, limits: Optional[Limits] = None
    ) -> Decision:
        raise NotImplementedError

    async def check_batch(self, checks: Iterable[Mapping[str, Any]]) -> List[Decision]:
        """One Decision per check (``{"policy", "identifiers", "cost", "limits"}``), in order."""
        return [await self.check(c["policy"], c["identifiers"], c.get("cost", 1), c.get("limits")) for c in checks]

    async def report(self, policy: str, identifiers: Mapping[str, str], cost: int) -> None:
        raise NotImplementedError

    async def release(self, leases: list) -> None:
        raise NotImplementedError

    async def renew(self, leases: list) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def peek(self, policy: str, identifiers: Mapping[str, str], limits: Optional[Limits] = None) -> Decision:
        """The identifiers' state under ``policy`` without consuming anything (a check of cost
        0): ``decision.answer["remaining"]`` is what is left of the binding rule."""
        return await self.check(policy, identifiers, 0, limits)

    async def wait_until_allowed(
        self,
        policy: str,
        identifiers: Mapping[str, str],
        cost: int = 1,
        *,
        max_wait: float,
        limits: Optional[Limits] = None,
    ) -> Decision:
        """Checks; while denied by a limit, sleeps the denial's Retry-After and checks again,
        never sleeping past ``max_wait`` seconds from the call. Returns the last Decision:
        allowed, or the denial still standing (at once when its Retry-After ends after the
        deadline: no wait would let it pass, unless only a concurrency rule denied, whose
        slot may free sooner), or an unavailable or misconfigured check as it came."""
        deadline = time.monotonic() + max_wait
        while True:
            decision = await self.check(policy, identifiers, cost, limits)
            if decision.outcome != "limited" or decision.retry_after is None:
                return decision
            left = deadline - time.monotonic()
            # A little past Retry-After, so the denial cache has let go of it by then.
            wait = max(decision.retry_after, 0.0) + 0.01
            if left <= 0 or (wait > left and not denied_by_concurrency_only(decision.answer)):
                return decision
            await asyncio.sleep(min(wait, left))

    @contextlib.asynccontextmanager
    async def lease(self, policy: str, identifiers: Mapping[str, str]) -> AsyncIterator[Decision]:
        """``async with spillway.lease(...) as decision:`` checks (cost 1), raises Refused when
        not allowed, renews the check's leases while the block runs and releases them however
        it ends."""
        decision = await self.check(policy, identifiers, 1)
        if not decision.allowed:
            raise Refused(decision)
        held = self.hold(decision)
        try:
            yield decision
        finally:
            await held.close()

    def hold(self, decision: Decision) -> "HeldLeases":
        """Holds a check's leases while work runs: renews them every third of the shortest time
        one has left until ``await held.close()``, which releases them."""
        return HeldLeases(self, decision)

    async def _keep(self, leases: list, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.renew(leases)
            except SpillwayError as e:
                log.warning("renewing leases failed: %s", e)

    @contextlib.asynccontextmanager
    async def reserve(self, policy: str, identifiers: Mapping[str, str], estimate: int) -> AsyncIterator["Reservation"]:
        """Reserve, then report: ``async with spillway.reserve(..., estimate) as r:`` checks the
        estimate (Refused when not allowed); call ``r.used(n)`` with what the work really used
        and the difference is reported at the end. When the block raises, the whole estimate
        is given back."""
        decision = await self.check(policy, identifiers, estimate)
        if not decision.allowed:
            raise Refused(decision)
        reservation = Reservation(decision, estimate)
        # The check's own leases (a policy with a concurrency rule too) are renewed while the
        # block runs, however long it takes, and released when it ends.
        held = self.hold(decision)
        # Only what Spillway counted is settled: not a check let through open, degraded or
        # shadow-denied (which consumed nothing).
        answer = decision.answer or {}
        counted = decision.answer is not None and not answer.get("degraded") and not answer.get("shadow_denied")
        try:
            yield reservation
        except BaseException:
            if counted:
                await self._settle(policy, identifiers, -estimate)
            raise
        finally:
            await held.close()
        if counted and reservation.actual is not None:
            await self._settle(policy, identifiers, reservation.actual - estimate)

    async def _settle(self, policy: str, identifiers: Mapping[str, str], delta: int) -> None:
        if delta == 0:
            return
        try:
            await self.report(policy, identifiers, delta)
        except SpillwayError as e:
            log.warning("reporting usage of %s failed (%+d): %s", policy, delta, e)


class Spillway(SpillwayClient):
    """A Spillway client. ``on_unavailable`` and ``on_misconfigured`` must be chosen.

    The circuit breaker: after ``breaker_failures`` calls in a row that found Spillway
    unavailable, no call is made for ``breaker_period`` seconds (checks answer
    ``unavailable`` at once, ``from_breaker``); then one trial call, whose success closes it.
    ``breaker_failures=None`` turns it off.
    """

    def __init__(
        self,
        url: str,
        key: str,
        *,
        on_unavailable: FailMode,
        on_misconfigured: FailMode,
        timeout: float = DEFAULT_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        breaker_failures: Optional[int] = DEFAULT_BREAKER_FAILURES,
        breaker_period: float = DEFAULT_BREAKER_PERIOD,
    ):
        if not isinstance(on_unavailable, FailMode) or not isinstance(on_misconfigured, FailMode):
            raise TypeError("on_unavailable and on_misconfigured must each be FailMode.OPEN or FailMode.CLOSED")
        self.on_unavailable = on_unavailable
        self.on_misconfigured = on_misconfigured
        self.timeout = timeout
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            headers={"authorization": f"Bearer {key}"},
            timeout=timeout,
            transport=transport,
        )
        self._breaker = None if breaker_failures is None else Breaker(breaker_failures, breaker_period)
        self._denials: dict = {}
        self._warned_unmatched: set = set()

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- checks ---------------------------------------------------------------------------

    async def check(
        self, policy: str, identifiers: Mapping[str, str], cost: int = 1, limits: Optional[Limits] = None
    ) -> Decision:
        """Checks ``cost`` units of ``policy`` for ``identifiers``, with the rules' numbers
        ``limits`` sends (``{"<rule>": {"limit": 500}}``) when given. Never raises: a check that
        could not be decided is a Decision saying why, allowed as the failure modes say."""
        key = _cache_key(policy, identifiers, cost, limits)
        cached = self._cached(key)
        if cached is not None:
            return cached
        path = "/api/v1/check"
        try:
            response = await self._post(path, _check_body(policy, identifiers, cost, limits))
        except _Unavailable as e:
            return self._unavailable(policy, e.reason, e.from_breaker)
        headers = [(k, v) for k in _PASSED_ON for v in response.headers.get_list(k)]
        try:
            body = response.json()
        except ValueError:
            body = None
        if body is None and response.status_code in (200, 429):
            kind = response.headers.get("content-type", "no content type")
            return self._unavailable(
                policy, f"an answer that is not JSON ({response.status_code}, {kind}) from {self.url}{path}"
            )
        return self._judge(key, response.status_code, body, headers, f"{self.url}{path}", response.text)

    async def check_batch(self, checks: Iterable[Mapping[str, Any]]) -> List[Decision]:
        """Checks each of ``checks`` (``{"policy", "identifiers", "cost"?, "limits"?}``) in one
        call (``POST /api/v1/check/batch``; parts of 100), and answers one Decision each, in
        order, as ``check`` would: the failure modes and the denial cache apply to each (a
        remembered denial is not sent). A batch's answer carries no RateLimit headers: a
        denied item's ``headers`` hold only ``Retry-After``."""
        items = [(c["policy"], c["identifiers"], c.get("cost", 1), c.get("limits")) for c in checks]
        decisions: List[Optional[Decision]] = [self._cached(_cache_key(*item)) for item in items]
        todo = [i for i, d in enumerate(decisions) if d is None]
        for start in range(0, len(todo), MAX_BATCH):
            part = todo[start : start + MAX_BATCH]
            for i, decision in zip(part, await self._batch([items[i] for i in part])):
                decisions[i] = decision
        return decisions  # type: ignore[return-value]

    async def _batch(self, items: list) -> List[Decision]:
        path = "/api/v1/check/batch"
        where = f"{self.url}{path}"
        body = {"checks": [_check_body(*item) for item in items]}
        try:
            response = await self._post(path, body, failed=_every_check_unavailable)
        except _Unavailable as e:
            return self._all_unavailable(items, e.reason, e.from_breaker)
        try:
            results = response.json()["results"] if response.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            results = None
        if response.status_code == 200 and (not isinstance(results, list) or len(results) != len(items)):
            return self._all_unavailable(items, f"an unreadable batch answer ({response.status_code}) from {where}")
        if results is None:
            # The batch as a whole was not answered: each of its checks is unavailable, or
            # refused as a configuration error (a wrong key); said once.
            status, detail = response.status_code, _detail(response)
            if status >= 500:
                return self._all_unavailable(items, f"{status} from {where}: {detail}")
            log.error(
                "Spillway refused a batch of %d (%s from %s): %s; a configuration error",
                len(items),
                status,
                where,
                detail,
            )
            return [
                Decision("misconfigured", self.on_misconfigured is FailMode.OPEN, status=status, detail=detail)
                for _ in items
            ]
        decisions = []
        for i, (item, result) in enumerate(zip(items, results)):
            status, answer = result.get("status"), result.get("body")
            headers = []
            if status == 429 and isinstance(answer, dict) and answer.get("retry_after_ms") is not None:
                headers.append(("retry-after", str(max(1, math.ceil(answer["retry_after_ms"] / 1000)))))
            decisions.append(self._judge(_cache_key(*item), status, answer, headers, f"{where} (checks[{i}])", ""))
        return decisions

    def _judge(self, key: tuple, status: int, body: Any, headers: list, where: str, text: str) -> Decision:
        """The Decision for one check's answer: its status and its body (the check's answer for
        200 and 429, else a problem)."""
        policy = key[0]
        if status in (200, 429):
            if not isinstance(body, dict) or "allowed" not in body:
                return self._unavailable(policy, f"an answer that is not a check's ({status}) from {where}")
            return self._decided(key, body, headers)
        detail = (body.get("detail") if isinstance(body, dict) else None) or text or str(body)
        if status == 422:
            return Decision("too_costly", False, status=status, detail=detail)
        if status >= 500:
            return self._unavailable(policy, f"{status} from {where}: {detail}")
        log.error(
            "Spillway refused the check of %s (%s from %s): %s; a configuration error", policy, status, where, detail
        )
        return Decision(
            "misconfigured",
            self.on_misconfigured is FailMode.OPEN,
            status=status,
            detail=detail,
        )

    async def _post(
        self, path: str, body: dict, failed: Optional[Callable[[httpx.Response, str], Optional[str]]] = None
    ) -> httpx.Response:
        """A POST held to the timeout as a whole (httpx's own timeouts are per phase, and a
        trickling answer restarts the read timeout with every chunk), through the breaker.
        Raises ``_Unavailable`` naming the cause; a 5xx is returned, and counted as a failure
        (as is an answer ``failed(response, url)`` gives a reason for)."""
        url = f"{self.url}{path}"
        breaker = self._breaker
        try:
            trial = breaker.enter() if breaker else False
        except BreakerOpen as e:
            raise _Unavailable(str(e), from_breaker=True) from None
        settled = False
        try:
            try:
                response = await _send(self._http, "POST", url, self.timeout, json=body)
            except _Unavailable as e:
                settled = True
                self._failed(trial, e.reason)
                raise
            settled = True
            if response.status_code >= 500:
                self._failed(trial, f"{response.status_code} from {url}: {_detail(response)}")
            elif failed is not None and (reason := failed(response, url)):
                self._failed(trial, reason)
            elif breaker and breaker.succeeded():
                log.info("Spillway answers again: circuit breaker closed")
            return response
        finally:
            if breaker and not settled:
                breaker.abandoned(trial)

    def _failed(self, trial: bool, reason: str) -> None:
        breaker = self._breaker
        if breaker and breaker.failed(trial, reason):
            log.warning(
                "circuit breaker open: %s (%s); not calling Spillway for %g s, checks fail %s meanwhile",
                "the trial call failed too"
                if trial
                else f"Spillway unavailable {breaker.failures} times in a row, the last",
                reason,
                breaker.period,
                self.on_unavailable.value,
            )

    def _unavailable(self, policy: str, reason: str, from_breaker: bool = False) -> Decision:
        # The breaker said once, at warning level, that it opened and why: every check it
        # answers meanwhile is not worth a warning of its own.
        (log.debug if from_breaker else log.warning)(
            "Spillway unavailable for %s (failing %s): %s", policy, self.on_unavailable.value, reason
        )
        return Decision("unavailable", self.on_unavailable is FailMode.OPEN, detail=reason, from_breaker=from_breaker)

    def _all_unavailable(self, items: list, reason: str, from_breaker: bool = False) -> List[Decision]:
        """Every check of a batch that could not be made: said once."""
        policies = ", ".join(sorted({item[0] for item in items}))
        self._unavailable(f"a batch of {len(items)} ({policies})", reason, from_breaker)
        return [
            Decision("unavailable", self.on_unavailable is FailMode.OPEN, detail=reason, from_breaker=from_breaker)
            for _ in items
        ]

    def _decided(self, key: tuple, answer: dict, headers: list) -> Decision:
        policy = answer.get("policy", key[0])
        if answer.get("unmatched") and policy not in self._warned_unmatched:
            self._warned_unmatched.add(policy)
            log.warning(
                "no rule of policy %s counts the identifiers sent: nothing is limited "
                "(fix the identifiers or the policy's dimensions)",
                policy,
            )
        if answer.get("allowed"):
            return Decision("allowed", True, answer=answer, headers=headers)
        retry_ms = answer.get("retry_after_ms")
        decision = Decision(
            "limited",
            False,
            answer=answer,
            headers=headers,
            retry_after=None if retry_ms is None else retry_ms / 1000,
        )
        self._remember(key, decision)
        return decision

    # --- the denial cache: until Retry-After, never for a concurrency rule ------------------

    def _remember(self, key: tuple, decision: Decision) -> None:
        answer = decision.answer or {}
        by_concurrency = any(
            not r.get("allowed") and r.get("algorithm") == "concurrency" for r in answer.get("results") or []
        )
        if by_concurrency or answer.get("degraded") or not decision.retry_after:
            return
        if len(self._denials) >= _CACHE_CAPACITY:
            now = time.monotonic()
            self._denials = {k: v for k, v in self._denials.items() if v[0] > now}
            if len(self._denials) >= _CACHE_CAPACITY:
                self._denials.clear()
        now = time.monotonic()
        self._denials[key] = (now + min(decision.retry_after, MAX_CACHED), now + decision.retry_after, decision)

    def _cached(self, key: tuple) -> Optional[Decision]:
        entry = self._denials.get(key)
        if entry is None:
            return None
        until, retry_at, decision = entry
        now = time.monotonic()
        if until <= now:
            self._denials.pop(key, None)
            return None
        left = retry_at - now
        # The stored RateLimit header's reset is stale: the policy and a fresh Retry-After.
        headers = [(k, v) for k, v in decision.headers if k == "ratelimit-policy"]
        headers.append(("retry-after", str(math.ceil(left))))
        return Decision("limited", False, answer=decision.answer, headers=headers, retry_after=left, from_cache=True)

    # --- after the check --------------------------------------------------------------------

    async def report(self, policy: str, identifiers: Mapping[str, str], cost: int) -> None:
        """Usage known after the fact, added to every rule; a negative cost gives back."""
        await self._call("/api/v1/report", {"policy": policy, "identifiers": dict(identifiers), "cost": cost})

    async def release(self, leases: list) -> None:
        """Releases leases (idempotent)."""
        if leases:
            await self._call("/api/v1/leases/release", {"leases": list(leases)})

    async def renew(self, leases: list) -> None:
        """Extends leases by their rule's lease length from now."""
        if leases:
            await self._call("/api/v1/leases/renew", {"leases": list(leases)})

    async def _call(self, path: str, body: dict) -> None:
        try:
            response = await self._post(path, body)
        except _Unavailable as e:
            raise SpillwayError(f"Spillway is unavailable: {e.reason}") from e
        if response.is_success:
            return
        raise _refused("POST", f"{self.url}{path}", response)


class HeldLeases:
    """A check's leases, renewed until closed (see ``SpillwayClient.hold``)."""

    def __init__(self, client: SpillwayClient, decision: Decision):
        self._client = client
        self._leases = decision.leases
        self._renewer = None
        if self._leases:
            ends = [r["reset_ms"] for r in decision.answer["results"] if r.get("lease")]
            self._renewer = asyncio.ensure_future(client._keep(self._leases, max(min(ends) / 3, 50) / 1000))

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        leases, self._leases = self._leases, []
        try:
            await self._client.release(leases)
        except SpillwayError as e:
            log.warning("releasing leases failed (they end with their lease time): %s", e)


class Reservation:
    """An estimate checked; ``used(n)`` says what the work really used."""

    def __init__(self, decision: Decision, estimate: int):
        self.decision = decision
        self.estimate = estimate
        self.actual: Optional[int] = None

    def used(self, actual: int) -> None:
        self.actual = actual


# --- calls and their errors -----------------------------------------------------------------


class _Unavailable(Exception):
    """A call that found Spillway unavailable; ``reason`` names what failed and why."""

    def __init__(self, reason: str, from_breaker: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.from_breaker = from_breaker


async def _send(http: httpx.AsyncClient, method: str, url: str, timeout: float, **kwargs: Any) -> httpx.Response:
    """One call, its answer read in full within ``timeout`` seconds; raises ``_Unavailable``
    naming the URL and the cause (``timed out after 0.1 s calling …``, ``ConnectError:
    [Errno 111] Connection refused calling …``)."""

    async def whole() -> httpx.Response:
        response = await http.request(method, url, **kwargs)
        await response.aread()
        return response

    try:
        return await asyncio.wait_for(whole(), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        raise _Unavailable(f"timed out after {timeout:g} s calling {url}") from None
    except httpx.HTTPError as e:
        raise _Unavailable(f"{_cause(e)} calling {url}") from e


def _cause(error: BaseException) -> str:
    """``ConnectError: [Errno 111] Connection refused``: the error's type and the operating
    system's reason, which httpx and anyio wrap in ``All connection attempts failed``."""
    reasons: list = []
    seen: set = set()
    stack: list = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and isinstance(e.errno, int):
            # The system's words for the number (asyncio's own strerror is "Connect call
            # failed"); a resolver's error (a negative number) says its own.
            said = os.strerror(e.errno) if e.errno > 0 else e.strerror
            reason = f"[Errno {e.errno}] {said}"
            if reason not in reasons:
                reasons.append(reason)
        stack.extend(getattr(e, "exceptions", None) or ())
        stack.extend((e.__context__, e.__cause__))
    said = "; ".join(reasons) or str(error)
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail") or response.text)
    except (ValueError, AttributeError):
        return response.text


def _refused(method: str, url: str, response: httpx.Response) -> SpillwayError:
    try:
        problem = response.json()
    except ValueError:
        problem = None
    return SpillwayError(
        f"Spillway refused {method} {url} ({response.status_code}): {_detail(response)}",
        response.status_code,
        problem if isinstance(problem, dict) else None,
    )


def _every_check_unavailable(response: httpx.Response, url: str) -> Optional[str]:
    """A batch whose every check answered a 5xx found Spillway unavailable (Redis down under
    policies that fail closed), as a single check's 503 does: why, or None."""
    try:
        results = response.json()["results"]
        if results and all(r["status"] >= 500 for r in results):
            first = results[0]
            return f"{first['status']} from {url} for each of {len(results)} checks: {first['body'].get('detail')}"
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None
