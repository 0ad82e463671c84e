"""An in-memory Spillway for a service's own tests: the client's interface (``check``,
``peek``, ``check_batch``, ``wait_until_allowed``, ``lease``, ``reserve``, ``hold``,
``report``, ``release``, ``renew``), counting in memory, so the middleware and the FastAPI
dependency run without a server.

    fake = FakeSpillway({"api": {"limit": 2, "window": 60, "concurrency": 4}})
    app.add_middleware(SpillwayMiddleware, client=fake, policy="api", identify=...)
    ...
    fake.deny("api")          # the next checks of api are denied (until fake.restore())
    fake.unavailable(times=1)  # the next check finds Spillway unavailable
    assert fake.calls[-1].identifiers == {"user": "ada"}

Each policy is a fixed window per identifiers (``limit`` per ``window`` seconds, the window
starting at its first check) and, with ``concurrency``, at most that many leases in flight
(each held ``lease`` seconds unless renewed). It answers as Spillway does: bodies and
RateLimit headers of the same shape, 429 denials with Retry-After, a cost over the limit
``too_costly``, an unknown policy or an unknown rule in ``limits`` ``misconfigured`` (404,
400), the failure modes chosen as for ``Spillway``. It is a fake, not a model: one window
rule and one concurrency rule per policy, no ``caller_max`` (any ``limits`` number is taken),
no overrides, no denial cache.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from .client import Decision, FailMode, Limits, SpillwayClient, SpillwayError

#: A policy's window when none is given (seconds).
DEFAULT_WINDOW = 60.0
#: How long a lease lasts unless renewed (seconds).
DEFAULT_LEASE = 30.0
#: A concurrency denial's Retry-After, as Spillway's (a slot frees whenever one is released).
CONCURRENCY_RETRY_HINT = 1.0


@dataclass
class Call:
    """One call the code under test made: ``method`` is ``check``, ``peek``, ``check_batch``
    (one per check of the batch), ``report``, ``release`` or ``renew``."""

    method: str
    policy: Optional[str] = None
    identifiers: Optional[dict] = None
    cost: Optional[int] = None
    limits: Optional[dict] = None
    leases: Optional[list] = None


@dataclass
class _Forced:
    kind: str  # "deny", "unavailable", "misconfigured"
    policy: Optional[str]
    times: Optional[int]
    retry_after: float = 1.0
    status: int = 404


@dataclass
class _Policy:
    rule: str
    limit: Optional[int]
    window: float
    concurrency: Optional[int]
    lease: float
    concurrency_rule: str


def _policy(spec: Union[int, Mapping[str, Any]]) -> _Policy:
    if isinstance(spec, int):
        spec = {"limit": spec}
    unknown = set(spec) - {"limit", "window", "rule", "concurrency", "lease", "concurrency_rule"}
    if unknown:
        raise ValueError(
            f"a fake policy takes limit, window, rule, concurrency, lease, concurrency_rule; not {sorted(unknown)}"
        )
    return _Policy(
        rule=spec.get("rule", "window"),
        limit=spec.get("limit"),
        window=float(spec.get("window", DEFAULT_WINDOW)),
        concurrency=spec.get("concurrency"),
        lease=float(spec.get("lease", DEFAULT_LEASE)),
        concurrency_rule=spec.get("concurrency_rule", "in-flight"),
    )


class FakeSpillway(SpillwayClient):
    """``policies`` maps each policy's name to its limit per window (an int) or to
    ``{"limit", "window" (s), "rule" (its name), "concurrency", "lease" (s)}``."""

    def __init__(
        self,
        policies: Optional[Mapping[str, Union[int, Mapping[str, Any]]]] = None,
        *,
        on_unavailable: FailMode = FailMode.CLOSED,
        on_misconfigured: FailMode = FailMode.CLOSED,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.policies: Dict[str, _Policy] = {name: _policy(spec) for name, spec in (policies or {}).items()}
        self.on_unavailable = on_unavailable
        self.on_misconfigured = on_misconfigured
        self.calls: List[Call] = []
        self._clock = clock
        self._skew = 0.0
        self._windows: dict = {}  # (policy, identifiers, limit) -> (ends_at, used)
        self._leases: dict = {}  # lease id -> (policy, identifiers, ends_at)
        self._forced: List[_Forced] = []
        self._ids = itertools.count(1)

    # --- what a test tells it ----------------------------------------------------------------

    def deny(self, policy: Optional[str] = None, *, retry_after: float = 1.0, times: Optional[int] = None) -> None:
        """The next checks (of ``policy``; None: of any) are denied with ``retry_after``
        seconds to wait: ``times`` of them, or all until ``restore()``."""
        self._forced.append(_Forced("deny", policy, times, retry_after=retry_after))

    def unavailable(self, policy: Optional[str] = None, *, times: Optional[int] = None) -> None:
        """The next checks find Spillway unavailable (answered as ``on_unavailable`` says), and
        ``report``, ``release`` and ``renew`` raise ``SpillwayError`` meanwhile."""
        self._forced.append(_Forced("unavailable", policy, times))

    def misconfigured(self, policy: Optional[str] = None, *, status: int = 404, times: Optional[int] = None) -> None:
        """The next checks are refused as a configuration error (answered as
        ``on_misconfigured`` says)."""
        self._forced.append(_Forced("misconfigured", policy, times, status=status))

    def restore(self) -> None:
        """Ends every ``deny``, ``unavailable`` and ``misconfigured``."""
        self._forced.clear()

    def advance(self, seconds: float) -> None:
        """Moves the fake's clock on: windows end and leases run out without sleeping."""
        self._skew += seconds

    def checks(self, policy: Optional[str] = None) -> List[Call]:
        """The checks made (``check``, ``peek``, each of a ``check_batch``), of ``policy`` or all."""
        return [c for c in self.calls if c.method in ("check", "peek", "check_batch") and policy in (None, c.policy)]

    def in_flight(self, policy: str, identifiers: Mapping[str, str]) -> int:
        """Leases held now by ``identifiers`` under ``policy``."""
        ids = _ids(identifiers)
        now = self._now()
        return sum(1 for p, i, ends in self._leases.values() if p == policy and i == ids and ends > now)

    # --- the client's interface -------------------------------------------------------------

    async def check(
        self, policy: str, identifiers: Mapping[str, str], cost: int = 1, limits: Optional[Limits] = None
    ) -> Decision:
        return self._check("check", policy, identifiers, cost, limits)

    async def peek(self, policy: str, identifiers: Mapping[str, str], limits: Optional[Limits] = None) -> Decision:
        return self._check("peek", policy, identifiers, 0, limits)

    async def check_batch(self, checks: Iterable[Mapping[str, Any]]) -> List[Decision]:
        return [
            self._check("check_batch", c["policy"], c["identifiers"], c.get("cost", 1), c.get("limits")) for c in checks
        ]

    async def report(self, policy: str, identifiers: Mapping[str, str], cost: int) -> None:
        self.calls.append(Call("report", policy, dict(identifiers), cost))
        self._raise_if_unavailable()
        spec = self.policies.get(policy)
        if spec is None:
            raise SpillwayError(
                f'Spillway refused POST fake/api/v1/report (404): policy: no policy named "{policy}"', 404
            )
        if spec.limit is not None:
            key = (policy, _ids(identifiers), spec.limit)
            ends, used = self._window(key, spec)
            self._windows[key] = (ends, max(0, used + cost))

    async def release(self, leases: list) -> None:
        if not leases:
            return
        self.calls.append(Call("release", leases=list(leases)))
        self._raise_if_unavailable()
        for lease in leases:
            self._leases.pop(lease, None)

    async def renew(self, leases: list) -> None:
        if not leases:
            return
        self.calls.append(Call("renew", leases=list(leases)))
        self._raise_if_unavailable()
        now = self._now()
        for lease in leases:
            held = self._leases.get(lease)
            if held and held[2] > now:
                policy, ids, _ = held
                self._leases[lease] = (policy, ids, now + self.policies[policy].lease)

    # --- deciding ---------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock() + self._skew

    def _forced_for(self, policy: str) -> Optional[_Forced]:
        for forced in self._forced:
            if forced.policy in (None, policy) and forced.times != 0:
                if forced.times is not None:
                    forced.times -= 1
                return forced
        return None

    def _raise_if_unavailable(self) -> None:
        if any(f.kind == "unavailable" and f.times != 0 for f in self._forced):
            raise SpillwayError("Spillway is unavailable: FakeSpillway.unavailable() says so")

    def _unavailable(self, reason: str) -> Decision:
        return Decision("unavailable", self.on_unavailable is FailMode.OPEN, detail=reason)

    def _misconfigured(self, status: int, detail: str) -> Decision:
        return Decision("misconfigured", self.on_misconfigured is FailMode.OPEN, status=status, detail=detail)

    def _window(self, key: tuple, spec: _Policy) -> tuple:
        now = self._now()
        ends, used = self._windows.get(key, (0.0, 0))
        if ends <= now:
            ends, used = now + spec.window, 0
        return ends, used

    def _check(
        self, method: str, policy: str, identifiers: Mapping[str, str], cost: int, limits: Optional[Limits]
    ) -> Decision:
        self.calls.append(Call(method, policy, dict(identifiers), cost, None if limits is None else dict(limits)))
        forced = self._forced_for(policy)
        if forced is not None and forced.kind == "unavailable":
            return self._unavailable("FakeSpillway.unavailable() says so")
        if forced is not None and forced.kind == "misconfigured":
            return self._misconfigured(forced.status, "FakeSpillway.misconfigured() says so")
        spec = self.policies.get(policy)
        if spec is None:
            return self._misconfigured(404, f'policy: no policy named "{policy}"')
        limit = spec.limit
        for rule, numbers in (limits or {}).items():
            if rule != spec.rule or spec.limit is None or set(numbers) != {"limit"}:
                return self._misconfigured(
                    400, f"limits.{rule}: the fake's policy {policy} takes only {spec.rule}.limit"
                )
            limit = numbers["limit"]
        ids = _ids(identifiers)
        now = self._now()
        results = []
        allowed = True
        if limit is not None:
            if cost > limit:
                return Decision(
                    "too_costly",
                    False,
                    status=422,
                    detail=f"cost: {cost} is more than rule {spec.rule} ever admits ({limit})",
                )
            key = (policy, ids, limit)
            ends, used = self._window(key, spec)
            ok = used + cost <= limit
            results.append(
                _result(spec.rule, ids, "fixed_window", ok, limit, limit - used, ends - now, None if ok else ends - now)
            )
            allowed = ok
        if spec.concurrency is not None:
            # Leases neither released nor renewed run out, as Spillway's do.
            self._leases = {i: held for i, held in self._leases.items() if held[2] > now}
            live = [i for i, (p, who, _) in self._leases.items() if p == policy and who == ids]
            ok = cost == 0 or len(live) < spec.concurrency
            soonest = min((self._leases[i][2] for i in live), default=now) - now
            results.append(
                _result(
                    spec.concurrency_rule,
                    ids,
                    "concurrency",
                    ok,
                    spec.concurrency,
                    spec.concurrency - len(live),
                    soonest,
                    None if ok else min(soonest, CONCURRENCY_RETRY_HINT),
                )
            )
            allowed = allowed and ok
        if forced is not None and forced.kind == "deny":
            allowed = False
            if not results:
                results.append(_result(spec.rule, ids, "fixed_window", False, 0, 0, 0, None))
            for r in results:
                r["allowed"], r["remaining"] = False, 0
                r["retry_after_ms"] = r["reset_ms"] = _ms(forced.retry_after)
        if allowed and cost > 0:
            # All or nothing, as Spillway: a denied check consumes nothing.
            for r in results:
                if r["algorithm"] == "fixed_window":
                    self._windows[key] = (ends, used + cost)
                    r["remaining"] -= cost
                else:
                    lease = f"fake-lease-{next(self._ids)}"
                    self._leases[lease] = (policy, ids, now + spec.lease)
                    r["lease"], r["remaining"], r["reset_ms"] = lease, r["remaining"] - 1, _ms(spec.lease)
        return self._decision(policy, spec, results, allowed)

    def _decision(self, policy: str, spec: _Policy, results: list, allowed: bool) -> Decision:
        binding = None
        if results:
            denied = [r for r in results if not r["allowed"]]
            binding = (
                max(denied, key=lambda r: r["retry_after_ms"] or 0)
                if denied
                else min(results, key=lambda r: r["remaining"] / max(r["limit"], 1))
            )
            binding["binding"] = True
        answer = {
            "allowed": allowed,
            "policy": policy,
            "policy_version": 1,
            "mode": "enforce",
            "limit": binding and binding["limit"],
            "remaining": binding and binding["remaining"],
            "reset_ms": binding and binding["reset_ms"],
            "retry_after_ms": binding and binding["retry_after_ms"],
            "degraded": False,
            "unmatched": False,
            "results": results,
        }
        quotas = []
        for r in results:
            if r["algorithm"] == "concurrency":
                quotas.append(f'"{r["rule"]}";q={r["limit"]};qu="concurrent-requests"')
            else:
                quotas.append(f'"{r["rule"]}";q={r["limit"]};w={math.ceil(spec.window)}')
        headers = []
        if binding is not None:
            headers.append(("ratelimit-policy", ", ".join(quotas)))
            headers.append(
                ("ratelimit", f'"{binding["rule"]}";r={binding["remaining"]};t={math.ceil(binding["reset_ms"] / 1000)}')
            )
        if allowed:
            return Decision("allowed", True, answer=answer, headers=headers)
        retry_ms = answer["retry_after_ms"]
        headers.append(("retry-after", str(max(1, math.ceil(retry_ms / 1000)))))
        return Decision("limited", False, answer=answer, headers=headers, retry_after=retry_ms / 1000)


def _ids(identifiers: Mapping[str, str]) -> tuple:
    return tuple(sorted(identifiers.items()))


def _ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000))


def _result(
    rule: str,
    ids: tuple,
    algorithm: str,
    allowed: bool,
    limit: int,
    remaining: int,
    reset: float,
    retry: Optional[float],
) -> dict:
    return {
        "rule": rule,
        "identifier": "&".join(f"{k}={v}" for k, v in ids),
        "algorithm": algorithm,
        "allowed": allowed,
        "limit": limit,
        "remaining": max(0, remaining),
        "reset_ms": _ms(reset),
        "retry_after_ms": None if retry is None else max(1, _ms(retry)),
        "binding": False,
    }
