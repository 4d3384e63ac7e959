-- Gives back a slot rate_limit.lua reserved for an attempt that then never ran (an
-- outer layer answered it first). KEYS[1] holds the time the next call is due;
-- ARGV = the due time the reservation set, interval. Only while that reservation is
-- still the last one: a later reservation keeps its slot, and this one stays spent.
local due = redis.call('GET', KEYS[1])
if due and tonumber(due) == tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], fmt(tonumber(ARGV[1]) - tonumber(ARGV[2])), 'KEEPTTL')
  return 1
end
return 0
