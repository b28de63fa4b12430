#!lua flags=no-writes

--#include filters
local p = ARGV[1]
local wh, flt, rec = p..'wh', p..'flt', p..'rec'
local hwm = tonumber(redis.call('GET', p..'hwm') or '0')
if tonumber(ARGV[2]) > hwm then return {0} end
if ARGV[3] ~= '0' then
  local v = redis.call('HGET', flt, ARGV[3])
  if v and redis.sha1hex(v) ~= ARGV[4] then return {0} end
end
local limit = tonumber(ARGV[5])
local incw, cfrom, cbefore, terms, texts, first = filters(p, 6)
local nt, nq = #terms, #texts
if not incw and redis.call('SCARD', wh) == 0 then incw = true end
local out = {1, hwm}
local found = 0
for i = first, #ARGV do
  local m = ARGV[i]
  local v = redis.call('HGET', flt, m)
  local ok = v ~= false
  if ok then
    local sp = string.find(v, ' ', 1, true)
    local c = tonumber(string.sub(v, 1, sp - 1))
    if (cfrom ~= nil and c < cfrom) or (cbefore ~= nil and c >= cbefore) then ok = false end
    for k = 1, nt do
      if ok and not redis.call('ZSCORE', terms[k], m) then ok = false end
    end
    if ok and not incw and redis.call('SISMEMBER', wh, m) == 1 then ok = false end
    for k = 1, nq do
      if ok and not string.find(v, texts[k], sp + 1, true) then ok = false end
    end
  end
  if ok then
    out[#out + 1] = tonumber(m)
    out[#out + 1] = redis.call('HGET', rec, m)
    out[#out + 1] = redis.call('SISMEMBER', wh, m)
    found = found + 1
    if found >= limit then break end
  end
end
return out
