-- One consumer's take from a queue with lanes (toolexec.transport.lanes): atomic, so a call is
-- always in exactly one of the queue, a lane, the consumer's inbox or kombu's unacked
-- record (the inbox is emptied by the MULTI that writes that record).
--
-- KEYS: 1 queue, 2 inbox, 3 weights, 4 caps, 5 vclock, 6 parked, 7..11 ready:1..5
-- ARGV: 1 now ('' = Redis TIME), 2 how many queued messages to sort into lanes at most,
--       3 a message to put back at the queue's head first ('' none: the one a BLMOVE
--       took that carries a lane), 4 lane prefix, 5 in-flight prefix, 6 lease (s)
-- Returns {message or false, priority, the in-flight sets the message was counted in
--          (space-separated suffixes; '' none), its delivery tag ('' none),
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
-- A lane is a fairness key, or 'key|tool#cap' for a tool with max_in_flight.
local function lane_of(item)
  local p, k, t, c = string.match(item,
    '"toolexec_lane":%s*"([1-5])|([%w%._:@%-]*)|([%w_%-]+)#(%d+)"')
  if p ~= nil and #k <= 64 and #t <= 64 and #c <= 6 then
    return tonumber(p), k .. '|' .. t .. '#' .. c
  end
  p, k = string.match(item, '"toolexec_lane":%s*"([1-5])|([%w%._:@%-]*)"')
  if p == nil or #k > 64 then return 3, '' end
  return tonumber(p), k
end

-- A lane's fairness key, and its in-flight sets with their caps: {suffix, cap}, ...
local function key_of(lane_id)
  return (string.match(lane_id, '^([^|]*)')) or lane_id
end

local function caps_of(lane_id)
  local k = key_of(lane_id)
  local out = {}
  if k ~= '' then
    local cap = tonumber(redis.call('HGET', CAPS, k) or '0') or 0
    if cap > 0 then out[#out + 1] = {k, cap} end
  end
  local t, c = string.match(lane_id, '|([^#]*)#(%d+)$')
  if t ~= nil and tonumber(c) > 0 then out[#out + 1] = {'tool:' .. t, tonumber(c)} end
  return out
end

local function full(caps)
  for _, pair in ipairs(caps) do
    local f = inflight_prefix .. pair[1]
    redis.call('ZREMRANGEBYSCORE', f, '-inf', fmt(now))
    if redis.call('ZCARD', f) >= pair[2] then return true end
  end
  return false
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
    if p ~= nil and not full(caps_of(k)) then
      redis.call('ZREM', PARKED, members[i])
      if redis.call('LLEN', lane(p, k)) > 0 then
        local at = math.max(tonumber(members[i + 1]), vclock(p))
        redis.call('ZADD', ready(tonumber(p)), fmt(at), k)
      end
    end
  end
end

local function take(p, k, vt, caps)
  local l = lane(p, k)
  local item = redis.call('RPOP', l)
  redis.call('LPUSH', INBOX, item)
  redis.call('HSET', VCLOCK, p, fmt(vt))
  local w = tonumber(redis.call('HGET', WEIGHTS, key_of(k)) or '1') or 1
  if w <= 0 then w = 1 end
  if redis.call('LLEN', l) > 0 then
    redis.call('ZADD', ready(p), fmt(vt + 1 / w), k)
  else
    redis.call('ZREM', ready(p), k)
  end
  local tag, sets = '', {}
  if #caps > 0 then
    tag = string.match(item, '"delivery_tag":%s*"([^"]+)"') or ''
    for _, pair in ipairs(caps) do
      if tag ~= '' then
        redis.call('ZADD', inflight_prefix .. pair[1], fmt(now + lease), tag)
        redis.call('PEXPIRE', inflight_prefix .. pair[1], math.ceil(lease * 1000))
        sets[#sets + 1] = pair[1]
      end
    end
  end
  return {item, tostring(p), table.concat(sets, ' '), tag}
end

-- Highest priority first; within it, the key with the lowest virtual time.
local function pick()
  for p = 1, 5 do
    for _ = 1, 64 do
      local head = redis.call('ZRANGE', ready(p), 0, 0, 'WITHSCORES')
      if #head == 0 then break end
      local k, vt = head[1], tonumber(head[2])
      local caps = caps_of(k)
      if redis.call('LLEN', lane(p, k)) == 0 then
        redis.call('ZREM', ready(p), k)
      elseif full(caps) then
        redis.call('ZREM', ready(p), k)
        redis.call('ZADD', PARKED, fmt(vt), p .. '|' .. k)
      else
        return take(p, k, vt, caps)
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
