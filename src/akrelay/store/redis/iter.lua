#!lua flags=no-writes
local p = ARGV[1]
local hash = p .. (ARGV[4] or 'rec')
local seqs = redis.call('ZRANGEBYSCORE', p..'all', '(' .. ARGV[2], '+inf', 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, s in ipairs(seqs) do
  out[#out + 1] = tonumber(s)
  out[#out + 1] = redis.call('HGET', hash, s)
  out[#out + 1] = redis.call('SISMEMBER', p..'wh', s)
end
return out
