#!lua
local p = ARGV[1]
local cur = redis.call('HGET', p..'meta', ARGV[2])
if ARGV[5] == '1' then
  if cur then return 0 end
elseif cur ~= ARGV[3] then
  return 0
end
redis.call('HSET', p..'meta', ARGV[2], ARGV[4])
return 1
