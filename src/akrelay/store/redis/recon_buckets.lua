#!lua flags=no-writes
local p, shift = ARGV[1], ARGV[2]
local bs = redis.call('ZRANGEBYSCORE', p .. 'rc:k:' .. shift, ARGV[3], ARGV[4])
local key = p .. 'rc:b:' .. shift
local out = {}
for _, b in ipairs(bs) do
  out[#out + 1] = b
  local vals = redis.call('HMGET', key, b .. ':n', b .. ':0', b .. ':1', b .. ':2', b .. ':3', b .. ':4', b .. ':5',
                          b .. ':6', b .. ':7')
  for k = 1, 9 do out[#out + 1] = vals[k] or '0' end
end
return out
