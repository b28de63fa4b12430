#!lua flags=no-writes

--#include filters
local p = ARGV[1]
local after = tonumber(ARGV[2])
local upto = tonumber(ARGV[3])
if ARGV[3] == '' then upto = tonumber(redis.call('GET', p..'hwm') or '0') end
local budget = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local incw, cfrom, cbefore, terms, texts = filters(p, 6)
local nt, nq = #terms, #texts
local wh, flt, rec = p..'wh', p..'flt', p..'rec'
if after >= upto then return {after, 1, upto} end
-- with nothing withheld (the usual case) no candidate needs the check
if not incw and redis.call('SCARD', wh) == 0 then incw = true end
-- the smallest term set in the window drives the scan; an empty one ends it at once
local driver = p..'all'
local others = {}
if nt > 0 then
  local best, bestn = 0, nil
  for k = 1, nt do
    local c = redis.call('ZCOUNT', terms[k], '(' .. after, upto)
    if c == 0 then return {upto, 1, upto} end
    if bestn == nil or c < bestn then best, bestn = k, c end
  end
  driver = terms[best]
  for k = 1, nt do if k ~= best then others[#others + 1] = terms[k] end end
end
local timed = cfrom ~= nil or cbefore ~= nil
local filtered = timed or nq > 0
local blockok = {}
-- can block ``b`` hold a record inside the created_at bounds? (its summary is a superset of what it holds)
local function block_ok(b)
  local bo = blockok[b]
  if bo == nil then
    bo = true
    local stored = redis.call('HGET', p..'cblk', b)
    if stored then
      local sp = string.find(stored, ' ', 1, true)
      local lo, hi = tonumber(string.sub(stored, 1, sp - 1)), tonumber(string.sub(stored, sp + 1))
      if (cfrom ~= nil and hi < cfrom) or (cbefore ~= nil and lo >= cbefore) then bo = false end
    end
    blockok[b] = bo
  end
  return bo
end
local found = {}
local pos = after
local scanned = 0
local exhausted = 0
while #found < limit do
  if scanned >= budget then break end
  -- skip blocks that cannot match before reading any of their candidates
  while timed and scanned < budget and pos < upto and not block_ok(math.floor((pos + 1) / BLOCK)) do
    pos = (math.floor((pos + 1) / BLOCK) + 1) * BLOCK - 1
    scanned = scanned + 1
  end
  if pos >= upto then exhausted = 1; pos = upto; break end
  if scanned >= budget then break end
  local chunk = redis.call('ZRANGEBYSCORE', driver, '(' .. pos, upto, 'LIMIT', 0, math.min(256, budget - scanned))
  if #chunk == 0 then exhausted = 1; break end
  for _, m in ipairs(chunk) do
    local seq = tonumber(m)
    scanned = scanned + 1
    local ok = true
    if timed then
      local b = math.floor(seq / BLOCK)
      if not block_ok(b) then
        -- nothing in this block can match: continue after it
        pos = (b + 1) * BLOCK - 1
        if pos < seq then pos = seq end
        break
      end
    end
    pos = seq
    for k = 1, #others do
      if ok and not redis.call('ZSCORE', others[k], m) then ok = false end
    end
    if ok and not incw and redis.call('SISMEMBER', wh, m) == 1 then ok = false end
    if ok and filtered then
      local v = redis.call('HGET', flt, m)
      local sp = string.find(v, ' ', 1, true)
      if timed then
        local c = tonumber(string.sub(v, 1, sp - 1))
        if (cfrom ~= nil and c < cfrom) or (cbefore ~= nil and c >= cbefore) then ok = false end
      end
      if ok then
        for k = 1, nq do
          if not string.find(v, texts[k], sp + 1, true) then ok = false; break end
        end
      end
    end
    if ok then
      found[#found + 1] = m
      if #found >= limit then break end
    end
  end
  if pos >= upto then exhausted = 1; break end
end
local out = {pos, exhausted, upto}
for _, m in ipairs(found) do
  out[#out + 1] = tonumber(m)
  out[#out + 1] = redis.call('HGET', rec, m)
  out[#out + 1] = redis.call('SISMEMBER', wh, m)
end
return out
