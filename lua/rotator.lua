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
  KEYS[9]  meta       HASH  counters: seq lapnext qstart qmin pushed taken
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

local rcall = redis.call
local find, sub, match = string.find, string.sub, string.match
local tonumber, tostring, unpack = tonumber, tostring, unpack
local floor, min = math.floor, math.min

local ring, done, done_old = KEYS[1], KEYS[2], KEYS[3]
local marks, marks_old, revoked = KEYS[4], KEYS[5], KEYS[6]
local dead, wake, meta, pushlog = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local command = ARGV[1]

local SENTINEL = '*lap'
local MAX_ID_BYTES = 1024
local MAX_BATCH = 5000 -- ids or tokens per call; Lua's unpack() fails near 8000
local MAX_COUNT = 1000 -- jobs leased per call
local MAX_BUDGET = 10000 -- elements visited per call: bounds the time of one call
local MAX_LEASE_MS = 86400000 -- one day; longer jobs extend their lease
local REVOKED_KEEP_MS = 2 * 86400000 -- how long a refused token is remembered
local WAKE_TOKENS = 16 -- at most this many idle consumers woken by one push
local PUSHLOG_BUCKET_MS = 1000 -- pushes within a second share one checkpoint

local KEY_TYPES = {
  { ring, 'list' }, { done, 'set' }, { done_old, 'set' }, { marks, 'hash' },
  { marks_old, 'hash' }, { revoked, 'zset' }, { dead, 'list' }, { wake, 'list' },
  { meta, 'hash' }, { pushlog, 'list' },
}

local function fail(code, message)
  return { err = code .. ' ' .. message }
end

-- Arguments echoed in errors: short, and nothing that could break a reply or a log line.
local function printable(value)
  return '"' .. string.gsub(sub(tostring(value), 1, 64), '[^%w%p ]', '?') .. '"'
end

-- Scripts are not rolled back, so every key's type is checked before the first write.
local function check_key_types()
  for i = 1, #KEY_TYPES do
    local key, want = KEY_TYPES[i][1], KEY_TYPES[i][2]
    local got = rcall('TYPE', key)['ok']
    if got ~= want and got ~= 'none' then
      return fail('ROTATOR_WRONGTYPE', key .. ' holds a ' .. got .. ', expected a ' .. want)
    end
  end
  return nil
end

local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end

-- A whole number in [lo, hi] written in plain digits; strtod-isms like "1e3" or "nan" fail.
local function int_arg(value, name, lo, hi)
  if type(value) ~= 'string' or not match(value, '^%d+$') or #value > 15 then
    return nil, fail('ROTATOR_BADARG', name .. ' must be a whole number, got ' .. printable(value))
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, fail('ROTATOR_BADARG', name .. ' must be in ' .. lo .. '..' .. hi .. ', got ' .. value)
  end
  return n, nil
end

local function valid_id(id)
  return #id > 0 and #id <= MAX_ID_BYTES and not find(id, '*', 1, true)
end

-- Splits "<id>*<deadline>.<n>.<seq>"; nil for anything that is not a well-formed lease.
local function parse_token(element)
  local star = find(element, '*', 1, true)
  if not star or star == 1 or star > MAX_ID_BYTES + 1 then return nil end
  local deadline, n = match(element, '^(%d+)%.(%d+)%.%d+$', star + 1)
  if not deadline or #element - star > 40 or #deadline > 15 or #n > 9 then return nil end
  return sub(element, 1, star - 1), tonumber(deadline), tonumber(n)
end

local function check_ids(first)
  local count = #ARGV - first + 1
  if count > MAX_BATCH then
    return fail('ROTATOR_TOOMANY', 'at most ' .. MAX_BATCH .. ' ids per call, got ' .. count)
  end
  for i = first, #ARGV do
    if not valid_id(ARGV[i]) then
      return fail('ROTATOR_BADID', 'job id must be 1..' .. MAX_ID_BYTES ..
        ' bytes without "*", got ' .. printable(ARGV[i]))
    end
  end
  return nil
end

