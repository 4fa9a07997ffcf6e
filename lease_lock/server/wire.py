"""Constants of the "project locks" wire protocol, shared by the server and the HTTP client.

Everything here is a fact about the protocol, not about either end: the header names, the key
and TTL rules, the error codes and the takeover grace. Keeping them in one place makes the two
ends of the project agree by construction.
"""

from __future__ import annotations

import re

__all__ = [
    "HEADER_EXPIRES_IN",
    "HEADER_OWNER",
    "HEADER_RELEASED",
    "HEADER_REQUEST_ID",
    "HEADER_TOKEN",
    "KEY_PATTERN",
    "MAX_LIFETIME",
    "MAX_TTL",
    "MIN_TTL",
    "RENEW_MARGIN",
    "TAKEOVER_GRACE",
]

#: The ownership token of acquire, renew and release (a UUID in any form ``uuid.UUID`` reads).
HEADER_TOKEN = "X-Volcano-Lock-Token"  # noqa: S105 - a header name, not a secret
#: An optional request id (a UUID) used for logs, never for deduplication.
HEADER_REQUEST_ID = "X-Volcano-Request-Id"
#: Extension: the owner label stored with a grant (percent-encoded UTF-8).
HEADER_OWNER = "X-Lease-Lock-Owner"
#: Extension: on release and force release, ``true`` when a lease was actually dropped.
HEADER_RELEASED = "X-Lease-Lock-Released"
#: Extension: on a held read, seconds until another token could take the key (server-measured).
HEADER_EXPIRES_IN = "X-Lease-Lock-Expires-In"

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
