-- Shared by the idempotency record scripts, after prelude.lua.
-- KEYS = {record hash, waiters zset, lease index zset, token counter};
-- ARGV[1] = now ('' = Redis TIME), ARGV[2] = the record id (its member in the index).
local REC, WAIT, LEASES, TOKENS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[2]

local function get(f) return redis.call('HGET', REC, f) end

local now = clock(ARGV[1])

local function keep(ttl_s)
  local ms = math.ceil(tonumber(ttl_s) * 1000)
  redis.call('PEXPIRE', REC, ms)
  if redis.call('EXISTS', WAIT) == 1 then redis.call('PEXPIRE', WAIT, ms) end
end

local function hold(until_)
  redis.call('HSET', REC, 'lease_until', fmt(until_), 'updated_at', fmt(now))
  redis.call('ZADD', LEASES, fmt(until_), id)
end

-- whether (owner, token) still holds the call: the fencing check
local function holds(owner, token)
  return get('state') == 'in_progress' and owner ~= '' and get('owner') == owner
    and get('token') == token
end

local function fenced()
  if redis.call('EXISTS', REC) == 1 then redis.call('HINCRBY', REC, 'fenced', 1) end
  return {'fenced', {}}
end
