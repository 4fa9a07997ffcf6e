"""The Lua scripts of the Redis backend and the EVALSHA-first way they are run.

A lease is one string key holding ``<token>|<fence>|<owner>`` with a Redis expiry (``PX``), so
``PTTL <key>`` shows the lease and Redis's own clock ends it. ``<fence>`` is empty for an
unfenced grant. Tokens never contain ``|``, so ``<token>|`` is an unambiguous prefix;
the owner label is last and may contain anything.

Lua numbers are doubles and ``tostring`` prints them with 14 significant digits, which loses
the low digits of a microsecond timestamp (about 1.8e15). Every integer a script writes or
returns as text is therefore formatted with ``%.0f``, which prints a double's exact integer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

__all__ = [
    "ACQUIRE",
    "ADOPT",
    "COUNT_IN_WINDOW",
    "EXTEND",
    "FORCE_RELEASE",
    "GRANT_IF_FREE",
    "INSPECT",
    "MARK_WAITING",
    "PUSH_WAKE",
    "RELEASE",
    "Script",
]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1; run by hash first, by text when the server lacks it."""

    lua: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        # Redis names a cached script by the SHA1 of its text; computing it here means the first
        # call needs no SCRIPT LOAD round trip.
        object.__setattr__(self, "sha", hashlib.sha1(self.lua.encode()).hexdigest())  # noqa: S324

    def args(self, keys: Sequence[str], argv: Sequence[Any]) -> tuple[Any, ...]:
        """The arguments after ``EVALSHA <sha>`` / ``EVAL <lua>``: numkeys, keys, argv."""
        return (len(keys), *keys, *argv)

    def __call__(self, client: Any, keys: Sequence[str], argv: Sequence[Any]) -> Any:
        """Run on ``client`` (anything with redis-py's ``execute_command``) and return the raw reply."""
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *argv)
        except NoScriptError:
            # After a restart, a failover or SCRIPT FLUSH the cache is empty; EVAL runs the
            # script and caches it again, so later calls go back to EVALSHA.
            return client.execute_command("EVAL", self.lua, *self.args(keys, argv))


# Every script that writes after reading TIME asks for effects replication first; Redis 5 and
# later do that anyway, Redis 3.2 and 4 need it or they refuse the write.
_EFFECTS = "if redis.replicate_commands then redis.replicate_commands() end\n"

# Takes the next fence of KEYS[2] (counter lifetime ARGV[5] ms) into the Lua local ``fence``.
_TAKE_FENCE = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
local stored = redis.call('GET', KEYS[2]) or '0'
-- Only a counter may be read as one: anything else (a lease written under the counter's
-- name through the bare backend API) must not be overwritten, so fail loudly instead.
if not string.match(stored, '^%d+$') then
  return redis.error_reply('lease_lock: fence counter ' .. KEYS[2] .. ' holds a non-counter value')
