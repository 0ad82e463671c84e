"""The official Python client of Spillway, a rate limiter service backed by Redis.

    from spillway import Spillway, FailMode
    spillway = Spillway("http://spillway:3000", key,
                        on_unavailable=FailMode.OPEN, on_misconfigured=FailMode.CLOSED)
    decision = await spillway.check("api", {"user": "42"})

``spillway.admin.Admin`` resets identifiers and manages overrides (an admin key);
``spillway.testing.FakeSpillway`` stands in for Spillway in a service's own tests.
"""

from .admin import Admin
from .client import Decision, FailMode, Refused, Spillway, SpillwayClient, SpillwayError

__all__ = ["Admin", "Decision", "FailMode", "Refused", "Spillway", "SpillwayClient", "SpillwayError"]
