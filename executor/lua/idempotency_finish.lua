-- ARGV: now, id, owner, token, state, result json, retention_s
if not holds(ARGV[3], ARGV[4]) then return fenced() end
local waiters = redis.call('ZRANGE', WAIT, 0, -1)
redis.call('DEL', WAIT)
redis.call('ZREM', LEASES, id)
if ARGV[5] == 'released' then
  redis.call('DEL', REC)
else
  local uncertain = '0'
  if ARGV[5] == 'unknown' then uncertain = '1' end
  redis.call('HSET', REC, 'state', ARGV[5], 'result', ARGV[6], 'owner', '',
    'finished_at', fmt(now), 'updated_at', fmt(now), 'uncertain', uncertain)
  redis.call('HDEL', REC, 'arguments', 'phase', 'lease_until')
  keep(ARGV[7])
end
return {'ok', waiters}
