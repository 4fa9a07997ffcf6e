"""The Lua scripts of the Redis backend and the EVALSHA-first way they are run.

A lease is one string key holding ``<token>|<fence>|<owner>`` with a Redis expiry (``PX``), so
``PTTL <key>`` shows the lease and Redis's own clock ends it. ``<fence>`` is empty for an
unfenced grant. Tokens never contain ``|``, so ``<token>|`` is an unambiguous prefix;
the owner label is last and may contain anything.

A counting key (``limit`` > 1) keeps its places in a hash under the same name instead: the
field ``#limit`` holds its limit and each holder's token maps to ``<lease end>|<fence>|<owner>``
(the end in server milliseconds, from ``TIME``). The hash expires with its last lease
(``PEXPIREAT``), so it exists exactly while a place is live, and a script that finds a hash
under the key's name knows the key is held by places.

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
    "ACQUIRE_COUNTED",
    "ADOPT",
    "COUNT_IN_WINDOW",
    "EXTEND",
    "FORCE_RELEASE",
    "GRANTED_PREFIX",
    "GRANT_IF_FREE",
    "INSPECT",
    "IS_HELD_PLACE",
    "JOIN_LINE",
    "LEAVE_LINE",
    "LIMIT_HELD",
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

# ``next_fence(counter, lifetime[, now])``: the next fence of the counter key (which then lives
# ``lifetime`` ms), or nil when that name holds something other than a counter; ``now`` is the
# reply of a TIME the caller has just read (TIME is read when it is not given).
_NEXT_FENCE = """
local function next_fence(counter, lifetime, now)
  now = now or redis.call('TIME')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local stored = redis.call('GET', counter) or '0'
  -- Only a counter may be read as one: anything else (a lease written under the counter's
  -- name through the bare backend API) must not be overwritten.
  if not string.match(stored, '^%d+$') then
    return nil
  end
  -- At least the server time: the fence keeps rising after the counter is lost.
  local taken = string.format('%.0f', math.max(micros, tonumber(stored) + 1))
  redis.call('SET', counter, taken, 'PX', lifetime)
  return taken
end
"""



def _take_fence(now: str = "nil") -> str:
    """Lua that takes the next fence of KEYS[2] (counter lifetime ARGV[5] ms) into the local
    ``fence``, failing loudly when KEYS[2] is no counter; ``now`` names a TIME reply the script
    has read already. Needs _NEXT_FENCE."""
    return f"""
fence = next_fence(KEYS[2], ARGV[5], {now})
if not fence then
  return redis.error_reply('lease_lock: fence counter ' .. KEYS[2] .. ' holds a non-counter value')
end
"""


_TAKE_FENCE = _take_fence()

# ``server_millis()``: the server time in milliseconds.
_SERVER_MILLIS = """
local function server_millis()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
"""

# Reads the lease of KEYS[1] into the Lua locals ``current`` (its value, false when the key is
# free, or GET's error when the name holds no string: a counting key's places, or data of
# another type) and ``mine`` (this token's "<token>|" prefix).
_READ_LEASE = """
local current = redis.pcall('GET', KEYS[1])
local mine = ARGV[1]
"""

# An exclusive grant finds a key whose name holds a counting key's places (a hash) held; a
# name holding anything else but a string answers GET's error, as it always did. Needs the
# locals of _READ_LEASE.
_PLACES_HOLD = """
if type(current) == 'table' then
  if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    return false
  end
  return current
