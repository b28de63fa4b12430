#!lua

--#include put
local p = ARGV[1]
local n = tonumber(ARGV[2])
local hwm = tonumber(redis.call('GET', p..'hwm') or '0')
local i = 3
for _ = 1, n do
  local nt = tonumber(ARGV[i + 7])
  if redis.call('HEXISTS', p..'ids', ARGV[i]) == 1 then return redis.error_reply('AKRELAY duplicate id ' .. ARGV[i]) end
  if tonumber(ARGV[i + 1]) <= hwm then return redis.error_reply('AKRELAY seq ' .. ARGV[i + 1] .. ' is not above ' .. hwm) end
  hwm = tonumber(ARGV[i + 1])
  i = i + 8 + nt
end
i = 3
local blocks = {}
for _ = 1, n do
  local id, s, acc, w, created, body, text = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local nt = tonumber(ARGV[i + 7])
  put(p, blocks, id, tonumber(s), acc, created, body, text, i + 8, nt)
  if w == '1' then redis.call('SADD', p..'wh', s) end
  i = i + 8 + nt
end
save_blocks(p, blocks)
if n > 0 then redis.call('SET', p..'hwm', hwm) end
return hwm
