--[[
rotator.lua: a reliable job queue on one Redis list (the ring). Redis >= 6.2 or Valkey >= 7.2.

Load once and call by SHA; the first ARGV picks the command. Every command takes the same ten
KEYS, which must share one hash tag so the module runs on Redis Cluster. Key names are never
built here: they all arrive through KEYS.

KEYS
  KEYS[1]  ring       LIST  job ids and leases, plus one sentinel; consumers rotate tail -> head
  KEYS[2]  done       SET   tokens acked since the last lap, awaiting removal from the ring
  KEYS[3]  done_old   SET   tokens acked before the last lap (swept at the next lap)
  KEYS[4]  marks      HASH  token -> "e<deadline ms>" (extended) or "n<due ms>" (nacked)
  KEYS[5]  marks_old  HASH  marks written before the last lap (swept at the next lap)
  KEYS[6]  revoked    ZSET  token -> ms it was revoked (re-leased, nacked or dead-lettered)
  KEYS[7]  dead       LIST  dead letters "<reason>*<deliveries>*<ms>*<element>", oldest first
  KEYS[8]  wake       LIST  wake-up tokens that idle consumers block on (BLPOP)
  KEYS[9]  meta       HASH  counters: seq lapnext lapguess qstart qmin pushed taken
  KEYS[10] pushlog    LIST  "<pushed>:<ms>" push checkpoints, newest first (pending age)

ELEMENTS OF THE RING
  sentinel   "*lap"                          exactly one; marks a full lap
  pending    "<id>"                          id: 1..1024 bytes, no "*"
  leased     "<id>*<deadline>.<n>.<seq>"     the delivery token: lease deadline in unix ms
                                             (server TIME), n = deliveries so far, seq = the
                                             queue's visit counter, so every token is unique
  Anything else is corrupt: a visit moves it to the dead letters with reason "corrupt".

COMMANDS (ARGV[1]; numbers are decimal integers)
  push ID [ID ...]
    Appends pending ids (at most 5000 per call); all or nothing. Wakes idle consumers.
    reply: number pushed
    errors: ROTATOR_BADID, ROTATOR_TOOMANY
  next COUNT LEASE_MS BUDGET MAX_DELIVERIES [ACK_TOKEN ...]
    First acks the tokens given (as `ack`), then visits at most BUDGET elements from the tail
    and leases at most COUNT jobs (1..1000) for LEASE_MS (1..86400000). An acked lease is
    removed; a young lease is skipped; an expired lease or a due nack is leased again with a
    new token, or dead-lettered once it was delivered MAX_DELIVERIES times (0: no limit).
    reply: {idle, wait_ms, acked, token1, reclaimed1, token2, reclaimed2, ...}
      idle     1 when a whole lap since the last push found nothing: block on KEYS[8]
      wait_ms  ms until the earliest known lease deadline or nack due time, -1 if none
      acked    how many ACK_TOKENs were accepted
      reclaimedN 1 when tokenN re-leases a job whose previous lease expired
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  ack TOKEN [TOKEN ...]
    Completes leases; the element leaves the ring when a consumer next reaches it.
    A token whose lease was re-issued, nacked or dead-lettered is refused.
    reply: number accepted
    errors: ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  nack DELAY_MS TOKEN [TOKEN ...]
    Gives leases back; each job is delivered again (as a new delivery) once DELAY_MS has
    passed (0..86400000). The old token is revoked.
    reply: {ok1, ok2, ...}  1 = requeued, 0 = lease lost (re-issued, acked or unknown queue)
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  extend LEASE_MS TOKEN [TOKEN ...]
    Moves each lease's deadline to now + LEASE_MS (1..86400000).
    reply: {deadline_ms, ok1, ok2, ...}  1 = extended, 0 = lease lost
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  stats
    reply: {"length", n, "pending", n, "in_flight", n, "done", n, "deferred", n, "dead", n,
            "oldest_pending_age_ms", n (-1 when nothing is pending)}
    Costs O(marks), never O(ring).
  peek COUNT
    The COUNT (1..1000) elements nearest the tail, tail first, without changing anything.
    reply: {element1, state1, time1, ...}; state: "lap", "pending", "leased", "done",
           "deferred", "corrupt"; time: lease deadline or due ms (0 when none)
    errors: ROTATOR_BADARG
  sweep BUDGET
    Visits at most BUDGET elements (1..10000) without leasing anything: removes acked
    elements, dead-letters corrupt ones, repairs the sentinel. Repeat until `visited` adds up
    to the ring's length to clean a whole lap (an idle queue otherwise cleans up lazily).
    reply: {visited, removed, length}
    errors: ROTATOR_BADARG
  dead START COUNT
    reply: dead-letter entries START .. START+COUNT-1 (COUNT 1..1000), oldest first
    errors: ROTATOR_BADARG
  requeue_dead COUNT [ID ...]
    Moves up to COUNT (1..5000) dead letters back to the ring as pending ids, oldest first;
    with IDs, only letters for those ids. Examines at most 10000 letters per call.
    reply: number requeued
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY

ERRORS (replies start with the code)
  ROTATOR_BADCMD, ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_BADTOKEN, ROTATOR_TOOMANY,
  ROTATOR_KEYS, ROTATOR_WRONGTYPE. Every argument and key type is checked before the first
  write, so a failing call changes nothing.

REDIS-CLI
  SHA=$(redis-cli SCRIPT LOAD "$(cat lua/rotator.lua)")
  Q="rotator:{orders}:ring rotator:{orders}:done rotator:{orders}:done_old rotator:{orders}:marks rotator:{orders}:marks_old rotator:{orders}:revoked rotator:{orders}:dead rotator:{orders}:wake rotator:{orders}:meta rotator:{orders}:pushlog"
  redis-cli EVALSHA $SHA 10 $Q push job-1 job-2
  redis-cli EVALSHA $SHA 10 $Q next 10 30000 1000 5
  redis-cli EVALSHA $SHA 10 $Q ack 'job-1*1732233600000.1.1'
  redis-cli EVALSHA $SHA 10 $Q stats
]]

