-- A ratio retry budget. KEYS = {the budget's hash, its retries (sorted set)}.
-- ARGV = now ('' = Redis TIME), operation (call | spend | peek), window_s, ratio,
-- min_retries, buckets, write id, keep; KEYS[3], the write ids seen (prelude's once):
-- a 'call' sent again after a broken connection is counted once. Calls are counted per bucket in the hash ('c:<bucket>'), buckets
-- older than the window deleted here, so the hash holds at most buckets + 1
-- fields; the window then reaches back between 9/10 and all of window_s, which
-- can only undercount calls. Retries are members of a sorted set scored by
-- their time, so each leaves the window exactly window_s after it was made:
-- the retries of any window_s never exceed the allowance.
local KEY = KEYS[1]
local RETRIES = KEYS[2]
local now, op = clock(ARGV[1]), ARGV[2]
local window, ratio, floor_, buckets =
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local current = math.floor(now * buckets / window)
local oldest = current - buckets + 1
local raw = redis.call('HGETALL', KEY)
local calls, stale = 0, {}
for i = 1, #raw, 2 do
  local field = raw[i]
  local index = tonumber(string.sub(field, 3))
  if string.sub(field, 1, 2) == 'c:' and index ~= nil and index >= oldest then
    calls = calls + tonumber(raw[i + 1])
  elseif field ~= 'seq' then table.insert(stale, field) end
end
if #stale > 0 then redis.call('HDEL', KEY, unpack(stale)) end
if op == 'call' and once(KEYS[3], ARGV[7] or '', tonumber(ARGV[8] or '0'), now) then
  redis.call('HINCRBY', KEY, 'c:' .. string.format('%d', current), 1)
  calls = calls + 1
end
redis.call('ZREMRANGEBYSCORE', RETRIES, '-inf', fmt(now - window))
local retries = redis.call('ZCARD', RETRIES)
local allowance = math.max(floor_, ratio * calls)
local allowed = retries + 1 <= allowance
if op == 'spend' and allowed then
  redis.call('ZADD', RETRIES, fmt(now), redis.call('HINCRBY', KEY, 'seq', 1))
  retries = retries + 1
end
if op ~= 'peek' then
  redis.call('PEXPIRE', KEY, math.ceil(window * 2000))
  redis.call('PEXPIRE', RETRIES, math.ceil(window * 2000))
end
return {allowed and 1 or 0, fmt(calls), fmt(retries), fmt(allowance)}
