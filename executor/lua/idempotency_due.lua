-- Records whose lease has ended, by the index; KEYS = {lease index}; ARGV: now, limit
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(clock(ARGV[1])), 'LIMIT', 0, tonumber(ARGV[2]))
