#!lua
local cur = tonumber(redis.call('GET', ARGV[1] .. 'rc:seq') or '0')
if tonumber(ARGV[2]) > cur then redis.call('SET', ARGV[1] .. 'rc:seq', ARGV[2]) end
return 1
