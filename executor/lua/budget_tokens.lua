-- A token-bucket retry budget (gRPC retry throttling). KEYS[1] = the budget's hash.
-- ARGV = now (unused), operation (fail | succeed | spend | peek), max_tokens,
-- token_ratio, idle TTL (s), write id, keep, successes (how many a 'succeed' stands for:
-- a worker's sum of them, toolexec.stores.tally; default 1); KEYS[3], the write ids seen (prelude's
-- once): an outcome sent again after a broken connection is counted once. A bucket
-- nobody touched for the idle TTL expires and starts full again.
local KEY = KEYS[1]
local op = ARGV[2]
if (op == 'fail' or op == 'succeed') and (ARGV[6] or '') ~= '' then
  if not once(KEYS[3], ARGV[6], tonumber(ARGV[7]), clock(ARGV[1])) then op = 'peek' end
end
local most, refund, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens = tonumber(redis.call('HGET', KEY, 'tokens') or most)
if op == 'fail' then tokens = math.max(0, tokens - 1)
elseif op == 'succeed' then tokens = math.min(most, tokens + refund * tonumber(ARGV[8] or '1')) end
if op == 'fail' or op == 'succeed' then
  redis.call('HSET', KEY, 'tokens', fmt(tokens))
  redis.call('EXPIRE', KEY, ttl)
end
return {tokens > most / 2 and 1 or 0, fmt(tokens)}
