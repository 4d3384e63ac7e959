-- ARGV: now, K, lease_s, permit id, idle_ttl
local now = clock(ARGV[1])
local k, lease, permit, idle = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local b = load()
if b.state == 'open' and b.isolated ~= '1' and now >= b.open_until then
  move(b, 'half_open', 'open_elapsed', now)
end
local v, wait = verdict(b, now, k)
if v == 'probe' then
  redis.call('ZREMRANGEBYSCORE', PROBES, '-inf', fmt(now))
  redis.call('ZADD', PROBES, fmt(now + lease), permit)
else
  permit = ''
end
if v == 'probe' or tr[1] then save(b, now, idle) end
return reply(b, now, v, permit, wait)
