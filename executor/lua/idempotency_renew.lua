-- ARGV: now, id, owner, token, lease_s
if not holds(ARGV[3], ARGV[4]) then return {'lost', ''} end
hold(now + tonumber(ARGV[5]))
return {'ok', get('lease_until')}
