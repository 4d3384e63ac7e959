-- Remove from the tail of queue KEYS[1] the messages ARGV[1..n], in that order, while
-- the tail is still each one: a consumer that took one meanwhile ends the sweep there,
-- so nothing but the stale messages the caller read is ever removed. Returns the count.
local removed = 0
for _, item in ipairs(ARGV) do
  if redis.call('LINDEX', KEYS[1], -1) ~= item then
    break
  end
  redis.call('RPOP', KEYS[1])
  removed = removed + 1
end
return removed
