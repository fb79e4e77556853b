#!lua name=rotator_contract_floor
-- The module's contract, bare: what one worker's one-job loop (M.loop_lease) costs the server
-- before any of its logic. A function library called as the module is (FCALL, a queue's
-- thirteen keys, next_packed's arguments), making the loop's seven commands with the same
-- keys and as many fields, and nothing else: no check, no number read or written as a
-- number, no fencing. Against bench/floor.lua (the pattern's floor) it says what the
-- contract itself costs (its keys, its arguments, the commands that keep the state); against
-- the module, what the module's own Lua costs. A benchmark reference, not a queue: it writes
-- fixed values.
--
-- KEYS: a queue's thirteen, in rotator.keys' order (1 ring, 2 done, 3 done_old, 4 marks,
--   5 marks_old, 6 revoked, 7 dead, 8 wake, 9 meta, 10 pushlog, 11 leases, 12 scheduled,
--   13 ids); the ring holds pending ids, the lease list one element.
-- ARGS: next_packed COUNT LEASE_MS BUDGET MAX_DELIVERIES ACK (as the module takes them).
-- Replies as next_packed does: { idle, wait_ms, acked, packed element }.
--
--   redis-cli FUNCTION LOAD "$(cat bench/contract_floor.lua)"
--   redis-cli FCALL rotator_contract_claim 13 $Q next_packed 1 30000 1000 0 '*1.1.1/1'

-- The meta fields the loop reads (LOOP_FIELDS), and a walk field's size (WALK_BYTES).
local FIELDS = { 'seq', 'walk', 'taken', 'origin', 'marked_n', 'marked_n_old', 'smin',
  'paused', 'rate_n', 'track_ids', 'prio', 'completed' }
local WALK = '0123456789abcdef0123456789abcdef0123456789abcdef' ..
  '0123456789abcdef0123456789abcdef0123456789abcdef'

local function claim(keys, args)
  local ring, meta, leases = keys[1], keys[9], keys[11]
  redis.call('LRANGE', leases, '0', '1')
  redis.call('HMGET', meta, unpack(FIELDS))
  redis.call('EXISTS', keys[2], keys[3], keys[4], keys[5], keys[6], keys[7])
  local t = redis.call('TIME')
  local ids = redis.call('RPOP', ring, args[2])
  local element = '*' .. t[1] .. t[2] .. '.1.1*' .. ids[1]
  redis.call('LSET', leases, '0', element)
  redis.call('HSET', meta, 'seq', '2', 'taken', '1', 'walk', WALK, 'completed', '1')
  return { 0, -1, 1, element }
end

redis.register_function('rotator_contract_claim', claim)