-- Two ways to run: EVAL/EVALSHA run this whole chunk on every call, so it defines its
-- functions each time (creating closures is a good part of a call's cost); FUNCTION LOAD runs
-- it once to register `main`, and each FCALL only runs `main`. Functions live in one table (M)
-- and key types are checked by the reads a command needs anyway (M.read), not by TYPE.
local M = {}
-- This call's named keys and arguments, and the command function (which a library may not
-- touch while it loads): all set by main for every call.
local K, A, rcall

local SENTINEL = '*lap'
-- Zero-padded visit numbers ("00042"), each formatted once: a token's seq is the call's
-- first visit number followed by one of these, which spares formatting a number per job.
-- Made by main on its first call (a library may not call setmetatable while it loads), so
-- loaded as a library it lives across calls.
local PAD
local function make_pad()
  return setmetatable({}, {
    __index = function(pad, i)
      local text = string.format('%05d', i)
      pad[i] = text
      return text
    end,
  })
end
local LIMIT = {
  id_bytes = 1024,
  batch = 5000, -- ids or tokens per call; Lua's unpack() fails near 8000
  count = 1000, -- jobs leased per call
  budget = 10000, -- elements visited per call: bounds the time of one call
  lease_ms = 86400000, -- one day; longer jobs extend their lease
  revoked_keep_ms = 2 * 86400000, -- how long a refused token is remembered
  wake_tokens = 16, -- at most this many idle consumers woken by one push
  pushlog_bucket_ms = 1000, -- pushes within a second share one checkpoint
}

function M.fail(code, message)
  return { err = code .. ' ' .. message }
end

-- Ends the command with an expected error. Only ever raised before a command's first write
-- (Redis does not roll back a script); the dispatcher turns it into the error reply.
function M.refuse(code, message)
  error(M.fail(code, message), 0)
end

-- Arguments echoed in errors: short, and nothing that could break a reply or a log line.
function M.printable(value)
  return '"' .. string.gsub(string.sub(tostring(value), 1, 64), '[^%w%p ]', '?') .. '"'
end

-- A read that is also its key's type check: every key a command writes is read through here
-- before the command's first write.
function M.read(name, key, ...)
  local reply = redis.pcall(name, key, ...)
  if type(reply) == 'table' and reply.err then
    M.refuse('ROTATOR_WRONGTYPE', key .. ' holds a ' .. rcall('TYPE', key)['ok'] ..
      ', not the type rotator keeps there')
  end
  return reply
end

function M.now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A whole number in [lo, hi] written in plain digits; strtod-isms like "1e3" or "nan" fail.
function M.int_arg(index, name, lo, hi)
  local value = A[index]
  if type(value) ~= 'string' or not string.find(value, '^%d+$') or #value > 15 then
    M.refuse('ROTATOR_BADARG', name .. ' must be a whole number, got ' .. M.printable(value))
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    M.refuse('ROTATOR_BADARG', name .. ' must be in ' .. lo .. '..' .. hi .. ', got ' .. value)
  end
  return n
end

function M.valid_id(id)
  return #id > 0 and #id <= LIMIT.id_bytes and not string.find(id, '*', 1, true)
end

-- Splits "<id>*<deadline>.<n>.<seq>"; nil for anything that is not a well-formed lease.
function M.parse_token(element)
  local star = string.find(element, '*', 1, true)
  if not star or star == 1 or star > LIMIT.id_bytes + 1 or #element - star > 40 then
    return nil
  end
  local deadline, n = string.match(element, '^(%d+)%.(%d+)%.%d+$', star + 1)
  if not deadline or #deadline > 15 or #n > 9 then return nil end
  return string.sub(element, 1, star - 1), tonumber(deadline), tonumber(n)
