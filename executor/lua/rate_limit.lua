-- GCRA: KEYS[1] holds the time the next call is due. ARGV = now ('' = Redis TIME),
-- interval, burst, max_wait. A slot is reserved (the due time advanced) only if the
-- call can wait for it; the wait goes back as a '%.17g' string, and with a reserved slot
-- the due time it set, which rate_limit_release.lua needs to give the slot back.
local now = clock(ARGV[1])
local interval, burst, max_wait = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local due = tonumber(redis.call('GET', KEYS[1]) or '0')
if due < now then due = now end
local wait = due - (burst - 1) * interval - now
if wait < 0 then wait = 0 end
if wait > max_wait then return {0, fmt(wait)} end
local next_due = due + interval
redis.call('SET', KEYS[1], fmt(next_due), 'PX', math.ceil((next_due - now) * 1000) + 1000)
return {1, fmt(wait), fmt(next_due)}
