#!lua

--#include put
local p = ARGV[1]
local n = tonumber(ARGV[2])
local ids, rec, wh = p..'ids', p..'rec', p..'wh'
local hwm = tonumber(redis.call('GET', p..'hwm') or '0')
local first = hwm
local blocks = {}
local out = {}
local i = 3
for _ = 1, n do
  local id, acc, created, body, text = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local nt = tonumber(ARGV[i + 5])
  local seen = redis.call('HGET', ids, id)
  if seen then
    out[#out + 1] = 0
    out[#out + 1] = tonumber(seen)
    out[#out + 1] = redis.call('HGET', rec, seen)
    out[#out + 1] = redis.call('SISMEMBER', wh, seen)
  else
    hwm = hwm + 1
    put(p, blocks, id, hwm, acc, created, body, text, i + 6, nt)
    out[#out + 1] = 1
    out[#out + 1] = hwm
    out[#out + 1] = false
    out[#out + 1] = 0
  end
  i = i + 6 + nt
end
if hwm > first then
  save_blocks(p, blocks)
  redis.call('SET', p..'hwm', hwm)
  redis.call('PUBLISH', p..'commits', hwm)
end
return out
