-- One consumer's take from a queue with lanes (toolexec.lanes): atomic, so a call is
-- always in exactly one of the queue, a lane, the consumer's inbox or kombu's unacked
-- record (the inbox is emptied by the MULTI that writes that record).
--
-- KEYS: 1 queue, 2 inbox, 3 weights, 4 caps, 5 vclock, 6 parked, 7..11 ready:1..5
-- ARGV: 1 now ('' = Redis TIME), 2 how many queued messages to sort into lanes at most,
--       3 a message to put back at the queue's head first ('' none: the one a BLMOVE
--       took that carries a lane), 4 lane prefix, 5 in-flight prefix, 6 lease (s)
-- Returns {message or false, priority, key, delivery tag counted in flight ('' none),
--          '1' when lanes still hold calls (the consumer keeps taking through here)}.
local Q, INBOX, WEIGHTS, CAPS, VCLOCK, PARKED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = clock(ARGV[1])
local batch = tonumber(ARGV[2])
local requeue = ARGV[3]
local lane_prefix, inflight_prefix = ARGV[4], ARGV[5]
local lease = tonumber(ARGV[6])
local MARK = '"toolexec_lane"'

local function ready(p) return KEYS[6 + p] end
local function lane(p, k) return lane_prefix .. p .. ':' .. k end
local function vclock(p) return tonumber(redis.call('HGET', VCLOCK, p) or '0') or 0 end

-- The lane a message's header names; the default lane (3, '') for anything else.
-- A header can only match where it is a real key: inside a JSON string a quote is \".
local function lane_of(item)
  local p, k = string.match(item, '"toolexec_lane":%s*"([1-5])|([%w%._:@%-]*)"')
  if p == nil or #k > 64 then return 3, '' end
  return tonumber(p), k
end

local function cap_of(k)
  if k == '' then return 0 end
  return tonumber(redis.call('HGET', CAPS, k) or '0') or 0
end

local function full(k, cap)
  if cap <= 0 then return false end
  local f = inflight_prefix .. k
  redis.call('ZREMRANGEBYSCORE', f, '-inf', fmt(now))
  return redis.call('ZCARD', f) >= cap
end

local function active()
  if redis.call('ZCARD', PARKED) > 0 then return true end
  for p = 1, 5 do
    if redis.call('ZCARD', ready(p)) > 0 then return true end
  end
  return false
end

local function ingest(n)
  for _ = 1, n do
    local item = redis.call('RPOP', Q)
    if not item then return end
    local p, k = lane_of(item)
    redis.call('LPUSH', lane(p, k), item)
    if not redis.call('ZSCORE', PARKED, p .. '|' .. k) then
      redis.call('ZADD', ready(p), 'NX', fmt(vclock(p)), k)
    end
  end
end

-- Lanes at their key's cap go back to their ready set once a call of the key ended.
local function unpark()
  local members = redis.call('ZRANGE', PARKED, 0, 31, 'WITHSCORES')
  for i = 1, #members, 2 do
    local p, k = string.match(members[i], '^(%d)|(.*)$')
    if p ~= nil and not full(k, cap_of(k)) then
      redis.call('ZREM', PARKED, members[i])
      if redis.call('LLEN', lane(p, k)) > 0 then
        local at = math.max(tonumber(members[i + 1]), vclock(p))
        redis.call('ZADD', ready(tonumber(p)), fmt(at), k)
      end
    end
  end
end

local function take(p, k, vt, cap)
  local l = lane(p, k)
  local item = redis.call('RPOP', l)
  redis.call('LPUSH', INBOX, item)
  redis.call('HSET', VCLOCK, p, fmt(vt))
  local w = tonumber(redis.call('HGET', WEIGHTS, k) or '1') or 1
  if w <= 0 then w = 1 end
  if redis.call('LLEN', l) > 0 then
    redis.call('ZADD', ready(p), fmt(vt + 1 / w), k)
  else
    redis.call('ZREM', ready(p), k)
  end
  local tag = ''
  if cap > 0 then
    tag = string.match(item, '"delivery_tag":%s*"([^"]+)"') or ''
    if tag ~= '' then
      redis.call('ZADD', inflight_prefix .. k, fmt(now + lease), tag)
      redis.call('PEXPIRE', inflight_prefix .. k, math.ceil(lease * 1000))
    end
  end
  return {item, tostring(p), k, tag}
end

-- Highest priority first; within it, the key with the lowest virtual time.
local function pick()
  for p = 1, 5 do
    for _ = 1, 64 do
      local head = redis.call('ZRANGE', ready(p), 0, 0, 'WITHSCORES')
      if #head == 0 then break end
      local k, vt = head[1], tonumber(head[2])
      local cap = cap_of(k)
      if redis.call('LLEN', lane(p, k)) == 0 then
        redis.call('ZREM', ready(p), k)
      elseif full(k, cap) then
        redis.call('ZREM', ready(p), k)
        redis.call('ZADD', PARKED, fmt(vt), p .. '|' .. k)
      else
        return take(p, k, vt, cap)
      end
    end
  end
  return nil
end

if requeue ~= '' then
  redis.call('LREM', INBOX, 1, requeue)
  redis.call('RPUSH', Q, requeue)
end
if not active() then
  -- no lanes: the plain queue's own order, as its BLMOVE would take it
  local tail = redis.call('LINDEX', Q, -1)
  if not tail then return {false, '', '', '', '0'} end
  if not string.find(tail, MARK, 1, true) then
    redis.call('LMOVE', Q, INBOX, 'RIGHT', 'LEFT')
    return {tail, '3', '', '', '0'}
  end
end
ingest(batch)
if redis.call('ZCARD', PARKED) > 0 then unpark() end
local got = pick()
local more = active() and '1' or '0'
if got == nil then return {false, '', '', '', more} end
got[5] = more
return got
