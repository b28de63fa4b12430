#!lua
local p = ARGV[1]
local s = redis.call('HGET', p..'ids', ARGV[2])
if not s then return 0 end
if ARGV[3] == '1' then redis.call('SADD', p..'wh', s) else redis.call('SREM', p..'wh', s) end
return 1
