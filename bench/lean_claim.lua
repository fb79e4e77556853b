#!lua name=rotator_lean_claim
-- Prototypes, for measuring only: the one-job claim of one worker's loop written as a path of
-- its own, to see what a rewrite of the module's short way could cost (issue 14). The state it
-- serves is the one bench.instructions' and bench.server_time's one-job case runs in: the
-- call acks the batch its worker claimed before (a batch ack, that batch alone in the lease
-- list), nothing else waits (no side structure exists: no acks one by one, marks, nacks,
-- fenced tokens or dead letters), no queue setting is on, and pending ids lie at the ring's
-- tail. There it makes the checks and writes the module's short way makes: the keys' names
-- (once a library, as the module), the arguments (each text read once), the ack's form and
-- batch, the side structures' absence and the settings', the lap, the lease pass's counting,
-- the popped id, and the counters; any other state is an error here, where the module would
-- take its long way. Two layouts of the queue's numbers:
--   fields  the module's own: a field each in the meta hash, read by one HMGET of what this
--           claim needs (the settings among them, to see that none is on), written back by
--           one HSET of what changed and the HINCRBY of `completed`, as the module does;
--   packed  one field of the meta hash, "state", packed by `struct` (15 doubles: the fields
--           layout's numbers in its order, then lstop lpass lskip packed completed origin and
--           the settings, 0 when none is on).
--
-- KEYS: the module's thirteen queue keys (lua/rotator.lua's header).
-- FCALL lean_claim 13 KEYS next_packed 1 LEASE_MS BUDGET MAX_DELIVERIES BATCH_ACK
--   -> {0, ms to the earliest deadline, jobs acked (1), the packed element "*<deadline>.1.<seq>*<id>"}
--   (lean_claim_packed: the same on the packed layout)
-- FCALL lean_seed 13 KEYS LAYOUT -> the batch ack of a first batch, which it puts in the lease
--   list as a worker's call before would have, with the state of a queue whose ring holds its
--   ids, in LAYOUT ("fields" or "packed").

local PACKED = 'ddddddddddddddd'
local ROLES = { ':ring', ':done', ':done_old', ':marks', ':marks_old', ':revoked', ':dead', ':wake',
  ':meta', ':pushlog', ':leases', ':scheduled', ':ids' }
-- What the fields layout reads: the numbers, then the settings and counts that must be absent
-- (or 0) for this state.
local FIELDS = { 'seq', 'lapnext', 'qstart', 'qlen', 'lmin', 'rpasses', 'lpasses', 'taken',
  'paused', 'smin', 'rate_n', 'track_ids', 'prio', 'stale', 'fence_ms', 'fence_max', 'dead_max',
  'dead_age_ms', 'marked_n', 'marked_a', 'marked_n_old', 'marked_a_old' }
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

-- The queue's numbers, {seq, lapnext, qstart, qlen, lmin, rpasses, lpasses, taken, ...}, and
-- their writing back, in each layout (the numbers a lease list holding only this call's batch
-- has: lmin and lstop its deadline, the lease pass over).
local LAYOUTS = {
  fields = {
    read = function(meta)
      local m = redis.call('HMGET', meta, unpack(FIELDS))
      for i = 9, #FIELDS do
        if m[i] and m[i] ~= '0' then error('LEAN_OTHER_STATE settings') end
      end
      local tn = tonumber
      local s = { tn(m[1]), tn(m[2]), tn(m[3]), tn(m[4]), tn(m[5]), m[6] and tn(m[6]) or 0,
        m[7] and tn(m[7]) or 0, tn(m[8]) }
      if not (s[1] and s[2] and s[3] and s[5] and s[8]) then error('LEAN_OTHER_STATE meta') end
      return s
    end,
    write = function(meta, s, deadline)
      redis.call('HSET', meta, 'seq', s[1], 'lapnext', s[2], 'qstart', s[3], 'lmin', deadline,
        'lstop', deadline, 'rpasses', s[6], 'lpasses', s[7], 'taken', s[8])
      redis.call('HINCRBY', meta, 'completed', '1')
    end,
    seed = function(meta, s)
      -- (with the module's `layout` field, which keeps the hash a hash table: see its
      -- LIMIT.meta_layout)
      redis.call('HSET', meta, 'seq', s[1], 'lapnext', s[2], 'qstart', s[3], 'qlen', s[4],
        'lmin', s[5], 'lstop', s[5], 'taken', 0, 'origin', s[1], 'layout',
        'rotator meta: a hash table on purpose, so that reading a field is O(1)')
    end,
  },
  packed = {
    read = function(meta)
      local s = { struct.unpack(PACKED, redis.call('HGET', meta, 'state')) }
      -- (s[15]: the settings, paused, scheduled jobs, a rate limit, tracked ids, priorities...)
      if s[15] ~= 0 then error('LEAN_OTHER_STATE settings') end
      return s
    end,
    write = function(meta, s, deadline)
      redis.call('HSET', meta, 'state', struct.pack(PACKED, s[1], s[2], s[3], s[4], deadline,
        s[6], s[7], s[8], deadline, 0, 0, s[12], s[13] + 1, s[14], s[15]))
    end,
    seed = function(meta, s)
      redis.call('HSET', meta, 'state', struct.pack(PACKED, s[1], s[2], s[3], s[4], s[5], 0, 0, 0,
        s[5], 0, 0, 0, 0, s[1], 0))
    end,
  },
}

