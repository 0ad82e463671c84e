"""The admin API's helpers a service's own tooling needs: reset an identifier's counters (and
undo it), look at them, add and remove overrides. They take an admin key, not the service
key the checks use, so they are a client of their own.

    admin = Admin("http://spillway:3000", os.environ["SPILLWAY_ADMIN_KEY"])
    await admin.reset("user", "42", reason="support ticket 1234")
    await admin.add_override("api", "user=vip-*", "unlimited", reason="partners")

Every helper raises ``SpillwayError`` naming the call and the cause when it fails (no failure
modes here: these are not on a request's path).
"""

from __future__ import annotations

from typing import Any, Optional, Union
from urllib.parse import quote

import httpx

from .client import SpillwayError, _refused, _send, _Unavailable

#: Admin calls write policies and audit records: a budget of seconds, not milliseconds.
DEFAULT_ADMIN_TIMEOUT = 5.0


class Admin:
    def __init__(
        self,
        url: str,
        key: str,
        *,
        timeout: float = DEFAULT_ADMIN_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.AsyncClient(headers={"authorization": f"Bearer {key}"}, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "Admin":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- identifiers ------------------------------------------------------------------------

    async def inspect(self, dimension: str, value: str) -> dict:
        """The live state of every rule of every policy for one identifier (nothing consumed):
        ``{"identifier", "policies": [{"policy", "rules": [...]}]}``."""
        return await self._call("GET", _identifier(dimension, value))

    async def reset(
        self,
        dimension: str,
        value: str,
        *,
        reason: str,
        policy: Optional[str] = None,
        rule: Optional[str] = None,
    ) -> dict:
        """Resets the identifier's counters: everywhere, in ``policy``, or for one ``rule`` of
        it; ``reason`` goes to the audit log. Answers ``{"identifier", "policies",
        "deleted_keys", "undo": {"token", "until_ms"} | None}``; ``undo_reset(token)`` puts the
        counters back within a minute. Every instance of Spillway forgets its cached denials
        at once (a client's own denial cache keeps a denial until its Retry-After, at most 10 s)."""
        params = {"reason": reason}
        if policy is not None:
            params["policy"] = policy
        if rule is not None:
            params["rule"] = rule
        return await self._call("DELETE", _identifier(dimension, value), params=params)

    async def undo_reset(self, token: str) -> dict:
        """Puts back what a reset deleted (within a minute of it, once)."""
        return await self._call("POST", f"/api/v1/resets/{quote(token, safe='')}/undo")

    # --- overrides --------------------------------------------------------------------------

    async def overrides(self, policy: str) -> list:
        """The policy's overrides, in order (the first that matches applies)."""
        return (await self._call("GET", _overrides(policy)))["overrides"]

    async def add_override(
        self,
        policy: str,
        match: str,
        action: str,
        *,
        rules: Optional[list] = None,
        expires_at_ms: Optional[int] = None,
        reason: Optional[str] = None,
    ) -> dict:
        """Adds an override: ``match`` is ``user=42``, ``user=vip-*`` or ``ip=10.0.0.0/8``;
        ``action`` is ``unlimited``, ``block`` or ``limit`` (with ``rules``). Every instance
        follows at once. Answers ``{"policy", "version", "overrides"}``."""
        document: dict = {"match": match, "action": action}
        if rules is not None:
            document["rules"] = rules
        if expires_at_ms is not None:
            document["expires_at_ms"] = expires_at_ms
        if reason is not None:
            document["reason"] = reason
        return await self._call("POST", _overrides(policy), json=document)

    async def remove_override(self, policy: str, which: Union[int, str]) -> dict:
        """Removes an override: by its place in the list (from 0), or the first whose ``match``
        is ``which``. (Looked up, then removed by place: an override added or removed by
        someone else in between may shift it.) Answers ``{"policy", "version", "overrides"}``."""
        if isinstance(which, str):
            matches = [o.get("match") for o in await self.overrides(policy)]
            if which not in matches:
                raise SpillwayError(f"no override of {policy} matches {which!r} (it has {matches})", 404)
            which = matches.index(which)
        return await self._call("DELETE", f"{_overrides(policy)}/{int(which)}")

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict:
        url = f"{self.url}{path}"
        try:
            response = await _send(self._http, method, url, self.timeout, **kwargs)
        except _Unavailable as e:
            raise SpillwayError(f"Spillway is unavailable: {e.reason}") from e
        if not response.is_success:
            raise _refused(method, url, response)
        return response.json()


def _identifier(dimension: str, value: str) -> str:
    return f"/api/v1/identifiers/{quote(dimension, safe='')}/{quote(value, safe='')}"


def _overrides(policy: str) -> str:
    return f"/api/v1/policies/{quote(policy, safe='')}/overrides"
