"""SageMaker stateful sessions: sticky routing for a conversation's turns, and nothing more.

Why. On an endpoint with several instances, SageMaker's router sends each request to whichever
instance is least busy, so turn ``n + 1`` of a conversation finds turn ``n``'s KV cache on its
instance only 1/N of the time. SageMaker's stateful sessions route every request that carries a
session's id to the instance that created it ("Stateful sessions with Amazon SageMaker AI
models", the SageMaker developer guide), which keeps the conversation's prompt prefix in that
instance's prefix cache (docs/design-decisions.md#session-affinity).

The protocol, as AWS's own container standard implements it (aws/model-hosting-container-
standards, ``sagemaker/sessions``, which vLLM's SageMaker entry point uses):

* ``InvokeEndpoint(SessionId="NEW_SESSION")`` with the body ``{"requestType": "NEW_SESSION"}``:
  the container creates the id and its expiry and answers with the header
  ``X-Amzn-SageMaker-New-Session-Id: <id>; Expires=<UTC ISO-8601>`` (the caller reads
  ``NewSessionId``);
* a later request with ``SessionId=<id>`` reaches the container with the header
  ``X-Amzn-SageMaker-Session-Id: <id>``, on the same instance;
* ``{"requestType": "CLOSE"}`` with that header closes it; the answer carries
  ``X-Amzn-SageMaker-Closed-Session-Id: <id>`` (``ClosedSessionId``).

A session here is a *hint, never state*: the caller still sends the whole history with every
request, so an unknown or expired id (the instance was replaced, the session timed out, another
instance received it) is served exactly like a request without one, and the response says so.
The table only remembers which ids this instance issued and until when, bounded in size.

Pure module: standard library only.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

SESSION_ID_HEADER = "X-Amzn-SageMaker-Session-Id"
NEW_SESSION_ID_HEADER = "X-Amzn-SageMaker-New-Session-Id"
CLOSED_SESSION_ID_HEADER = "X-Amzn-SageMaker-Closed-Session-Id"
NEW_SESSION = "NEW_SESSION"
SESSION_ID_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
"""InvokeEndpoint's ``SessionId`` / ``ClosedSessionId`` pattern (max 256 characters)."""
SESSION_ID_MAX_LENGTH = 256


class SessionState(StrEnum):
    """What a request's session header meant on this instance."""

    OPENED = "opened"
    """The request opened the session (its id is in the response header)."""
    ACTIVE = "active"
    """A session this instance issued and that has not expired."""
    EXPIRED = "expired"
    """A session this instance issued whose expiry has passed."""
    UNKNOWN = "unknown"
    """An id this instance did not issue (or closed, or no longer remembers)."""


@dataclass(frozen=True)
class Session:
    """A session this instance issued."""

    session_id: str
    expires_at: float
    """Wall-clock epoch seconds."""

    @property
    def expires_iso(self) -> str:
        """The expiry as SageMaker's header writes it (UTC, seconds)."""
        return datetime.fromtimestamp(self.expires_at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def new_session_header(self) -> str:
        """The ``X-Amzn-SageMaker-New-Session-Id`` value: ``<id>; Expires=<UTC>``."""
        return f"{self.session_id}; Expires={self.expires_iso}"


def is_session_id(value: str) -> bool:
    """Whether ``value`` has the form SageMaker accepts for a session id."""
    return len(value) <= SESSION_ID_MAX_LENGTH and SESSION_ID_PATTERN.match(value) is not None


class SessionTable:
    """The ids this instance issued, each until its expiry; at most ``max_sessions`` (the
    oldest goes first when full — its conversation then simply loses affinity)."""

    def __init__(self, *, ttl_s: float, max_sessions: int,
                 clock: Callable[[], float] = time.time,
                 new_id: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        if ttl_s <= 0 or max_sessions < 1:
            raise ValueError(f"ttl_s must be > 0 and max_sessions >= 1, got {ttl_s}, "
                             f"{max_sessions}")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._new_id = new_id
        self._expiry: OrderedDict[str, float] = OrderedDict()
        self.opened_total = 0

    def __len__(self) -> int:
        return len(self._expiry)

    def open(self) -> Session:
        """Issue a new session (expired ones are forgotten first)."""
        now = self._clock()
        self._forget_expired(now)
        while len(self._expiry) >= self.max_sessions:
            self._expiry.popitem(last=False)
        session = Session(self._new_id(), now + self.ttl_s)
        self._expiry[session.session_id] = session.expires_at
        self.opened_total += 1
        return session

    def state(self, session_id: str) -> SessionState:
        """What ``session_id`` is on this instance now."""
        expires_at = self._expiry.get(session_id)
        if expires_at is None:
            return SessionState.UNKNOWN
        if expires_at <= self._clock():
            return SessionState.EXPIRED
        return SessionState.ACTIVE

    def close(self, session_id: str) -> bool:
        """Forget ``session_id``; whether this instance held it (expired or not)."""
        return self._expiry.pop(session_id, None) is not None

    def _forget_expired(self, now: float) -> None:
        # Sessions have one TTL, so the table is in expiry order: drop from the front.
        while self._expiry:
            oldest = next(iter(self._expiry.values()))
            if oldest > now:
                return
            self._expiry.popitem(last=False)
