-- ARGV: now, seconds ('' = isolate until reset), idle_ttl
local now = clock(ARGV[1])
local b = load()
local seconds = opt(ARGV[2])
if seconds then
  open(b, now, now + seconds, 'tripped')
else
  open(b, now, 0, 'tripped')
  b.isolated = '1'
end
save(b, now, tonumber(ARGV[3]))
return view(b, now)
