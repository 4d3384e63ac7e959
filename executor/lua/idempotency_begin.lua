-- ARGV: now, id, args hash, call id, ctx json, owner, lease_s, deadline, has_check,
--       mode, task, queue, arguments json, attempt, retention_s
local args, call, ctx, owner = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local lease_s, deadline, has_check, mode = tonumber(ARGV[7]), ARGV[8], ARGV[9] == '1', ARGV[10]

local function take(prior)
  local token = redis.call('INCR', TOKENS)
  redis.call('HSET', REC, 'state', 'in_progress', 'phase', 'running', 'owner', owner,
    'token', token, 'call', call, 'ctx', ctx, 'deadline', deadline, 'task', ARGV[11],
    'queue', ARGV[12], 'arguments', ARGV[13], 'attempt', ARGV[14])
  if mode == 'idempotent' then redis.call('HSET', REC, 'uncertain', '1') end
  redis.call('HINCRBY', REC, 'runs', 1)
  hold(now + lease_s)
  keep(ARGV[15])
  return {'acquired', tostring(token), prior, ''}
end

local state = get('state')
if not state then
  redis.call('HSET', REC, 'mode', mode, 'args', args, 'created_at', fmt(now),
    'takeovers', 0, 'fenced', 0, 'runs', 0, 'uncertain', '0')
  return take('0')
end
if get('args') ~= args then return {'mismatch', '', '', ''} end
if state ~= 'in_progress' then
  if state == 'unknown' and has_check then return take('1') end
  return {'replay', '', state, get('result')}
end
local prior = get('uncertain') or '0'
local same = get('call') == call
if now < tonumber(get('lease_until')) then
  if same and get('phase') ~= 'running' then return take(prior) end
  if same then return {'duplicate', '', '', ''} end
  redis.call('ZADD', WAIT, deadline, ctx)
  keep(ARGV[15])
  return {'joined', '', '', get('lease_until')}
end
-- the lease ran out: whoever held it is gone or stopped; this run takes over
if not same then redis.call('ZADD', WAIT, get('deadline'), get('ctx')) end
redis.call('HINCRBY', REC, 'takeovers', 1)
return take(prior)
