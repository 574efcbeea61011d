"""What a user pays for its calls that hung: counted per uid, not per connection.

A connection is free to make: a penalty kept on the connection whose call hung
(a throttle, a count towards revocation) is shed by connecting again. So the
watchdog's catches are counted for the *user*: while a user's count is alive
(``hung_call_throttle_s`` after its last hung call) every connection of it,
the ones it opens afterwards included, runs throttled, and once the count
reaches ``hung_calls_before_revoke`` the connection whose call hung is closed
and the user's new Hellos are refused until the count expires (except root's
and npud's own user's: an operator can always connect and look).

Connections npud drops for breaking the protocol (a fatal frame, too many stray fds,
too many requests refused NOT_PERMITTED) are counted the same way, in a count of their
own (``dropped_connection_penalty_s``, ``dropped_connections_before_refusal``): a user
that reconnects after each drop has its new connections refused, so the cost of a
connection (its accept, its Hello, the fds it floods) stops at a few per period.

Thread-safe: the watchdog charges from its timer thread, Hellos ask on the trio
thread.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable


@dataclasses.dataclass
class _Record:
    calls: int
    until: float


@dataclasses.dataclass(frozen=True)
class Charge:
    """What one hung call cost its user."""

    calls: int
    """The user's hung calls still counted, this one included."""
    revoke: bool
    """The connection whose call hung is to be closed."""


class HungCalls:
    """Every user's hung calls (or dropped connections) still counted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_uid: dict[int, _Record] = {}

    def charge(self, uid: int, *, remember: float, revoke_at: int, revoke_always: bool) -> Charge:
        """One more hung call of ``uid``, remembered for ``remember`` seconds from now
        (with the user's earlier ones still counted); ``revoke_at`` hung calls (0: never)
        or ``revoke_always`` revoke."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            record = self._by_uid.get(uid)
            if record is None:
                record = self._by_uid[uid] = _Record(0, now)
            record.calls += 1
            record.until = max(record.until, now + remember)
            calls = record.calls
        return Charge(calls, revoke_always or bool(revoke_at and calls >= revoke_at))

    def throttle_left(self, uid: int) -> float:
        """Seconds ``uid``'s connections stay throttled (0: none)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            record = self._by_uid.get(uid)
            return 0.0 if record is None else record.until - now

    def refused(self, uid: int, revoke_at: int) -> tuple[int, float] | None:
        """(hung calls, seconds left) when ``uid``'s new connections are refused now."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            record = self._by_uid.get(uid)
            if record is None or not revoke_at or record.calls < revoke_at:
                return None
            return record.calls, record.until - now

    def _expire(self, now: float) -> None:
        for uid in [uid for uid, record in self._by_uid.items() if record.until <= now]:
            del self._by_uid[uid]
