-- A ratio retry budget. KEYS = {the budget's hash, its retries (sorted set)}.
-- ARGV = now ('' = Redis TIME), operation (call | spend | peek | ok | fail | release),
-- window_s, ratio, min_retries, buckets, write id, keep, retry id, calls (how many calls a
-- 'call' counts: a worker's sum of them, toolexec.stores.tally; default 1); KEYS[3], the write ids seen
-- (prelude's once): a 'call' sent again after a broken connection is counted once.
-- Calls are counted per bucket in the hash ('c:<bucket>'), and so are the retries
-- that settled ('o:' succeeded, 'f:' failed); buckets older than the window are
-- deleted here, so the hash stays small; the window then reaches back between 9/10
-- and all of window_s, which can only undercount. Retries are members of a sorted
-- set scored by when they were granted, named by the retry's id (call id and attempt
-- number): a retry that succeeds is removed ('ok': it paid its way), one that fails
-- stays, renamed 'f:<id>', until it leaves the window exactly window_s after it was
-- granted. So the allowance limits the retries that are in flight or failed, never the
-- ones that worked. 'ok' and 'fail' are idempotent by themselves (a member is removed
-- or renamed once). 'release' gives back a grant no attempt used.
local KEY = KEYS[1]
local RETRIES = KEYS[2]
local now, op = clock(ARGV[1]), ARGV[2]
local window, ratio, floor_, buckets =
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local id = ARGV[9] or ''
local current = math.floor(now * buckets / window)
local cur = string.format('%d', current)
local oldest = current - buckets + 1
local raw = redis.call('HGETALL', KEY)
local sums, stale = {c = 0, o = 0, f = 0}, {}
for i = 1, #raw, 2 do
  local field = raw[i]
  local kind = string.sub(field, 1, 1)
  local index = tonumber(string.sub(field, 3))
  if sums[kind] ~= nil and string.sub(field, 2, 2) == ':' and index ~= nil
      and index >= oldest then
    sums[kind] = sums[kind] + tonumber(raw[i + 1])
  elseif field ~= 'seq' then table.insert(stale, field) end
end
if #stale > 0 then redis.call('HDEL', KEY, unpack(stale)) end
if op == 'call' then
  -- a healthy call's one write: its count. Nobody reads the reply (the worker queues it
  -- in the settlement), so the retries' clean-up and counts are left to the ops that
  -- answer a question; a set nobody spends from expires with its members long stale.
  if once(KEYS[3], ARGV[7] or '', tonumber(ARGV[8] or '0'), now) then
    local calls = tonumber(ARGV[10] or '1')
    redis.call('HINCRBY', KEY, 'c:' .. cur, calls)
    sums.c = sums.c + calls
  end
  redis.call('PEXPIRE', KEY, math.ceil(window * 2000))
  return {1, fmt(sums.c), '0', '0', fmt(sums.o), fmt(sums.f), '0'}
elseif op == 'ok' and id ~= '' and redis.call('ZREM', RETRIES, id) == 1 then
  redis.call('HINCRBY', KEY, 'o:' .. cur, 1)
  sums.o = sums.o + 1
elseif op == 'release' and id ~= '' then
  redis.call('ZREM', RETRIES, id)
elseif op == 'fail' and id ~= '' then
  local score = redis.call('ZSCORE', RETRIES, id)
  if score then
    redis.call('ZREM', RETRIES, id)
    redis.call('ZADD', RETRIES, score, 'f:' .. id)
    redis.call('HINCRBY', KEY, 'f:' .. cur, 1)
    sums.f = sums.f + 1
  end
end
redis.call('ZREMRANGEBYSCORE', RETRIES, '-inf', fmt(now - window))
local retries = redis.call('ZCARD', RETRIES)
-- retries that work earn room for more: the allowance grows with the ratio of retries
-- that succeeded to those that failed in the window (at most tenfold), so a burst of
-- one-off failures gets its retries after one short wait, while retries that keep
-- failing (an outage) stay within max(min_retries, ratio * calls)
local earned = 0
if sums.o > 0 then earned = math.min(sums.o / math.max(sums.f, 1), 9) end
local allowance = math.max(floor_, ratio * sums.c) * (1 + earned)
local allowed = retries + 1 <= allowance
-- a grant sent again (a broken connection) is the same grant
if op == 'spend' and id ~= '' and redis.call('ZSCORE', RETRIES, id) then
  allowed, retries = true, retries - 1
end
if op == 'spend' and allowed then
  if id == '' then id = redis.call('HINCRBY', KEY, 'seq', 1) end
  redis.call('ZADD', RETRIES, fmt(now), id)
  retries = retries + 1
end
if op ~= 'peek' then
  redis.call('PEXPIRE', KEY, math.ceil(window * 2000))
  redis.call('PEXPIRE', RETRIES, math.ceil(window * 2000))
end
-- when the oldest retry leaves the window, freeing a place whatever else happens
local frees = 0
local first = redis.call('ZRANGE', RETRIES, 0, 0, 'WITHSCORES')
if first[2] then frees = math.max(0, tonumber(first[2]) + window - now) end
return {allowed and 1 or 0, fmt(sums.c), fmt(retries), fmt(allowance), fmt(sums.o),
  fmt(sums.f), fmt(frees)}
