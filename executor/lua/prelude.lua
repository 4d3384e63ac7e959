-- Shared by every script that reads the time. ARGV[1] is the time in epoch
-- seconds from the caller's injected clock, or '' for Redis TIME.
local function fmt(x) return string.format('%.17g', x) end
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
