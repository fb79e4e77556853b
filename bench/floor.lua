-- The pattern's floor: the least one call of a circular reliable queue can do. It acks the
-- tokens it is given, rotates the ring's tail to its head and stamps a pending id there with
-- its deadline, and removes an acked element when it comes round. No fencing, no counters,
-- no checks: what rotator's module costs beyond this is the price of its guarantees.
--
-- KEYS[1] the ring, KEYS[2] the done set.
-- ARGV[1] LEASE_MS, ARGV[2] COUNT, ARGV[3..] tokens to ack. Replies with the new tokens.
local ring, done = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local count = tonumber(ARGV[2])
if #ARGV > 2 then redis.call('SADD', done, unpack(ARGV, 3)) end
local stamp = '*' .. (now + tonumber(ARGV[1]))
local tokens = {}
for _ = 1, 2 * count + 1 do
  local element = redis.call('RPOPLPUSH', ring, ring)
  if not element then break end
  if string.find(element, '*', 1, true) then
    -- a lease come round: gone when acked, skipped while young
    if redis.call('SREM', done, element) == 1 then redis.call('LPOP', ring) end
  else
    local token = element .. stamp
    redis.call('LSET', ring, 0, token)
    tokens[#tokens + 1] = token
    if #tokens == count then break end
  end
end
return tokens
