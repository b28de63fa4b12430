#!lua
local p = ARGV[1]
local s = redis.call('HGET', p..'ids', ARGV[2])
if not s then return 0 end
if s ~= ARGV[3] then return -1 end
for k = 4, #ARGV do redis.call('ZREM', p .. 't:' .. ARGV[k], s) end
redis.call('ZREM', p..'all', s)
redis.call('HDEL', p..'rec', s)
redis.call('HDEL', p..'flt', s)
redis.call('SREM', p..'wh', s)
redis.call('HDEL', p..'ids', ARGV[2])
return 1
