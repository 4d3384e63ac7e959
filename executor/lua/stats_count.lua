-- Counts one attempt's end in a minute's stats hash (toolexec.stats).
-- KEYS = {the minute's hash, its bucket's write ids seen (prelude's once)}.
-- ARGV = now, write id ('' = none), keep, the hash's TTL (s), then field, amount pairs.
-- An end sent again after a broken connection is counted once.
local now = clock(ARGV[1])
if not once(KEYS[2], ARGV[2], tonumber(ARGV[3] ~= '' and ARGV[3] or '0'), now) then return 0 end
for i = 5, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
