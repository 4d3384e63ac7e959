-- Counts one attempt's end in its bucket's stats hash (toolexec.stores.stats).
-- KEYS = {the bucket's hash, its write ids seen (prelude's once)}.
-- ARGV = now, write id ('' = none), keep, the hash's TTL (s), the minute, the oldest
-- minute kept, then counter, amount pairs. Fields are '<minute>|<tool>|<counter>'; the
-- first write of each minute deletes the minutes before the oldest kept (field
-- 'pruned' says which minute did), so the hash holds an hour, not every minute seen.
-- An end sent again after a broken connection is counted once.
local HASH = KEYS[1]
local now = clock(ARGV[1])
if not once(KEYS[2], ARGV[2], tonumber(ARGV[3] ~= '' and ARGV[3] or '0'), now) then return 0 end
local minute, oldest = ARGV[5], tonumber(ARGV[6])
if redis.call('HGET', HASH, 'pruned') ~= minute then
  local stale = {}
  for _, field in ipairs(redis.call('HKEYS', HASH)) do
    local m = tonumber(string.match(field, '^(%d+)|'))
    if m ~= nil and m < oldest then table.insert(stale, field) end
  end
  for i = 1, #stale, 1000 do
    redis.call('HDEL', HASH, unpack(stale, i, math.min(i + 999, #stale)))
  end
  redis.call('HSET', HASH, 'pruned', minute)
end
for i = 7, #ARGV, 2 do redis.call('HINCRBY', HASH, minute .. '|' .. ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', HASH, ARGV[4])
return 1
