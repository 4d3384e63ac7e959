-- Shared by every breaker script. KEYS = {state hash, probes zset, gate string} of one
-- breaker.
-- Each script returns the same reply (see toolexec.breaker.store._parse): verdict,
-- permit, wait, transition, state; numbers as '%.17g' strings.
local STATE, PROBES, GATE = KEYS[1], KEYS[2], KEYS[3]
local tr = {}
local MAX_TTL_MS = 315360000000  -- ten years (toolexec.bounds.MAX_SECONDS)

local function opt(arg) if arg == '' then return nil end return tonumber(arg) end

local function load()
  local raw = redis.call('HGETALL', STATE)
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
  return {
    exists = #raw > 0, state = h.state or 'closed', gen = tonumber(h.gen or '0'),
    open_until = tonumber(h.open_until or '0'), isolated = h.isolated or '0',
    window = h.window or '', consecutive = tonumber(h.consecutive or '0'),
    probe_ok = tonumber(h.probe_ok or '0'), not_before = tonumber(h.not_before or '0'),
    changed_at = tonumber(h.changed_at or '0'), reason = h.reason or '',
    trips = tonumber(h.trips or '0'),
  }
end

-- the gate clients keep a copy of (toolexec.breaker.gate): touched only when the breaker
-- moves or is not closed, so the calls a closed breaker counts never invalidate a copy;
-- published on the gate's own name, so clients drop their copy at once
local function gate(b, ttl)
  if b.state == 'closed' then
    if tr[1] then
      redis.call('DEL', GATE)
      redis.call('PUBLISH', GATE, '')
    end
    return
  end
  local value = b.state .. ' ' .. fmt(b.open_until) .. ' ' .. b.isolated .. ' ' .. b.trips
  if ttl == nil then
    redis.call('SET', GATE, value)
  else
    redis.call('SET', GATE, value, 'PX', ttl)
  end
  redis.call('PUBLISH', GATE, value)
end

local function save(b, now, idle_ttl)
  redis.call('HSET', STATE, 'state', b.state, 'gen', b.gen, 'open_until', fmt(b.open_until),
    'isolated', b.isolated, 'window', b.window, 'consecutive', b.consecutive,
    'probe_ok', b.probe_ok, 'not_before', fmt(b.not_before), 'changed_at', fmt(b.changed_at),
    'reason', b.reason, 'trips', b.trips)
  b.exists = true
  -- every number reaching here is bounded by the caller, and this one cannot fail
  -- after the HSET above either: the script never stops half-applied
  local ttl = math.min(math.ceil((math.max(b.open_until - now, 0) + idle_ttl) * 1000), MAX_TTL_MS)
  if b.isolated == '1' then
    redis.call('PERSIST', STATE)
    gate(b, nil)
    return
  end
  redis.call('PEXPIRE', STATE, ttl)
  redis.call('PEXPIRE', PROBES, ttl)
  gate(b, ttl)
end

local function move(b, to, reason, now)
  tr = {b.state, to, reason}
  b.state, b.gen, b.changed_at, b.reason, b.probe_ok = to, b.gen + 1, now, reason, 0
  b.not_before, b.isolated = 0, '0'
  redis.call('DEL', PROBES)
end

local function open(b, now, until_, reason)
  move(b, 'open', reason, now)
  b.open_until = until_
end

-- how long the trips-th consecutive trip keeps it open (BreakerPolicy.open_for)
local function open_for(trips, open_s, factor, cap)
  return math.min(math.max(cap, open_s), open_s * factor ^ math.min(trips - 1, 64))
end

local function close(b, now, reason)
  move(b, 'closed', reason, now)
  b.open_until, b.window, b.consecutive = 0, '', 0
end

local function live_probes(now)
  return redis.call('ZCOUNT', PROBES, '(' .. fmt(now), '+inf')
end

-- what acquire would do now: 'allow' | 'probe' | 'deny', and a wait when denied
local function verdict(b, now, k)
  if b.state == 'closed' then return 'allow', nil end
  if b.state == 'open' then
    if b.isolated == '1' then return 'deny', nil end
    if now < b.open_until then return 'deny', b.open_until - now end
  end
  if k == nil or live_probes(now) < k then return 'probe', nil end
  local first = redis.call('ZRANGEBYSCORE', PROBES, '(' .. fmt(now), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  return 'deny', tonumber(first[2]) - now
end

local function reply(b, now, v, permit, wait)
  local w = ''
  if wait then w = fmt(wait) end
  local _, failures = string.gsub(b.window, '[12]', '')
  local _, slow = string.gsub(b.window, '2', '')
  return {v, permit, w, tr[1] or '', tr[2] or '', tr[3] or '', fmt(now),
    b.exists and '1' or '0', b.state, tostring(b.gen), fmt(b.open_until), b.isolated,
    tostring(#b.window), tostring(failures), tostring(slow), tostring(b.consecutive),
    tostring(live_probes(now)), tostring(b.probe_ok), fmt(b.changed_at), b.reason,
    tostring(b.trips)}
end

-- the reply of a script that hands out no permit (probes counted as unlimited)
local function view(b, now)
  local v, wait = verdict(b, now, nil)
  return reply(b, now, v, '', wait)
end
