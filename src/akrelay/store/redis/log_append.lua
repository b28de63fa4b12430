#!lua
local p = ARGV[1]
local expect = tonumber(ARGV[2])
local size = tonumber(redis.call('GET', p..'log:size') or '0')
if size ~= expect then return size end
local n = tonumber(ARGV[3])
local i = 4
for k = 0, n - 1 do
  local idx = string.format('%d', size + k)
  redis.call('HSET', p..'log:e', idx, ARGV[i] .. ':' .. ARGV[i + 1])
  redis.call('HSET', p..'log:s', ARGV[i], idx)
  i = i + 2
end
local m = tonumber(ARGV[i])
i = i + 1
for _ = 1, m do
  redis.call('HSET', p..'log:n', ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('SET', p..'log:size', string.format('%d', size + n))
return -1