local function check_tokens(first, required)
  local count = #ARGV - first + 1
  if required and count < 1 then return fail('ROTATOR_BADTOKEN', 'no token given') end
  if count > MAX_BATCH then
    return fail('ROTATOR_TOOMANY', 'at most ' .. MAX_BATCH .. ' tokens per call, got ' .. count)
  end
  for i = first, #ARGV do
    if not parse_token(ARGV[i]) then
      return fail('ROTATOR_BADTOKEN', 'not a delivery token: ' .. printable(ARGV[i]))
    end
  end
  return nil
end

-- LPUSH in slices, keeping order, so long batches stay under unpack()'s limit.
local function lpush_all(key, items)
  for i = 1, #items, MAX_BATCH do
    rcall('LPUSH', key, unpack(items, i, min(i + MAX_BATCH - 1, #items)))
  end
end

-- Tokens in ARGV[first..] that were revoked, as a set.
local function revoked_among(first)
  local refused = {}
  if #ARGV >= first and rcall('ZCARD', revoked) > 0 then
    local scores = rcall('ZMSCORE', revoked, unpack(ARGV, first))
    for i = 1, #scores do
      if scores[i] then refused[ARGV[first + i - 1]] = true end
    end
  end
  return refused
end

local function tokens_in_done(tokens)
  local found = {}
  if #tokens == 0 then return found end
  for _, key in ipairs({ done, done_old }) do
    if rcall('SCARD', key) > 0 then
      local flags = rcall('SMISMEMBER', key, unpack(tokens))
      for i = 1, #flags do
        if flags[i] == 1 then found[tokens[i]] = true end
      end
    end
  end
  return found
end

-- Acks ARGV[first..]; returns how many were accepted. Arguments are already validated.
local function ack_tokens(first)
  if #ARGV < first or rcall('LLEN', ring) == 0 then return 0 end
  local refused = revoked_among(first)
  local accepted = {}
  for i = first, #ARGV do
    if not refused[ARGV[i]] then accepted[#accepted + 1] = ARGV[i] end
  end
  if #accepted > 0 then rcall('SADD', done, unpack(accepted)) end
  return #accepted
end

local function read_meta()
  local m = rcall('HMGET', meta, 'seq', 'lapnext', 'qstart', 'qmin', 'pushed', 'taken')
  return {
    seq = tonumber(m[1]) or 0, lapnext = tonumber(m[2]), qstart = tonumber(m[3]),
    qmin = tonumber(m[4]), pushed = tonumber(m[5]) or 0, taken = tonumber(m[6]) or 0,
  }
end

-- Notes `n` more pending ids: counters, the push checkpoint for ages, and a wake-up.
local function record_push(state, n, now)
  state.pushed = state.pushed + n
  local head = rcall('LINDEX', pushlog, 0)
  local head_ms = head and tonumber(match(head, ':(%d+)$'))
  if head_ms and now - head_ms < PUSHLOG_BUCKET_MS and now >= head_ms then
    rcall('LSET', pushlog, 0, state.pushed .. ':' .. head_ms)
  else
    rcall('LPUSH', pushlog, state.pushed .. ':' .. now)
  end
  -- Drop a few fully consumed checkpoints per push, so the log stays short.
  for _ = 1, 4 do
    local tail = rcall('LINDEX', pushlog, -1)
    if not tail or (tonumber(match(tail, '^(%d+):')) or 0) > state.taken then break end
    rcall('RPOP', pushlog)
  end
  -- Something new is available: consumers must look at a whole lap again before idling.
  rcall('HSET', meta, 'pushed', state.pushed, 'qstart', state.seq)
  local tokens = {}
  for i = 1, min(n, WAKE_TOKENS) do tokens[i] = '1' end
  rcall('LPUSH', wake, unpack(tokens))
  rcall('LTRIM', wake, 0, WAKE_TOKENS - 1)
end

local function cmd_push()
  local err = check_ids(2) or check_key_types()
  if err then return err end
  local n = #ARGV - 1
  if n == 0 then return 0 end
  local now = now_ms()
  local state = read_meta()
  if rcall('LLEN', ring) == 0 then
    -- A new (or deleted) ring gets its sentinel; the next sentinel seen starts lap counting.
    rcall('LPUSH', ring, SENTINEL)
    rcall('HDEL', meta, 'lapnext')
  end
  for i = 2, #ARGV, MAX_BATCH do
    rcall('LPUSH', ring, unpack(ARGV, i, min(i + MAX_BATCH - 1, #ARGV)))
  end
  record_push(state, n, now)
  return n
end

local function cmd_ack()
  local err = check_tokens(2, true) or check_key_types()
  if err then return err end
  return ack_tokens(2)
end

-- Shared by nack and extend: which tokens still hold a live lease.
local function live_tokens(first)
  local alive = {}
  if rcall('LLEN', ring) == 0 then return alive end
  local refused = revoked_among(first)
  local tokens = {}
  for i = first, #ARGV do tokens[#tokens + 1] = ARGV[i] end
  local acked = tokens_in_done(tokens)
  for _, token in ipairs(tokens) do
    if not refused[token] and not acked[token] then alive[token] = true end
  end
  return alive
end

local function cmd_nack()
  local delay, err = int_arg(ARGV[2], 'DELAY_MS', 0, MAX_LEASE_MS)
  err = err or check_tokens(3, true) or check_key_types()
  if err then return err end
  local now = now_ms()
  local due = now + delay
  local alive = live_tokens(3)
  local reply = {}
  local any = false
  for i = 3, #ARGV do
    local token = ARGV[i]
    if alive[token] then
      alive[token] = nil -- a token given twice is requeued once
      rcall('HSET', marks, token, 'n' .. due)
      rcall('HDEL', marks_old, token)
      rcall('ZADD', revoked, now, token)
      reply[#reply + 1] = 1
      any = true
    else
      reply[#reply + 1] = 0
    end
  end
  if any then
    local state = read_meta()
    local qmin = state.qmin and min(state.qmin, due) or due
    rcall('HSET', meta, 'qmin', qmin, 'qstart', state.seq)
    rcall('LPUSH', wake, '1')
    rcall('LTRIM', wake, 0, WAKE_TOKENS - 1)
  end
  return reply
end

local function cmd_extend()
  local lease, err = int_arg(ARGV[2], 'LEASE_MS', 1, MAX_LEASE_MS)
  err = err or check_tokens(3, true) or check_key_types()
  if err then return err end
  local deadline = now_ms() + lease
  local alive = live_tokens(3)
  local reply = { deadline }
  for i = 3, #ARGV do
    local token = ARGV[i]
    if alive[token] then
      rcall('HSET', marks, token, 'e' .. deadline)
      rcall('HDEL', marks_old, token)
      reply[#reply + 1] = 1
    else
      reply[#reply + 1] = 0
    end
  end
  return reply
end

-- Looks up, for a slice of elements, where their ack and mark live. Fills, per element:
-- done_in[i] = key of the done set holding it; mark[i] = mark value; mark_in[i] = its key.
local function look_up(slice, done_in, mark, mark_in)
  local tokens, at = {}, {}
  for i = 1, #slice do
    if find(slice[i], '*', 2, true) then
      tokens[#tokens + 1] = slice[i]
      at[#tokens] = i
    end
  end
  if #tokens == 0 then return end
  for _, key in ipairs({ done, done_old }) do
    if rcall('SCARD', key) > 0 then
      local flags = rcall('SMISMEMBER', key, unpack(tokens))
      for j = 1, #flags do
        if flags[j] == 1 and not done_in[at[j]] then done_in[at[j]] = key end
      end
    end
  end
  for _, key in ipairs({ marks, marks_old }) do
    if rcall('HLEN', key) > 0 then
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

local function cmd_next()
  local count, err = int_arg(ARGV[2], 'COUNT', 1, MAX_COUNT)
  local lease, budget, max_deliveries
  if not err then lease, err = int_arg(ARGV[3], 'LEASE_MS', 1, MAX_LEASE_MS) end
  if not err then budget, err = int_arg(ARGV[4], 'BUDGET', 1, MAX_BUDGET) end
  if not err then max_deliveries, err = int_arg(ARGV[5], 'MAX_DELIVERIES', 0, 1000000) end
  err = err or check_tokens(6, false) or check_key_types()
  if err then return err end

  local acked = ack_tokens(6)
  local length = rcall('LLEN', ring)
  if length == 0 then return { 1, -1, acked } end

  local now = now_ms()
  local deadline = now + lease
  local state = read_meta()
  local seq, lapnext, taken = state.seq, state.lapnext, state.taken
  local qmin, qstart = state.qmin, state.qstart or state.seq
  if qmin and qmin <= now then
    -- Something has come due since the last idle lap: look at a whole lap again.
    qmin, qstart = nil, seq
  end
  local soonest = nil -- earliest deadline or due time among the elements kept
  local function keep_time(t)
    if not soonest or t < soonest then soonest = t end
  end

  local reply = { 0, -1, acked }
  local rotated = {} -- elements for the head, in visit order
  local srem = { [done] = {}, [done_old] = {} }
  local hdel = { [marks] = {}, [marks_old] = {} }
  local keep_marks = {} -- token, value pairs that must live in the current marks generation
  local revoke, letters = {}, {}
  local live = length -- ring length as it is at this point of the visits
  local visited, leased = 0, 0
  local limit = min(budget, length)
  local lapped = false

  local function flush_side_writes()
    for _, key in ipairs({ done, done_old }) do
      if #srem[key] > 0 then rcall('SREM', key, unpack(srem[key])) end
      srem[key] = {}
    end
    for _, key in ipairs({ marks, marks_old }) do
      if #hdel[key] > 0 then rcall('HDEL', key, unpack(hdel[key])) end
      hdel[key] = {}
    end
    if #keep_marks > 0 then rcall('HSET', marks, unpack(keep_marks)) end
    keep_marks = {}
  end

  -- Hands out a new delivery of `id` (delivered `n` times so far), revoking `old_token`.
  local function lease_again(id, n, old_token, reclaimed, mark_key)
    if mark_key then table.insert(hdel[mark_key], old_token) end
    if old_token then revoke[#revoke + 1] = old_token end
    if max_deliveries > 0 and n >= max_deliveries then
      letters[#letters + 1] = 'max_deliveries*' .. n .. '*' .. now .. '*' .. id
      live = live - 1
      return
    end
    local seq_here = seq + visited
    local token = id .. '*' .. deadline .. '.' .. (n + 1) .. '.' .. seq_here
    rotated[#rotated + 1] = token
    reply[#reply + 1] = token
    reply[#reply + 1] = reclaimed
    leased = leased + 1
    keep_time(deadline)
  end

  -- The sentinel's visit ends a lap: whatever an old generation still holds was not claimed by
  -- any element during a whole lap, so it is a leftover (late ack, stale mark) and goes.
  local function end_lap(slice, from, done_in, mark_in)
    flush_side_writes()
    rcall('DEL', done_old, marks_old)
    if rcall('EXISTS', done) == 1 then rcall('RENAME', done, done_old) end
    if rcall('EXISTS', marks) == 1 then rcall('RENAME', marks, marks_old) end
    rcall('ZREMRANGEBYSCORE', revoked, '-inf', '(' .. (now - REVOKED_KEEP_MS))
    -- Look-ups already made for the rest of this slice now live one generation older.
    local older = { [done] = done_old, [marks] = marks_old }
    for i = from, 1, -1 do
      if done_in[i] then done_in[i] = older[done_in[i]] or false end
      if mark_in[i] then mark_in[i] = older[mark_in[i]] or false end
    end
    rotated[#rotated + 1] = SENTINEL
    lapnext = seq + visited + live
    lapped = true
  end

  while visited < limit and leased < count do
    local want = min(limit - visited, count - leased + 16)
    local slice = rcall('LRANGE', ring, -(visited + want), -(visited + 1))
    local done_in, mark, mark_in = {}, {}, {}
    look_up(slice, done_in, mark, mark_in)
    local i = #slice
    while i >= 1 and leased < count do
      local element = slice[i]
      visited = visited + 1
      local index = seq + visited
      if lapnext and index > lapnext then lapnext = nil end
      if element == SENTINEL then
        if lapnext and index < lapnext then
          live = live - 1 -- a second sentinel: drop it
        else
          end_lap(slice, i - 1, done_in, mark_in)
        end
      else
        if lapnext and index == lapnext then
          -- The sentinel is missing (someone removed it): put one back just before this
          -- element, which is then the first of the next lap.
          live = live + 1
          end_lap(slice, i, done_in, mark_in)
          lapnext = lapnext - 1
        end
        local star = find(element, '*', 1, true)
        if not star then
          if valid_id(element) then
            taken = taken + 1
            lease_again(element, 0, nil, 0, nil)
          else
            taken = taken + 1
            letters[#letters + 1] = 'corrupt*0*' .. now .. '*' .. element
            live = live - 1
          end
        elseif done_in[i] ~= nil then
          if done_in[i] then table.insert(srem[done_in[i]], element) end
          live = live - 1
        else
          local id, lease_deadline, n = parse_token(element)
          local m = mark[i]
          local kind = m and sub(m, 1, 1)
          local when = m and tonumber(match(m, '^[en](%d+)$'))
          if not id then
            letters[#letters + 1] = 'corrupt*0*' .. now .. '*' .. element
            if mark_in[i] then table.insert(hdel[mark_in[i]], element) end
            live = live - 1
          elseif when and kind == 'n' then
            if when <= now then
              lease_again(id, n, element, 0, mark_in[i])
            else
              rotated[#rotated + 1] = element
              keep_time(when)
              if mark_in[i] ~= marks then
                keep_marks[#keep_marks + 1] = element
                keep_marks[#keep_marks + 1] = m
                if mark_in[i] then table.insert(hdel[mark_in[i]], element) end
              end
            end
          else
            if when then lease_deadline = when end
            if lease_deadline <= now then
              lease_again(id, n, element, 1, mark_in[i])
            else
              rotated[#rotated + 1] = element
              keep_time(lease_deadline)
              if m and mark_in[i] ~= marks then
                keep_marks[#keep_marks + 1] = element
                keep_marks[#keep_marks + 1] = m
                if mark_in[i] then table.insert(hdel[mark_in[i]], element) end
              end
            end
          end
        end
      end
      i = i - 1
    end
  end

  -- The ring: drop the visited tail, put back what stays at the head, in visit order.
  rcall('LTRIM', ring, 0, -(visited + 1))
  lpush_all(ring, rotated)
  flush_side_writes()
  if #revoke > 0 then
    local args = {}
    for j = 1, #revoke do
      args[#args + 1] = now
      args[#args + 1] = revoke[j]
    end
    rcall('ZADD', revoked, unpack(args))
  end
  if #letters > 0 then rcall('RPUSH', dead, unpack(letters)) end

  seq = seq + visited
  if soonest and (not qmin or soonest < qmin) then qmin = soonest end
  local idle = leased == 0 and seq - qstart >= live
  local fields = { 'seq', seq, 'qstart', qstart, 'taken', taken }
  if lapnext then
    fields[#fields + 1] = 'lapnext'
    fields[#fields + 1] = lapnext
  end
  if qmin then
    fields[#fields + 1] = 'qmin'
    fields[#fields + 1] = qmin
  end
  rcall('HSET', meta, unpack(fields))
  if not lapnext then rcall('HDEL', meta, 'lapnext') end
  if not qmin then rcall('HDEL', meta, 'qmin') end
  if idle then
    -- Only a call that has seen a whole lap since the last push may clear the wake list.
    rcall('DEL', wake)
    reply[1] = 1
  end
  if qmin then reply[2] = qmin - now end
  return reply
end

local function count_deferred()
  local deferred = 0
  for _, key in ipairs({ marks, marks_old }) do
    if rcall('HLEN', key) > 0 then
      local values = rcall('HVALS', key)
      for i = 1, #values do
        if sub(values[i], 1, 1) == 'n' then deferred = deferred + 1 end
      end
    end
  end
  return deferred
end

local function cmd_stats()
  local err = check_key_types()
  if err then return err end
  local now = now_ms()
  local state = read_meta()
  local ring_length = rcall('LLEN', ring)
  local length = ring_length > 0 and ring_length - 1 or 0
  local pending = math.max(0, min(length, state.pushed - state.taken))
  local acked = rcall('SCARD', done) + rcall('SCARD', done_old)
  local deferred = count_deferred()
  local in_flight = math.max(0, length - pending - acked - deferred)
  local oldest = -1
  if pending > 0 then
    local tail = rcall('LRANGE', pushlog, -64, -1)
    for i = #tail, 1, -1 do
      local pushed, at = match(tail[i], '^(%d+):(%d+)$')
      if pushed and tonumber(pushed) > state.taken then
        oldest = math.max(0, now - tonumber(at))
        break
      end
    end
  end
  return {
    'length', length, 'pending', pending, 'in_flight', in_flight, 'done', acked,
    'deferred', deferred, 'dead', rcall('LLEN', dead), 'oldest_pending_age_ms', oldest,
  }
end

local function cmd_peek()
  local count, err = int_arg(ARGV[2], 'COUNT', 1, MAX_COUNT)
  err = err or check_key_types()
  if err then return err end
  local slice = rcall('LRANGE', ring, -count, -1)
  local done_in, mark = {}, {}
  look_up(slice, done_in, mark, {})
  local reply = {}
  for i = #slice, 1, -1 do
    local element = slice[i]
    local state, at = 'pending', 0
    if element == SENTINEL then
      state = 'lap'
    elseif find(element, '*', 1, true) or not valid_id(element) then
      local id, lease_deadline = parse_token(element)
      local when = mark[i] and tonumber(match(mark[i], '^[en](%d+)$'))
      if not id then
        state = 'corrupt'
      elseif done_in[i] then
        state = 'done'
      elseif when and sub(mark[i], 1, 1) == 'n' then
        state, at = 'deferred', when
      else
        state, at = 'leased', when or lease_deadline
      end
    end
    reply[#reply + 1] = element
    reply[#reply + 1] = state
    reply[#reply + 1] = at
  end
  return reply
end

local function cmd_dead()
  local start, err = int_arg(ARGV[2], 'START', 0, 1e15)
  local count
  if not err then count, err = int_arg(ARGV[3], 'COUNT', 1, MAX_COUNT) end
  err = err or check_key_types()
  if err then return err end
  return rcall('LRANGE', dead, start, start + count - 1)
end

-- The job id inside a dead letter, or nil when it holds no valid id.
local function dead_letter_id(letter)
  local element = match(letter, '^[^*]*%*%d+%*%d+%*(.*)$')
  if not element then return nil end
  local star = find(element, '*', 1, true)
  local id = star and sub(element, 1, star - 1) or element
  return valid_id(id) and id or nil
end

local function cmd_requeue_dead()
  local count, err = int_arg(ARGV[2], 'COUNT', 1, MAX_BATCH)
  err = err or check_ids(3) or check_key_types()
  if err then return err end
  local wanted = nil
  if #ARGV >= 3 then
    wanted = {}
    for i = 3, #ARGV do wanted[ARGV[i]] = true end
  end
  local letters = rcall('LRANGE', dead, 0, MAX_BUDGET - 1)
  local ids, kept = {}, {}
  for i = 1, #letters do
    local id = #ids < count and dead_letter_id(letters[i])
    if id and (not wanted or wanted[id]) then
      ids[#ids + 1] = id
    else
      kept[#kept + 1] = letters[i]
    end
  end
  if #ids == 0 then return 0 end
  local now = now_ms()
  local state = read_meta()
  -- Rewrite the examined prefix without the requeued letters, keeping their order.
  rcall('LTRIM', dead, #letters, -1)
  local reversed = {}
  for i = #kept, 1, -1 do reversed[#reversed + 1] = kept[i] end
  lpush_all(dead, reversed)
  if rcall('LLEN', ring) == 0 then
    rcall('LPUSH', ring, SENTINEL)
    rcall('HDEL', meta, 'lapnext')
  end
  lpush_all(ring, ids)
  record_push(state, #ids, now)
  return #ids
end

local COMMANDS = {
  push = cmd_push,
  next = cmd_next,
  ack = cmd_ack,
  nack = cmd_nack,
  extend = cmd_extend,
  stats = cmd_stats,
  peek = cmd_peek,
  dead = cmd_dead,
  requeue_dead = cmd_requeue_dead,
}

if #KEYS ~= 10 then
  return fail('ROTATOR_KEYS', 'expected 10 keys, got ' .. #KEYS)
end
local handler = command and COMMANDS[command]
if not handler then
  return fail('ROTATOR_BADCMD', 'unknown command ' .. tostring(command))
end
return handler()
