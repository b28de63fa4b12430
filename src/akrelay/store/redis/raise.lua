#!lua
local p = ARGV[1]
local hwm = tonumber(redis.call('GET', p..'hwm') or '0')
local want = tonumber(ARGV[2])
if want > hwm then redis.call('SET', p..'hwm', string.format('%d', want)); hwm = want end
return hwm
