#!lua
local p = ARGV[1]
local add = ARGV[2] == '1'
local nlevels = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local items = p .. 'rc:items'
local i = 5
local changed = 0
for _ = 1, n do
  local did
  if add then did = redis.call('ZADD', items, 'NX', 0, ARGV[i]) else did = redis.call('ZREM', items, ARGV[i]) end
  if did == 1 then
    changed = changed + 1
    for l = 0, nlevels - 1 do
      local at = i + 1 + l * 10
      local shift, bucket = ARGV[at], ARGV[at + 1]
      local key = p .. 'rc:b:' .. shift
      local cnt = redis.call('HINCRBY', key, bucket .. ':n', add and 1 or -1)
      for k = 0, 7 do redis.call('HINCRBY', key, bucket .. ':' .. k, ARGV[at + 2 + k]) end
      if cnt == 0 then
        redis.call('HDEL', key, bucket .. ':n', bucket .. ':0', bucket .. ':1', bucket .. ':2', bucket .. ':3',
                   bucket .. ':4', bucket .. ':5', bucket .. ':6', bucket .. ':7')
        redis.call('ZREM', p .. 'rc:k:' .. shift, bucket)
      elseif add and cnt == 1 then
        redis.call('ZADD', p .. 'rc:k:' .. shift, bucket, bucket)
      end
    end
  end
  i = i + 1 + nlevels * 10
end
return changed
