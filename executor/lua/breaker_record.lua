-- ARGV: now, failed, slow, retry_after, generation, permit, N, rate, window, min_calls,
--       open_s, M, idle_ttl, write id, keep, open_factor, max_open_s, successes  (N and rate:
--       0 = off; retry_after, generation, write id: '' = none; successes: how many calls
--       a success record stands for, a worker's sum of them (toolexec.stores.tally), else 1).
--       KEYS[4]: the record ids
--       seen (prelude's once): a record sent again after a broken connection is counted
--       once. Each trip that follows the last without a calm spell (closed for twice
--       the last open) stays open open_factor times longer, up to max_open_s.
local now = clock(ARGV[1])
local failed, slow = ARGV[2] == '1', ARGV[3] == '1'
local ra, gen, permit = opt(ARGV[4]), opt(ARGV[5]), ARGV[6]
local n, rate, size, min_calls = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]),
  tonumber(ARGV[10])
local open_s, m, idle = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local factor, cap = tonumber(ARGV[16] or '1'), tonumber(ARGV[17] or ARGV[11])
local count = tonumber(ARGV[18] or '1')
local bad = failed or slow
local b = load()
if not once(KEYS[4], ARGV[14] or '', tonumber(ARGV[15] or '0'), now) then return view(b, now) end
if permit ~= '' then redis.call('ZREM', PROBES, permit) end

-- until when the next trip keeps it open: longer for each consecutive trip
local function next_until()
  if b.state == 'closed' and b.trips > 0
      and now - b.changed_at >= 2 * open_for(b.trips, open_s, factor, cap) then
    b.trips = 0  -- a calm spell since the last trip: start short again
  end
  b.trips = b.trips + 1
  local until_ = now + open_for(b.trips, open_s, factor, cap)
  if ra then until_ = math.max(until_, now + ra) end
  return until_
end

local function on_closed()
  local mark = '0'
  if failed then mark = '1' elseif slow then mark = '2' end
  if not bad then mark = string.rep('0', math.min(count, size)) end
  b.window = string.sub(b.window .. mark, -size)
  if bad then
    b.consecutive = b.consecutive + 1
    if ra then b.not_before = math.max(b.not_before, now + ra) end
  else
    b.consecutive, b.not_before = 0, 0
  end
  local calls = #b.window
  local _, failures = string.gsub(b.window, '[12]', '')
  if n > 0 and b.consecutive >= n then
    open(b, now, math.max(next_until(), b.not_before), 'consecutive_failures')
  elseif rate > 0 and calls >= min_calls and failures / calls >= rate then
    open(b, now, math.max(next_until(), b.not_before), 'failure_rate')
  end
end

local function on_probe()
  if bad then
    open(b, now, next_until(), 'probe_failed')
  else
    b.probe_ok = b.probe_ok + 1
    if b.probe_ok >= m then close(b, now, 'probes_succeeded') end
  end
end

local stale = (gen ~= nil and gen ~= b.gen) or (b.state == 'half_open' and permit == '')
local dirty = true
if b.state == 'open' then
  dirty = bad and ra ~= nil and b.isolated ~= '1' and now + ra > b.open_until
  if dirty then b.open_until = now + ra end
elseif stale then
  dirty = false
elseif b.state == 'closed' then
  on_closed()
else
  on_probe()
end
if dirty then save(b, now, idle) end
return view(b, now)
