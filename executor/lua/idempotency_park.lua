-- ARGV: now, id, owner, token, hold_s, uncertain, ctx json, next attempt, retention_s
-- Between attempts: nobody runs the call, the retry message will take it up.
if not holds(ARGV[3], ARGV[4]) then return fenced() end
redis.call('HSET', REC, 'phase', 'retry_wait', 'owner', '', 'uncertain', ARGV[6],
  'ctx', ARGV[7], 'attempt', ARGV[8])
hold(now + tonumber(ARGV[5]))
keep(ARGV[9])
return {'ok', {}}
