-- ARGV: now, idle_ttl
local now = clock(ARGV[1])
local b = load()
close(b, now, 'reset')
b.trips = 0
save(b, now, tonumber(ARGV[2]))
return view(b, now)
