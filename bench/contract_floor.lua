#!lua name=rotator_contract_floor
-- The module's contract, bare: what one worker's one-job loop (M.loop_lease) and a push of
-- one id cost the server before any of their logic. A function library called as the
-- module is (FCALL, a queue's thirteen keys, the command's arguments), making the loop's
-- seven commands, or the push's eight, with the same keys and as many fields, and nothing
-- else: no check, no number read or written as a number, no fencing. Against bench/floor.lua
-- (the pattern's floor) it says what the contract itself costs (its keys, its arguments, the
-- commands that keep the state); against the module, what the module's own Lua costs
-- (bench.instructions, for the claim; bench.wake, for a push and the claim after a wake-up).
-- A benchmark reference, not a queue: it writes fixed values.
--
-- KEYS: a queue's thirteen, in rotator.keys' order (1 ring, 2 done, 3 done_old, 4 marks,
--   5 marks_old, 6 revoked, 7 dead, 8 wake, 9 meta, 10 pushlog, 11 leases, 12 scheduled,
--   13 ids); the ring holds pending ids, the lease list one element.
-- rotator_contract_claim ARGS: next_packed COUNT LEASE_MS BUDGET MAX_DELIVERIES ACK (as the
-- module takes them). Replies as next_packed does: { idle, wait_ms, acked, packed element },
-- { 1, -1, 0, "" } when the ring is empty.
-- rotator_contract_push ARGS: push ID. Replies 1, as push does.
--
--   redis-cli FUNCTION LOAD "$(cat bench/contract_floor.lua)"
--   redis-cli FCALL rotator_contract_claim 13 $Q next_packed 1 30000 1000 0 '*1.1.1/1'
--   redis-cli FCALL rotator_contract_push 13 $Q push job-1

-- The meta fields a claim's first read takes (FRESH_FIELDS: the loop's, and lease_max) with
-- the storage format's (every call's first read checks it, M.first_reads), and a walk field's
-- size (WALK_BYTES).
local FIELDS = { 'seq', 'walk', 'taken', 'origin', 'marked_n', 'marked_n_old', 'smin',
  'paused', 'rate_n', 'track_ids', 'prio', 'completed', 'lease_max', 'format' }
local WALK = '0123456789abcdef0123456789abcdef0123456789abcdef' ..
  '0123456789abcdef0123456789abcdef0123456789abcdef'

local function claim(keys, args)
  local ring, meta, leases = keys[1], keys[9], keys[11]
  redis.call('HMGET', meta, unpack(FIELDS)) -- (with the storage format's check)
  redis.call('LRANGE', leases, '0', '1')
  redis.call('EXISTS', keys[2], keys[3], keys[4], keys[5], keys[6], keys[7])
  local t = redis.call('TIME')
  local ids = redis.call('RPOP', ring, args[2])
  if not ids then return { 1, -1, 0, '' } end -- (a blocked consumer's claim after a timeout)
  local element = '*' .. t[1] .. t[2] .. '.1.1*' .. ids[1]
  redis.call('LSET', leases, '0', element)
  redis.call('HSET', meta, 'seq', '2', 'taken', '1', 'walk', WALK, 'completed', '1')
  return { 0, -1, 1, element }
end

-- The push's eight commands (M.push_ids with record_push, a push within its checkpoint's
-- second): the seven meta fields it reads with the storage format's, the ring's length, the
-- wake list's length, the push log's head, the time, the id pushed, the meta written back, a
-- wake-up.
local function push(keys, args)
  local ring, wake, meta, pushlog = keys[1], keys[8], keys[9], keys[10]
  redis.call('HMGET', meta, 'seq', 'origin', 'pushed', 'taken', 'walk', 'track_ids', 'layout',
    'format')
  redis.call('LLEN', ring)
  redis.call('LLEN', wake)
  redis.call('LINDEX', pushlog, '0')
  redis.call('TIME')
  redis.call('LPUSH', ring, args[2])
  redis.call('HSET', meta, 'walk', WALK, 'pushed', '1')
  redis.call('LPUSH', wake, '1')
  return 1
end

redis.register_function('rotator_contract_claim', claim)
redis.register_function('rotator_contract_push', push)
