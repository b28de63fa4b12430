#!lua
-- Add (ARGV[2] == '1') or remove items: per item its member, then per level its shift, bucket and 8 signed limbs.
-- Only the items that change rc:items count; their increments are summed per bucket first, so items that
-- share a bucket (a batch of recent commits shares all but the lowest levels) cost one HINCRBY per field.
-- The sums stay exact: at most APPLY_CHUNK limbs of 32 bits each are added, far below 2^53.
local p = ARGV[1]
local add = ARGV[2] == '1'
local nlevels = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local items = p .. 'rc:items'
local i = 5
local changed = 0
local order, delta = {}, {}
for _ = 1, n do
  local did
  if add then did = redis.call('ZADD', items, 'NX', 0, ARGV[i]) else did = redis.call('ZREM', items, ARGV[i]) end
  if did == 1 then
    changed = changed + 1
    for l = 0, nlevels - 1 do
      local at = i + 1 + l * 10
      local id = ARGV[at] .. ' ' .. ARGV[at + 1]
      local d = delta[id]
      if d == nil then
        d = {ARGV[at], ARGV[at + 1], 0, 0, 0, 0, 0, 0, 0, 0, 0}
        delta[id] = d
        order[#order + 1] = id
      end
      d[3] = d[3] + 1
      for k = 0, 7 do d[4 + k] = d[4 + k] + tonumber(ARGV[at + 2 + k]) end
    end
  end
  i = i + 1 + nlevels * 10
end
for _, id in ipairs(order) do
  local d = delta[id]
  local shift, bucket = d[1], d[2]
  local key = p .. 'rc:b:' .. shift
  local cnt = redis.call('HINCRBY', key, bucket .. ':n', add and d[3] or -d[3])
  for k = 0, 7 do
    if d[4 + k] ~= 0 then redis.call('HINCRBY', key, bucket .. ':' .. k, string.format('%d', d[4 + k])) end
  end
  if cnt == 0 then
    redis.call('HDEL', key, bucket .. ':n', bucket .. ':0', bucket .. ':1', bucket .. ':2', bucket .. ':3',
               bucket .. ':4', bucket .. ':5', bucket .. ':6', bucket .. ':7')
    redis.call('ZREM', p .. 'rc:k:' .. shift, bucket)
  elseif add and cnt == d[3] then
    redis.call('ZADD', p .. 'rc:k:' .. shift, bucket, bucket)
  end
end
return changed
