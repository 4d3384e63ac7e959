-- ARGV: now, id, hold_s, retention_s
-- An expired lease found by a sweeper: hand the call's message back to be published.
if get('state') ~= 'in_progress' then
  redis.call('ZREM', LEASES, id)
  return {'done'}
end
local lease_until = tonumber(get('lease_until'))
if now < lease_until then
  redis.call('ZADD', LEASES, fmt(lease_until), id)
  return {'live'}
end
if tonumber(get('deadline')) <= now then
  -- its caller gave up; the waiter with the most time left inherits the call
  redis.call('ZREMRANGEBYSCORE', WAIT, '-inf', fmt(now))
  local heir = redis.call('ZRANGE', WAIT, -1, -1, 'WITHSCORES')
  if #heir == 0 then
    redis.call('ZREM', LEASES, id)
    return {'expired'}
  end
  redis.call('ZREM', WAIT, heir[1])
  redis.call('HSET', REC, 'ctx', heir[1], 'deadline', heir[2],
    'call', cjson.decode(heir[1])['call_id'])
end
redis.call('HSET', REC, 'phase', 'requeued', 'owner', '')
redis.call('HINCRBY', REC, 'takeovers', 1)
hold(now + tonumber(ARGV[3]))
keep(ARGV[4])
return {'requeue', get('task'), get('queue'), get('arguments'), get('ctx'), get('attempt')}
