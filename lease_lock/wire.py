"""Constants of the "project locks" wire protocol, shared by the server and the HTTP client.

Everything here is a fact about the protocol, not about either end: the header names, the key
and TTL rules, the error codes and the takeover grace. Keeping them in one place makes the two
ends of the project agree by construction. It lives below both ends (``lease_lock.server`` and
``lease_lock.backends.http``), so that importing the client never loads the server.
"""

from __future__ import annotations

import re

__all__ = [
    "HEADER_ADOPT",
    "HEADER_EXPIRES_IN",
    "HEADER_OWNER",
    "HEADER_PREFER",
    "HEADER_PREFERENCE_APPLIED",
    "HEADER_RELEASED",
    "HEADER_REQUEST_ID",
    "HEADER_TOKEN",
    "HEADER_WAIT",
    "HEADER_WAITED",
    "HEADER_WAIT_STEP",
    "KEY_PATTERN",
    "MAX_LIFETIME",
    "MAX_TTL",
    "MIN_TTL",
    "RENEW_MARGIN",
    "TAKEOVER_GRACE",
    "wait_text",
]

#: The ownership token of acquire, renew and release (a UUID in any form ``uuid.UUID`` reads).
HEADER_TOKEN = "X-Volcano-Lock-Token"  # noqa: S105 - a header name, not a secret
#: An optional request id (a UUID) used for logs, never for deduplication.
HEADER_REQUEST_ID = "X-Volcano-Request-Id"
#: Extension: the owner label stored with a grant (percent-encoded UTF-8).
HEADER_OWNER = "X-Lease-Lock-Owner"
#: Extension: on an acquisition, the token of a claim (a UUID) that the grant replaces: the key
#: is granted when free or held by that token, as a new grant with a new fence, and refused
#: (409 ``lock_held``) when any other token holds it.
HEADER_ADOPT = "X-Lease-Lock-Adopt"
#: Extension: on release and force release, ``true`` when a lease was actually dropped.
HEADER_RELEASED = "X-Lease-Lock-Released"
#: Extension: on a held read, seconds until another token could take the key (server-measured).
HEADER_EXPIRES_IN = "X-Lease-Lock-Expires-In"

#: Extension (RFC 7240): ``wait=N`` asks the server to hold a read or an acquisition of a held
#: key until it is free or ``N`` seconds pass.
HEADER_PREFER = "Prefer"
#: The answer to a ``Prefer: wait=N`` the server honoured.
HEADER_PREFERENCE_APPLIED = "Preference-Applied"
#: Extension: on every answer of a server offering the wait extension, its longest wait (seconds).
HEADER_WAIT = "X-Lease-Lock-Wait"
#: Extension: beside ``HEADER_WAIT``, the finest wait the server honours (seconds): ``0.001``
#: from a server that takes ``wait=N.NNN``, fractions of a second (RFC 7240's own values are
#: whole seconds, and a server without this header ignores a fraction).
HEADER_WAIT_STEP = "X-Lease-Lock-Wait-Step"
#: Extension: on a grant that answers a waiting acquisition, the seconds the server held the
#: request before it tried the grant, rounded down to the millisecond (so the lease started no
#: earlier than the request's sending plus this).
HEADER_WAITED = "X-Lease-Lock-Waited"

#: Lock names the service accepts.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Shortest and longest lease on the wire, in whole seconds.
MIN_TTL = 5
MAX_TTL = 7_776_000
#: No acquisition outlives this many seconds, however often it is renewed.
MAX_LIFETIME = 7_776_000
#: After a lease's expiry nobody else may take the key for this many seconds.
TAKEOVER_GRACE = 1.0
#: A renewal must arrive more than this many seconds before the lease's expiry.
RENEW_MARGIN = 1.0


def wait_text(seconds: float) -> str:
    """``seconds`` as a ``wait=`` value, to the millisecond and without a needless fraction
    (``30``, ``0.25``)."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")
