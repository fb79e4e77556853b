#!lua name=rotator_primitives
-- The building blocks of a module call, each alone in a function, for bench/primitives.py to
-- count: what an FCALL costs before it does anything, per declared key, and the two ways a
-- call can keep a queue's numeric state in a hash (a field per number, or all in one field).
--
-- KEYS[1] a hash holding the state both ways (fields a..x, and "msgpack" and "struct") and a
-- one-job claim's meta fields; KEYS[2] a hash to write to; any more keys are only declared.
-- ARGV[1] a 13-digit stamp.

local FIELDS = { 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p',
  'q', 'r', 's', 't', 'u', 'v', 'w', 'x' }
local STRUCT_24 = 'dddddddddddddddddddddddd' -- 24 doubles: what a Lua 5.1 number is
-- The fields lua/rotator.lua's read_meta asks a queue's meta hash for (META_FIELDS: a test
-- keeps the two lists the same; one worker's loop reads 11 of them, LOOP_FIELDS), with the
-- walk's twelve numbers packed in one field, and what a plain queue's meta holds of them after
-- a few claims (as MONITOR and HGETALL show them). CLAIM_FIELDS_34: what it read before the
-- walk's numbers were packed, a field each (CLAIM_META holds both).
local CLAIM_FIELDS = { 'seq', 'walk', 'pushed', 'taken', 'origin', 'fence_ms', 'fence_max',
  'dead_max', 'dead_age_ms', 'marked_n', 'marked_a', 'marked_n_old', 'marked_a_old', 'smin',
  'paused', 'rate_n', 'rate_ms', 'rate_tat', 'track_ids', 'prio', 'pseq', 'stale', 'layout',
  'lease_max' }
local CLAIM_FIELDS_34 = { 'seq', 'lapnext', 'qstart', 'qmin', 'pushed', 'taken', 'lapguess',
  'qlen', 'packed', 'origin', 'fence_ms', 'fence_max', 'dead_max', 'dead_age_ms', 'marked_n',
  'marked_a', 'marked_n_old', 'marked_a_old', 'lmin', 'lstop', 'lpass', 'lskip', 'rpasses',
  'lpasses', 'smin', 'paused', 'rate_n', 'rate_ms', 'rate_tat', 'track_ids', 'prio', 'pseq',
  'stale', 'layout' }
local CLAIM_META = { 'seq', '1795927715542', 'lapnext', '1795927715640', 'qstart',
  '1795927715538', 'pushed', '100', 'taken', '3', 'lapguess', '0', 'qlen', '101', 'origin',
  '1795927715536', 'lmin', '1795927745841', 'lstop', '1795927745841', 'lpass', '0', 'lskip', '0',
  'lpasses', '1', 'layout', 'rotator meta: a hash table on purpose, so that reading a field is O(1)' }
-- The module's walk field (WALK_FORMAT): qstart qlen lapnext qmin lapguess packed lmin lstop
-- lpass lskip rpasses lpasses, -inf for an absent one; CLAIM_META's numbers.
local WALK_FORMAT, ABSENT = '<dddddddddddd', -1 / 0
local WALK = { 1795927715538, 101, 1795927715640, ABSENT, 0, ABSENT, 1795927745841, 1795927745841,
  0, 0, ABSENT, 1 }
local STAMP = 1795926272913

-- The numbers a call writes back, made the same way for both layouts.
local function numbers(n)
  local values = {}
  for i = 1, n do values[i] = STAMP + i end
  return values
end

local function sum(values)
  local total = 0
  for i = 1, 24 do total = total + values[i] end
  return total
end

redis.register_function('noop', function() return 1 end)

redis.register_function('reply_4', function(_, args) return { 0, 0, 1, args[1] } end)

redis.register_function('tonumber_16', function(_, args)
  local total = 0
  for _ = 1, 16 do total = total + tonumber(args[1]) end
  return total
end)

redis.register_function('read_fields', function(keys)
  local raw, values = redis.call('HMGET', keys[1], unpack(FIELDS)), {}
  for i = 1, 24 do values[i] = tonumber(raw[i]) end
  return sum(values)
end)

-- (every field but the layout's text and the walk is a number; the walk as the module reads it)
redis.register_function('read_claim_meta', function(keys)
  local raw, values = redis.call('HMGET', keys[1], unpack(CLAIM_FIELDS)), {}
  for i = 1, #CLAIM_FIELDS - 1 do
    if raw[i] and i ~= 2 then values[#values + 1] = tonumber(raw[i]) end
  end
  local walk = { struct.unpack(WALK_FORMAT, raw[2]) }
  for i = 1, 12 do
    if walk[i] ~= ABSENT then values[#values + 1] = walk[i] end
  end
  return #values
end)

redis.register_function('read_claim_meta_34', function(keys)
  local raw, values = redis.call('HMGET', keys[1], unpack(CLAIM_FIELDS_34)), {}
  for i = 1, #CLAIM_FIELDS_34 - 1 do
    if raw[i] then values[#values + 1] = tonumber(raw[i]) end
  end
  return #values
end)

redis.register_function('read_msgpack', function(keys)
  return sum({ cmsgpack.unpack(redis.call('HGET', keys[1], 'msgpack')) })
end)

redis.register_function('read_struct', function(keys)
  return sum({ struct.unpack(STRUCT_24, redis.call('HGET', keys[1], 'struct')) })
end)

redis.register_function('write_8_fields', function(keys)
  local v = numbers(8)
  return redis.call('HSET', keys[2], 'a', v[1], 'b', v[2], 'c', v[3], 'd', v[4], 'e', v[5],
    'f', v[6], 'g', v[7], 'h', v[8])
end)

redis.register_function('write_msgpack', function(keys)
  return redis.call('HSET', keys[2], 'msgpack', cmsgpack.pack(unpack(numbers(24))))
end)

redis.register_function('write_struct', function(keys)
  return redis.call('HSET', keys[2], 'struct', struct.pack(STRUCT_24, unpack(numbers(24))))
end)

-- Fills KEYS[1] with the state both ways, and with a one-job claim's meta fields.
redis.register_function('prepare', function(keys)
  local values, pairs_ = numbers(24), {}
  for i = 1, 24 do
    pairs_[#pairs_ + 1] = FIELDS[i]
    pairs_[#pairs_ + 1] = string.format('%d', values[i])
  end
  redis.call('HSET', keys[1], unpack(pairs_))
  redis.call('HSET', keys[1], 'msgpack', cmsgpack.pack(unpack(values)),
    'struct', struct.pack(STRUCT_24, unpack(values)))
  redis.call('HSET', keys[1], unpack(CLAIM_META))
  redis.call('HSET', keys[1], 'walk', struct.pack(WALK_FORMAT, unpack(WALK)))
  return 1
end)
