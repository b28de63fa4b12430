#!lua flags=no-writes
local p = ARGV[1]
local ids, rec, wh = p..'ids', p..'rec', p..'wh'
local out = {}
for k = 2, #ARGV do
  local s = redis.call('HGET', ids, ARGV[k])
  if s then
    out[#out + 1] = tonumber(s)
    out[#out + 1] = redis.call('HGET', rec, s)
    out[#out + 1] = redis.call('SISMEMBER', wh, s)
  else
    out[#out + 1] = 0
    out[#out + 1] = false
    out[#out + 1] = 0
  end
end
return out