local function claim(layout, keys, args)
  check_keys(keys)
  local ring, leases, meta = keys[1], keys[11], keys[9]
  local count = int_arg(args[2], 1, 1000)
  local lease = int_arg(args[3], 1, 86400000)
  int_arg(args[4], 1, 1000)
  int_arg(args[5], 0, 1000000)
  local ack = args[6] or ''
  local now = now_ms()
  local s = layout.read(meta)
  if redis.call('EXISTS', keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]) ~= 0 then
    error('LEAN_OTHER_STATE side structures')
  end
  local length = redis.call('LLEN', ring)
  if count ~= 1 or count >= length or count > s[2] - s[1] - 1 or s[5] <= now then
    error('LEAN_OTHER_STATE ring')
  end
  -- The ack: "*<deadline>.1.<call seq>/<jobs>", the batch at the lease list's tail.
  local slash = string.find(ack, '/', 2, true)
  if string.byte(ack) ~= 42 or not slash then error('ROTATOR_BADTOKEN ' .. ack) end
  local batch, jobs = string.sub(ack, 1, slash - 1), string.sub(ack, slash + 1)
  local acked_deadline = string.match(batch, '^%*(%d+)%.1%.%d+$')
  if not acked_deadline or #acked_deadline > 15 then error('ROTATOR_BADTOKEN ' .. ack) end
  local tail = redis.call('LRANGE', leases, '-2', '-1')
  if #tail ~= 1 or jobs ~= '1' or string.sub(tail[1], 1, #batch + 1) ~= batch .. '*' then
    error('LEAN_OTHER_STATE lease list')
  end
  local id = redis.call('RPOP', ring)
  if #id == 0 or #id > 1024 or string.find(id, '*', 1, true) then
    redis.call('RPUSH', ring, id)
    error('LEAN_OTHER_STATE not a pending id')
  end
  local deadline = now + lease
  local element = string.format('*%d.1.%d*', deadline, s[1]) .. id
  redis.call('LSET', leases, '0', element)
  -- The lease pass (the module's walk_leases for its one visit): the list walked whole, and
  -- the ring too since the last ageing, the acks and marks age (none exists: nothing renamed).
  s[7] = s[7] + 1
  if (s[6] >= 1 or length - 1 <= 1) and s[7] >= 1 then s[7], s[6] = 0, -1 end
  s[1], s[2], s[3], s[8] = s[1] + 2, s[2] + 1, s[3] + 1, s[8] + 1
  layout.write(meta, s, deadline)
  return { 0, deadline - now, 1, element }
end

local function seed(keys, args)
  local layout = LAYOUTS[args[1]]
  local now = now_ms()
  local deadline = now + 60000
  redis.call('LPUSH', keys[11], string.format('*%d.1.%d*seed', deadline, now))
  layout.seed(keys[9], { now + 1, now + redis.call('LLEN', keys[1]) + 10, now,
    redis.call('LLEN', keys[1]), deadline })
  return string.format('*%d.1.%d/1', deadline, now)
end

redis.register_function('lean_claim', function(keys, args)
  return claim(LAYOUTS.fields, keys, args)
end)
redis.register_function('lean_claim_packed', function(keys, args)
  return claim(LAYOUTS.packed, keys, args)
end)
redis.register_function('lean_seed', seed)