end

function M.check_count(first, what)
  local count = #A - first + 1
  if count > LIMIT.batch then
    M.refuse('ROTATOR_TOOMANY', 'at most ' .. LIMIT.batch .. ' ' .. what .. ' per call, got ' .. count)
  end
end

function M.check_ids(first)
  M.check_count(first, 'ids')
  for i = first, #A do
    if not M.valid_id(A[i]) then
      M.refuse('ROTATOR_BADID', 'job id must be 1..' .. LIMIT.id_bytes ..
        ' bytes without "*", got ' .. M.printable(A[i]))
    end
  end
end

-- Tokens are only checked for their shape here; nothing parses their numbers.
function M.check_tokens(first, required)
  if required and #A < first then M.refuse('ROTATOR_BADTOKEN', 'no token given') end
  M.check_count(first, 'tokens')
  local find = string.find
  for i = first, #A do
    local token = A[i]
    -- A plain search for "*" (memchr), then a pattern over the short stamp only.
    local star = find(token, '*', 2, true)
    if not star or star > LIMIT.id_bytes + 1 or #token - star > 40
        or not find(token, '^%d+%.%d+%.%d+$', star + 1) then
      M.refuse('ROTATOR_BADTOKEN', 'not a delivery token: ' .. M.printable(token))
    end
  end
end

