-- Compare-and-set of a run's guard state. KEYS[1]: the state; ARGV: SHA-1 of the value
-- the caller read ('' = none), the new value ('' = delete), TTL in s. Writes only if the
-- value is still the one read, so a concurrent round is never overwritten: 1, else 0.
local current = redis.call('GET', KEYS[1])
local seen = ''
if current then seen = redis.sha1hex(current) end
if seen ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
end
return 1
