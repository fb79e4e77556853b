#!lua name=rotator_lean_claim
-- A prototype, for measuring only: the one-job claim of one worker's loop written as a path of
-- its own over a packed state, to see what a rewrite of the module's short way could cost
-- (issue 14). The state it serves is the one bench.instructions' and bench.server_time's
-- one-job case runs in: the call acks the batch its worker claimed before (a batch ack, that
-- batch alone in the lease list), nothing else waits (no side structure exists: no acks one by
-- one, marks, nacks, fenced tokens or dead letters), no queue setting is on, and pending ids
-- lie at the ring's tail. There it makes the checks and writes the module's short way makes:
-- the keys' names (once a library, as the module), the arguments (each text read once), the
-- ack's form and batch, the side structures' absence, the lap, the lease pass's counting, the
-- popped id, and the counters; any other state is an error here, where the module would take
-- its long way. The queue's numbers live in one field of the meta hash, "state", packed by
-- `struct` (15 doubles), instead of a field each.
--
-- KEYS: the module's thirteen queue keys (lua/rotator.lua's header).
-- FCALL lean_claim 13 KEYS next_packed COUNT(1) LEASE_MS BUDGET MAX_DELIVERIES BATCH_ACK
--   -> {0, ms to the earliest deadline, jobs acked (1), the packed element "*<deadline>.1.<seq>*<id>"}
-- FCALL lean_seed 13 KEYS -> the batch ack of a first batch, which it puts in the lease list
--   as a worker's call before would have, with the state of a queue whose ring holds its ids.

local STATE = 'ddddddddddddddd'
local ROLES = { ':ring', ':done', ':done_old', ':marks', ':marks_old', ':revoked', ':dead', ':wake',
  ':meta', ':pushlog', ':leases', ':scheduled', ':ids' }
local KEPT = { ints = {}, keys = {} }

local function int_arg(text, lo, hi)
  local n = KEPT.ints[text]
  if n then return n end
  n = tonumber(text)
  if not n or n < lo or n > hi or n % 1 ~= 0 then error('ROTATOR_BADARG ' .. tostring(text)) end
  KEPT.ints[text] = n
  return n
end

local function check_keys(keys)
  local last = KEPT.keys
  local same = #keys == #last
  for i = 1, same and #keys or 0 do
    if keys[i] ~= last[i] then same = false break end
  end
  if same then return end
  local base = string.sub(keys[1], 1, -6)
  for i = 1, 13 do
    if keys[i] ~= base .. ROLES[i] then error('ROTATOR_KEYS ' .. keys[i]) end
  end
  KEPT.keys = keys
end

local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

local function claim(keys, args)
  check_keys(keys)
  local ring, leases, meta = keys[1], keys[11], keys[9]
  local count = int_arg(args[2], 1, 1000)
  local lease = int_arg(args[3], 1, 86400000)
  int_arg(args[4], 1, 1000)
  int_arg(args[5], 0, 1000000)
  local ack = args[6]
  local now = now_ms()
  local seq, lapnext, qstart, qlen, lmin, _, _, _, rpasses, lpasses, taken, packed, completed,
    origin, settings = struct.unpack(STATE, redis.call('HGET', meta, 'state'))
  -- (settings: paused, scheduled jobs, a rate limit, tracked ids, priorities, own fence)
  if settings ~= 0 then error('LEAN_OTHER_STATE settings') end
  if redis.call('EXISTS', keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]) ~= 0 then
    error('LEAN_OTHER_STATE side structures')
  end
  local length = redis.call('LLEN', ring)
  if count ~= 1 or count >= length or count > lapnext - seq - 1 or lmin <= now then
    error('LEAN_OTHER_STATE ring')
  end
  -- The ack: "*<deadline>.1.<call seq>/<jobs>", the batch at the lease list's tail.
  local slash = string.find(ack or '', '/', 2, true)
  if string.byte(ack or '') ~= 42 or not slash then error('ROTATOR_BADTOKEN ' .. tostring(ack)) end
  local batch, jobs = string.sub(ack, 1, slash - 1), string.sub(ack, slash + 1)
  local acked_deadline = string.match(batch, '^%*(%d+)%.1%.%d+$')
  if not acked_deadline or #acked_deadline > 15 then error('ROTATOR_BADTOKEN ' .. ack) end
  local tail = redis.call('LRANGE', leases, '-2', '-1')
  local last = tail[#tail]
  if #tail ~= 1 or jobs ~= '1' or string.sub(last, 1, #batch + 1) ~= batch .. '*' then
    error('LEAN_OTHER_STATE lease list')
  end
  local id = redis.call('RPOP', ring)
  if #id == 0 or #id > 1024 or string.find(id, '*', 1, true) then
    redis.call('RPUSH', ring, id)
    error('LEAN_OTHER_STATE not a pending id')
  end
  local deadline = now + lease
  local element = string.format('*%d.1.%d*', deadline, seq) .. id
  redis.call('LSET', leases, '0', element)
  -- The lease pass (the module's walk_leases for its one visit): the list walked whole, and
  -- the ring too since the last ageing, the acks and marks age (none exists: nothing renamed).
  lpasses = lpasses + 1
  if (rpasses >= 1 or length - 1 <= 1) and lpasses >= 1 then lpasses, rpasses = 0, -1 end
  -- (the lease list now holds this call's batch only: the earliest deadline, and the one
  -- a walk would stop at)
  redis.call('HSET', meta, 'state', struct.pack(STATE, seq + 2, lapnext + 1, qstart + 1, qlen,
    deadline, deadline, 0, 0, rpasses, lpasses, taken + 1, packed, completed + 1, origin,
    settings))
  return { 0, deadline - now, 1, element }
end

local function seed(keys)
  local now = now_ms()
  local length = redis.call('LLEN', keys[1])
  local deadline = now + 60000
  redis.call('LPUSH', keys[11], string.format('*%d.1.%d*seed', deadline, now))
  redis.call('HSET', keys[9], 'state', struct.pack(STATE, now + 1, now + length + 10, now, length,
    deadline, deadline, 0, 0, 0, 0, 0, 0, 0, now, 0))
  return string.format('*%d.1.%d/1', deadline, now)
end

redis.register_function('lean_claim', claim)
redis.register_function('lean_seed', seed)
