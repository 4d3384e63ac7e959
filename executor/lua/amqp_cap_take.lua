-- A call of a capped fairness key starts on RabbitMQ only while fewer than its cap run
-- fleet-wide (toolexec.worker.amqp_caps). KEYS[1]: sorted set of the key's calls in
-- flight, member = task id, score = when the entry lapses. ARGV = task id, now, lapse
-- time, cap, TTL seconds. A task id already counted (a call RabbitMQ redelivered after
-- its worker died) is counted once and its lapse time renewed. Returns 1 (start) or 0.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1])
    or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  if redis.call('TTL', KEYS[1]) < tonumber(ARGV[5]) then
    redis.call('EXPIRE', KEYS[1], ARGV[5])
  end
  return 1
end
return 0