end
"""

# The places of a counting key KEYS[1] (a hash: "#limit" -> its limit, each holder's token ->
# "<lease end, server ms>|<fence>|<owner>"), which lives exactly as long as its last place.
_PLACES = """
-- Reads the places (``all``, the hash's HGETALL) at server time ``millis`` and drops those
-- whose lease ended. Returns the key's limit (text; nil when the name holds no counting key),
-- how many live places other than ``token``'s it has, the latest lease end among those (0
-- when none), and ``token``'s own live place (its value) or nil.
local function read_places(all, millis, token)
  local limit, others, last, own, ended = nil, 0, 0, nil, {}
  for i = 1, #all, 2 do
    local field, value = all[i], all[i + 1]
    if field == '#limit' then
      limit = value
    else
      local ends = tonumber(string.match(value, '^(%d+)|') or '')
      if not ends or ends <= millis then
        ended[#ended + 1] = field
      elseif field == token then
        own = value
      else
        others = others + 1
        last = math.max(last, ends)
      end
    end
  end
  -- Only a counting key is pruned: a hash written under a lock key's name through the bare
  -- backend API is left alone.
  if limit then
    for _, field in ipairs(ended) do
      redis.call('HDEL', KEYS[1], field)
    end
  end
  return limit, others, last, own
end

-- Whether ``all`` (a hash's HGETALL of two fields) is a counting key's limit and ``token``'s
-- place alone: that place is then live, since the key lives exactly as long as its last place.
local function sole_place(all, token)
  return (all[1] == '#limit' and all[3] == token) or (all[1] == token and all[3] == '#limit')
end

-- The key ends with its last place: its expiry moves to ``last`` (server ms), or the key goes
-- when no place is left (``last`` is 0). Returns true when it went.
local function settle_places(last)
  if last == 0 then
    redis.call('DEL', KEYS[1])
    return true
  end
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', last))
  return false
end
"""

# ``answer_wake(lost)``: an attempt that answers a wake (ARGV[6] "1") ends it: the last KEYS
# entry is the key's waiting marker, whose field ``o`` says until when a wake is outstanding
# (see _ANNOUNCE). A loss (``lost``: the key held by another token) ends it too unless ARGV[7]
# (milliseconds, "0" for none) keeps the waiter's turn: the wake then stays outstanding that
# long, while the loser tries again on its own (see TURN_RETRY_MS in _watch). Needs
# _SERVER_MILLIS.
_ANSWER_WAKE_FN = """
local function answer_wake(lost)
  -- Only a hash is a marker: a lease written under its name through the bare backend API is
  -- left alone.
  if ARGV[6] == '1' and redis.call('TYPE', KEYS[#KEYS]).ok == 'hash' then
    local kept = tonumber(ARGV[7] or '0')
    if kept > 0 and lost then
      redis.call('HSET', KEYS[#KEYS], 'o', string.format('%.0f', server_millis() + kept))
    else
      redis.call('HDEL', KEYS[#KEYS], 'o')
    end
  end
end
"""

# The exclusive attempt's answer to a wake. Needs the locals of _READ_LEASE (a string or false).
_ANSWER_WAKE = (
    _SERVER_MILLIS
    + _ANSWER_WAKE_FN
    + """
if ARGV[6] == '1' then
  answer_wake(current and string.sub(current, 1, #mine) ~= mine)
end
"""
)

# Grants KEYS[1] to the token (ARGV[1] "<token>|") when it is free or the token's own, keeping
# the fence of a lease the token holds; returns false when another token holds it. Needs the
# locals of _READ_LEASE and _NEXT_FENCE.
_GRANT = (
    """
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

#: KEYS[1] lease key, KEYS[2] fence counter (same hash slot; only when fenced), and last the
#: key's waiting marker when ARGV[6] is "1".
#: ARGV[1] "<token>|", ARGV[2] lease in ms, ARGV[3] owner, ARGV[4] "1" to fence,
#: ARGV[5] counter lifetime in ms, ARGV[6] "1" when this attempt answers a wake (see RELEASE),
#: ARGV[7] with it: how many ms the waiter's turn is kept if it loses ("0": none).
#: Returns nil when another token holds the key, else the fence as text ("" when unfenced).
#: A repeated acquire by the holding token keeps its fence and sets a new lease.
ACQUIRE = Script(_EFFECTS + _NEXT_FENCE + _READ_LEASE + _PLACES_HOLD + _ANSWER_WAKE + _GRANT)

# ``state(listing)``: what INSPECT answers for KEYS[1]: {its lease (or nil), PTTL in ms, server
# seconds, server microseconds}; for a counting key its places (HGETALL) stand for the lease.
# A name holding another type answers GET's error, or nil when ``listing``.
_STATE = """
local function state(listing)
  local now = redis.call('TIME')
  local kind = redis.call('TYPE', KEYS[1]).ok
  local value = false
  if kind == 'hash' then
    value = redis.call('HGETALL', KEYS[1])
  elseif kind == 'string' or not listing then
    value = redis.call('GET', KEYS[1])
  end
  return {value, redis.call('PTTL', KEYS[1]), now[1], now[2]}
end
"""

#: The error a counting grant answers when the live holders have another limit: this, a space
#: and their limit (1 for an exclusive holder).
LIMIT_HELD = "LIMIT"

#: KEYS[1] the counting key, KEYS[2] its fence counter (same hash slot), and last the key's
#: waiting marker when ARGV[6] is "1".
#: ARGV[1] "<token>|", ARGV[2] lease in ms, ARGV[3] owner, ARGV[4] the limit, ARGV[5] counter
#: lifetime in ms, ARGV[6] "1" when this attempt answers a wake, ARGV[7] with it: how many ms
#: the waiter's turn is kept if it loses ("0": none).
#: Drops the places whose lease ended, then renews the token's own place (its fence kept) or
#: grants a new place with a fence from the key's counter while fewer than the limit are live.
#: Returns the fence as text; nil when every place is taken; the error LIMIT_HELD when the live
#: holders have another limit (nothing written).
ACQUIRE_COUNTED = Script(
    _EFFECTS
    + _NEXT_FENCE
    + _SERVER_MILLIS
    + _ANSWER_WAKE_FN
    + _PLACES
    + """
local all = redis.pcall('HGETALL', KEYS[1])
if all.err then
  -- No hash: an exclusive holder's lease (a string), else data of another type.
  if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
    return all
  end
  answer_wake(false)
  return redis.error_reply('"""
    + LIMIT_HELD
    + """ 1')
end
local now = redis.call('TIME')
local millis = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local token = string.sub(ARGV[1], 1, -2)
local limit, others, last, own = read_places(all, millis, token)
if not limit and #all > 0 then
  return redis.error_reply('lease_lock: ' .. KEYS[1] .. ' holds a hash that is no counting key')
end
local live = others + (own and 1 or 0)
if live > 0 and limit ~= ARGV[4] then
  answer_wake(false)
  return redis.error_reply('"""
    + LIMIT_HELD
    + """ ' .. limit)
end
local fence
if own then
  fence = string.match(own, '^%d+|(%d*)|')
elseif live < tonumber(ARGV[4]) then
"""
    + _take_fence("now")
    + """
else
  answer_wake(true)
  return false
end
local ends = millis + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], token, string.format('%.0f', ends) .. '|' .. fence .. '|' .. ARGV[3], '#limit', ARGV[4])
settle_places(math.max(last, ends))
answer_wake(false)
return fence
"""
)

#: The same keys and ARGV as ACQUIRE (ARGV[4] is ignored: always fenced; the lock service's
#: waiting requests keep no turn, so ARGV[7] is "0").
#: Grants only a key no lease holds, this token's included. Returns the fence as text on a
#: grant, else what INSPECT returns for the key (read in the same atomic step).
GRANT_IF_FREE = Script(
    _EFFECTS
    + _NEXT_FENCE
    + _STATE
    + _READ_LEASE
    + """
if type(current) == 'table' then
  return state(false)
end
"""
    + _ANSWER_WAKE
    + """
if current then
  return state(false)
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
#: Returns 1 when the token held the key (or a place of the counting key) and its lease was
#: replaced, else 0.
EXTEND = Script(
    _SERVER_MILLIS
    + _PLACES
    + """
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  -- A counting key's places (another type fails in HGETALL, as in GET): the token's own
  -- place gets the new lease. Effects replication comes before the first write after TIME.
  if redis.replicate_commands then redis.replicate_commands() end
  local millis = server_millis()
  local token = string.sub(ARGV[1], 1, -2)
  local all = redis.call('HGETALL', KEYS[1])
  local limit, others, last, own = read_places(all, millis, token)
  if not (limit and own) then
    return 0
  end
  local ends = millis + tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], token, string.format('%.0f', ends) .. string.match(own, '^%d+(|.*)$'))
  settle_places(math.max(last, ends))
  return 1
end
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

#: The prefix of each waiting thread's own grant list (see _HAND_ON).
GRANTED_PREFIX = "lease_lock:granted:"

# What a release does for the waiters in the key's line (see JOIN_LINE): KEYS[4] the key's
# fence counter, KEYS[5] its line (a list of waiting tokens, oldest first), KEYS[6] their
# entries (a hash: token -> "<fresh until, server ms>|<claim ms>|<1 to fence, else 0>|<burst
# ms>|<owner>", the field "!": the server ms before which no release hands the key over, and
# the field "?": the value of "!" whose waiter was told of a release, see below).
# Entries gone stale (not refreshed in time: the waiter died, stopped or left) are dropped on
# the way to the first fresh one, and the release hands that waiter the key: for its claim
# window, with a fence from the counter, the fence pushed onto its grant list (GRANTED_PREFIX +
# token) where the waiter is blocked in BLPOP. The waiter wakes holding the key, and extends the
# claim to a full lease from there, or the claim lapses. Returns true; announce() is then not
# needed. The new holder then keeps the key through its releases for its burst: until "!", a
# release leaves the key free (false), so a holder that releases and takes the key straight
# back is not interrupted at every release by a hand-over, each of which costs a waiter's
# wake-up. The first such release of a burst tells the waiter at the head of the line instead
# (tell_free): it asks for the key itself when the burst ends, and so a holder that does not
# take the key back leaves it idle for the rest of its burst only.
_HAND_ON = (
    _NEXT_FENCE
    + _SERVER_MILLIS
    + """
-- The first waiter in line whose entry is fresh, then its claim ms, '1' when fenced, burst ms
-- and owner; nil when there is none. Stale entries met on the way are dropped.
local function next_waiter(millis)
  while true do
    local waiter = redis.call('LINDEX', KEYS[5], 0)
    if not waiter then
      return nil
    end
    local entry = redis.call('HGET', KEYS[6], waiter)
    local fresh, claim, fenced, burst, owner
    if entry then
      fresh, claim, fenced, burst, owner = string.match(entry, '^(%d+)|(%d+)|([01])|(%d+)|(.*)$')
    end
    if fresh and tonumber(fresh) > millis then
      return waiter, claim, fenced, burst, owner
    end
    redis.call('LPOP', KEYS[5])
    redis.call('HDEL', KEYS[6], waiter)
  end
end

-- Tells a waiter blocked on its grant list that the key is free, and in how many ms the
-- current burst ends ("!<ms>"): it asks for the key itself then. A grant or word already on
-- the list wakes it anyway.
local function tell_free(waiter, claim, left)
  local granted = '"""
    + GRANTED_PREFIX
    + """' .. waiter
  if redis.call('LLEN', granted) == 0 then
    redis.call('RPUSH', granted, '!' .. string.format('%.0f', math.max(0, left)))
    redis.call('PEXPIRE', granted, claim)
  end
end

local function hand_on(lifetime)
  if redis.call('TYPE', KEYS[5]).ok ~= 'list' or redis.call('TYPE', KEYS[6]).ok ~= 'hash' then
    return false
  end
  local millis = server_millis()
  local waiter, claim, fenced, burst, owner = next_waiter(millis)
  if not waiter then
    return false
  end
  local burst_end = redis.call('HGET', KEYS[6], '!')
  if burst_end and millis < tonumber(burst_end) then
    if redis.call('HGET', KEYS[6], '?') ~= burst_end then
      redis.call('HSET', KEYS[6], '?', burst_end)
      tell_free(waiter, claim, tonumber(burst_end) - millis)
    end
    return false
  end
  local fence = ''
  if fenced == '1' then
    fence = next_fence(KEYS[4], lifetime)
    if not fence then
      return false  -- no fence can be taken: the waiter asks for the key itself (and fails)
    end
  end
  redis.call('LPOP', KEYS[5])
  redis.call('HDEL', KEYS[6], waiter)
  redis.call('HSET', KEYS[6], '!', string.format('%.0f', millis + tonumber(burst)))
  redis.call('SET', KEYS[1], waiter .. '|' .. fence .. '|' .. owner, 'PX', claim)
  local granted = '"""
    + GRANTED_PREFIX
    + """' .. waiter
  redis.call('DEL', granted)
  redis.call('RPUSH', granted, fence)
  redis.call('PEXPIRE', granted, claim)
  return true
end
"""
)

# Deletes KEYS[1] when the token (ARGV[1] "<token>|") holds it, then hands it over or announces
# the release (see _HAND_ON and _ANNOUNCE, with the keys and ARGV of RELEASE); returns 1, else 0.
# For a counting key, the token's own place goes instead: its release is announced as a key's
# is, and the release of the last place hands the key on as well. Needs _PLACES.
_RELEASE_IF_HELD = """
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  -- A counting key's places (another type fails in HGETALL, as in GET).
  local token = string.sub(ARGV[1], 1, -2)
  local all = redis.call('HGETALL', KEYS[1])
  local last = 0
  if not (#all == 4 and sole_place(all, token)) then
    local limit, others, own
    limit, others, last, own = read_places(all, server_millis(), token)
    if not (limit and own) then
      return 0
    end
    if others > 0 then
      redis.call('HDEL', KEYS[1], token)
    end
  end
  if not settle_places(last) or not hand_on(ARGV[6]) then
    announce(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  end
  return 1
end
if current and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if not hand_on(ARGV[6]) then
    announce(ARGV[2], ARGV[3], ARGV[4], ARGV[5])
  end
  return 1
end
return 0
"""

#: KEYS[1] lease key, KEYS[2] its waiting marker, KEYS[3] its wake list, KEYS[4] its fence
#: counter, KEYS[5] its line, KEYS[6] the line's entries (all in the key's hash slot).
#: ARGV[1] "<token>|", ARGV[2] channel, ARGV[3] message (the key), ARGV[4] wake lifetime in ms,
#: ARGV[5] how long a pushed wake stays outstanding at most, in ms, ARGV[6] fence counter
#: lifetime in ms.
#: Returns 1 when the token held the key and it was deleted (and handed over to the first live
#: waiter in line, or else announced), else 0.
RELEASE = Script(_ANNOUNCE + _HAND_ON + _PLACES + _RELEASE_IF_HELD)

#: KEYS as for RELEASE. ARGV[1] channel, ARGV[2] message (the key), ARGV[3] wake lifetime in
#: ms, ARGV[4] how long a pushed wake stays outstanding at most, in ms, ARGV[5] fence counter
#: lifetime in ms.
#: Returns 1 when a live lease (or every place of a counting key) was deleted (and handed over
#: or announced), else 0.
FORCE_RELEASE = Script(
    _ANNOUNCE
    + _HAND_ON
    + """
if redis.call('DEL', KEYS[1]) == 1 then
  if not hand_on(ARGV[5]) then
    announce(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
  end
  return 1
end
return 0
"""
)

#: KEYS[1] lease key, KEYS[2] fence counter, KEYS[3] the key's line, KEYS[4] the line's
#: entries, KEYS[5] this waiter's grant list. ARGV[1] to ARGV[5] as for ACQUIRE, ARGV[6] the
#: claim window in ms, ARGV[7] how long the entry stays fresh in ms, ARGV[8] the token, ARGV[9]
#: the burst in ms that a release handing this waiter the key gives it (see _HAND_ON).
#: A waiting thread's attempt: the key is granted as by ACQUIRE when it is free or the token's
#: own (the token then leaves the line: a release may have handed it the key meanwhile);
#: when another token holds it, the token takes a place at the end of the line or, already in
#: it, keeps its place and refreshes its entry. Returns the fence as text on a grant; else nil,
#: or for the head of the line while a holder's burst runs the milliseconds it has left.
JOIN_LINE = Script(
    _EFFECTS
    + _NEXT_FENCE
    + _READ_LEASE
    + _PLACES_HOLD
    + """
local line_ok = redis.call('TYPE', KEYS[3]).ok
local entries_ok = redis.call('TYPE', KEYS[4]).ok
line_ok = line_ok == 'list' or line_ok == 'none'
entries_ok = entries_ok == 'hash' or entries_ok == 'none'
if current and string.sub(current, 1, #mine) ~= mine then
  -- Only a list is a line and only a hash its entries: a lease written under either name
  -- through the bare backend API is left alone (this waiter then polls).
  if line_ok and entries_ok then
    local now = redis.call('TIME')
    local millis = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    local fresh = string.format('%.0f', millis + tonumber(ARGV[7]))
    local entry = table.concat({fresh, ARGV[6], ARGV[4], ARGV[9], ARGV[3]}, '|')
    if redis.call('HSET', KEYS[4], ARGV[8], entry) == 1 then
      redis.call('RPUSH', KEYS[3], ARGV[8])
    end
    local life = tonumber(ARGV[7]) + tonumber(ARGV[6])
    redis.call('PEXPIRE', KEYS[3], life)
    redis.call('PEXPIRE', KEYS[4], life)
    -- The head of the line learns how long the holder's burst still runs (see _HAND_ON): it
    -- asks for the key itself when the burst ends, as no release hands it over before then.
    if redis.call('LINDEX', KEYS[3], 0) == ARGV[8] then
      local burst_end = tonumber(redis.call('HGET', KEYS[4], '!') or '0')
      if burst_end > millis then
        return burst_end - millis
      end
    end
  end
  return false
end
if line_ok and entries_ok then
  redis.call('HDEL', KEYS[4], ARGV[8])
  redis.call('LREM', KEYS[3], 0, ARGV[8])
end
redis.call('DEL', KEYS[5])
"""
    + _GRANT
)

#: KEYS as for RELEASE, then KEYS[7] this waiter's grant list. ARGV as for RELEASE, then
#: ARGV[7] the token.
#: A waiting thread that leaves without the key takes its entry out of the line; a grant that a
#: release handed it meanwhile is released as by RELEASE (handed on, or announced), with no
#: burst of its own in the way. When the key is free, the waiter now at the head of the line is
#: told (the leaving one may have been told of a release inside a burst, see _HAND_ON). Returns
#: 1 when such a grant was released, else 0.
LEAVE_LINE = Script(
    _ANNOUNCE
    + _HAND_ON
    + _PLACES
    + """
if redis.call('TYPE', KEYS[5]).ok == 'list' and redis.call('TYPE', KEYS[6]).ok == 'hash' then
  redis.call('HDEL', KEYS[6], ARGV[7])
  redis.call('LREM', KEYS[5], 0, ARGV[7])
  -- A key handed to this waiter goes on at once: the burst it came with (see _HAND_ON) is for
  -- a holder that takes the key back, and this one leaves without using it.
  -- (A counting key's places, read as an error here, hold the key for other tokens.)
  local held = redis.pcall('GET', KEYS[1])
  if type(held) == 'string' and string.sub(held, 1, #ARGV[1]) == ARGV[1] then
    redis.call('HDEL', KEYS[6], '!')
  elseif not held then
    local millis = server_millis()
    local waiter, claim = next_waiter(millis)
    if waiter then
      tell_free(waiter, claim, tonumber(redis.call('HGET', KEYS[6], '!') or '0') - millis)
    end
  end
end
redis.call('DEL', KEYS[7])
"""
    + _RELEASE_IF_HELD
)

#: KEYS[1] lease key. ARGV[1] "1" when listing (a name holding neither a lease nor places then
#: reads as free), else "0".
#: Returns {value or nil, PTTL in ms, server seconds, server microseconds}, read atomically;
#: for a counting key, its hash's fields and values (flat) stand for the value.
INSPECT = Script(_STATE + "return state(ARGV[1] == '1')\n")

#: KEYS[1] a key whose name holds no string (is_held's GET was refused). ARGV[1] the token.
#: Returns 1 when the token holds a live place of the counting key, else 0 (GET's error for a
#: name holding neither a string nor a hash).
IS_HELD_PLACE = Script(
    _SERVER_MILLIS
    + """
local place = redis.call('HGET', KEYS[1], ARGV[1])
local ends = place and tonumber(string.match(place, '^(%d+)|') or '')
if ends and ends > server_millis() and redis.call('HEXISTS', KEYS[1], '#limit') == 1 then
  return 1
end
return 0
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
    + _NEXT_FENCE
    + _READ_LEASE
    + _PLACES_HOLD
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
