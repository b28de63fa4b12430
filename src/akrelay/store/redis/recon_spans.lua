#!lua flags=no-writes
local p = ARGV[1]
local out = {}
for s = 0, tonumber(ARGV[2]) - 1 do
  local shift, lo, hi = ARGV[3 + 3 * s], ARGV[4 + 3 * s], ARGV[5 + 3 * s]
  local bs = redis.call('ZRANGEBYSCORE', p .. 'rc:k:' .. shift, lo, '(' .. hi)
  local key = p .. 'rc:b:' .. shift
  out[#out + 1] = #bs
  for _, b in ipairs(bs) do
    local vals = redis.call('HMGET', key, b .. ':n', b .. ':0', b .. ':1', b .. ':2', b .. ':3', b .. ':4', b .. ':5',
                            b .. ':6', b .. ':7')
    for k = 1, 9 do out[#out + 1] = vals[k] or '0' end
  end
end
return out