end
local last = tonumber(stored)
-- At least the server time: the fence keeps rising after the counter is lost.
fence = string.format('%.0f', math.max(micros, last + 1))
redis.call('SET', KEYS[2], fence, 'PX', ARGV[5])
"""

# Reads the lease of KEYS[1] into the Lua locals ``current`` (its value or false) and ``mine``
# (this token's "<token>|" prefix).
_READ_LEASE = """
local current = redis.call('GET', KEYS[1])
local mine = ARGV[1]
"""

# An attempt that answers a wake (ARGV[6] "1") ends it: the last KEYS entry is the key's waiting
# marker, whose field ``o`` says until when a wake is outstanding (see _ANNOUNCE). A loss (the
# key held by another token) ends it too unless ARGV[7] (milliseconds, "0" for none) keeps the
# waiter's turn: the wake then stays outstanding that long, while the loser tries again on its
# own (see TURN_RETRY_MS in _watch). Needs the locals of _READ_LEASE.
_ANSWER_WAKE = """
-- Only a hash is a marker: a lease written under its name through the bare backend API is
-- left alone.
if ARGV[6] == '1' and redis.call('TYPE', KEYS[#KEYS]).ok == 'hash' then
  local kept = tonumber(ARGV[7] or '0')
  if kept > 0 and current and string.sub(current, 1, #mine) ~= mine then
    local now = redis.call('TIME')
    local millis = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('HSET', KEYS[#KEYS], 'o', string.format('%.0f', millis + kept))
  else
    redis.call('HDEL', KEYS[#KEYS], 'o')
  end
end
"""

#: KEYS[1] lease key, KEYS[2] fence counter (same hash slot; only when fenced), and last the
#: key's waiting marker when ARGV[6] is "1".
#: ARGV[1] "<token>|", ARGV[2] lease in ms, ARGV[3] owner, ARGV[4] "1" to fence,
#: ARGV[5] counter lifetime in ms, ARGV[6] "1" when this attempt answers a wake (see RELEASE),
#: ARGV[7] with it: how many ms the waiter's turn is kept if it loses ("0": none).
#: Returns nil when another token holds the key, else the fence as text ("" when unfenced).
#: A repeated acquire by the holding token keeps its fence and sets a new lease.
ACQUIRE = Script(
    _EFFECTS
    + _READ_LEASE
    + _ANSWER_WAKE
    + """
local fence = ''
if current then
  if string.sub(current, 1, #mine) ~= mine then
    return false
  end
  local rest = string.sub(current, #mine + 1)
  local bar = string.find(rest, '|', 1, true)
  if not bar then
    return false
  end
  fence = string.sub(rest, 1, bar - 1)
end
if fence == '' and ARGV[4] == '1' then
"""
    + _TAKE_FENCE
    + """
end
redis.call('SET', KEYS[1], mine .. fence .. '|' .. ARGV[3], 'PX', ARGV[2])
return fence
"""
)

#: The same keys and ARGV as ACQUIRE (ARGV[4] is ignored: always fenced; the lock service's
#: waiting requests keep no turn, so ARGV[7] is "0").
#: Grants only a key no lease holds, this token's included. Returns the fence as text on a
#: grant, else what INSPECT returns for the key (read in the same atomic step).
GRANT_IF_FREE = Script(
    _EFFECTS
    + _READ_LEASE
    + _ANSWER_WAKE
    + """
if current then
  local now = redis.call('TIME')
  return {current, redis.call('PTTL', KEYS[1]), now[1], now[2]}
end
local fence = ''
"""
    + _TAKE_FENCE
    + """
redis.call('SET', KEYS[1], mine .. fence .. '|' .. ARGV[3], 'PX', ARGV[2])
return fence
"""
)

#: KEYS[1] lease key. ARGV[1] "<token>|", ARGV[2] lease in ms.
#: Returns 1 when the token held the key and its lease was replaced, else 0.
EXTEND = Script(
    """
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
)

# The announcement of a release: a pub/sub message for every watcher and, when some process
# waits for the key (its waiting marker KEYS[2] exists), one wake on the key's wake list KEYS[3]
# for the one watcher that has waited longest (a wake nobody took is replaced, not added to).
# A wake is outstanding until the time in the marker's field ``o`` (server ms): from its push
# for OUTSTANDING_MS at most, until the woken process's attempt at the key answers it (ACQUIRE
# with ARGV[6]), which clears it or, on a loss that keeps the waiter's turn, moves it to the
# end of that turn. Meanwhile further releases push no wake, since a woken waiter is about to
# try anyway. Without that, a holder that releases and re-takes at once would wake a waiter on
# every cycle, only for each woken attempt to fail. (A field further ahead than OUTSTANDING_MS
# is not believed: a server clock stepped back must not silence the wakes.)
_ANNOUNCE = (
    _EFFECTS
    + """
local function announce(channel, message, wake_ms, outstanding_ms)
  redis.call('PUBLISH', channel, message)
  -- Only a hash is a marker and only a list a wake list: a lease written under either name
  -- through the bare backend API is neither read nor replaced (its waiters poll instead).
  if redis.call('TYPE', KEYS[2]).ok == 'hash' then
    local wakes = redis.call('TYPE', KEYS[3]).ok
    if wakes ~= 'list' and wakes ~= 'none' then
      return
    end
    local now = redis.call('TIME')
    local millis = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    local due = tonumber(redis.call('HGET', KEYS[2], 'o') or '')
    if due and millis < due and due - millis <= tonumber(outstanding_ms) then
      return
    end
    redis.call('HSET', KEYS[2], 'o', string.format('%.0f', millis + tonumber(outstanding_ms)))
    redis.call('DEL', KEYS[3])
    redis.call('LPUSH', KEYS[3], '1')
    redis.call('PEXPIRE', KEYS[3], wake_ms)
  end
end
"""
)

#: KEYS[1] lease key, KEYS[2] its waiting marker, KEYS[3] its wake list. ARGV[1] "<token>|",
#: ARGV[2] channel, ARGV[3] message (the key), ARGV[4] wake lifetime in ms, ARGV[5] how long
#: a pushed wake stays outstanding at most, in ms.
#: Returns 1 when the token held the key and it was deleted (and announced), else 0.
RELEASE = Script(
    _ANNOUNCE
    + """
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  announce(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  return 1
end
return 0
"""
)

#: KEYS as for RELEASE. ARGV[1] channel, ARGV[2] message (the key), ARGV[3] wake lifetime in
#: ms, ARGV[4] how long a pushed wake stays outstanding at most, in ms.
#: Returns 1 when a live lease was deleted (and announced), else 0.
FORCE_RELEASE = Script(
    _ANNOUNCE
    + """
if redis.call('DEL', KEYS[1]) == 1 then
  announce(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
  return 1
end
return 0
"""
)

#: KEYS[1] lease key. No ARGV.
#: Returns {value or nil, PTTL in ms, server seconds, server microseconds}, read atomically.
INSPECT = Script(
    """
local now = redis.call('TIME')
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), now[1], now[2]}
"""
)

#: KEYS[1] counter hash {w = window index, n = count}. ARGV[1] window length in microseconds.
#: Returns {count in the current window, microseconds left in it (text)}. Windows are aligned
#: to multiples of their length on the server's clock.
COUNT_IN_WINDOW = Script(
    _EFFECTS
    + """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
local width = tonumber(ARGV[1])
local index = math.floor(micros / width)
local label = string.format('%.0f', index)
local amount = tonumber(ARGV[2] or '1')
local count = amount
if redis.call('HGET', KEYS[1], 'w') == label then
  count = redis.call('HINCRBY', KEYS[1], 'n', amount)
else
  redis.call('HSET', KEYS[1], 'w', label, 'n', amount)
end
local left = (index + 1) * width - micros
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.ceil(left / 1000) + 1000))
return {count, string.format('%.0f', left)}
"""
)

#: KEYS[1] lease key, KEYS[2] fence counter (same hash slot).
#: ARGV[1] "<token>|", ARGV[2] lease in ms, ARGV[3] owner, ARGV[4] "<claim token>|",
#: ARGV[5] counter lifetime in ms.
#: Hands the key from the claim to the token: a free key, or one the claim holds, gets a new
#: lease with a new fence; the token's own lease is renewed with its fence kept. Returns the
#: fence as text, or nil when any other token holds the key.
ADOPT = Script(
    _EFFECTS
    + _READ_LEASE
    + """
local fence = ''
if current and string.sub(current, 1, #mine) == mine then
  local rest = string.sub(current, #mine + 1)
  local bar = string.find(rest, '|', 1, true)
  local kept = bar and string.sub(rest, 1, bar - 1) or ''
  if kept ~= '' then
    redis.call('SET', KEYS[1], mine .. kept .. '|' .. ARGV[3], 'PX', ARGV[2])
    return kept
  end
elseif current and string.sub(current, 1, #ARGV[4]) ~= ARGV[4] then
  return false
end
"""
    + _TAKE_FENCE
    + """
redis.call('SET', KEYS[1], mine .. fence .. '|' .. ARGV[3], 'PX', ARGV[2])
return fence
"""
)

# The hand-off names of a key may hold a lease written through the bare backend API, which a
# watcher must neither turn into a marker or a wake list nor give a new expiry. Run with EVAL
# (in the watcher's pipelines, where no EVALSHA fallback can follow a lost script cache).
_HANDOFF_NAMES_FREE = """
local marker = redis.call('TYPE', KEYS[1]).ok
local wakes = redis.call('TYPE', KEYS[2]).ok
local free = (marker == 'hash' or marker == 'none') and (wakes == 'list' or wakes == 'none')
"""

#: KEYS[1] the key's waiting marker, KEYS[2] its wake list. ARGV[1] the marker's life in ms.
#: Sets (or refreshes) the marker; returns 1, or 0 when either name holds something else.
MARK_WAITING = Script(
    _HANDOFF_NAMES_FREE
    + """
if not free then
  return 0
end
redis.call('HSET', KEYS[1], 'w', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""
)

#: KEYS[1] the key's waiting marker, KEYS[2] its wake list. ARGV[1] the wake's life in ms.
#: Pushes a wake back; returns 1, or 0 when either name holds something else.
PUSH_WAKE = Script(
    _HANDOFF_NAMES_FREE
    + """
if not free then
  return 0
end
redis.call('LPUSH', KEYS[2], '1')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
"""
)
