-- Shared by every script that reads the time. ARGV[1] is the time in epoch
-- seconds from the caller's injected clock, or '' for Redis TIME.
local function fmt(x) return string.format('%.17g', x) end
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- Exactly-once for a write that may be sent again after a broken connection
-- (toolexec.layers.batch, held writes): whether write `id` is new, remembered in the sorted
-- set `key` (in the caller's hash tag) until `keep` (epoch s, the call's deadline and a
-- margin), after which no copy of it can arrive. '' = no id: always new.
local function once(key, id, keep, now)
  if id == '' then return true end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(now))
  if redis.call('ZSCORE', key, id) then return false end
  redis.call('ZADD', key, fmt(keep), id)
  local need = math.ceil((keep - now) * 1000) + 1000
  if redis.call('PTTL', key) < need then redis.call('PEXPIRE', key, need) end
  return true
end
