-- ARGV from i: include withheld, created_from, created_before, nt, terms..., nq, texts...
-- returns them (terms as keys) and the index of the first argument after them
local function filters(p, i)
  local cfrom, cbefore = nil, nil
  if ARGV[i + 1] ~= '' then cfrom = tonumber(ARGV[i + 1]) end
  if ARGV[i + 2] ~= '' then cbefore = tonumber(ARGV[i + 2]) end
  local nt = tonumber(ARGV[i + 3])
  local terms, texts = {}, {}
  for k = 1, nt do terms[k] = p .. 't:' .. ARGV[i + 3 + k] end
  local nq = tonumber(ARGV[i + 4 + nt])
  for k = 1, nq do texts[k] = ARGV[i + 4 + nt + k] end
  return ARGV[i] == '1', cfrom, cbefore, terms, texts, i + 5 + nt + nq
end
