-- store one record (seq as a number) and its index entries; widen its block's created_at range in ``blocks``
local function put(p, blocks, id, seq, acc, created, body, text, first_term, nt)
  local s = string.format('%d', seq)
  redis.call('HSET', p..'ids', id, s)
  redis.call('HSET', p..'rec', s, acc .. ':' .. body)
  redis.call('HSET', p..'flt', s, created .. ' ' .. text)
  redis.call('ZADD', p..'all', seq, s)
  for t = first_term, first_term + nt - 1 do
    redis.call('ZADD', p .. 't:' .. ARGV[t], seq, s)
  end
  local c = tonumber(created)
  local b = math.floor(seq / BLOCK)
  local r = blocks[b]
  if r == nil then
    local stored = redis.call('HGET', p..'cblk', b)
    if stored then
      local sp = string.find(stored, ' ', 1, true)
      r = {tonumber(string.sub(stored, 1, sp - 1)), tonumber(string.sub(stored, sp + 1))}
    else
      r = {c, c}
    end
    blocks[b] = r
  end
  if c < r[1] then r[1] = c end
  if c > r[2] then r[2] = c end
  return s
end

local function save_blocks(p, blocks)
  for b, r in pairs(blocks) do
    redis.call('HSET', p..'cblk', b, string.format('%d %d', r[1], r[2]))
  end
end
