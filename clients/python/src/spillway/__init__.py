"""The official Python client of Spillway, a rate limiter service backed by Redis.

    from spillway import Spillway, FailMode
    spillway = Spillway("http://spillway:3000", key,
                        on_unavailable=FailMode.OPEN, on_misconfigured=FailMode.CLOSED)
    decision = await spillway.check("api", {"user": "42"})
"""

from .client import Decision, FailMode, Refused, Spillway, SpillwayError

__all__ = ["Decision", "FailMode", "Refused", "Spillway", "SpillwayError"]
