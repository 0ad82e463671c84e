"""The client: checks with a timeout and an explicit failure mode, the headers to pass on,
an RFC 9457 problem for end users, a denial cache, leases and reserve-then-report."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Optional

import httpx

log = logging.getLogger("spillway")

#: How long a call may take before Spillway counts as unavailable (seconds). Spillway answers
#: from one Redis round trip; keep this well under your own request's budget.
DEFAULT_TIMEOUT = 0.1

_PASSED_ON = ("ratelimit-policy", "ratelimit", "retry-after")
_CACHE_CAPACITY = 10_000
#: A denial is remembered at most this long (seconds): a support reset or a new override
#: then shows soon.
MAX_CACHED = 10.0


class FailMode(enum.Enum):
    """What a check that could not be decided means for the request."""

    OPEN = "open"  #: let it through (and log): the usual choice for an API
    CLOSED = "closed"  #: refuse it: for a limit guarding money or abuse


class SpillwayError(Exception):
    """A call that is not a check (report, release, renew) failed."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


@dataclass
class Decision:
    """What a check decided.

    ``outcome`` is one of ``allowed``, ``limited`` (denied by a limit), ``too_costly`` (a cost
    no rule could ever allow, 422), ``unavailable`` (network error, timeout, 5xx) and
    ``misconfigured`` (401, 403, 404, 400: a configuration error).
    """

    outcome: str
    allowed: bool
    answer: Optional[dict] = None
    headers: list = field(default_factory=list)
    retry_after: Optional[float] = None
    from_cache: bool = False
    status: Optional[int] = None
    detail: Optional[str] = None

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


def _cache_key(policy: str, identifiers: Mapping[str, str], cost: int) -> tuple:
    return (policy, cost, tuple(sorted(identifiers.items())))


class Spillway:
    """A Spillway client. ``on_unavailable`` and ``on_misconfigured`` must be chosen."""

    def __init__(
        self,
        url: str,
        key: str,
        *,
        on_unavailable: FailMode,
        on_misconfigured: FailMode,
        timeout: float = DEFAULT_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ):
        if not isinstance(on_unavailable, FailMode) or not isinstance(on_misconfigured, FailMode):
            raise TypeError("on_unavailable and on_misconfigured must each be FailMode.OPEN or FailMode.CLOSED")
        self.on_unavailable = on_unavailable
        self.on_misconfigured = on_misconfigured
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"authorization": f"Bearer {key}"},
            timeout=timeout,
            transport=transport,
        )
        self._denials: dict = {}
        self._warned_unmatched: set = set()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "Spillway":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- checks ---------------------------------------------------------------------------

    async def check(self, policy: str, identifiers: Mapping[str, str], cost: int = 1) -> Decision:
        """Checks ``cost`` units of ``policy`` for ``identifiers``. Never raises: a check that
        could not be decided is a Decision saying why, allowed as the failure modes say."""
        key = _cache_key(policy, identifiers, cost)
        cached = self._cached(key)
        if cached is not None:
            return cached
        body = {"policy": policy, "identifiers": dict(identifiers), "cost": cost}
        try:
            response = await self._post("/api/v1/check", body)
        except (httpx.HTTPError, asyncio.TimeoutError) as e:
            return self._unavailable(policy, f"{type(e).__name__}: {e}")
        headers = [(k, v) for k in _PASSED_ON for v in response.headers.get_list(k)]
        status = response.status_code
        if status in (200, 429):
            try:
                answer = response.json()
            except ValueError as e:
                return self._unavailable(policy, f"unreadable answer: {e}")
            return self._decided(key, answer, headers)
        detail = _detail(response)
        if status == 422:
            return Decision("too_costly", False, status=status, detail=detail)
        if status >= 500:
            return self._unavailable(policy, f"{status}: {detail}")
        log.error("Spillway refused the check of %s (%s): %s; a configuration error", policy, status, detail)
        return Decision(
            "misconfigured",
            self.on_misconfigured is FailMode.OPEN,
            status=status,
            detail=detail,
        )

    async def _post(self, path: str, body: dict) -> httpx.Response:
        """A POST held to the timeout as a whole (httpx's own timeouts are per phase, and a
        trickling answer restarts the read timeout with every chunk)."""

        async def whole() -> httpx.Response:
            response = await self._http.post(path, json=body)
            await response.aread()
            return response

        return await asyncio.wait_for(whole(), self.timeout)

    def _unavailable(self, policy: str, reason: str) -> Decision:
        log.warning("Spillway unavailable for %s (failing %s): %s", policy, self.on_unavailable.value, reason)
        return Decision("unavailable", self.on_unavailable is FailMode.OPEN, detail=reason)

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
        except (httpx.HTTPError, asyncio.TimeoutError) as e:
            raise SpillwayError(f"Spillway is unavailable: {type(e).__name__}: {e}") from e
        if response.is_success:
            return
        raise SpillwayError(f"Spillway refused ({response.status_code}): {_detail(response)}", response.status_code)

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


class HeldLeases:
    """A check's leases, renewed until closed (see ``Spillway.hold``)."""

    def __init__(self, client: "Spillway", decision: Decision):
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


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail") or response.text)
    except ValueError:
        return response.text
