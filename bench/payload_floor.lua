-- The floor of a circular queue whose jobs carry bodies: the least one claim of a batch, with
-- the batch ack of an earlier one, can do in each of two layouts. No fencing, no counters, no
-- checks, no reclaim: what it costs is the layout's own price, the limit a module built on it
-- could approach (issue 23 measures whether the payload queue's layout is what holds it back).
--
--   hash     as rotator keeps payloads today: the ring holds ids, a hash id -> body. A claim
--            pops the ids and reads their bodies (HMGET); removing an acked batch splits its
--            element into ids and deletes their bodies (HDEL).
--   inline   bodies travel in the ring's elements, "<id>*<body>" (an id holds no "*"). A claim
--            pops elements and replies with them as they are; the lease keeps them, packed
--            by cmsgpack into its one element; removing an acked batch deletes nothing else.
--   moved    the hash layout, but a claim moves the batch's bodies into one field of the hash
--            named by the batch (packed by cmsgpack), so that removing an acked batch deletes
--            one field, without splitting its element.
--
-- KEYS[1] ring (LIST), KEYS[2] leases (LIST, the batches in flight, newest at the head),
-- KEYS[3] acked (SET of batch names acked before their lease reached the tail), KEYS[4] the
-- bodies (HASH; the hash layout only), KEYS[5] a counter for batch names (STRING).
-- ARGV[1] LAYOUT ("hash" | "inline" | "moved"), ARGV[2] COUNT, ARGV[3..] names of batches to
-- ack. Replies {batch name, then ids and bodies, or the inline layout's elements}; {} when
-- the ring is empty.
local ring, leases, acked, bodies, counter = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local inline, moved = ARGV[1] == 'inline', ARGV[1] == 'moved'

-- The acks: a batch at the lease list's tail goes at once, with any acked before it behind
-- it; one further in is remembered until the tail reaches it (several consumers ack out of
-- order).
if #ARGV > 2 then redis.call('SADD', acked, unpack(ARGV, 3)) end
while true do
  local tail = redis.call('LRANGE', leases, -1, -1)[1]
  if not tail then break end
  local name = string.sub(tail, 1, string.find(tail, '*', 2, true) - 1)
  if redis.call('SREM', acked, name) == 0 then break end
  redis.call('RPOP', leases)
  if moved then
    redis.call('HDEL', bodies, name)
  elseif not inline then
    local ids, at = {}, #name + 2
    while at <= #tail do
      local star = string.find(tail, '*', at, true) or #tail + 1
      ids[#ids + 1] = string.sub(tail, at, star - 1)
      at = star + 1
    end
    redis.call('HDEL', bodies, unpack(ids))
  end
end

-- The claim.
local popped = redis.call('RPOP', ring, tonumber(ARGV[2]))
if not popped then return {} end
local name = '*' .. redis.call('INCR', counter)
local reply = { name }
if inline then
  redis.call('LPUSH', leases, name .. '*' .. cmsgpack.pack(popped))
  for i = 1, #popped do reply[i + 1] = popped[i] end
else
  redis.call('LPUSH', leases, name .. '*' .. table.concat(popped, '*'))
  local found = redis.call('HMGET', bodies, unpack(popped))
  if moved then
    redis.call('HDEL', bodies, unpack(popped))
    redis.call('HSET', bodies, name, cmsgpack.pack(found))
  end
  for i = 1, #popped do
    reply[#reply + 1] = popped[i]
    reply[#reply + 1] = found[i]
  end
end
return reply
