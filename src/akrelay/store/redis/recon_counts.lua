#!lua flags=no-writes
-- (bucket, count) of the non-empty buckets lo <= bucket < hi of one level: what a descent walks (no id sums)
local p, shift = ARGV[1], ARGV[2]
local bs = redis.call('ZRANGEBYSCORE', p .. 'rc:k:' .. shift, ARGV[3], ARGV[4])
local key = p .. 'rc:b:' .. shift
local out = {}
for first = 1, #bs, 1000 do
  local fields = {}
  for i = first, math.min(#bs, first + 999) do fields[#fields + 1] = bs[i] .. ':n' end
  local ns = redis.call('HMGET', key, unpack(fields))
  for i, n in ipairs(ns) do
    out[#out + 1] = bs[first + i - 1]
    out[#out + 1] = n or '0'
  end
end
return out
