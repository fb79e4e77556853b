-- A prototype, not a queue command: a push that hands its job to a blocked consumer in the
-- same call (issue 14's wake target). Appended to the module's library source by
-- bench.profiles (handoff_library), where `main` is the module's entry: the function pushes
-- one id by the module's own push, claims it at once by the module's own next_packed, and
-- LPUSHes the packed element onto a hand-off list that the consumer blocks on (BLPOP), so
-- the consumer holds a lease when it wakes instead of a token that sends it to claim. What
-- it leaves out of the protocol it stands for (a consumer registering as a waiter, a push
-- claiming only while one is registered, the waiter's own timeout and count, a hand-off
-- nobody took) is bookkeeping of a few commands; the push and the claim are the module's.
--
-- KEYS: a queue's thirteen, then the hand-off list.
-- ARGS: ID LEASE_MS BUDGET MAX_DELIVERIES
redis.register_function('rotator_handoff_push', function(keys, args)
  local queue = { unpack(keys, 1, 13) }
  local pushed = main(queue, { 'push', args[1] })
  if type(pushed) == 'table' and pushed.err then return pushed end
  local claimed = main(queue, { 'next_packed', '1', args[2], args[3], args[4] })
  if type(claimed) == 'table' and claimed.err then return claimed end
  if claimed[4] ~= '' then redis.call('LPUSH', keys[14], claimed[4]) end
  return pushed
end)