-- LPUSH in slices, keeping order, so long batches stay under unpack()'s limit.
function M.lpush_all(key, items)
  for i = 1, #items, LIMIT.batch do
    rcall('LPUSH', key, unpack(items, i, math.min(i + LIMIT.batch - 1, #items)))
  end
end

function M.read_meta()
  local m = M.read('HMGET', K.meta, 'seq', 'lapnext', 'qstart', 'qmin', 'pushed', 'taken',
    'lapguess')
  return {
    seq = tonumber(m[1]) or 0, lapnext = tonumber(m[2]), qstart = tonumber(m[3]),
    qmin = tonumber(m[4]), pushed = tonumber(m[5]) or 0, taken = tonumber(m[6]) or 0,
    lapguess = m[7] == '1' or not tonumber(m[2]),
  }
end

-- The sizes of the side structures; reading them is also their type check.
function M.read_sides()
  return {
    [K.done] = M.read('SCARD', K.done), [K.done_old] = M.read('SCARD', K.done_old),
    [K.marks] = M.read('HLEN', K.marks), [K.marks_old] = M.read('HLEN', K.marks_old),
    revoked = M.read('ZCARD', K.revoked),
  }
end

-- Tokens in A[first..] that were revoked, as a set.
function M.revoked_among(first, sides)
  local refused = {}
  if #A >= first and sides.revoked > 0 then
    local scores = rcall('ZMSCORE', K.revoked, unpack(A, first))
    for i = 1, #scores do
      if scores[i] then refused[A[first + i - 1]] = true end
    end
  end
  return refused
end

-- Acks A[first..] (already checked); returns how many were accepted.
function M.ack_tokens(first, ring_length, sides)
  if #A < first or ring_length == 0 then return 0 end
  local refused = M.revoked_among(first, sides)
  local accepted = {}
  for i = first, #A do
    local token = A[i]
    if not refused[token] then
      accepted[#accepted + 1] = token
      refused[token] = true -- a token given twice counts once
    end
  end
  if #accepted > 0 then
    rcall('SADD', K.done, unpack(accepted))
    sides[K.done] = sides[K.done] + #accepted
  end
  return #accepted
end

function M.ack()
  M.check_tokens(2, true)
  local length = M.read('LLEN', K.ring)
  local sides = { [K.done] = M.read('SCARD', K.done), revoked = M.read('ZCARD', K.revoked) }
  return M.ack_tokens(2, length, sides)
end

-- A ring that does not exist (new, or deleted) gets its sentinel; lap counting restarts.
function M.ensure_ring(length)
  if length == 0 then
    rcall('LPUSH', K.ring, SENTINEL)
    rcall('HDEL', K.meta, 'lapnext')
  end
end

-- Reads (and so type-checks) what record_push will write.
function M.read_push_keys()
  M.read('LLEN', K.wake)
  return M.read('LINDEX', K.pushlog, 0)
end

-- Notes `n` more pending ids: counters, the push checkpoint for ages, and a wake-up.
function M.record_push(meta, n, now, head)
  local pushlog = K.pushlog
  meta.pushed = meta.pushed + n
  local head_ms = head and tonumber(string.match(head, ':(%d+)$'))
  if head_ms and now - head_ms < LIMIT.pushlog_bucket_ms and now >= head_ms then
    rcall('LSET', pushlog, 0, meta.pushed .. ':' .. head_ms)
  else
    rcall('LPUSH', pushlog, meta.pushed .. ':' .. now)
  end
  -- Drop a few fully consumed checkpoints per push, so the log stays short.
  for _ = 1, 4 do
    local tail = rcall('LINDEX', pushlog, -1)
    if not tail or (tonumber(string.match(tail, '^(%d+):')) or 0) > meta.taken then break end
    rcall('RPOP', pushlog)
  end
  -- Something new is available: consumers must look at a whole lap again before idling.
  rcall('HSET', K.meta, 'pushed', meta.pushed, 'qstart', meta.seq)
  local tokens = {}
  for i = 1, math.min(n, LIMIT.wake_tokens) do tokens[i] = '1' end
  rcall('LPUSH', K.wake, unpack(tokens))
  rcall('LTRIM', K.wake, 0, LIMIT.wake_tokens - 1)
end

-- The job id inside a dead letter, or nil when it holds no valid id.
function M.dead_letter_id(letter)
  local element = string.match(letter, '^[^*]*%*%d+%*%d+%*(.*)$')
  if not element then return nil end
  local star = string.find(element, '*', 1, true)
  local id = star and string.sub(element, 1, star - 1) or element
  return M.valid_id(id) and id or nil
end

function M.push()
  M.check_ids(2)
  local n = #A - 1
  if n == 0 then return 0 end
  local length = M.read('LLEN', K.ring)
  local meta = M.read_meta()
  local head = M.read_push_keys()
  local now = M.now_ms()
  M.ensure_ring(length)
  for i = 2, #A, LIMIT.batch do
    rcall('LPUSH', K.ring, unpack(A, i, math.min(i + LIMIT.batch - 1, #A)))
  end
  M.record_push(meta, n, now, head)
  return n
end

function M.requeue_dead()
  local count = M.int_arg(2, 'COUNT', 1, LIMIT.batch)
  M.check_ids(3)
  local wanted = nil
  if #A >= 3 then
    wanted = {}
    for i = 3, #A do wanted[A[i]] = true end
  end
  local letters = M.read('LRANGE', K.dead, 0, LIMIT.budget - 1)
  local length = M.read('LLEN', K.ring)
  local meta = M.read_meta()
  local head = M.read_push_keys()
  local ids, kept = {}, {}
  for i = 1, #letters do
    local id = #ids < count and M.dead_letter_id(letters[i])
    if id and (not wanted or wanted[id]) then
      ids[#ids + 1] = id
    else
      kept[#kept + 1] = letters[i]
    end
  end
  if #ids == 0 then return 0 end
  -- Rewrite the examined prefix without the requeued letters, keeping their order.
  rcall('LTRIM', K.dead, #letters, -1)
  local reversed = {}
  for i = #kept, 1, -1 do reversed[#reversed + 1] = kept[i] end
  M.lpush_all(K.dead, reversed)
  M.ensure_ring(length)
  M.lpush_all(K.ring, ids)
  M.record_push(meta, #ids, M.now_ms(), head)
  return #ids
end

-- Which tokens in A[first..] still hold a live lease: not revoked, not acked.
function M.live_tokens(first)
  local alive = {}
  local length = M.read('LLEN', K.ring)
  local sides = M.read_sides()
  if length == 0 then return alive end
  local refused = M.revoked_among(first, sides)
  local tokens = {}
  for i = first, #A do tokens[#tokens + 1] = A[i] end
  local acked = {}
  for _, key in ipairs({ K.done, K.done_old }) do
    if sides[key] > 0 then
      local flags = rcall('SMISMEMBER', key, unpack(tokens))
      for i = 1, #flags do
        if flags[i] == 1 then acked[tokens[i]] = true end
      end
    end
  end
  for _, token in ipairs(tokens) do
    if not refused[token] and not acked[token] then alive[token] = true end
  end
  return alive
end

function M.nack()
  local delay = M.int_arg(2, 'DELAY_MS', 0, LIMIT.lease_ms)
  M.check_tokens(3, true)
  local alive = M.live_tokens(3)
  local meta = M.read_meta()
  M.read('LLEN', K.wake)
  local now = M.now_ms()
  local due = now + delay
  local reply = {}
  local any = false
  for i = 3, #A do
    local token = A[i]
    if alive[token] then
      alive[token] = nil -- a token given twice is requeued once
      rcall('HSET', K.marks, token, 'n' .. due)
      rcall('HDEL', K.marks_old, token)
      rcall('ZADD', K.revoked, now, token)
      reply[#reply + 1] = 1
      any = true
    else
      reply[#reply + 1] = 0
    end
  end
  if any then
    local qmin = meta.qmin and math.min(meta.qmin, due) or due
    rcall('HSET', K.meta, 'qmin', qmin, 'qstart', meta.seq)
    rcall('LPUSH', K.wake, '1')
    rcall('LTRIM', K.wake, 0, LIMIT.wake_tokens - 1)
  end
  return reply
end

function M.extend()
  local lease = M.int_arg(2, 'LEASE_MS', 1, LIMIT.lease_ms)
  M.check_tokens(3, true)
  local alive = M.live_tokens(3)
  local deadline = M.now_ms() + lease
  local reply = { deadline }
  for i = 3, #A do
    local token = A[i]
    if alive[token] then
      rcall('HSET', K.marks, token, 'e' .. deadline)
      rcall('HDEL', K.marks_old, token)
      reply[#reply + 1] = 1
    else
      reply[#reply + 1] = 0
    end
  end
  return reply
end

-- Looks up, for a slice of ring elements, where their ack and mark live. Fills, per index:
-- done_in[i] = key of the done set holding it; mark[i] = mark value; mark_in[i] = its key.
-- One command per structure for the whole slice, whatever its size.
function M.look_up(slice, sides, stamped, done_in, mark, mark_in)
  local find = string.find
  local tokens, at = {}, {}
  local n = 0
  for i = 1, #slice do
    -- A "*" after the first byte: a lease (or a corrupt element that parse_token rejects).
    if find(slice[i], '*', 2, true) then
      n = n + 1
      tokens[n], at[n] = slice[i], i
      stamped[i] = true
    end
  end
  if n == 0 then return end
  for _, key in ipairs({ K.done, K.done_old }) do
    if sides[key] > 0 then
      local flags = rcall('SMISMEMBER', key, unpack(tokens))
      for j = 1, #flags do
        if flags[j] == 1 and not done_in[at[j]] then done_in[at[j]] = key end
      end
    end
  end
  for _, key in ipairs({ K.marks, K.marks_old }) do
    if sides[key] > 0 then
      local values = rcall('HMGET', key, unpack(tokens))
      for j = 1, #tokens do
        local i = at[j]
        if values[j] and not done_in[i] and not mark[i] then
          mark[i] = values[j]
          mark_in[i] = key
        end
      end
    end
  end
end

-- Applies the side-structure writes collected so far by a walk, keeping the sizes in
-- s.sides true (end_lap renames only what exists).
function M.flush_side_writes(s)
  local sides = s.sides
  for _, key in ipairs({ K.done, K.done_old }) do
    if #s.srem[key] > 0 then sides[key] = sides[key] - rcall('SREM', key, unpack(s.srem[key])) end
    s.srem[key] = {}
  end
  for _, key in ipairs({ K.marks, K.marks_old }) do
    if #s.hdel[key] > 0 then sides[key] = sides[key] - rcall('HDEL', key, unpack(s.hdel[key])) end
    s.hdel[key] = {}
  end
  if #s.keep_marks > 0 then
    sides[K.marks] = sides[K.marks] + rcall('HSET', K.marks, unpack(s.keep_marks))
  end
  s.keep_marks = {}
end

-- The sentinel's visit ends a lap: whatever an old generation still holds was not claimed
-- by any element during a whole lap, so it is a leftover (late ack, stale mark) and goes.
-- Look-ups already made for slice[1..from] now live one generation older.
function M.end_lap(s, from, done_in, mark_in)
  M.flush_side_writes(s)
  rcall('DEL', K.done_old, K.marks_old)
  local sides = s.sides
  if sides[K.done] > 0 then rcall('RENAME', K.done, K.done_old) end
  if sides[K.marks] > 0 then rcall('RENAME', K.marks, K.marks_old) end
  sides[K.done_old], sides[K.done] = sides[K.done], 0
  sides[K.marks_old], sides[K.marks] = sides[K.marks], 0
  rcall('ZREMRANGEBYSCORE', K.revoked, '-inf', '(' .. (s.now - LIMIT.revoked_keep_ms))
  local older = { [K.done] = K.done_old, [K.marks] = K.marks_old }
  for i = from, 1, -1 do
    if done_in[i] then done_in[i] = older[done_in[i]] or false end
    if mark_in[i] then mark_in[i] = older[mark_in[i]] or false end
  end
  s.rotated[#s.rotated + 1] = SENTINEL
  s.lapnext, s.lapguess = s.seq + s.visited + s.live, false
end

-- Hands out a new delivery of `id` (delivered `n` times so far) in place of `old_token`,
-- or dead-letters it when it has had its deliveries.
function M.lease_again(s, id, n, old_token, reclaimed, mark_key)
  if mark_key then table.insert(s.hdel[mark_key], old_token) end
  s.revoke[#s.revoke + 1] = old_token
  if s.max_deliveries > 0 and n >= s.max_deliveries then
    s.letters[#s.letters + 1] = 'max_deliveries*' .. n .. '*' .. s.now .. '*' .. id
    s.live = s.live - 1
    return
  end
  local token = id .. '*' .. s.deadline .. '.' .. (n + 1) .. '.' .. s.seq_base .. PAD[s.visited]
  s.rotated[#s.rotated + 1] = token
  s.reply[#s.reply + 1] = token
  s.reply[#s.reply + 1] = reclaimed
  s.leased = s.leased + 1
end

-- An element that stays as it is for now; a mark it still needs moves to the current
-- generation.
function M.keep(s, element, at, m, m_key)
  s.rotated[#s.rotated + 1] = element
  if at and (not s.soonest or at < s.soonest) then s.soonest = at end
  if m and m_key ~= K.marks then
    s.keep_marks[#s.keep_marks + 1] = element
    s.keep_marks[#s.keep_marks + 1] = m
    if m_key then table.insert(s.hdel[m_key], element) end
  end
end

function M.dead_letter(s, reason, n, element)
  s.letters[#s.letters + 1] = reason .. '*' .. n .. '*' .. s.now .. '*' .. element
  s.live = s.live - 1
end

-- A leased element that is not acked: keep it, or lease it again once it is due.
function M.visit_lease(s, element, m, m_key)
  if not m and s.young_low then
    -- The common case, a young lease with no mark, decided without parsing a number: a
    -- deadline written with as many digits as now and the longest lease is young when it
    -- sorts after now and no later than now + the longest lease (digit strings of one length
    -- sort like their numbers, and anything else fails these checks and is parsed below).
    local star = string.find(element, '*', 2, true)
    local width = #s.young_low
    local deadline = string.sub(element, star + 1, star + width)
    if deadline > s.young_low and deadline <= s.young_high and #element - star <= 40
        and string.byte(element, star + width + 1) == 46 and star <= LIMIT.id_bytes + 1 then
      local rotated = s.rotated
      rotated[#rotated + 1] = element
      if not s.young_min or deadline < s.young_min then s.young_min = deadline end
      return
    end
  end
  local id, deadline, n = M.parse_token(element)
  local kind = m and string.sub(m, 1, 1)
  local when = m and tonumber(string.match(m, '^[en](%d+)$'))
  if not id then
    if m_key then table.insert(s.hdel[m_key], element) end
    M.dead_letter(s, 'corrupt', 0, element)
    return
  end
  if when and kind == 'e' then deadline = when end
  local due = (when and kind == 'n') and when or deadline
  if due > s.now or s.sweeping then
    M.keep(s, element, due, m, m_key)
  else
    M.lease_again(s, id, n, element, (kind == 'n') and 0 or 1, m_key)
  end
end

-- The state of one walk over the tail of the ring, shared by next and sweep. Reading the
-- ring's length and the side structures' sizes also checks every key the walk may write.
function M.start_walk(lease, max_deliveries)
  local length = M.read('LLEN', K.ring)
  local meta = M.read_meta()
  local sides = M.read_sides()
  M.read('LLEN', K.dead)
  local now = M.now_ms()
  local lapnext = meta.lapnext or (meta.seq + length + 1)
  -- Tokens end in this call's first visit number and the visit's place in the call (PAD):
  -- unique, because the next call that leases starts at a higher visit number.
  local seq_base = tostring(meta.seq)
  local s = {
    now = now, deadline = now + lease, max_deliveries = max_deliveries, sides = sides,
    seq_base = seq_base, first = '*' .. (now + lease) .. '.1.' .. seq_base,
    young_low = tostring(now), young_high = tostring(now + LIMIT.lease_ms),
    length = length, live = length, -- ring length as it is at this point of the visits
    seq = meta.seq, lapnext = lapnext, qmin = meta.qmin,
    -- With the lap position unknown (new ring, lost meta), guess that the sentinel is within
    -- one ring length: a sentinel seen before then is accepted, none seen means it is gone.
    lapguess = meta.lapguess,
    qstart = meta.qstart or meta.seq, taken = meta.taken,
    reply = {}, rotated = {}, revoke = {}, letters = {}, keep_marks = {},
    srem = { [K.done] = {}, [K.done_old] = {} }, hdel = { [K.marks] = {}, [K.marks_old] = {} },
    visited = 0, leased = 0, soonest = nil, young_min = nil, sweeping = false,
  }
  if #s.young_low ~= #s.young_high then s.young_low = nil end -- no shortcut across a new digit
  return s
end

-- Visits at most `limit` elements from the tail, leasing up to `count` jobs.
function M.walk(s, count, limit)
  local PAD, SENTINEL = PAD, SENTINEL
  -- A pending id's first delivery: its token is id .. first .. PAD[visit within this call].
  local first = s.first
  local rotated, reply, srem = s.rotated, s.reply, s.srem
  local n_rotated, n_reply = #rotated, #reply
  -- Slices start just larger than what is wanted (every element fetched costs a string
  -- conversion) and double while the walk finds elements to skip.
  local extra = 2
  while s.visited < limit and s.leased < count do
    local want = math.min(limit - s.visited, count - s.leased + extra)
    extra = extra * 2
    local slice = rcall('LRANGE', K.ring, -(s.visited + want), -(s.visited + 1))
    local stamped, done_in, mark, mark_in = {}, {}, {}, {}
    M.look_up(slice, s.sides, stamped, done_in, mark, mark_in)
    local i = #slice
    while i >= 1 and s.leased < count do
      local element = slice[i]
      local visited = s.visited + 1
      s.visited = visited
      local index = s.seq + visited
      if index > s.lapnext then
        s.lapnext, s.lapguess = index + s.live, true -- lost track: guess again
      end
      if element == SENTINEL then
        if index < s.lapnext and not s.lapguess then
          s.live = s.live - 1 -- a second sentinel: drop it
        else
          M.end_lap(s, i - 1, done_in, mark_in)
          n_rotated = #rotated
        end
      else
        if index == s.lapnext then
          -- The sentinel is missing (someone removed it): put one back just before this
          -- element, which is then the first of the next lap.
          s.live = s.live + 1
          M.end_lap(s, i, done_in, mark_in)
          n_rotated = #rotated
          s.lapnext = s.lapnext - 1
        end
        if not stamped[i] then
          if element == '' or #element > LIMIT.id_bytes or string.byte(element) == 42 then
            s.taken = s.taken + 1 -- empty, too long, or starting with "*": not an id
            M.dead_letter(s, 'corrupt', 0, element)
          elseif s.sweeping then
            n_rotated = n_rotated + 1
            rotated[n_rotated] = element
          else
            s.taken = s.taken + 1
            local token = element .. first .. PAD[visited]
            n_rotated = n_rotated + 1
            rotated[n_rotated] = token
            reply[n_reply + 1], reply[n_reply + 2] = token, 0
            n_reply = n_reply + 2
            s.leased = s.leased + 1
          end
        elseif done_in[i] ~= nil then
          if done_in[i] then
            local list = srem[done_in[i]]
            list[#list + 1] = element
          end
          s.live = s.live - 1
        else
          M.visit_lease(s, element, mark[i], mark_in[i])
          n_rotated, n_reply = #rotated, #reply
        end
      end
      i = i - 1
    end
  end
end

-- Writes what a walk decided: the ring (visited tail dropped, what stays pushed back at the
-- head in visit order), side structures, revocations, dead letters and counters.
function M.finish_walk(s)
  rcall('LTRIM', K.ring, 0, -(s.visited + 1))
  M.lpush_all(K.ring, s.rotated)
  M.flush_side_writes(s)
  if #s.revoke > 0 then
    local args = {}
    for j = 1, #s.revoke do
      args[#args + 1] = s.now
      args[#args + 1] = s.revoke[j]
    end
    rcall('ZADD', K.revoked, unpack(args))
  end
  if #s.letters > 0 then rcall('RPUSH', K.dead, unpack(s.letters)) end
  s.seq = s.seq + s.visited
  if s.leased > 0 and (not s.soonest or s.deadline < s.soonest) then s.soonest = s.deadline end
  local young = s.young_min and tonumber(s.young_min)
  if young and (not s.soonest or young < s.soonest) then s.soonest = young end
  if s.soonest and (not s.qmin or s.soonest < s.qmin) then s.qmin = s.soonest end
  rcall('HSET', K.meta, 'seq', s.seq, 'qstart', s.qstart, 'taken', s.taken,
    'lapnext', s.lapnext, 'lapguess', s.lapguess and 1 or 0, 'qmin', s.qmin or '')
end

function M.next()
  local count = M.int_arg(2, 'COUNT', 1, LIMIT.count)
  local lease = M.int_arg(3, 'LEASE_MS', 1, LIMIT.lease_ms)
  local budget = M.int_arg(4, 'BUDGET', 1, LIMIT.budget)
  local max_deliveries = M.int_arg(5, 'MAX_DELIVERIES', 0, 1000000)
  M.check_tokens(6, false)
  local s = M.start_walk(lease, max_deliveries)
  local acked = M.ack_tokens(6, s.length, s.sides)
  if s.length == 0 then return { 1, -1, acked } end
  if s.qmin and s.qmin <= s.now then
    -- Something has come due since the last idle lap: look at a whole lap again.
    s.qmin, s.qstart = nil, s.seq
  end
  s.reply = { 0, -1, acked }
  M.walk(s, count, math.min(budget, s.length))
  M.finish_walk(s)
  local reply = s.reply
  if s.leased == 0 and s.seq - s.qstart >= s.live then
    -- A whole lap since the last push found nothing. Only such a call may clear the wake
    -- list, so a push between two partial laps cannot lose its wake-up.
    rcall('DEL', K.wake)
    reply[1] = 1
  end
  if s.qmin then reply[2] = s.qmin - s.now end
  return reply
end

function M.sweep()
  local budget = M.int_arg(2, 'BUDGET', 1, LIMIT.budget)
  local s = M.start_walk(0, 0)
  if s.length == 0 then return { 0, 0, 0 } end
  s.sweeping = true
  M.walk(s, 1, math.min(budget, s.length))
  M.finish_walk(s)
  return { s.visited, s.length - s.live, math.max(s.live - 1, 0) }
end

function M.stats()
  local now = M.now_ms()
  local meta = M.read_meta()
  local ring_length = M.read('LLEN', K.ring)
  local length = ring_length > 0 and ring_length - 1 or 0
  local pending = math.max(0, math.min(length, meta.pushed - meta.taken))
  local acked = M.read('SCARD', K.done) + M.read('SCARD', K.done_old)
  local deferred = 0
  for _, key in ipairs({ K.marks, K.marks_old }) do
    local values = M.read('HVALS', key)
    for i = 1, #values do
      if string.sub(values[i], 1, 1) == 'n' then deferred = deferred + 1 end
    end
  end
  local in_flight = math.max(0, length - pending - acked - deferred)
  -- The push log holds cumulative push counts, newest first: the oldest pending job was
  -- pushed in the oldest checkpoint whose count exceeds what was taken. Binary search.
  local oldest = -1
  local lo, hi = 0, M.read('LLEN', K.pushlog) - 1
  local found = nil
  while pending > 0 and lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local pushed, at = string.match(rcall('LINDEX', K.pushlog, mid) or '', '^(%d+):(%d+)$')
    if pushed and tonumber(pushed) > meta.taken then
      found, lo = tonumber(at), mid + 1
    else
      hi = mid - 1
    end
  end
  if found then oldest = math.max(0, now - found) end
  return {
    'length', length, 'pending', pending, 'in_flight', in_flight, 'done', acked,
    'deferred', deferred, 'dead', M.read('LLEN', K.dead), 'oldest_pending_age_ms', oldest,
  }
end

function M.peek()
  local count = M.int_arg(2, 'COUNT', 1, LIMIT.count)
  local slice = M.read('LRANGE', K.ring, -count, -1)
  local done_in, mark = {}, {}
  M.look_up(slice, M.read_sides(), {}, done_in, mark, {})
  local reply = {}
  for i = #slice, 1, -1 do
    local element = slice[i]
    local state, at = 'pending', 0
    if element == SENTINEL then
      state = 'lap'
    elseif string.find(element, '*', 1, true) or not M.valid_id(element) then
      local id, deadline = M.parse_token(element)
      local when = mark[i] and tonumber(string.match(mark[i], '^[en](%d+)$'))
      if not id then
        state = 'corrupt'
      elseif done_in[i] then
        state = 'done'
      elseif when and string.sub(mark[i], 1, 1) == 'n' then
        state, at = 'deferred', when
      else
        state, at = 'leased', when or deadline
      end
    end
    reply[#reply + 1] = element
    reply[#reply + 1] = state
    reply[#reply + 1] = at
  end
  return reply
end

function M.dead()
  local start = M.int_arg(2, 'START', 0, 1e15)
  local count = M.int_arg(3, 'COUNT', 1, LIMIT.count)
  return M.read('LRANGE', K.dead, start, start + count - 1)
end

local COMMANDS = {
  push = M.push,
  next = M.next,
  ack = M.ack,
  nack = M.nack,
  extend = M.extend,
  sweep = M.sweep,
  stats = M.stats,
  peek = M.peek,
  dead = M.dead,
  requeue_dead = M.requeue_dead,
}

-- One call, whichever way it came: EVAL/EVALSHA (KEYS, ARGV) or FCALL (keys, args).
local function main(keys, args)
  if #keys ~= 10 then
    return M.fail('ROTATOR_KEYS', 'expected 10 keys, got ' .. #keys)
  end
  -- Named KEYS slots, in the order of the header.
  K = {
    ring = keys[1], done = keys[2], done_old = keys[3], marks = keys[4], marks_old = keys[5],
    revoked = keys[6], dead = keys[7], wake = keys[8], meta = keys[9], pushlog = keys[10],
  }
  A = args
  rcall = redis.call
  PAD = PAD or make_pad()
  local handler = COMMANDS[args[1]]
  if not handler then
    return M.fail('ROTATOR_BADCMD', 'unknown command ' .. M.printable(args[1]))
  end
  local ok, result = pcall(handler)
  if not ok and not (type(result) == 'table' and result.err) then
    error(result, 0) -- a bug, or an error from Redis itself: report it as it is
  end
  return result
end

if redis.register_function then
  -- Loaded as a library: the loader's first lines name it (FUNCTION_NAME), see
  -- rotator/script.py. Registered once; FCALL then runs only `main`.
  redis.register_function(FUNCTION_NAME, main)
  return
end
return main(KEYS, ARGV)
