"""The Lua scripts of the shared budget (run atomically by Redis, on Redis's clock).

One hash per (app, API) holds everything: ``s`` and ``l`` are the theoretical arrival times (TAT) of the
short (per-second) and long (per-minute) GCRA windows, ``b`` is ``blocked_until`` (from a 429's
``x-ogw-ratelimit-reset``). All three are whole microseconds of Redis ``TIME``, written with ``%.0f``
(Lua's ``tostring`` keeps only 14 digits, too few for microseconds since 1970). The key expires once
every field is in the past, so idle budgets leave nothing behind.

Every script takes an optional ``now`` in microseconds as its last argument: empty means Redis ``TIME``
(always, in production); tests pass one to step time without waiting.
"""

from __future__ import annotations

# Shared prologue: `now` from the argument or the server clock, and the key's lifetime after a write.
_PROLOGUE = """
local function server_now(override)
  if override ~= nil and override ~= '' then return tonumber(override) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function keep_until(key, latest, now)
  redis.call('PEXPIRE', key, math.ceil((latest - now) / 1000) + 1000)
end
"""

# KEYS[1] budget hash; ARGV: short interval, short tolerance, long interval, long tolerance (µs), now.
# The tolerance is burst × interval for urgent requests and the ordinary burst × interval otherwise.
# Returns {1, 0, now, short TAT, long TAT} when granted (both TATs written), {0, wait µs, now} otherwise
# (nothing written): the wait is the longest of blocked_until and the two windows.
TAKE = (
    _PROLOGUE
    + """
local now = server_now(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 's', 'l', 'b')
local blocked = tonumber(state[3]) or 0
local short_tat = math.max(tonumber(state[1]) or 0, now) + tonumber(ARGV[1])
local long_tat = math.max(tonumber(state[2]) or 0, now) + tonumber(ARGV[3])
local wait = math.max(blocked - now, short_tat - tonumber(ARGV[2]) - now, long_tat - tonumber(ARGV[4]) - now)
if wait > 0 then
  return {0, math.ceil(wait), now}
end
local s = string.format('%.0f', short_tat)
local l = string.format('%.0f', long_tat)
redis.call('HSET', KEYS[1], 's', s, 'l', l)
keep_until(KEYS[1], math.max(short_tat, long_tat, blocked), now)
return {1, 0, now, s, l}
"""
)

# KEYS[1] budget hash; ARGV: pause µs, now. blocked_until = max(current, now + pause); returns the
# remaining pause in µs.
PAUSE = (
    _PROLOGUE
    + """
local now = server_now(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 's', 'l', 'b')
local blocked = math.max(tonumber(state[3]) or 0, now + tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'b', string.format('%.0f', blocked))
keep_until(KEYS[1], math.max(blocked, tonumber(state[1]) or 0, tonumber(state[2]) or 0), now)
return blocked - now
"""
)

# KEYS[1] budget hash; ARGV: the short and long TATs the grant wrote, short interval, long interval.
# Undoes that grant only while it is still the newest (compare-and-set): after another grant, taking
# one interval off would also credit the time that passed in between, which the GCRA already forgave.
# Returns 1 when refunded, 0 when not.
REFUND = """
local state = redis.call('HMGET', KEYS[1], 's', 'l')
if state[1] ~= ARGV[1] or state[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1],
  's', string.format('%.0f', tonumber(ARGV[1]) - tonumber(ARGV[3])),
  'l', string.format('%.0f', tonumber(ARGV[2]) - tonumber(ARGV[4])))
return 1
"""
