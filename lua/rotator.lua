--[[
rotator.lua: a reliable job queue on one Redis list (the ring). Redis >= 6.2 or Valkey >= 7.2.

Load once and call by SHA (or as a function library: FUNCTIONS, below); the first ARGV picks
the command. The queue commands take the thirteen
queue KEYS below; pushp/nextp/ackp take them plus KEYS[14] (and KEYS[15] to keep per-item
stats); pushi/nackp/items take all fifteen; the topic commands (t...) take the
TOPIC KEYS, then thirteen queue KEYS per consumer group (tpublish_chunk: then its marker,
under "<base>:publish:"). All keys of one call must share one hash
tag so the module runs on Redis Cluster. Key names are never built here: they all arrive
through KEYS, and their names are checked before anything is read or written: a queue's thirteen
are "<base>:ring" ... "<base>:ids" in the order below, one base for all; KEYS[14] is
"<base>:payloads" (a topic group: the topic's bodies) or push_chunk's marker under "<base>:",
KEYS[15] "<base>:items". Anything else: ROTATOR_KEYS, nothing written.

KEYS
  KEYS[1]  ring       LIST  pending job ids and deferred jobs, plus one sentinel; consumers
                            rotate tail -> head
  KEYS[2]  done       SET   tokens acked since the last lap, awaiting removal
  KEYS[3]  done_old   SET   tokens acked before the last lap (swept at the next lap)
  KEYS[4]  marks      HASH  token -> "e<deadline ms>" (extended), "w<deadline ms>" (extended
                            and moved to the lease list's head, see LEASES), "n<due ms>"
                            (nacked) or "f<error>" (buried); batch -> "a<jobs>" (acked
                            whole) or "t" (touched, see below)
  KEYS[5]  marks_old  HASH  marks written before the last lap (swept at the next lap)
  KEYS[6]  revoked    ZSET  token -> ms it was revoked (re-leased, nacked or dead-lettered);
                            "<batch>*": every token of that batch (its expiry re-leased them);
                            "<token>+", "<batch>+": an ack that dropped payloads (ackp), kept
                            a minute at most, and refusing nothing
  KEYS[7]  dead       LIST  dead letters "<reason>*<deliveries>*<ms>*<element>", oldest first;
                            reason "failed" (bury): element "<id>*<error>"
  KEYS[8]  wake       LIST  wake-up tokens that idle consumers block on (BLPOP)
  KEYS[9]  meta       HASH  counters: seq origin pushed taken, walk (the claim walk's numbers,
                            packed: see THE WALK'S NUMBERS), marked_n marked_a marked_n_old
                            marked_a_old (the marks' counts),
                            dead_dropped, expired (a topic group's), smin paused (see
                            SCHEDULED), schedules ticking and "schedule:<name>" (see
                            SCHEDULES), rate_n rate_ms rate_tat (see rate_limit), d0..d25
                            dsum (see durations), prio pseq (see PRIORITIES), completed
                            redelivered reclaimed lettered retried cancelled (added to by
                            the calls that change them, read by stats alone, and completed
                            by one worker's loop, which writes it with its own numbers),
                            stale (see IDS), copies (see pushp), lease_max (the longest
                            LEASE_MS of a claim that leased nothing: see next), layout (written
                            once: keeps it a hash table, see LIMIT.meta_layout); settings
                            (configure); format (see FORMAT)
  KEYS[10] pushlog    LIST  "<pushed>:<ms>" push checkpoints, one a second at most, newest
                            first (pending age); the newest's count is meta pushed
  KEYS[11] leases     LIST  the jobs in flight: leases and packed batches, newest at the head,
                            walked from the tail in deadline order (see LEASES)
  KEYS[12] scheduled  ZSET  the jobs not in the ring yet: id -> due ms, jobs pushed for later
                            (see SCHEDULED); "*<level>*<id>" -> below 0, jobs waiting at a
                            priority (see PRIORITIES), or its due ms, scheduled at one
  KEYS[13] ids        HASH  id -> where its one copy is, on a queue that tracks ids (see IDS)
  KEYS[14] payloads   HASH  id -> payload; pushp/nextp/ackp only (a topic group: its bodies);
                            push_chunk takes its marker hash here instead
  KEYS[15] items      HASH  id -> "<enqueued ms>:<deliveries>:<last delivery ms>:<last error>"
                            per-item stats, kept only by calls given this key (0: unknown)

TOPIC KEYS (then KEYS[5..17] are group 1's thirteen queue keys, KEYS[18..30] group 2's, ...)
  KEYS[1]  topic      HASH  seq (last message seq), ms (last message ms), bytes (retained),
                            format (see FORMAT)
  KEYS[2]  groups     HASH  group name -> its ring key (KEYS[1] of its thirteen queue keys)
  KEYS[3]  log        ZSET  one entry per run of messages a publish stored: "<ms>-<first>-<bytes>"
                            scored by <first>, the run's oldest retained seq; a run ends
                            where the next begins (the newest at the topic's seq); <bytes>:
                            its payloads' (an entry "<ms>-<seq>": a run of one, bytes unread)
  KEYS[4]  bodies     HASH  message id -> payload, for the retained messages only
  A message id is "<ms>-<seq>": ms from TIME (never lower than the last id's), seq counts up
  from 1 per topic. A group's ring holds message ids like any job ids; its meta also counts
  `expired`, the ids its backlog bound dropped (tpublish).
  Key names follow one layout: KEYS[1..4] are "<base>:topic:meta", "<base>:topic:groups",
  "<base>:topic:log" and "<base>:topic:bodies" (base: "<prefix>:{<topic>}"), and group
  GROUP's thirteen are "<base>:group:<GROUP>:<role>" with the roles in the order of KEYS above.
  Every topic command checks the names (not the contents) before writing anything and
  refuses other keys with ROTATOR_KEYS.

ELEMENTS OF THE RING
  sentinel   "*lap"                          exactly one; marks a full lap
  pending    "<id>"                          id: 1..1024 bytes, no "*"
  leased     "<id>*<deadline>.<n>.<seq>"     the delivery token: lease deadline in unix ms
                                             (server TIME), n = deliveries so far, seq = the
                                             call's first visit number and a 5-digit place,
                                             so every token is unique
  packed     "<batch>*<id>*<id>..."          the first deliveries (n = 1) of one next call:
             batch = "*<deadline>.1.<seq>"   job k's token is <id> .. batch .. k as 5 digits
  A packed batch is the leases it stands for, kept as one element: one visit for the whole
  batch while it is young, and one write when it is acked whole. When one of its jobs is
  acked, nacked or extended on its own, the batch is marked "t" (touched); a touched or
  expired batch is broken up at its next visit into its leases, which are then visited as
  usual, and the batch is revoked (a later batch ack is refused: ack each token). An expired
  batch that was never touched has all its jobs leased again at once (a crashed worker's
  batch): one revoked member "<batch>*" then fences every token of it.
  Anything else is corrupt: a visit moves it to the dead letters with reason "corrupt".
  The ring holds the sentinel, pending ids and deferred jobs; leases and packed batches live
  in the lease list (KEYS[11]), and one met in the ring (written there by hand, or by a module
  from before the lease list) moves there at its visit.
  A push puts its ids at the ring's head, behind everything pending; onto a ring that holds
  only its sentinel (an idle queue's), at its tail, ahead of the sentinel, in push order (meta
  lapnext moves on by as many): a consumer woken by the push leases them without crossing
  the lap first. Either way they are met in push order, after every id pushed before them.
  A topic's publish and replay push onto each group's ring the same way (behind the
  sentinel where the backlog's bound would drop some of them again).

LEASES (how a claim avoids the jobs in flight)
  Each lease, packed batch or re-lease is pushed at the lease list's head when it is made, so
  the list runs in deadline order from its tail while every lease has the same length. A
  call walks the list from its tail before it walks the ring, and only when something there
  may be done with: when meta lmin (the earliest deadline the list may hold) has come, or
  when acks or nacked jobs wait and the tail is not a young lease known to be live (meta lstop:
  the deadline its tokens carry; an ack or nack with that deadline clears it). The walk removes
  acked leases and batches, leases expired ones again (or dead-letters them), breaks up touched
  or expired batches, moves a nacked job to the ring to wait (or leases it again when due),
  moves an extended lease to the head (marked "w": it waits there by its new deadline, until
  another extend marks it "e" again; one extended beyond this call's own deadline waits in the
  ring instead, as a nacked job does, so that it holds up no lease behind it), and stops at the
  first lease young by its own deadline (a "w" lease: by its new one): young leases are never
  visited one by one, so a claim costs the same however many are in flight. The price: a lease
  made shorter than one before it (a smaller LEASE_MS, an extend that shortens), or a job nacked
  behind a younger lease, is reached when the walk gets there, at the latest when the leases
  before it fall due. A sweep does not stop at young leases: it puts them back at the tail in
  their places.
  Acks and marks age (done -> done_old, marks -> marks_old, the old ones dropped) once both
  lists have been walked whole since the last ageing: the ring from sentinel to sentinel
  (meta rpasses), the lease list once every element it held has been visited (meta lpass,
  lskip, lpasses); a list holding nothing needs no pass.

SCHEDULED (jobs pushed for later)
  push_later keeps its ids out of the ring, in KEYS[12] scored by due ms (server TIME); meta
  smin holds a time no later than the earliest. The first next (next_packed, nextp) called
  once smin has come moves the due ids (at most 1000 per call, earliest first) to the ring
  as a push does, so they queue behind what is pending, then leases as usual: O(log n) per
  job, and scheduled jobs cost a claim of ready ones nothing. An idle reply's wait_ms counts
  down to smin too, so a consumer blocked on KEYS[8] wakes when the earliest scheduled job
  falls due; a push_later that brings smin forward pushes a wake-up.

SCHEDULES (recurring jobs)
  A schedule NAME is the meta field "schedule:<NAME>" and, while it has a next tick, the
  member "*<NAME>" of KEYS[12] scored by it (no id holds "*"). When promote finds that member
  due, it pushes one job "<JOB_ID>@<tick ms>" and moves the member to the schedule's first
  tick after now: the tick is decided inside one call, so however many consumers run, each
  tick makes one job, and ticks missed while nothing claimed (or the queue was paused) make
  one catch-up job, not one each. An interval schedule (EVERY_MS) computes its ticks here;
  a cron schedule is given its due times by the caller (the module does not read cron: the
  Python client computes them with a cron library) and idles once they run out, until a
  schedule FILL gives more (the Python worker loops refill them).

PRIORITIES (jobs that wait behind the pending ids)
  The ring's pending ids are priority level 0, the most urgent. push_priority puts ids at a
  level from 1 to 9 (9: least urgent): they wait in KEYS[12] as members "*<level>*<id>"
  scored (level - 10) * 2^40 + their push order (meta pseq), so below 0, apart from the
  scheduled jobs, most urgent first and first in first out within a level; meta prio counts
  them. A claim (next, next_packed, nextp) takes them into its batch, in that order, after
  its walk, while it has room and once no pending id is left in the ring: priorities are
  strict, and a lower level waits while a higher one has jobs. Only their first delivery
  goes by level: an expired lease or a nacked job comes back when due, as any job. A queue
  with no job at a priority pays one field of the HMGET every claim makes; one with some
  takes the walk (not M.fast_lease), plus O(log n) per job taken. stats counts them as
  pending (and in length), and alone in "prioritized". An id waiting at a level pushed
  there again moves to the back of it and is not counted again.

IDS (a queue that tracks ids: unique jobs and cancel)
  configure track_ids 1, given while the queue holds no job (nothing pending, in flight,
  deferred or scheduled), makes the queue keep KEYS[13]: id -> where its one copy is:
    "p"        waiting in the ring          "s"         scheduled (KEYS[12])
    "q<level>" waiting at a priority        "s<level>"  scheduled at one
    "<stamp>"  leased or deferred, its token "<id>*<stamp>"
  Such a queue holds each id once: every push command (push pushi push_chunk push_later
  push_priority pushp pushp_later requeue_dead, and a schedule's ticks) skips an id it holds
  and counts only the ids it takes; an id held by a lease already acked (its token in a done
  set, or its batch acked whole) is free again at once, and so is one cancelled. An id
  scheduled again moves, as on any queue. Each walk (next, next_packed, nextp, sweep) writes
  the stamps of the leases it makes and drops the entries of jobs that leave (acked and
  removed, dead-lettered). cancel removes a scheduled job (or one waiting at a priority) at
  once; a copy with an element (a pending id, a lease, a deferred job) loses its entry and is
  recorded under the field "*<id>" (no id holds "*"): "<n>[,<stamp>...]", n pending copies
  and the stamps of leases or deferred jobs, until the walk that meets the element drops it
  (meta stale counts what the records hold; a walk reads them only while there are some).
  An element the index does not name otherwise is leased as usual: nothing is dropped for
  want of an entry. The walk costs one HMGET per slice of the ring and one per lease it
  visits; a tracked queue takes no short way (M.fast_lease). Counts (stats) include a
  cancelled job until the walk drops it (a sweep reaches a young lease at its deadline).
  track_ids 0 drops the index.

FORMAT (rolling upgrades)
  These keys, laid out as above, are storage format 1. A later module that stores something
  another way has a higher format: it converts a queue in place at its first write, records
  its format in meta's field `format` (a topic's: in KEYS[1]'s `format`, and in every group's
  meta, by a topic command), and reads the older formats as before. Every call reads that
  field first (HMGET: the queue's meta; a topic command: the topic's KEYS[1]). Absent or "1":
  the call goes on. Anything else: ROTATOR_FORMAT, nothing written. So a client left on an
  older module during a rolling upgrade stops with that error on a queue a newer one has
  converted, instead of misreading it (two modules that keep one state two ways can each
  lease a job the other holds). This module writes no `format`: format 1 is the absent
  field's.

COMMANDS (ARGV[1]; numbers are decimal integers)
  push ID [ID ...]
    Appends pending ids (at most 5000 per call); all or nothing. Wakes idle consumers.
    Plain ids onto a queue that exists and does not track ids take a short way,
    M.plain_push, that writes exactly what the general push writes.
    reply: number pushed
    errors: ROTATOR_BADID, ROTATOR_TOOMANY
  push_later IN|AT TIME ID [ID ...]                               (KEYS 1..13, or 1..15)
    Schedules ids to be pushed TIME ms from now (IN), or at the unix ms TIME (AT; server TIME),
    at most ten years ahead (315360000000 ms); a time passed is due at once (see SCHEDULED).
    An id already scheduled moves to the new time: one scheduled job per id. At most 5000
    ids; all or nothing. With KEYS 1..15: also starts each id's stats, as pushi does.
    reply: number scheduled
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY
  push_priority LEVEL IN|AT TIME ID [ID ...]                      (KEYS 1..13, or 1..15)
    Pushes ids to wait at priority LEVEL (1..9; the ring's pending ids are level 0, see
    PRIORITIES), now (IN 0, or a time passed) or, as push_later, once due (a scheduled job
    that keeps its level). At most 5000 ids; all or nothing. With KEYS 1..15: also starts
    each id's stats, as pushi does.
    reply: number added (an id waiting at that level already moves to its back, uncounted)
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY
  schedule SET|FILL NAME JOB_ID EVERY_MS SPEC [DUE ...]
    Defines the recurring schedule NAME (1..128 of A-Z a-z 0-9 . _ : @ / -; at most 1000
    per queue), whose ticks push "<JOB_ID>@<tick ms>" (JOB_ID: an id of at most 1008
    bytes). EVERY_MS 1..315360000000: a tick every EVERY_MS, the first EVERY_MS from now,
    and no DUE. EVERY_MS 0: a tick at each DUE (1..1000 ascending unix ms, at most ten years
    ahead) that is after the last tick. SPEC (at most 256 bytes) is kept for the caller (a
    cron expression, a label). SET adds or replaces NAME; a NAME with the same JOB_ID,
    EVERY_MS and SPEC keeps its next tick and last tick (declaring a schedule again at every
    start changes nothing) but takes the DUEs given. FILL only gives DUEs to such a
    schedule, and does nothing to any other.
    reply: 1 when NAME was added or changed, 0 when it was the same (or FILL did nothing)
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY
  unschedule NAME
    Forgets the schedule NAME (jobs it pushed stay).
    reply: 1, or 0 when there was no such schedule
  schedules
    reply: per schedule, by name: {name, job_id, every_ms, spec, next_tick_ms (-1: none, due
           times ran out), last_tick_ms (0: none yet), dues_left, last_due_ms (-1: none), ...}
  pause
    next, next_packed and nextp lease nothing (nor reclaim expired leases) until resume: they
    take their acks and reply idle, to wait until resume wakes them (or their LEASE_MS at
    most, as any idle reply: see next's wait_ms). Pushes, acks, nacks, extends and leases
    already out go on as before.
    reply: 1, or 0 when the queue was paused already
  resume
    Ends a pause and wakes idle consumers.
    reply: 1, or 0 when the queue was not paused
  durations [TOTAL_MS BUCKET COUNT ...]
    The queue's histogram of processing times, which workers add to (here, or with the acks
    of a next or an ack, see next): COUNT (1..1e9) more jobs took a time in BUCKET
    (0..25): bucket 0 under 1 ms, bucket b from 2^(b-1) to 2^b ms, bucket 25 from 2^24 ms
    (4.7 hours) on; TOTAL_MS (0..1e15) is what they took together. Every argument is checked
    before any is added (meta fields d0..d25 and dsum).
    reply: the 26 buckets' counts, bucket 0 first, then the total ms
    errors: ROTATOR_BADARG
  rate_limit JOBS PER_MS
    Limits what next, next_packed and nextp lease, across every consumer, to JOBS (1..1e9)
    per PER_MS (1..86400000) ms: at most JOBS in a burst, then one every PER_MS / JOBS ms
    (a generic cell rate kept in meta: rate_n rate_ms rate_tat). A call may lease fewer than
    its COUNT; one that may lease none takes its acks and replies idle with wait_ms until
    one more may go (or its LEASE_MS, if sooner). JOBS 0 lifts the limit.
    reply: 1
    errors: ROTATOR_BADARG
  push_chunk CHUNK TTL_MS ID [ID ...]                     (KEYS 1..13, KEYS[14] a marker hash)
    push, once per chunk of a bulk load: only when the marker's field `chunks` (0 when
    absent) equals CHUNK; then `chunks` becomes CHUNK + 1 and the marker expires in TTL_MS.
    A chunk the marker already counts pushes nothing, so a retried loader pushes no id twice;
    it renews the marker's expiry, a write: a WAIT after the retry covers the first push too.
    reply: {pushed, chunks, earlier}  pushed is 0 when the chunk was already in; earlier is
      then, for the marker's last chunk (the one a call whose reply was lost sends again),
      what the call that pushed it pushed (the marker's field `pushed`), else 0
    errors: ROTATOR_BADARG (CHUNK beyond what the marker records), ROTATOR_BADID,
            ROTATOR_TOOMANY, ROTATOR_WRONGTYPE
  next COUNT LEASE_MS BUDGET MAX_DELIVERIES [ACK_TOKEN ...]
    First acks the tokens (and batch acks) given, as `ack`; then visits at most BUDGET
    (1..1000) elements, of the lease list (see LEASES) and then of the ring, from their tails
    (a batch broken up counts its leases too: at most BUDGET plus one batch of work), and
    leases at most COUNT jobs (1..1000) for LEASE_MS (1..86400000), fewer once the ids of
    its first deliveries reach 256 KB (one batch stays a small copy). An acked lease is
    removed; a young lease is left where it is; an expired lease or a due nack is leased again
    with a new token, or dead-lettered once it was delivered MAX_DELIVERIES times (0: no
    limit).
    reply: {idle, wait_ms, acked, token1, reclaimed1, token2, reclaimed2, ...}
      idle     1 when a whole lap since the last push found nothing, and nothing in the lease
               list is due: block on KEYS[8]
      wait_ms  ms until the earliest known lease deadline or nack due time, and at most
               LEASE_MS: an idle consumer blocks no longer than its own lease time, so a lease
               another consumer takes meanwhile (for as long, or longer) falls due no sooner
               than it looks again
    A call whose new leases fall due before anything known so far, and are shorter than the
    longest LEASE_MS an idle consumer may be waiting (meta lease_max, which a call that
    leases nothing raises to its own), pushes one wake-up, so an idle consumer blocked
    before they existed waits for them instead of its whole wait. Consumers that share one
    lease time push none: a wake-up would only spin an idle consumer, whose claim then runs
    before the reply of the claim that woke it.
      acked    how many ACK_TOKENs were accepted
      reclaimedN 1 when tokenN re-leases a job whose previous lease expired
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
    The last ACK_TOKEN may instead be processing times, "#<total ms>,<bucket>:<count>,..."
    (one or more buckets, as durations takes them): the acked jobs' times, added to the
    queue's histogram in the same call (nextp, ack and ackp take them too).
    The call a busy queue makes most (batch acks, in order or not, nothing else to repair,
    pending ids at the ring's tail) takes a short way, M.fast_lease, that writes exactly
    what the walk writes without building its state; one worker's loop (one batch ack of
    the lease list's lone batch) a shorter one still, M.loop_lease, seven commands a call;
    and a claim that acks nothing while nothing is in flight (a consumer woken on an idle
    queue) another, M.fresh_lease.
  next_packed COUNT LEASE_MS BUDGET MAX_DELIVERIES [ACK_TOKEN ...]
    next, with this call's first deliveries sent as their packed element instead of a
    token each (what the Python client calls: less work on both sides of the wire).
    reply: {idle, wait_ms, acked, packed, token1, reclaimed1, ...}
      packed   "<batch>*<id1>*<id2>..." ("" when none): job k's token is
               <id k> .. <batch> .. k as 5 digits, not reclaimed
      tokenN   the later deliveries, as in next
    errors: as next
  ack TOKEN [TOKEN ...]
    Completes leases; the element leaves the lease list when a walk next reaches it.
    A token whose lease was re-issued, nacked or dead-lettered is refused, and so is one
    this queue never issued (its call seq before the queue's origin: from another queue, or
    from this one before a delete; or beyond its seq). A TOKEN may be a
    batch ack "*<deadline>.1.<seq>/<jobs>" (<deadline>.1.<seq> = a first delivery's stamp
    less its last 5 digits): it completes every job of that call's batch, and is refused
    once the batch was revoked or one of its jobs was acked, given back or extended on its
    own (then ack the tokens one by one).
    reply: number accepted (a batch ack counts once)
    errors: ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  nack DELAY_MS TOKEN [TOKEN ...]
    Gives leases back; each job is delivered again (as a new delivery) once DELAY_MS has
    passed (0..86400000) and the lease list's walk has reached it (see LEASES). The old token
    is revoked.
    reply: {ok1, ok2, ...}  1 = requeued, 0 = lease lost (re-issued, acked or unknown queue)
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  bury ERROR TOKEN [TOKEN ...]                                   (KEYS 1..13, or 1..15)
    Sends live leases to the dead letters with ERROR (at most 4096 bytes; may be empty):
    each is marked "f<ERROR>" and revoked (with its batch), as by nack, and the walk that
    reaches its element writes the letter "failed*<deliveries>*<ms>*<id>*<ERROR>" (a
    sweep reaches it at once; stats counts it as done meanwhile). For a worker's last
    failure, instead of a nack that the next visit would dead-letter without the error.
    With KEYS[15]: also records ERROR as each job's last error, as nackp does.
    reply: {ok1, ok2, ...}  1 = buried, 0 = lease lost (as nack)
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  extend LEASE_MS TOKEN [TOKEN ...]
    Moves each lease's deadline to now + LEASE_MS (1..86400000).
    reply: {deadline_ms, ok1, ok2, ...}  1 = extended, 0 = lease lost, -1 = its job was
           cancelled (a queue that tracks ids): stop working on it
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  unique PUSH_COMMAND ARG ...
    Any of push pushi push_later push_priority pushp pushp_later, on a queue that tracks ids
    (see IDS);
    refused with ROTATOR_UNTRACKED, nothing written, on one that does not: a producer that
    counts on each id being held once says so.
    reply: the push command's (ids taken)
    errors: the push command's, ROTATOR_UNTRACKED
  once CHUNK TTL_MS [unique] PUSH_COMMAND ARG ...       (the push command's KEYS, then a marker)
    The push command (any of unique's), once per chunk of a push, as push_chunk does it for
    a plain push: it runs only when the marker hash's field `chunks` (0 when absent) equals
    CHUNK; then `chunks` becomes CHUNK + 1, `pushed` its reply, and the marker expires in
    TTL_MS. A chunk the marker already counts runs nothing (so a push sent again after a lost
    reply pushes nothing twice) and renews the marker's expiry. The marker is the last key, a
    key under "<base>:" that is none of the queue's.
    reply: the push command's; for the marker's last chunk sent again, what its first call
      pushed; for an older chunk, 0
    errors: the push command's, ROTATOR_BADARG (CHUNK beyond what the marker records),
            ROTATOR_KEYS, ROTATOR_WRONGTYPE
  cancel ID [ID ...]
    On a queue that tracks ids (see IDS): a scheduled job leaves at once; a waiting one is
    dropped at the walk's next visit; one in flight has its token revoked (its ack is
    refused, its extend answers -1, and no batch ack covers it) and is dropped when the walk
    reaches its lease, instead of being leased again. Counted in stats' cancelled.
    reply: how many of the ids were found scheduled, waiting or in flight (and not acked)
    errors: ROTATOR_BADID, ROTATOR_TOOMANY, ROTATOR_UNTRACKED
  delete [FORGET]                                            (KEYS 1..13, 1..14 or 1..15)
    Removes every key given (in the background: UNLINK), keeping only the seq of KEYS[9], so
    that a queue made again under the name never hands out a token of this one. FORGET 1
    removes that too (a name never used again).
    reply: 1, or 0 when there was nothing to remove
  configure [NAME VALUE ...]
    Sets queue settings (kept in KEYS[9]); every pair is checked before any is written.
      fence_ms     1000..2592000000, default 3600000: how long a refused token (re-leased,
                   nacked, dead-lettered, a broken-up batch) is remembered and refused
      fence_max    1000..1000000000, default 1000000: how many are remembered at most
      dead_max     1..1000000, default 100000: dead letters kept, the newest
      dead_age_ms  0 or 1000..315360000000, default 604800000: dead letters older are
                   dropped (0: no age limit)
      track_ids    0 or 1, default 0: keep the id index (see IDS); 1 only on a queue that
                   holds no job (ROTATOR_BADARG otherwise)
    Each call that adds refused tokens or dead letters drops, oldest first, at most what it
    added plus 1000 beyond these bounds (meta field dead_dropped counts dropped letters).
    reply: {name, value, ...} for every setting
    errors: ROTATOR_BADARG
  stats
    reply: {"length", n, "pending", n, "in_flight", n, "done", n, "deferred", n, "dead", n,
            "oldest_pending_age_ms", n (-1 when nothing is pending),
            "overdue", n, "overdue_capped", 0|1, "scheduled", n, "paused", 0|1,
            "schedules", n, "rate_limit_jobs", n, "rate_limit_ms", n (0 0: no limit),
            "pushed", n, "delivered", n, "completed", n, "retried", n, "reclaimed", n,
            "dead_lettered", n, "cancelled", n, "prioritized", n, "d0", n, ... "d25", n,
            "dsum", ms}
    Jobs: length = pending + in_flight + done + deferred + overdue. pending: pushed, never
    leased; in_flight: leased, deadline not passed; done: acked, element not yet removed;
    deferred: given back, waiting for its delay (or for the walk, once due); overdue: lease
    past its deadline, not yet reclaimed, counted from the lease list's tail (at most 100
    elements and 1000 jobs: overdue_capped 1 says the count is a lower bound).
    O(1) but for that bounded tail: counters kept in meta (marked_n, marked_a and their
    _old), never a whole read. scheduled: jobs waiting in KEYS[12] (push_later), not counted
    in length; schedules: the recurring schedules. The last seven count since the queue was
    made (delete starts them again), each in the call that does it: ids pushed (and moved
    from the schedule or the dead letters), deliveries (first ones and later), jobs acked
    and removed, jobs given back by nack, expired leases leased again, dead letters
    written, jobs cancelled (see IDS). prioritized: the pending jobs waiting at a priority
    (see PRIORITIES). d0..d25 and dsum: the processing-time histogram (see durations).
  peek COUNT
    The COUNT (1..1000) elements nearest the ring's tail, tail first, then the lease list's
    from its tail, without changing anything; a packed batch shows as the leases it stands
    for, first job first (at most COUNT rows).
    reply: {element1, state1, time1, ...}; state: "lap", "pending", "leased", "done",
           "deferred", "buried", "corrupt"; time: lease deadline or due ms (0 when none)
    errors: ROTATOR_BADARG
  scan START STOP COUNT
    The elements START..STOP-1 counted from the ring's tail and on into the lease list's
    (LENGTH: both lists), as peek shows them, at most COUNT (1..1000) rows' worth of elements (an element is never split:
    a packed batch alone may give up to 1000 rows). Changes nothing. Continue from NEXT until
    it reaches STOP (or LENGTH); SEQ and PUSHED unchanged across pages means nothing moved.
    reply: {NEXT, LENGTH, SEQ, PUSHED, element1, state1, time1, ...}
    errors: ROTATOR_BADARG
  sweep BUDGET
    Visits at most BUDGET elements (1..1000; broken-up batches count their leases) of the
    lease list, then of the ring, without leasing anything: removes acked elements (young
    leases stay in their places), dead-letters corrupt ones, repairs the sentinel. Repeat
    until `visited` adds up to both lists' lengths to clean them whole (an idle queue
    otherwise cleans up lazily).
    reply: {visited, removed, length} (removed and length in jobs)
    errors: ROTATOR_BADARG
  dead START COUNT
    reply: dead-letter entries START .. START+COUNT-1 (COUNT 1..1000), oldest first
    errors: ROTATOR_BADARG
  requeue_dead COUNT [ID ...]
    Moves up to COUNT (1..5000) dead letters back to the ring as pending ids, oldest first;
    with IDs, only letters for those ids. Examines at most 1000 letters per call, from the
    oldest: requeue_dead_from goes on from where a call stopped.
    reply: number requeued
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY
  requeue_dead_from START COUNT [ID ...]
    requeue_dead from the dead letter at index START on (0: the oldest).
    reply: {requeued, next}  call again with START = next until next is -1
  pushp ID PAYLOAD [ID PAYLOAD ...]                                (KEYS 1..14, or 1..15)
    push, and stores each payload under its id in KEYS[14] (an id pushed again gets the new
    payload; while a copy of it is queued, the field "<id>*" counts the copies beyond the
    first, and its payload stays until the last is acked; meta copies counts those fields,
    from a push that found KEYS[14] empty). At most 2500 pairs; all or nothing. With
    KEYS[15]: starts each id's stats.
    reply: number pushed
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY
  nextp COUNT LEASE_MS BUDGET MAX_DELIVERIES DROP [ACK_TOKEN ...]   (KEYS 1..14, or 1..15)
    next, with each job's payload read from KEYS[14] in the same call. DROP 1 deletes the
    payloads (and stats) of the ACK_TOKENs accepted (a plain queue: batch acks must name
    their jobs, as ackp takes them); 0 keeps them (a topic group). With KEYS[15]: notes each
    delivery (count and time) in the job's stats.
    reply: {idle, wait_ms, acked, token1, reclaimed1, payload1, ...}; payload nil if none
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  nextp_packed COUNT LEASE_MS BUDGET MAX_DELIVERIES DROP [ACK_TOKEN ...]
                                                                    (KEYS 1..14, or 1..15)
    nextp, with this call's first deliveries sent as next_packed sends them (what the Python
    client calls). With DROP 1, one worker's loop (its one ack the named batch ack of the
    lease list's lone batch) takes M.loop_lease too, and drops that batch's payloads. A
    claim whose one ack is a named batch ack of a batch in the lease list but not at its
    tail (several workers acking out of order), on a queue with no marks and a lease list
    of at most LIMIT.take_out_look (64) elements, takes that batch out of the list at once
    (LPOS, LREM) instead of marking it acked until the walk reaches it.
    reply: {idle, wait_ms, acked, packed, payload1, ..., payloadK, token, reclaimed, payload,
      ...}: packed as in next_packed, then the payloads of its K jobs in their order, then
      each later delivery as in nextp
    errors: as nextp
  ackp TOKEN [TOKEN ...]                                            (KEYS 1..14, or 1..15)
    ack, and deletes the payloads (and stats) of the accepted tokens' ids, or, for an id
    pushed more than once, counts one copy less (the payload stays for the others). An ack
    sent again (a call retried after its reply was lost) deletes nothing more: while its lease
    waits for the walk, the done set or the batch's mark tells; once the walk removed it, the
    call's memory of what it dropped: "<token>+" and "<batch>+" in KEYS[6], kept for the fence
    window, at most a minute (sent again later than that, with a copy of its id queued, it
    would take the copy's payload). A TOKEN may be a named batch ack: the packed element
    "*<deadline>.1.<seq>*<id1>*<id2>..." a next_packed or nextp_packed reply sent. It is
    accepted as that batch's batch ack (see ack) when that very element is in the lease list,
    within LIMIT.named_look (100) elements of either end, so the ids are the batch's own;
    otherwise refused (ack the tokens). Its payloads go the first time it is accepted, never
    again (its tokens sent after it are known as above). At most 5000 jobs named per call,
    tokens and named ids together.
    reply: number accepted (a named batch ack counts once)
    errors: ROTATOR_BADTOKEN (a bare batch ack "*<stamp>/<jobs>" too: the ids are needed),
      ROTATOR_TOOMANY
  pushi ID [ID ...]                                                 (KEYS 1..15)
    push, and starts each id's stats (enqueued now, no deliveries): a queue with stats but
    without payloads.
    reply: number pushed
    errors: ROTATOR_BADID, ROTATOR_TOOMANY
  nackp DELAY_MS ERROR TOKEN [TOKEN ...]                            (KEYS 1..15)
    nack, and records ERROR (at most 4096 bytes) as the last error of each job given back.
    reply: {ok1, ok2, ...} as nack
    errors: ROTATOR_BADARG, ROTATOR_BADTOKEN, ROTATOR_TOOMANY
  pushp_later IN|AT TIME ID PAYLOAD [ID PAYLOAD ...]                (KEYS 1..14, or 1..15)
    push_later, storing each payload now as pushp does (an id scheduled again gets the new
    payload). At most 2500 pairs; all or nothing.
    reply: number scheduled
    errors: ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_TOOMANY
  items ID [ID ...]                                                 (KEYS 1..15)
    reply: each id's stats string (see KEYS[15]), nil for an id without stats
    errors: ROTATOR_BADID, ROTATOR_TOOMANY
  tpublish MAXLEN MAXAGE_MS PAYLOAD [PAYLOAD ...]                 (TOPIC KEYS + every group)
    Stores 1..1000 payloads as new messages and pushes their ids onto every group's ring, in
    one call; then drops retained messages beyond MAXLEN or older than MAXAGE_MS (0: no
    limit), oldest first, at most n+16 per call. The KEYS must name exactly the registered
    groups, each once; otherwise nothing is written (read the groups and call again).
    Bounds each group's backlog (pending ids, never leases) by MAXLEN (with MAXLEN 0, by
    1000000): once it is more than 16 over, the oldest pending ids leave the group's ring
    tail down to the bound, at most n+16 per group, never delivered to that group and
    counted in its meta's `expired`. The sentinel, leases and packed batches among the tail
    elements read stay there in order; per group it reads at most n+16 plus
    max(16, 1000 / groups) elements.
    reply: {id1, id2, ...}
    errors: ROTATOR_BADARG, ROTATOR_TOOMANY, ROTATOR_STALE
  tpublish_chunk CHUNK TTL_MS MAXLEN MAXAGE_MS PAYLOAD [PAYLOAD ...]
                                              (TOPIC KEYS + every group, then a marker hash)
    tpublish, once per chunk of a publish: only when the marker's field `chunks` (0 when
    absent) equals CHUNK; then `chunks` becomes CHUNK + 1, the marker keeps the chunk's ids
    (fields ms, first, n) and expires in TTL_MS. The marker is a key under "<base>:publish:".
    A chunk the marker already counts publishes nothing, so a publish sent again after a lost
    reply publishes no message twice; it renews the marker's expiry, a write: a WAIT after
    the retry covers the first publish too. It checks the group KEYS only when it publishes.
    reply: {id1, id2, ...}  for the marker's last chunk sent again, the ids its first call
      published; for an older chunk, {}
    errors: ROTATOR_BADARG (as tpublish's, or CHUNK beyond what the marker records),
            ROTATOR_TOOMANY, ROTATOR_STALE, ROTATOR_WRONGTYPE, ROTATOR_KEYS
  tsubscribe GROUP                                                (TOPIC KEYS + that group)
    Registers GROUP (1..64 of A-Z a-z 0-9 . _ @ / -) with its ring key; at most 100 groups.
    Every later tpublish reaches it. Registering a known group changes nothing.
    reply: {added (1 or 0), last_seq}  messages up to last_seq are not pushed to it
    errors: ROTATOR_BADARG, ROTATOR_TOOMANY
  tunsubscribe GROUP                                              (TOPIC KEYS + that group)
    Forgets GROUP and deletes its thirteen queue keys (UNLINK: freed in the background).
    reply: 1, or 0 when it was not registered
    errors: ROTATOR_BADARG
  treplay GROUP FROM_SEQ TO_SEQ COUNT                             (TOPIC KEYS + that group)
    Pushes the retained messages with FROM_SEQ <= seq <= TO_SEQ (0: the last seq) onto
    GROUP's ring again, at most COUNT (1..5000), oldest first.
    reply: {pushed, next_from_seq, to_seq}  done when next_from_seq > to_seq
    errors: ROTATOR_BADARG, ROTATOR_NOGROUP
  tseek MS                                                        (TOPIC KEYS only)
    reply: the seq of the oldest retained message with ms >= MS, else last seq + 1
    errors: ROTATOR_BADARG
  ttrim MAXLEN MAXAGE_MS BUDGET                                   (TOPIC KEYS only)
    Applies retention as tpublish does, dropping at most BUDGET (1..2000) messages (the
    Python client sends 2000 per call: about 3 ms of server time).
    reply: number dropped
    errors: ROTATOR_BADARG
  tstats                                                          (TOPIC KEYS + every group)
    reply: {"retained", n, "bytes", n, "last_seq", n, "groups", g, then per group: name,
            length, pending, in_flight, done, deferred, dead, oldest_pending_age_ms,
            overdue, overdue_capped (as stats gives them)}
    errors: ROTATOR_STALE

ERRORS (replies start with the code)
  ROTATOR_BADCMD, ROTATOR_BADARG, ROTATOR_BADID, ROTATOR_BADTOKEN, ROTATOR_TOOMANY,
  ROTATOR_KEYS, ROTATOR_WRONGTYPE, ROTATOR_STALE (retry: the topic's groups changed),
  ROTATOR_NOGROUP, ROTATOR_UNTRACKED (unique or cancel on a queue without the id index),
  ROTATOR_FORMAT (a newer module's storage format: see FORMAT). Every argument and key type
  is checked before the first write, so a failing call changes nothing. The server may wrap
  the reply: Redis 7.0 and Valkey 8 send "ERR ROTATOR_BADARG ... script: <sha>, on
  @user_script:<line>." to EVALSHA (a client strips a leading "ERR " before it reads the
  code).

REDIS-CLI
  SHA=$(redis-cli -x SCRIPT LOAD < lua/rotator.lua)
  Q="rotator:{orders}:ring rotator:{orders}:done rotator:{orders}:done_old rotator:{orders}:marks rotator:{orders}:marks_old rotator:{orders}:revoked rotator:{orders}:dead rotator:{orders}:wake rotator:{orders}:meta rotator:{orders}:pushlog rotator:{orders}:leases rotator:{orders}:scheduled rotator:{orders}:ids"
  redis-cli EVALSHA $SHA 13 $Q push job-1 job-2 job-3 job-4     # 4
  # next replies {idle, wait_ms, acked, token1, reclaimed1, ...}: line 4 is the first token,
  # "job-1*<deadline>.1.<seq>" (e.g. 'job-1*1732233600000.1.173223357000000001')
  TOKEN1=$(redis-cli EVALSHA $SHA 13 $Q next 1 30000 1000 5 | sed -n 4p)
  TOKEN2=$(redis-cli EVALSHA $SHA 13 $Q next 1 30000 1000 5 | sed -n 4p)
  redis-cli EVALSHA $SHA 13 $Q extend 60000 "$TOKEN1"     # {deadline_ms, 1}
  redis-cli EVALSHA $SHA 13 $Q ack "$TOKEN1"              # 1
  redis-cli EVALSHA $SHA 13 $Q nack 60000 "$TOKEN2"       # {1}: job-2 again in a minute
  # next_packed's line 4 is the packed batch "*<deadline>.1.<seq>*job-3*job-4"; its batch ack
  # is "*<deadline>.1.<seq>/2" (e.g. '*1732233600000.1.1732233570000/2')
  BATCH=$(redis-cli EVALSHA $SHA 13 $Q next_packed 2 30000 1000 5 | sed -n 4p | cut -d'*' -f2)
  redis-cli EVALSHA $SHA 13 $Q ack "*$BATCH/2"            # 1: job-3 and job-4 at once
  redis-cli EVALSHA $SHA 13 $Q push job-5
  TOKEN5=$(redis-cli EVALSHA $SHA 13 $Q next 1 30000 1000 5 | sed -n 4p)
  redis-cli EVALSHA $SHA 13 $Q bury 'bad input' "$TOKEN5" # {1}
  redis-cli EVALSHA $SHA 13 $Q sweep 1000                 # {visited, removed, length}
  redis-cli EVALSHA $SHA 13 $Q dead 0 10                  # failed*1*<ms>*job-5*bad input
  redis-cli EVALSHA $SHA 13 $Q requeue_dead 10            # 1: job-5 pending again
  redis-cli EVALSHA $SHA 13 $Q requeue_dead_from 0 10     # {0, -1}: no letter left
  redis-cli EVALSHA $SHA 13 $Q stats
  redis-cli EVALSHA $SHA 13 $Q peek 10
  redis-cli EVALSHA $SHA 13 $Q scan 0 100 100
  redis-cli EVALSHA $SHA 13 $Q push_later IN 30000 job-6           # delivered in 30 s
  redis-cli EVALSHA $SHA 13 $Q push_later AT 1893488400000 job-7   # 2030-01-01 09:00 UTC
  redis-cli EVALSHA $SHA 13 $Q push_priority 3 IN 0 job-8         # behind the pending ids
  redis-cli EVALSHA $SHA 13 $Q schedule SET nightly report 86400000 'every day'
  redis-cli EVALSHA $SHA 13 $Q schedule SET at-nine report 0 '0 9 * * *' 1893488400000
  redis-cli EVALSHA $SHA 13 $Q schedules
  redis-cli EVALSHA $SHA 13 $Q unschedule at-nine         # 1
  redis-cli EVALSHA $SHA 13 $Q pause
  redis-cli EVALSHA $SHA 13 $Q resume
  redis-cli EVALSHA $SHA 13 $Q rate_limit 100 1000        # 100 jobs per second; 0 lifts it
  redis-cli EVALSHA $SHA 13 $Q durations 90 6 2           # two jobs took 32-64 ms, 90 in all
  redis-cli EVALSHA $SHA 14 $Q rotator:{orders}:load-1 push_chunk 0 60000 job-9   # {1, 1, 0}
  P="$Q rotator:{orders}:payloads"
  redis-cli EVALSHA $SHA 14 $P pushp job-10 '{"n":10}'
  redis-cli EVALSHA $SHA 14 $P pushp_later IN 60000 job-11 '{"n":11}'
  # nextp_packed's line 4 is its packed batch (job-5 job-9 job-10 job-8), then the payloads;
  # ackp takes the packed batch itself as the ack of all its jobs, and drops their payloads
  PACKED=$(redis-cli EVALSHA $SHA 14 $P nextp_packed 10 30000 1000 5 1 | sed -n 4p)
  redis-cli EVALSHA $SHA 14 $P ackp "$PACKED"             # 1
  I="$P rotator:{orders}:items"
  redis-cli EVALSHA $SHA 15 $I pushi job-12
  TOKEN12=$(redis-cli EVALSHA $SHA 15 $I nextp 1 30000 1000 5 1 | sed -n 4p)
  redis-cli EVALSHA $SHA 15 $I nackp 60000 'timed out' "$TOKEN12"     # {1}
  redis-cli EVALSHA $SHA 15 $I items job-12               # <enqueued ms>:1:<ms>:timed out
  # unique and cancel need a queue that tracks ids, set on an empty queue: another one
  U=$(for r in ring done done_old marks marks_old revoked dead wake meta pushlog leases scheduled ids; do
        printf 'rotator:{emails}:%s ' $r; done)
  redis-cli EVALSHA $SHA 13 $U configure track_ids 1 > /dev/null
  redis-cli EVALSHA $SHA 13 $U unique push mail-1 mail-1 mail-2   # 2: each id once
  M=rotator:{emails}:push:run-2                               # a push sent again: once
  redis-cli EVALSHA $SHA 14 $U $M once 0 60000 push_later IN 0 mail-3      # 1
  redis-cli EVALSHA $SHA 14 $U $M once 0 60000 push_later IN 0 mail-3      # 1: pushes nothing
  redis-cli EVALSHA $SHA 13 $U cancel mail-2                     # 1 found
  redis-cli EVALSHA $SHA 13 $U delete                            # 1: only its seq stays
  T="rotator:{news}:topic:meta rotator:{news}:topic:groups"
  T="$T rotator:{news}:topic:log rotator:{news}:topic:bodies"
  G=$(for r in ring done done_old marks marks_old revoked dead wake meta pushlog leases scheduled ids; do
        printf 'rotator:{news}:group:mail:%s ' $r; done)
  redis-cli EVALSHA $SHA 17 $T $G tsubscribe mail
  redis-cli EVALSHA $SHA 17 $T $G tpublish 100000 0 'hello' 'world'
  redis-cli EVALSHA $SHA 17 $T $G treplay mail 1 0 100    # {2, 3, 2}
  redis-cli EVALSHA $SHA 4 $T tseek 1732233600000         # 1
  redis-cli EVALSHA $SHA 4 $T ttrim 1 0 2000              # 1: keeps the last message
  P=rotator:{news}:publish:run-1                        # a publish sent again: once
  redis-cli EVALSHA $SHA 18 $T $G $P tpublish_chunk 0 60000 1 0 'again'   # {"<ms>-3"}
  redis-cli EVALSHA $SHA 18 $T $G $P tpublish_chunk 0 60000 1 0 'again'   # {"<ms>-3"}
  redis-cli EVALSHA $SHA 17 $T $G tstats
  redis-cli EVALSHA $SHA 17 $T $G tunsubscribe mail       # 1

FUNCTIONS
  Loaded by FUNCTION LOAD with two first lines, "#!lua name=<name>" and "local FUNCTION_NAME =
  '<name>'" (the clients' name is "rotator_" and the first 16 hex digits of this file's SHA1:
  rotator/script.py's library_source), the module registers two functions: <name>, which
  takes every command by FCALL as EVALSHA takes it, and <name>_ro, registered 'no-writes',
  which takes by FCALL_RO the commands that only read (stats peek scan dead schedules items
  tstats, and durations without counts) and refuses any other: ROTATOR_BADCMD, nothing
  changed. A server runs FCALL_RO where it refuses FCALL of a function that may write: out
  of memory under noeviction, and on a read-only replica.
  L=rotator_$(sha1sum lua/rotator.lua | cut -c1-16)
  (printf '#!lua name=%s\nlocal FUNCTION_NAME = "%s"\n' $L $L; cat lua/rotator.lua) |
    redis-cli -x FUNCTION LOAD REPLACE                    # the library's name
  R=$(for r in ring done done_old marks marks_old revoked dead wake meta pushlog leases scheduled ids; do
        printf 'rotator:{reports}:%s ' $r; done)
  redis-cli FCALL $L 13 $R push report-1 report-2        # 2
  redis-cli FCALL_RO ${L}_ro 13 $R stats                 # length 2, pending 2, ...
]]

-- SECTIONS, in this order
--    1. Constants         limits, widths and byte codes of the element grammar
--    2. Call state        what main binds at the start of a call (nothing rebinds it)
--    3. Shared helpers    errors, guarded reads, time, argument and token checks
--    4. Queue state       counters, side-structure sizes and wake-ups, on any queue's keys
--    5. Ack checks        what the short way of next asks of its batch acks
--    6. Walk state        what a claim reads first and writes back last
--    7. Queue commands    a worker's busy loop: next_packed (and next), and the short way of
--                         next
--    8. Push and ack      push, the checks and bookkeeping every push shares, and acks one
--                         by one: ack
--    9. Setbacks          a worker's calls for jobs that fail or run long: nack bury extend
--   10. The walk engine   one walk over the lists' tails, for next, next_packed and sweep
--   11. On first use      tracked ids; push_chunk push_later push_priority pause resume; rate
--                         limits and durations; scheduled and prioritized jobs; cancel sweep
--                         delete configure stats peek scan dead requeue_dead
--                         requeue_dead_from; recurring schedules: schedule unschedule schedules
--   12. Payloads          pushp pushp_later nextp ackp, and item stats: pushi nackp items
--   13. Topics            tpublish tpublish_chunk tsubscribe tunsubscribe treplay tseek ttrim tstats
--                         (8 is defined on first use by M.define_push_ack, 9 by
--                         M.define_setbacks, 10 by M.define_walk, 11 by M.define_later, 12
--                         and 13 by M.define_extensions: see ON_FIRST_USE)
--   14. Dispatch          the command table, the KEYS by name, main
--
-- Sections 3 to 14 are the body of one function, define_module, which the chunk calls once.
--
-- Two ways to run: EVAL/EVALSHA run this whole chunk on every call, so it defines its
-- functions each time (creating closures and filling M is a good part of a call's cost, which
-- is why sections 8-13 are defined only by a call that needs them); FUNCTION LOAD runs it once
-- to register `main`, and each FCALL only runs `main`. Functions live in one table (M, see
-- section 2) and key types are checked by the reads a command needs anyway (M.read), not by
-- TYPE.

-- 1. CONSTANTS ------------------------------------------------------------------------------------

-- Limits, and the widths of the element grammar (ELEMENTS OF THE RING, above), as fields of
-- one table rather than a local each: every file-level local that a function uses costs an
-- upvalue on every EVAL call (about 0.14 us each on Redis 7.0, measured), a field nothing.
local LIMIT = {
  id_bytes = 1024,
  batch = 5000, -- ids or tokens per call; Lua's unpack() fails near 8000
  count = 1000, -- jobs leased per call
  -- Elements one next or sweep visits at most: a visit over deferred or extended jobs costs
  -- about 4-8 us of server time, so no call passes 10 ms.
  budget = 1000,
  known_ints = 64, -- whole-number arguments a library keeps read (KEPT)
  known_batches = 16, -- packed elements a library keeps a generation (two kept: M.keep_packed)
  trim_budget = 2000, -- retained messages one ttrim drops at most (about 3 ms)
  lease_ms = 86400000, -- one day; longer jobs extend their lease
  max_deliveries = 1000000, -- next's MAX_DELIVERIES (0 there: no limit)
  -- Queue settings (configure), defaults (their ranges: configure's SETTINGS): how long and
  -- how many refused tokens are remembered (the fencing window), and how many dead letters
  -- are kept, for how long.
  fence_ms = 3600000, fence_max = 1000000, dead_max = 100000, dead_age_ms = 7 * 86400000,
  track_ids = 0, -- see IDS
  format = '1', -- this module's storage format, as meta's `format` names it (see FORMAT)
  trim_step = 1000, -- refused tokens or dead letters one call drops beyond what it adds
  -- How long an ack that dropped payloads is remembered at most (M.remember_dropped): a
  -- call retried after its reply was lost comes again within this.
  drop_memory_ms = 60000,
  -- The meta hash's field `layout`, written at a queue's first push: a value longer than the
  -- servers' hash-max-listpack-value (64 bytes) makes the hash a hash table for good, where
  -- the HMGET of some 38 fields every claim makes does not search a listpack field by field.
  meta_layout = 'rotator meta: a hash table on purpose, so that reading a field is O(1)',
  -- Expired leases one call re-leases one by one at most: each is a revocation (a ZADD into
  -- a set of up to fence_max tokens, and its trim), about 5 us on a full set. A batch that
  -- expired whole is one revocation for all its jobs (visit_packed).
  revokes = 250,
  fast_acks = 8, -- batch acks the short way of next takes at most (M.fast_lease)
  -- Scheduled jobs one next moves to the ring at most once due (about 1 us each), and how
  -- far ahead a job may be scheduled (ten years).
  promote = 1000,
  schedule_ms = 3650 * 86400000,
  -- Recurring schedules: per queue, the bytes of a name and of a spec, and the due times one
  -- schedule is given at once.
  schedules = 1000, schedule_name = 128, spec_bytes = 256, schedule_dues = 1000,
  rate_jobs = 1e9, -- rate_limit's JOBS (per PER_MS, at most a day); durations' COUNT
  -- Priority levels below the ring's (push_priority's LEVEL), and the room each has in the
  -- scores of K.scheduled below 0: level L waits at (L - 10) * prio_span + its push order,
  -- exact in a double (9 * 2^40 is about 10^13).
  priority_levels = 9, prio_span = 2 ^ 40,
  duration_buckets = 26, -- durations: under 1 ms, then doubling up to 2^24 ms and beyond
  -- stats counts overdue leases from the lease list's tail: at most this many elements, and
  -- batch_bytes of them, and LIMIT.count tokens looked up (then its count is a lower bound).
  overdue_look = 100,
  -- The ids of one call's batch of first deliveries, in bytes: once they reach this, the call
  -- leases no more (a batch of 1000 ids of 1 KB would be a megabyte to make, move and break).
  batch_bytes = 256 * 1024,
  -- The lease list's walk reads at most this many bytes of elements per call (a packed batch
  -- of 1000 ids of 1 KB is 1 MB).
  lease_bytes = 2 * 1024 * 1024,
  dead_scan = 1000, -- dead letters requeue_dead examines per call
  wake_tokens = 16, -- at most this many idle consumers woken by one push
  pushlog_bucket_ms = 1000, -- pushes within a second share one checkpoint
  pushlog_drops = 4, -- consumed checkpoints dropped per checkpoint added: the log stays short
  groups = 100, -- consumer groups per topic: a publish takes 13 KEYS per group
  group_bytes = 64,
  trim_extra = 16, -- retained messages a publish may drop by age beyond what it adds
  retention = 1e12, -- MAXLEN (messages) and MAXAGE_MS (about 31 years)
  error_bytes = 4096, -- the last error kept in a job's item stats, or in a buried job's letter
  echo_bytes = 64, -- of an argument echoed in an error: enough to recognise it
  -- A number read back from text (an argument, a deadline) has at most 15 digits, so it is a
  -- whole number a double holds exactly (2^53 has 16 digits); unix ms have 13 until 2286.
  int_digits = 15,
  no_bound = 1e15, -- the bound of a number with no range of its own: int_digits bound it
  -- A delivery count has at most 9 digits. A lease counted stamped_deliveries times (the most
  -- 9 digits hold) was written by hand: no real count gets there, and the next would not fit.
  delivery_digits = 9,
  stamped_deliveries = 999999999,
  -- A stamp "<deadline>.<n>.<seq>" (a token after its "*"; a batch name, "*" included) has
  -- at most 48 bytes: room for a 15-digit deadline, a 9-digit count and a 20-digit seq (a
  -- 13-digit call seq, which starts at the ms a queue is made, and the 5-digit place). Anything
  -- longer is not a stamp, and is never parsed at length.
  stamp_bytes = 48,
  -- A batch ack "*<deadline>.1.<call seq>/<jobs>": a batch name of at most stamp_bytes, "/"
  -- and the at most 4 digits of a job count (LIMIT.count), with room to spare.
  batch_ack_bytes = 60,
  -- A named batch ack "*<deadline>.1.<call seq>*<id>*<id>..." (the packed element itself)
  -- is looked for among this many elements at each end of the lease list (LPOS MAXLEN).
  named_look = 100,
  -- A named batch ack of a batch in a lease list at most this long, not at its tail (acked
  -- out of order, as several workers ack), takes its element out at once (M.takes_out):
  -- LPOS and LREM each compare at most this many elements.
  take_out_look = 64,
  -- A token's seq ends in the job's place in its call, zero-padded: 5 digits hold any place
  -- a call gives out (at most LIMIT.count); place_format writes that width.
  place_digits = 5,
  place_format = '%05d',
}

-- The KEYS of one queue (ring .. pushlog, the header's order), and a topic call's own KEYS,
-- which its groups' queue KEYS follow.
local QUEUE_KEYS = 13
local TOPIC_KEYS = 4
-- A queue's key names are "<base>:<role>", one base for all (rotator/keys.py builds them):
-- the name of the ring, less ":ring", and these endings in KEYS order.
local QUEUE_ROLES = {
  ':ring', ':done', ':done_old', ':marks', ':marks_old', ':revoked', ':dead', ':wake', ':meta',
  ':pushlog', ':leases', ':scheduled', ':ids',
}
-- The same, as a set: whether a key under a queue's base is one of its thirteen.
local QUEUE_ROLE_SET = {}
for i = 1, #QUEUE_ROLES do QUEUE_ROLE_SET[QUEUE_ROLES[i]] = true end

-- The element grammar: the sentinel, and the bytes that tell elements and marks apart (locals:
-- the walk reads them for every element it visits).
local SENTINEL = '*lap'
local BYTE_STAR = 42 -- '*': opens the sentinel, a packed batch and a batch ack; ends an id
local BYTE_A = 97 -- 'a': opens the mark of a batch acked whole ("a<jobs>")
local BYTE_N = 110 -- 'n': opens the mark of a nacked job ("n<due ms>")
local BYTE_E = 101 -- 'e': opens the mark of an extended lease ("e<deadline ms>")
local BYTE_W = 119 -- 'w': an extended lease moved to the lease list's head ("w<deadline ms>")
local BYTE_F = 102 -- 'f': opens the mark of a buried job ("f<error>")
local BYTE_HASH = 35 -- '#': opens the processing times a next or an ack may carry
local BYTE_S = 115 -- 's': opens an id index entry of a scheduled job
-- Ends the name of an ack remembered in K.revoked as having dropped payloads (see
-- M.remember_dropped); no token, batch or batch fence ends so.
local DROPPED_MARK = '+'

-- next takes the short ways (M.loop_lease, M.fresh_lease, M.fast_lease), and push its own
-- (M.plain_push), where they apply. A test flips this to compare them with the walk (and
-- push_ids) key by key (tests/lua/test_fast_lease.py).
local FAST_LEASE = true

-- 2. CALL STATE -----------------------------------------------------------------------------------

-- Bound by main at the start of every call, and never rebound during it: this call's
-- arguments (A), all its KEYS (KS), and the command function (which a library may not touch
-- while it loads). K names the call's queue keys (nil for a topic call), T the topic's keys
-- (nil for a queue call), and NGROUPS counts the groups whose queue keys follow T (0 for a
-- queue call). Code working on a topic group's queue is handed that queue's keys instead.
local A, KS, rcall
local K
-- The call came as `unique <push command> ...` (see IDS); A then starts at the push command.
local UNIQUE
-- The call drops what an ack completes (ackp, nextp DROP 1): ack_tokens then returns only the
-- tokens acked for the first time, so an ack sent twice drops nothing twice.
local FRESH_ACKS
-- The call names its batch acks (ackp, nextp DROP 1): check_tokens turned each named batch ack
-- into its batch ack "<batch>/<jobs>" and keeps here what it named ({element, ids}); the ids
-- of those accepted for the first time go to DROPPED.ids, whose payloads are dropped, and
-- their batch names to DROPPED.batches, which the call remembers (M.remember_dropped). (One
-- worker's loop takes its named batch ack without NAMED, and leaves in DROPPED.call what
-- M.forget needs to know of the call, which the walk's state holds otherwise.)
local NAMED, DROPPED
-- The call has trimmed the revoked set (M.trim_revoked): a call trims it once.
local TRIMMED
-- The packed element this call made, and its ids in order, so that a call that reads their
-- payloads (M.leased_ids) does not split the element it has just joined.
local PACKED, PACKED_IDS
-- The meta fields M.run read with the format for this call's first read (M.first_reads), until
-- that read takes them (M.first_meta).
local FIRST_META
local T, NGROUPS
-- The call's KEYS layout (see COMMANDS), nil for an unknown command.
local LAYOUT
-- Zero-padded places ("00042"), each formatted once: a token's seq is the call's first visit
-- number followed by the job's place in the call's batch (or among the call's later
-- deliveries), which spares formatting a number per job.
-- Made by main on its first call (a library may not call setmetatable while it loads), so
-- loaded as a library it lives across calls.
local PAD
-- The queue keys whose names the last call checked (see M.checked_before), and its K: kept by
-- a library only (LIBRARY), as an EVAL call's chunk, and all it binds, ends with the call.
local CHECKED
-- The commands' layouts main has looked up (M.layout_of), by command: a library's last across
-- calls, so that it looks each command up once.
local LAYOUTS
-- What a library remembers across calls to spare work (one table: a file-level local costs
-- every EVAL call an upvalue per function using it). `ints`: the whole-number arguments
-- int_arg has read, by their text, their number (a worker sends the same count, lease and
-- budget every call), at most LIMIT.known_ints of them (`nints`). `leased`: the packed
-- elements claims made lately, by their text, how many ids each holds: the last
-- LIMIT.known_batches of them (`nleased`), and as many before those (the tables' __index, see
-- M.keep_packed); `named`: of those a payload claim made (to be
-- acked by name), the ids themselves (never changed once kept: name_batch hands out the list,
-- and M.drop_named copies it before adding to it);
-- `acks`: of those, what one worker's loop needs of each one's whole-batch ack, by the ack's
-- text (M.loop_ack). See M.keep_packed. And texts read last, with what they convert to
-- (a conversion costs some 2k instructions, a look-up a tenth of that): `second`,
-- `second_ms`, TIME's seconds and as ms (M.now_ms); `origin`, `origin_n`, a queue's origin
-- (M.origin_number); `checkpoint`, `checkpoint_ms`, a push log's head and its time
-- (M.checkpoint_ms).
local KEPT
local LIBRARY = false
-- The module's functions (sections 3 to 14 define them, see define_module).
local M = {}
function M.make_pad()
  local format = LIMIT.place_format
  return setmetatable({}, {
    __index = function(pad, i)
      local text = string.format(format, i)
      pad[i] = text
      return text
    end,
  })
end

-- THE FUNCTIONS: sections 3 to 14 are the body of define_module, which the chunk calls once,
-- below. A closure made at the chunk's top level finds each local of the chunk it uses by
-- searching all the chunk's captured locals (luaF_findupval); one made inside a function
-- copies them from that function's own upvalues. An EVAL call makes some 60 closures: made
-- here, a one-job claim runs 2% fewer instructions (13k of 579k, counted under callgrind).
local function define_module()
  -- 3. SHARED HELPERS: errors, guarded reads, time, arguments, tokens -----------------------------

  -- The small whole numbers a claim passes to commands most (list offsets, counts, counters'
  -- steps), as text: a Lua number passed as it is Redis 7.0 formats with "%.17g", some 2.7k
  -- instructions each (callgrind), 13 numbers a one-job claim; Valkey 8 converts them
  -- cheaply. string.format('%d') costs about as much as "%.17g": larger numbers go as numbers.
  local SMALL_TEXT = { [-3] = '-3', [-2] = '-2', [-1] = '-1', [0] = '0', '1', '2', '3', '4' }
  -- The meta fields of a walk's state that write_meta writes back when they changed, by the
  -- names they have in both (nil: absent); the walk's numbers go packed (WALK_FIELDS).
  local WRITTEN_META = { 'taken', 'prio', 'lease_max' }
  -- THE WALK'S NUMBERS: the idle lap (qstart qlen qmin), the ring's lap (lapnext lapguess),
  -- the jobs in packed batches beyond one per element (packed), and the lease list's walk
  -- (lmin lstop lpass lskip rpasses lpasses, see LEASES), kept in one meta field, "walk", as
  -- twelve little-endian doubles packed by `struct` in WALK_FIELDS' order (an absent one as
  -- -inf; lapguess 1 or 0). Every claim reads and writes them: as a field each they cost a
  -- one-job claim some 17% of its instructions more (each field an HMGET or HSET names, and
  -- each number's strtod and formatting; bench.instructions). A call that needs one or two of
  -- them reads them at their places (walk_number_at: a push lapnext, an ack lstop) and a push
  -- rewrites the first two before the field's other bytes (record_push). A queue a module
  -- before the packed field wrote keeps them as a field each, by these names: read from there
  -- until the first write of the packed field, which deletes them (M.walk_of).
  local WALK_FIELDS = { 'qstart', 'qlen', 'lapnext', 'qmin', 'lapguess', 'packed', 'lmin', 'lstop',
    'lpass', 'lskip', 'rpasses', 'lpasses' }
  local WALK_FORMAT, WALK_BYTES, ABSENT = '<dddddddddddd', 96, -1 / 0
  local WALK_PLACE = { lapnext = 3, lapguess = 5, lstop = 8 } -- (their places in WALK_FIELDS)
  -- An empty table for a result nothing adds to (read only): a table made and collected
  -- costs a claim about 1k instructions.
  local NONE = {}
  -- The meta fields a claim reads (read_meta_fields; meta_of takes them by place), and those
  -- of them one worker's loop needs (M.loop_lease), which it reads alone, and the counter it
  -- writes: each field an HMGET names costs a call some 1k instructions (callgrind, Valkey 8).
  -- When the loop declines, it reads the rest (see M.loop_places).
  local META_FIELDS = { 'seq', 'walk', 'pushed', 'taken', 'origin', 'fence_ms', 'fence_max',
    'dead_max', 'dead_age_ms', 'marked_n', 'marked_a', 'marked_n_old', 'marked_a_old', 'smin',
    'paused', 'rate_n', 'rate_ms', 'rate_tat', 'track_ids', 'prio', 'pseq', 'stale', 'layout',
    'lease_max' }
  local LOOP_FIELDS = { 'seq', 'walk', 'taken', 'origin', 'marked_n', 'marked_n_old', 'smin',
    'paused', 'rate_n', 'track_ids', 'prio', 'completed' }
  -- A claim's first read (fresh_lease's, by M.run: M.first_reads): the loop's, then lease_max
  -- (a fresh start's wake-up rule, deadline_wakes), then the storage format (FORMAT, which
  -- M.run checks). (Written out: a library's chunk runs at FUNCTION LOAD, where `unpack` is
  -- not there yet.)
  local CLAIM_FIELDS = { 'seq', 'walk', 'taken', 'origin', 'marked_n', 'marked_n_old', 'smin',
    'paused', 'rate_n', 'track_ids', 'prio', 'completed', 'lease_max', 'format' }
  local LEASE_MAX_AT = 13 -- (lease_max's place in CLAIM_FIELDS)
  -- A push's first read (plain_push's, by M.run), with the format last.
  local PUSH_FIELDS = { 'seq', 'pushed', 'taken', 'walk', 'track_ids', 'layout', 'format' }
  local FORMAT_ONLY = { 'format' }
  local LOOP_PLACES -- (made once needed: an EVAL call runs this chunk whole every time)

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
    local head = string.sub(tostring(value), 1, LIMIT.echo_bytes)
    return '"' .. string.gsub(head, '[^%w%p ]', '?') .. '"'
  end

  -- A read that is also its key's type check: every key a command writes is read through here
  -- before the command's first write.
  function M.read(name, key, ...)
    local reply = redis.pcall(name, key, ...)
    if type(reply) == 'table' and reply.err then
      -- (another refusal, such as an ACL's NOPERM, ends the call as the server said it)
      if not string.find(reply.err, '^WRONGTYPE') then error(reply, 0) end
      M.refuse('ROTATOR_WRONGTYPE', key .. ' holds a ' .. rcall('TYPE', key)['ok'] ..
        ', not the type rotator keeps there')
    end
    return reply
  end

  -- A command, once the storage format of the queue (or the topic) its keys name is this
  -- module's (FORMAT): a newer module's refused before anything is read or written.
  -- Reads `command`'s first meta fields too (M.first_reads), for the command to take.
  function M.run(handler, meta, command)
    local fields = M.first_reads(command)
    local got = M.read('HMGET', meta, unpack(fields)) -- (HMGET: in every worker's ACL rule)
    local format = got[#fields]
    if format and format ~= LIMIT.format then
      M.refuse('ROTATOR_FORMAT', meta .. ' is in storage format ' .. M.printable(format) ..
        ', which this module (format ' .. LIMIT.format .. ') does not know: upgrade this client')
    end
    if fields ~= FORMAT_ONLY then FIRST_META = got end
    return handler()
  end

  -- The marker protocol of push_chunk, tpublish_chunk and `once`: a call that is one chunk
  -- (0, 1, ...) of a push or publish whose progress the marker hash records in its field
  -- `chunks`. It runs (`run()`: its reply, then the fields to keep beside `chunks`) only when
  -- `chunks` equals CHUNK, and then counts it; a chunk the marker counts already (sent again
  -- after a lost reply) runs nothing and replies `again(recorded, last, chunks)`, recorded
  -- being the marker's `fields` and last whether it is the marker's last chunk. Either way
  -- the marker expires in TTL_MS: renewed by a retry too, a write, so that a WAIT after it
  -- also covers the first try's.
  function M.marked(marker, chunk, ttl, fields, run, again)
    local recorded = M.read('HMGET', marker, 'chunks', unpack(fields))
    local chunks = tonumber(recorded[1]) or 0
    if chunks > chunk then
      local reply = again({ unpack(recorded, 2) }, chunk == chunks - 1, chunks)
      rcall('PEXPIRE', marker, ttl)
      return reply
    end
    if chunks < chunk then
      M.refuse('ROTATOR_BADARG', 'chunk ' .. chunk .. ' comes after chunk ' .. chunks ..
        ', which the marker does not record: it expired or was deleted')
    end
    local reply, kept = run()
    rcall('HSET', marker, 'chunks', chunk + 1, unpack(kept))
    rcall('PEXPIRE', marker, ttl)
    return reply
  end

  -- `once CHUNK TTL_MS` before a push command (see the header): the push (`push`, a handler)
  -- run by the marker protocol, its marker the call's last key. A chunk sent again replies
  -- what its first call pushed (the marker's field `pushed`); an older chunk, 0.
  function M.once(push, once)
    return function()
      local chunk = M.int_arg(2, 'CHUNK', 0, LIMIT.no_bound, once.args)
      local ttl = M.int_arg(3, 'TTL_MS', 1, LIMIT.no_bound, once.args)
      return M.marked(once.marker, chunk, ttl, { 'pushed' }, function()
        local pushed = push()
        return pushed, { 'pushed', pushed }
      end, function(recorded, last)
        return last and tonumber(recorded[1]) or 0
      end)
    end
  end

  -- The commonest calls' first read of meta, by command (a claim's, a push's), which M.run
  -- makes in the HMGET that reads the format, the last field, so that the check costs those
  -- calls a field, not a command; every other call's HMGET reads the format alone. (By
  -- comparisons, each of two interned strings' pointers: no table for an EVAL call to make.)
  function M.first_reads(command)
    if command == 'next_packed' or command == 'nextp_packed' or command == 'next'
        or command == 'nextp' then
      return CLAIM_FIELDS
    end
    return (command == 'push' or command == 'push_chunk') and PUSH_FIELDS or FORMAT_ONLY
  end

  -- The meta fields M.run read for this call's first read (by the places of the command's
  -- M.first_reads), once: nil for any later read, or a call of another command. Taken only by
  -- reads made before the call's first write.
  function M.first_meta()
    local got = FIRST_META
    FIRST_META = nil
    return got
  end

  -- A command the server may refuse for what it finds there (a write: a counter written by hand
  -- that is not a whole number; a short way's guarded read: a key of another type): its error
  -- reply, where rcall would fail the call.
  function M.attempt(name, key, ...)
    return redis.pcall(name, key, ...)
  end

  -- (TIME's digits made numbers by arithmetic: tonumber converts a string twice. A library
  -- converts the seconds once a second: a conversion costs some 1.9k instructions.)
  function M.now_ms()
    local t, kept = rcall('TIME'), KEPT
    local second = t[1]
    if second ~= kept.second then kept.second, kept.second_ms = second, second * 1000 end
    return kept.second_ms + math.floor(t[2] / 1000)
  end

  -- A whole number in [lo, hi] written in plain digits; strtod-isms like "1e3" or "nan" fail.
  function M.int_arg(index, name, lo, hi, from)
    local value = (from or A)[index]
    local kept = KEPT
    local n = kept.ints[value] -- (read before: its text checked, its number made once)
    if not n then
      if type(value) ~= 'string' or not string.find(value, '^%d+$')
          or #value > LIMIT.int_digits then
        M.refuse('ROTATOR_BADARG', name .. ' must be a whole number, got ' .. M.printable(value))
      end
      n = tonumber(value)
      if kept.nints >= LIMIT.known_ints then kept.ints, kept.nints = {}, 0 end
      kept.ints[value], kept.nints = n, kept.nints + 1
    end
    if n < lo or n > hi then
      M.refuse('ROTATOR_BADARG', name .. ' must be in ' .. lo .. '..' .. hi .. ', got ' .. value)
    end
    return n
  end

  -- COMMAND KEY ITEM... in slices, keeping order, so long lists stay under unpack()'s limit
  -- (LIMIT.batch is even: field/value and score/member pairs stay whole). Returns the sum of
  -- the replies: what SREM, HDEL, HSET and ZADD count.
  function M.call_all(command, key, items)
    local total = 0
    for i = 1, #items, LIMIT.batch do
      total = total + rcall(command, key, unpack(items, i, math.min(i + LIMIT.batch - 1, #items)))
    end
    return total
  end

  -- ZMSCORE of any number of members, LIMIT.batch at a time.
  function M.zmscore_all(key, members)
    local scores = {}
    for i = 1, #members, LIMIT.batch do
      local part = rcall('ZMSCORE', key,
        unpack(members, i, math.min(i + LIMIT.batch - 1, #members)))
      for j = 1, #part do scores[i + j - 1] = part[j] end
    end
    return scores
  end

  -- HMGET of any number of fields, LIMIT.batch at a time.
  function M.hmget_all(key, fields)
    local values = {}
    for i = 1, #fields, LIMIT.batch do
      local part = rcall('HMGET', key, unpack(fields, i, math.min(i + LIMIT.batch - 1, #fields)))
      for j = 1, #part do values[i + j - 1] = part[j] end
    end
    return values
  end

  function M.check_count(first, what)
    local count = #A - first + 1
    if count > LIMIT.batch then
      M.refuse('ROTATOR_TOOMANY',
        'at most ' .. LIMIT.batch .. ' ' .. what .. ' per call, got ' .. count)
    end
  end

  -- Tokens (and, where `batches` allows, batch acks) are only checked for their shape here;
  -- nothing parses their numbers. `batches` 'named': batch acks must name their jobs (a call
  -- that drops payloads needs the ids), each one turned into its batch ack here (see NAMED).
  function M.check_tokens(first, required, batches)
    if required and #A < first then M.refuse('ROTATOR_BADTOKEN', 'no token given') end
    M.check_count(first, 'tokens')
    local find, byte, BYTE_STAR = string.find, string.byte, BYTE_STAR
    local named -- (batches 'named': each named batch ack's ids, by argument)
    for i = first, #A do
      local token = A[i]
      -- A plain search for "*" (memchr), then a pattern over the short stamp only.
      local star = find(token, '*', 2, true)
      if not star or star > LIMIT.id_bytes + 1 or #token - star > LIMIT.stamp_bytes
          or byte(token) == BYTE_STAR or not find(token, '^%d+%.%d+%.%d+$', star + 1) then
        local jobs
        if batches == 'named' then
          local ids = M.name_batch(token, star)
          jobs = ids and #ids
          named = named or {}
          named[i] = ids
        else
          jobs = batches and #token <= LIMIT.batch_ack_bytes
            and string.match(token, '^%*%d+%.1%.%d+/(%d+)$')
        end
        jobs = jobs and tonumber(jobs)
        if not jobs or jobs < 1 or jobs > LIMIT.count then
          M.refuse('ROTATOR_BADTOKEN', (batches and 'not a delivery token or batch ack: '
            or 'not a delivery token: ') .. M.printable(token))
        end
      end
    end
    -- (rewritten once every argument passed: a refused call leaves A as it came)
    if named then M.take_names(first, named) end
  end

  -- The runs of `s` between its "*"s from byte `at` on, empty ones skipped (what gmatch with
  -- '[^*]+' gives), appended to `ids` (or a new table): by plain find, which is about a third
  -- cheaper than the pattern (8 against 12 us for a batch of 100 ids on this project's machine).
  -- nil when a run is longer than `longest` bytes (if given): checked as it is cut.
  function M.split_ids(s, at, ids, longest)
    ids = ids or {}
    local find, sub, n, size = string.find, string.sub, #ids, #s
    longest = longest or size
    while at <= size do
      local star = find(s, '*', at, true) or size + 1
      if star - at > longest then return nil end
      if star > at then
        n = n + 1
        ids[n] = sub(s, at, star - 1)
      end
      at = star + 1
    end
    return ids
  end

  -- Splits "<id>*<deadline>.<n>.<seq>"; nil for anything that is not a well-formed lease.
  function M.parse_token(element)
    local star = string.find(element, '*', 1, true)
    if not star or star == 1 or star > LIMIT.id_bytes + 1
        or #element - star > LIMIT.stamp_bytes then
      return nil
    end
    local deadline, n = string.match(element, '^(%d+)%.(%d+)%.%d+$', star + 1)
    if not deadline or #deadline > LIMIT.int_digits or #n > LIMIT.delivery_digits then
      return nil
    end
    return string.sub(element, 1, star - 1), tonumber(deadline), tonumber(n)
  end

  -- The batch of a first-delivery token "<id>*<deadline>.1.<seq>", as "*<deadline>.1.<call
  -- seq>" (the seq less its last five digits, see PAD), or nil for a later delivery: only first
  -- deliveries are leased in batches.
  function M.batch_of(token)
    local star = string.find(token, '*', 2, true)
    -- Count 1, then a seq of at least a call seq digit and the LIMIT.place_digits of a place.
    if not string.find(token, '^%d+%.1%.%d%d%d%d%d%d', star + 1) then return nil end
    return '*' .. string.sub(token, star + 1, -(LIMIT.place_digits + 1))
  end

  -- A batch ack "*<deadline>.1.<call seq>/<jobs>": its batch and how many jobs it acks.
  function M.split_batch_ack(arg)
    local slash = string.find(arg, '/', 2, true)
    return string.sub(arg, 1, slash - 1), string.sub(arg, slash + 1)
  end

  -- 4. QUEUE STATE: counters, side structures, wake-ups -------------------------------------------
  -- The helpers a topic also applies to its groups' queues (read_meta, add_wake_tokens, and
  -- read_push_keys, ensure_ring, record_push in section 8, queue_stats in section 11) take the
  -- queue's keys as their first parameter, K; everything else works on this call's own queue, K
  -- of section 2.

  -- A queue's seq and origin from their meta fields (strings or nil): a queue without a seq
  -- starts at now, and its origin is its first seq.
  function M.seq_origin(seq_field, origin_field)
    local seq = tonumber(seq_field) or M.now_ms()
    return seq, origin_field and M.origin_number(origin_field) or (seq_field and 0 or seq)
  end

  -- A queue's stored origin as a number (nil: not one). It changes only when the queue is
  -- made again, so a library converts each text once (KEPT).
  function M.origin_number(text)
    local kept = KEPT
    if text ~= kept.origin then kept.origin, kept.origin_n = text, tonumber(text) end
    return kept.origin_n
  end

  -- A queue without a seq (new, or its keys deleted by hand) starts counting visits at the
  -- server's time in ms, not at 0: its tokens then carry seqs beyond those of a queue of the same
  -- name deleted before (unless that one visited more than an element per ms since it began).
  -- `delete` keeps the seq, which makes that sure. `seeded`: the seq is not stored yet.
  function M.read_meta(K)
    return M.meta_of(M.read_meta_fields(K), K.meta)
  end

  -- The meta hash's fields read_meta reads, as HMGET gives them (false: absent), in this order
  -- (the one-worker loop of next reads them by place: M.loop_lease).
  function M.read_meta_fields(K)
    return M.read('HMGET', K.meta, unpack(META_FIELDS))
  end

  -- read_meta's table of the fields read_meta_fields read, `m`, from the meta hash `meta_key`.
  function M.meta_of(m, meta_key)
    local seq, origin = M.seq_origin(m[1], m[5])
    -- (`m[i] and tn(m[i])`: most fields are absent, and calling tonumber costs more than the
    -- test; `or nil`: HMGET gives an absent field as false, which must read as nil)
    local tn = tonumber
    local w = M.walk_of(meta_key, m[2], m[1])
    local lapnext = w.lapnext
    return {
      -- origin: the first seq of the queue as it is now (see refused_among)
      seq = seq, seeded = not m[1], origin = origin,
      fence_ms = m[6] and tn(m[6]) or LIMIT.fence_ms,
      fence_max = m[7] and tn(m[7]) or LIMIT.fence_max,
      dead_max = m[8] and tn(m[8]) or LIMIT.dead_max,
      dead_age_ms = m[9] and tn(m[9]) or LIMIT.dead_age_ms,
      marked = { m[10] and tn(m[10]) or 0, m[11] and tn(m[11]) or 0, m[12] and tn(m[12]) or 0,
        m[13] and tn(m[13]) or 0 }, -- see read_marked
      -- The lease list's walk (see M.walk_leases): the earliest deadline it may hold, the
      -- deadline of the young lease its last walk stopped at, the elements left in its pass,
      -- and the passes of both lists since the acks and marks last aged.
      lmin = w.lmin, lstop = w.lstop, lpass = w.lpass, lskip = w.lskip,
      rpasses = w.rpasses or 0, lpasses = w.lpasses or 0,
      -- No later than the earliest due time of the scheduled jobs (see SCHEDULED); paused: see
      -- pause.
      smin = m[14] and tn(m[14]) or nil, paused = m[15] == '1',
      -- The rate limit (see rate_limit): jobs per ms, and where its cell rate has got to.
      rate_n = m[16] and tn(m[16]) or nil, rate_ms = m[17] and tn(m[17]) or nil,
      rate_tat = m[18] and tn(m[18]) or nil,
      -- Whether K.ids indexes the queue's ids (see IDS).
      track_ids = m[19] and tn(m[19]) or 0, tracked = m[19] == '1',
      -- Jobs waiting at a priority level (in K.scheduled, below 0), and their push order so far
      -- (see PRIORITIES).
      prio = m[20] and tn(m[20]) or 0, pseq = m[21] and tn(m[21]) or 0,
      stale = m[22] and tn(m[22]) or 0, -- cancelled copies recorded (see parse_stale)
      layout = m[23], -- see LIMIT.meta_layout
      lease_max = m[24] and tn(m[24]) or nil, -- see deadline_wakes
      lapnext = lapnext, qstart = w.qstart, qmin = w.qmin,
      pushed = m[3] and tn(m[3]) or 0, taken = m[4] and tn(m[4]) or 0,
      lapguess = w.lapguess == 1 or not lapnext, qlen = w.qlen,
      packed = w.packed or 0, -- jobs in packed elements beyond one per element
      walk = w, -- the numbers as stored (save_walk writes them back)
    }
  end

  -- The walk's numbers (THE WALK'S NUMBERS) the meta hash `meta_key` holds, from its walk field
  -- as HMGET gave it (`packed`: false when absent), by name (nil: absent). `stored_seq`: the
  -- hash's seq field as read; where it is set and the walk field is not (a queue a module
  -- before the packed field wrote), the numbers are read from their own fields, and the table
  -- notes `legacy` (save_walk deletes those). A walk field of another size (written by hand)
  -- reads as absent, as a field that is not a number reads today; so does a NaN in it.
  function M.walk_of(meta_key, packed, stored_seq)
    if packed and #packed == WALK_BYTES then
      -- (one constructor: a table grown a field at a time is rehashed four times)
      local a, b, c, d, e, f, g, h, i, j, k, l = M.walk_values(packed)
      return { qstart = a, qlen = b, lapnext = c, qmin = d, lapguess = e, packed = f, lmin = g,
        lstop = h, lpass = i, lskip = j, rpasses = k, lpasses = l, stored = true }
    end
    local w = {}
    if stored_seq then
      local fields = M.read('HMGET', meta_key, unpack(WALK_FIELDS))
      for i = 1, #WALK_FIELDS do
        if fields[i] then w.legacy, w[WALK_FIELDS[i]] = true, tonumber(fields[i]) end
      end
    end
    return w
  end

  -- The twelve numbers of a walk field of WALK_BYTES, in WALK_FIELDS' order (nil: absent).
  -- (One worker's loop takes them as they are, M.loop_lease: a table of them costs it 5%.)
  function M.walk_values(packed)
    local a, b, c, d, e, f, g, h, i, j, k, l = struct.unpack(WALK_FORMAT, packed)
    -- (walk_number's test written out: a call for each costs the loop some 1%)
    return a == a and a ~= ABSENT and a or nil, b == b and b ~= ABSENT and b or nil,
      c == c and c ~= ABSENT and c or nil, d == d and d ~= ABSENT and d or nil,
      e == e and e ~= ABSENT and e or nil, f == f and f ~= ABSENT and f or nil,
      g == g and g ~= ABSENT and g or nil, h == h and h ~= ABSENT and h or nil,
      i == i and i ~= ABSENT and i or nil, j == j and j ~= ABSENT and j or nil,
      k == k and k ~= ABSENT and k or nil, l == l and l ~= ABSENT and l or nil
  end

  -- A number of the walk field as unpacked: nil for an absent one (-inf), and for a NaN.
  function M.walk_number(x)
    if x == x and x ~= ABSENT then return x end
    return nil
  end

  -- The walk as a call that needs few of its numbers reads it: the stored field when it is one
  -- (`packed`; walk_number_at reads a number of it alone, walk_table makes the whole table
  -- once asked for), or else walk_of's table (`walk`).
  function M.walk_stored(meta_key, raw, stored_seq)
    if raw and #raw == WALK_BYTES then return raw, nil end
    return false, M.walk_of(meta_key, raw, stored_seq)
  end

  -- The walk's number `name` as walk_stored gave the walk: at its place in the stored field
  -- (WALK_PLACE), without unpacking the others, or else from walk_of's table.
  function M.walk_number_at(packed, walk, name)
    if not packed then return walk[name] end
    return M.walk_number(struct.unpack('<d', packed, 8 * WALK_PLACE[name] - 7))
  end

  -- `holder`'s walk as walk_of's table (holder.walk), made from its stored field
  -- (holder.walk_packed, see walk_stored) once asked for.
  function M.walk_table(holder)
    if not holder.walk then holder.walk = M.walk_of(nil, holder.walk_packed) end
    return holder.walk
  end

  -- The walk field's value for twelve numbers in WALK_FIELDS' order (nil: absent).
  function M.walk_packed(a, b, c, d, e, f, g, h, i, j, k, l)
    return struct.pack(WALK_FORMAT, a or ABSENT, b or ABSENT, c or ABSENT, d or ABSENT,
      e or ABSENT, f or ABSENT, g or ABSENT, h or ABSENT, i or ABSENT, j or ABSENT, k or ABSENT,
      l or ABSENT)
  end

  -- The walk field's value for the numbers of `w` (walk_of's form).
  function M.walk_text(w)
    return M.walk_packed(w.qstart, w.qlen, w.lapnext, w.qmin, w.lapguess, w.packed, w.lmin,
      w.lstop, w.lpass, w.lskip, w.rpasses, w.lpasses)
  end

  -- Writes the numbers of `w` (walk_of's table, changed by the caller) to the meta hash
  -- `meta_key`, with the other fields given (field, value, ...), by one HSET; then deletes the
  -- numbers' own fields of a queue an older module wrote (walk_of's `legacy`).
  function M.save_walk(meta_key, w, ...)
    rcall('HSET', meta_key, 'walk', M.walk_text(w), ...)
    M.walk_saved(meta_key, w)
  end

  -- After the walk field of `w` was written: its legacy fields go (see walk_of).
  function M.walk_saved(meta_key, w)
    if w.legacy then
      rcall('HDEL', meta_key, unpack(WALK_FIELDS))
      w.legacy = nil
    end
    w.stored = true
  end

  -- The sizes of the side structures; reading them is also their type check.
  function M.read_sides()
    return {
      [K.done] = M.read('SCARD', K.done), [K.done_old] = M.read('SCARD', K.done_old),
      [K.marks] = M.read('HLEN', K.marks), [K.marks_old] = M.read('HLEN', K.marks_old),
      revoked = M.read('ZCARD', K.revoked),
    }
  end

  -- read_sides, and the dead letters' count. Usually none of them exists (batch acks leave
  -- nothing behind): one EXISTS says so, and a key that does not exist has no wrong type. When
  -- one does, it is most often the fencing set alone (it keeps what a nack, a reclaim or an ack
  -- that dropped payloads revoked for the fence window): its size says so, one read where
  -- reading every side structure takes six.
  -- `found`: what an EXISTS of them said, if the caller asked already (M.loop_lease).
  function M.read_sides_and_dead(found)
    found = found or rcall('EXISTS', K.done, K.done_old, K.marks, K.marks_old, K.revoked, K.dead)
    if found == 0 then
      return { [K.done] = 0, [K.done_old] = 0, [K.marks] = 0, [K.marks_old] = 0, revoked = 0 }, 0
    end
    if found == 1 then
      local revoked = M.read('ZCARD', K.revoked)
      if revoked > 0 then
        return { [K.done] = 0, [K.done_old] = 0, [K.marks] = 0, [K.marks_old] = 0,
          revoked = revoked }, 0
      end
    end
    return M.read_sides(), M.read('LLEN', K.dead)
  end

  -- What the marks hashes hold, counted as stats counts it, kept in the meta hash so that stats
  -- reads no hash whole: per hash, its deferred jobs ("n" marks) and the jobs of its batch acks
  -- ("a<jobs>" marks). Every write of a mark goes through count_mark; when the marks age the
  -- counts move with the hashes. Noted in sides.marked.
  local MARK_COUNTS = { 'marked_n', 'marked_a', 'marked_n_old', 'marked_a_old' }

  function M.read_marked(sides, counts)
    local c = counts
    if not c then
      local m = M.read('HMGET', K.meta, unpack(MARK_COUNTS))
      c = {}
      for i = 1, 4 do c[i] = tonumber(m[i]) or 0 end
    end
    sides.marked = { [K.marks] = { c[1], c[2] }, [K.marks_old] = { c[3], c[4] }, was = c }
    return sides
  end

  -- Counts a mark `m` into (sign 1) or out of (sign -1) the hash `key`.
  function M.count_mark(sides, key, m, sign)
    if not m or not key then return end
    local kind = string.byte(m)
    local counts = sides.marked[key]
    if kind == BYTE_N then
      counts[1] = counts[1] + sign
    elseif kind == BYTE_A then
      counts[2] = counts[2] + sign * (tonumber(string.sub(m, 2)) or 0)
    elseif kind == BYTE_F then
      counts[2] = counts[2] + sign -- a buried job: done with, like an acked one
    end
  end

  -- The counts that changed, appended to `fields` (meta field, value, ...).
  function M.marked_fields(sides, fields)
    local marked = sides.marked
    local new, old = marked[K.marks], marked[K.marks_old]
    local now = { new[1], new[2], old[1], old[2] }
    for i = 1, 4 do
      if now[i] ~= marked.was[i] then
        local count = math.max(now[i], 0)
        fields[#fields + 1], fields[#fields + 2] = MARK_COUNTS[i], SMALL_TEXT[count] or count
      end
    end
    marked.was = now
    return fields
  end

  -- Wakes up to n idle consumers of the queue K: a token each, the list kept at most
  -- LIMIT.wake_tokens long (trimmed only when this push made it longer). `wake`: the list's
  -- length where the caller read it and nothing was pushed onto it since; then only the tokens
  -- that fit go (the same list as pushing all and trimming), and none onto a full list.
  -- `guarded`: a short way's first write, where nothing has read the list (where a consumer
  -- waits, it is empty: its length need not be read first): false, nothing written, for a
  -- list of another type. True otherwise.
  function M.add_wake_tokens(K, n, wake, guarded)
    local want = math.min(n, LIMIT.wake_tokens - (wake or 0))
    if want <= 0 then return true end
    local tokens = {}
    for i = 1, want do tokens[i] = '1' end
    local length
    if guarded then
      length = M.attempt('LPUSH', K.wake, unpack(tokens))
      if type(length) ~= 'number' then return false end
    else
      length = rcall('LPUSH', K.wake, unpack(tokens))
    end
    if length > LIMIT.wake_tokens then rcall('LTRIM', K.wake, 0, LIMIT.wake_tokens - 1) end
    return true
  end

  -- 5. ACK CHECKS: what the short way of next asks of its batch acks ------------------------------
  -- Also used by the acks one by one (ack_tokens, section 8), and by nack, bury and extend
  -- (section 9).

  -- The lease list's walk stopped at a young lease that was live (meta lstop: the deadline its
  -- tokens carry), and waits for it before it looks for acked leases behind it. True when one
  -- of the tokens (or batch names) acked or given back has that deadline, and so may be that
  -- lease: the walk may go on at the next call.
  function M.frees_tail(tokens, lstop)
    if not lstop then return false end
    local deadline = string.format('%d', lstop) -- (an integer's format, not %.14g's)
    for i = 1, #tokens do
      if M.named_deadline(tokens[i]) == deadline then return true end
    end
    return false
  end

  -- The deadline a token, a batch name or a lease list element carries, as text: the digits
  -- after its first "*" (a lease made, a batch made; an extended lease waits by its mark's).
  function M.named_deadline(text)
    return string.match(text, '%*(%d+)%.')
  end

  -- Tokens (or batch acks) in A[first..] that were revoked or never issued, as a set. A batch
  -- ack is refused
  -- when its batch was revoked: one of its jobs was given back, or its element was broken up.
  function M.refused_among(first, sides)
    local refused = {}
    -- A token this queue never issued: its call seq is before the queue's origin (a token of
    -- a queue deleted before, or of another queue) or not reached yet.
    local origin, seq = sides.origin, sides.seq
    local match, sub = string.match, string.sub
    for i = first, #A do
      local arg = A[i]
      local call
      if string.byte(arg) == BYTE_STAR then
        call = tonumber(match(arg, '^%*%d+%.1%.(%d+)/'))
      else
        call = tonumber(sub(match(arg, '%.(%d+)$') or '', 1, -(LIMIT.place_digits + 1)))
      end
      if not call or call < origin or call >= seq then refused[arg] = true end
    end
    M.refuse_touched(first, sides, refused)
    if #A >= first and sides.revoked > 0 then
      -- Each arg's own name, and for a first delivery or batch ack its batch's expiry, which
      -- fences the whole batch ("<batch>*", see visit_packed).
      local names, of = {}, {}
      for i = first, #A do
        local arg = A[i]
        local batch
        if string.byte(arg) == BYTE_STAR then
          batch = M.split_batch_ack(arg)
          names[#names + 1], of[#names + 1] = batch, arg
        else
          batch = M.batch_of(arg)
          names[#names + 1], of[#names + 1] = arg, arg
        end
        if batch then names[#names + 1], of[#names + 1] = batch .. '*', arg end
      end
      local scores = M.zmscore_all(K.revoked, names) -- (up to two names a token)
      for i = 1, #names do
        if scores[i] then refused[of[i]] = true end
      end
    end
    return refused
  end

  -- A batch ack of a batch marked touched: one of its jobs was acked, given back or extended
  -- on its own, so acking the batch whole could count that job twice (or complete one given
  -- back). Refused: the client acks token by token. Only read while marks exist.
  function M.refuse_touched(first, sides, refused)
    if (sides[K.marks] or 0) + (sides[K.marks_old] or 0) == 0 then return end
    local names, of = {}, {}
    for i = first, #A do
      local arg = A[i]
      if string.byte(arg) == BYTE_STAR and not refused[arg] then
        names[#names + 1], of[#names + 1] = M.split_batch_ack(arg), arg
      end
    end
    if #names == 0 then return end
    for _, key in ipairs({ K.marks, K.marks_old }) do
      if (sides[key] or 0) > 0 then
        local marks = M.hmget_all(key, names)
        for i = 1, #names do
          if marks[i] == 't' then refused[of[i]] = true end
        end
      end
    end
  end

  -- 6. WALK STATE: what a claim reads first and writes back last ----------------------------------
  -- Shared by the short way of next (section 7) and the walk (section 10): the lists' lengths,
  -- the side structures' sizes and the meta hash, read at a claim's start (read_walk_state),
  -- and the counters written back at its end (write_meta, add_counts).

  -- The state of one walk over the tail of the ring, shared by next and sweep. Reading the
  -- ring's length and the side structures' sizes also checks the keys the walk may write; the
  -- wake list, which a claim writes only when it idles or makes the earliest deadline, is
  -- checked by check_wake where that may happen: a claim behind other leases reads one key less.
  -- The arguments, when given, are what a claim the one-worker loop declined (M.loop_lease)
  -- read already: the lists' lengths, and maybe the meta fields, the side structures' count
  -- (EXISTS) and TIME; nothing is read twice, and the order of the reads stays this one.
  function M.read_walk_state(length, lease_length, fields, found, now)
    if not length then length = M.read('LLEN', K.ring) end
    if not lease_length then lease_length = M.read('LLEN', K.leases) end
    local meta = M.meta_of(fields or M.read_meta_fields(K), K.meta)
    local sides, dead_length = M.read_sides_and_dead(found)
    M.read_marked(sides, meta.marked)
    sides.origin, sides.seq, sides.lstop = meta.origin, meta.seq, meta.lstop
    sides.walk = meta.walk -- (write_acked writes it)
    return { length = length, lease_length = lease_length, meta = meta, sides = sides,
      dead_length = dead_length, now = now or M.now_ms() }
  end

  -- Reads (and so type-checks) the wake list, once a call, before the first write of a call
  -- that may write it (an idle call deletes it, a push or an early deadline adds a token).
  function M.check_wake(state)
    if not state.wake_checked then
      M.read('LLEN', K.wake)
      state.wake_checked = true
    end
  end

  -- How many ids a packed element lists from its byte `start` on (just after its batch name):
  -- its runs of bytes other than "*". One plain search per id (memchr) costs half what one
  -- gsub of the pattern does over a batch of 100; an empty id (two "*" in a row, or one at the
  -- end: written by hand) sends it to the pattern, which skips empty runs.
  function M.count_ids(element, start)
    local find, ids, at = string.find, 1, start
    while true do
      local star = find(element, '*', at, true)
      if not star then break end
      if star == at then at = nil break end
      ids, at = ids + 1, star + 1
    end
    if at and at <= #element then return ids end
    local _, runs = string.gsub(string.sub(element, start), '[^*]+', '')
    return runs
  end

  -- Both lists walked whole since the last ageing: the ring (or it holds at most its sentinel)
  -- and the lease list (or it is left empty).
  function M.walked_whole(rpasses, lpasses, ring_live, leases_left)
    return (rpasses >= 1 or ring_live <= 1) and (lpasses >= 1 or leases_left == 0)
  end

  -- The deadline a lease or packed batch was made with (its place in the lease list), nil for
  -- anything that is neither (a visit dead-letters it).
  function M.own_deadline(element, batch)
    if batch then
      local deadline = string.match(batch, '^%*(%d+)%.1%.%d+$')
      if not deadline or #deadline > LIMIT.int_digits or #batch > LIMIT.stamp_bytes
          or not string.find(element, '[^*]', #batch + 2) then
        return nil
      end
      return tonumber(deadline)
    end
    local _, deadline = M.parse_token(element)
    return deadline
  end

  -- One more wake-up token (the list kept short).
  function M.wake_one()
    M.add_wake_tokens(K, 1)
  end

  -- Forgets refused tokens past the fencing window, oldest first, and beyond its count: at most
  -- what this call added plus LIMIT.trim_step, so the set shrinks steadily and no call does
  -- work in proportion to it. A token forgotten is no longer refused (README, "Guarantees").
  -- `size`: at most how many the set holds now (its size before the call plus what it added).
  function M.trim_revoked(meta, now, added, size)
    TRIMMED = true
    if size == 0 then return end -- the common case of a queue without failures: no command
    local step = added + LIMIT.trim_step
    local old = rcall('ZRANGEBYSCORE', K.revoked, '-inf', '(' .. (now - meta.fence_ms),
      'LIMIT', 0, step)
    local drop = #old
    if drop < step and size > meta.fence_max then
      drop = math.min(step, math.max(drop, rcall('ZCARD', K.revoked) - meta.fence_max))
    end
    if drop > 0 then rcall('ZREMRANGEBYRANK', K.revoked, 0, drop - 1) end
  end

  -- Writes the counters a walk changed (only those: formatting numbers is a good part of a
  -- short call); an absent field reads as its default, as read_meta says.
  -- The fields are compared in a loop over their names, not by a call each: a Lua call costs
  -- as much as the comparison many times over. Absent ones (nil) are written as ''.
  function M.write_meta(s)
    local was = s.meta
    local fields, n = { 'seq', s.seq }, 2
    if was.seeded then
      fields[3], fields[4], n = 'origin', was.origin, 4
    end
    for i = 1, #WRITTEN_META do
      local name = WRITTEN_META[i]
      local value = s[name]
      if value ~= was[name] then
        fields[n + 1], fields[n + 2], n = name, value and (SMALL_TEXT[value] or value) or '', n + 2
      end
    end
    local w = was.walk
    local packed, lapguess = math.max(s.packed, 0), s.lapguess and 1 or 0
    local changed = not w.stored or w.packed ~= packed or w.lapguess ~= lapguess
    for i = 1, #WALK_FIELDS do
      local name = WALK_FIELDS[i]
      if name ~= 'packed' and name ~= 'lapguess' and s[name] ~= w[name] then
        changed, w[name] = true, s[name]
      end
    end
    if changed then
      w.packed, w.lapguess = packed, lapguess
      fields[n + 1], fields[n + 2], n = 'walk', M.walk_text(w), n + 2
    end
    local stale = s.stale_count or was.stale
    if stale ~= was.stale then
      fields[n + 1], fields[n + 2] = 'stale', stale
    end
    M.marked_fields(s.sides, fields)
    rcall('HSET', K.meta, unpack(fields))
    if changed then M.walk_saved(K.meta, w) end
    M.add_counts(s)
  end

  -- The counters (see stats) are added to, not read, by the calls that change them: reading
  -- four fields and formatting their sums cost every call about 1 us, an HINCRBY of the ones
  -- that changed costs only the calls that change them about 0.4 us each. (One worker's loop
  -- is the exception: it writes `completed` in the HSET it makes anyway, M.loop_lease.)
  function M.add_counts(s)
    if s.completed ~= 0 then M.add_count(K.meta, 'completed', s.completed) end
    if s.redelivered ~= 0 then M.add_count(K.meta, 'redelivered', s.redelivered) end
    if s.reclaimed ~= 0 then M.add_count(K.meta, 'reclaimed', s.reclaimed) end
    if s.lettered ~= 0 then M.add_count(K.meta, 'lettered', s.lettered) end
  end

  -- Adds n to a counter. One that is not a whole number (written by hand) starts again from n:
  -- the call has written the rest already, and must not fail now.
  function M.add_count(key, field, n)
    local added = M.attempt('HINCRBY', key, field, SMALL_TEXT[n] or n)
    if type(added) == 'table' and added.err then rcall('HSET', key, field, n) end
  end

  -- 7. QUEUE COMMANDS -----------------------------------------------------------------------------

  function M.next()
    local times = M.durations_arg(6)
    local reply = M.lease(6, true)
    M.add_durations(times)
    return reply
  end

  function M.next_packed()
    local times = M.durations_arg(6)
    local reply = M.lease(6, true, true)
    M.add_durations(times)
    return reply
  end

  -- The processing times a call of next, next_packed, nextp, ack or ackp may carry as its last
  -- argument, "#<total ms>,<bucket>:<count>,..." (every token holds a "*"; this never does):
  -- checked and taken off A, so the command sees its tokens only. Returns {field, count, ...}
  -- for add_durations.
  function M.durations_arg(first)
    if #A < first then return nil end
    local last = A[#A]
    if string.byte(last) ~= BYTE_HASH or string.find(last, '*', 1, true) then return nil end
    local total = string.match(last, '^#(%d+)')
    local adds, size = { 'dsum', tonumber(total) }, #(total or '') + 1
    for bucket, count in string.gmatch(last, ',(%d+):(%d+)') do
      local b, n = tonumber(bucket), tonumber(count)
      if #bucket > 2 or #count > 10 or b >= LIMIT.duration_buckets or n < 1
          or n > LIMIT.rate_jobs then
        break
      end
      adds[#adds + 1], adds[#adds + 2] = 'd' .. b, n
      size = size + #bucket + #count + 2
    end
    if not total or #total > LIMIT.int_digits or size ~= #last or #adds < 4 then
      M.refuse('ROTATOR_BADARG', 'processing times must be #<total ms>,<bucket 0..' ..
        (LIMIT.duration_buckets - 1) .. '>:<count>,..., got ' .. M.printable(last))
    end
    A[#A] = nil
    return adds
  end

  -- Adds processing times (durations_arg) to the queue's histogram (see durations).
  function M.add_durations(adds)
    if not adds then return end
    for i = 1, #adds, 2 do rcall('HINCRBY', K.meta, adds[i], adds[i + 1]) end
  end

  -- next's work, with the ack tokens starting at A[first] (batch acks among them when
  -- `batches`); also returns the accepted tokens, and the state it read (read_walk_state).
  -- `compact`: the reply carries this call's first deliveries as their packed element
  -- (next_packed) instead of a token each.
  function M.lease(first, batches, compact)
    local count = M.int_arg(2, 'COUNT', 1, LIMIT.count)
    local lease = M.int_arg(3, 'LEASE_MS', 1, LIMIT.lease_ms)
    local budget = M.int_arg(4, 'BUDGET', 1, LIMIT.budget)
    local max_deliveries = M.int_arg(5, 'MAX_DELIVERIES', 0, LIMIT.max_deliveries)
    local looped, length, lease_length, fields, found, now -- (what loop_lease read)
    if FAST_LEASE and batches then
      looped, length, lease_length, fields, found, now =
        M.loop_lease(first, count, lease, budget, compact, batches == 'named')
      -- (a claim that leased waits at most until its own deadline: wait_capped holds)
      if looped then return looped, NONE end
    end
    M.check_tokens(first, false, batches)
    local state = M.read_walk_state(length, lease_length, fields, found, now)
    if state.meta.paused then
      local reply, accepted = M.lease_held(first, compact, state, -1, lease)
      return M.wait_capped(reply, lease), accepted, state
    end
    if state.meta.smin and state.meta.smin <= state.now then
      M.check_wake(state) -- (promote pushes, and wakes)
      M.promote(state.meta, state.length, state.now)
      state = M.read_walk_state()
    end
    if not state.meta.rate_n then
      local reply, accepted = M.lease_now(first, count, lease, budget, max_deliveries, compact,
        state)
      return M.wait_capped(reply, lease), accepted, state
    end
    local rate = M.rate_allowance(state.meta, state.now)
    if rate.allowed < 1 then
      local reply, accepted = M.lease_held(first, compact, state, rate.wait, lease)
      return M.wait_capped(reply, lease), accepted, state
    end
    local reply, accepted = M.lease_now(first, math.min(count, rate.allowed), lease, budget,
      max_deliveries, compact, state)
    M.note_rate(rate, M.leased_count(reply, compact))
    return M.wait_capped(reply, lease), accepted, state
  end

  -- An idle consumer waits no longer than its own lease time (see next's wait_ms), so that a
  -- lease as long, taken while it waits, falls due no sooner than it looks again: the reply's
  -- wait_ms, at most `lease` (none known: `lease`).
  function M.wait_capped(reply, lease)
    local wait = reply[2]
    if wait < 0 or wait > lease then reply[2] = lease end
    return reply
  end

  -- Whether a claim's new leases, falling due at `deadline` after `lease` ms, wake an idle
  -- consumer to wait for them (note_leases): they fall due before anything known so far
  -- (`before`, nil: nothing), and sooner than an idle consumer may be waiting. One waits at
  -- most the LEASE_MS of the claim that told it to (wait_capped), a claim that leased
  -- nothing: such a claim raises the meta's lease_max to its LEASE_MS (raised_lease_max), so
  -- only a lease shorter than `lease_max` (nil: none known) may fall due while one waits.
  -- Claims of one lease time wake no one: a wake-up would spin an idle consumer whose claim,
  -- pipelined behind its BLPOP, runs before this call's reply goes out.
  function M.deadline_wakes(deadline, before, lease, lease_max)
    return (not before or deadline < before) and (not lease_max or lease < lease_max)
  end

  -- The lease_max a claim of `lease` ms that leased `leased` jobs leaves (`lease_max`: the
  -- meta's as read): raised to `lease` by a claim that leased nothing (see deadline_wakes).
  function M.raised_lease_max(lease, leased, lease_max)
    if leased == 0 and lease > 0 and (not lease_max or lease > lease_max) then return lease end
    return lease_max
  end

  -- lease's work once the queue may lease: the short way, or the walk.
  function M.lease_now(first, count, lease, budget, max_deliveries, compact, state)
    -- (the walk keeps the id index, and looks at the jobs waiting at a priority)
    if FAST_LEASE and not state.meta.tracked and state.meta.prio == 0 then
      local reply = M.fast_lease(first, count, lease, budget, compact, state)
      if reply then return reply, {} end
    end
    local s = M.start_walk(lease, max_deliveries, state)
    local acked, accepted = M.ack_tokens(first, s.length + s.lease_length, s.sides, s)
    s.lstop = s.sides.lstop
    local reply = compact and { 0, -1, acked, '' } or { 0, -1, acked }
    if s.length == 0 and s.lease_length == 0 then
      reply[1] = 1
      if s.meta.smin then reply[2] = math.max(s.meta.smin - s.now, 1) end
      return reply, accepted
    end
    s.reply, s.compact = reply, compact
    if s.qmin and s.qmin <= s.now then
      -- Something has come due since the last idle lap: look at a whole lap again.
      s.qmin, s.qstart, s.qlen = nil, s.seq, s.length
    end
    M.walk_lists(s, count, budget)
    M.lease_prioritized(s)
    M.finish_walk(s)
    if compact then reply[4] = s.packed_element or '' end
    if s.leased == 0 and s.seq - s.qstart >= s.qlen and not s.lease_more then
      -- Every element the ring held at the last push has been visited since, the pushed ones
      -- last, and nothing was found. Only such a call may clear the wake list, so a push
      -- between two partial laps cannot lose its wake-up.
      rcall('DEL', K.wake)
      reply[1] = 1
    end
    local soonest = M.soonest(s.qmin, s.lmin, s.meta.smin)
    if soonest then reply[2] = soonest - s.now end
    return reply, accepted
  end

  -- The earliest of the times given (nil ones skipped): when something next falls due.
  function M.soonest(a, b, c)
    local soonest = a
    if b and (not soonest or b < soonest) then soonest = b end
    if c and (not soonest or c < soonest) then soonest = c end
    return soonest
  end

  -- ONE WORKER'S LOOP, the short way's commonest state as a path of its own (issue 14): the
  -- call acks, by one batch ack, the batch at the lease list's tail, which is all the list
  -- holds (a worker claiming and acking in turn) or the oldest of several workers' batches
  -- with a young lease before it (workers taking turns: each acks the batch it claimed a turn
  -- ago), no side structure exists but the fencing set (which has not fenced the batch), no
  -- setting that changes a claim is on (pause, scheduled jobs, a rate limit, tracked ids,
  -- priorities, marks counted), and `count` pending ids lie at the ring's tail. There
  -- fast_lease's work comes down to fixed writes (drop the acked batch, lease the ids at the
  -- head, move the counters), which this makes from the meta fields read by place, with no
  -- table of the walk's state, the acks, the lease list's places or the fields to write, and
  -- reading only the meta fields it needs (LOOP_FIELDS). It checks what fast_lease checks
  -- in that state; anything else, or anything that looks wrong, is fast_lease's and the
  -- walk's, which then refuse or take it as they always have. Returns the reply, or nil and
  -- what it read (read_walk_state's arguments), having changed nothing.
  -- `named`: a payload claim's loop (nextp_packed DROP 1), whose ack names its batch (NAMED:
  -- the packed element itself, which the lease list's one element must then be), and whose
  -- ids' payloads go: DROPPED, with what M.forget needs to know of the call (its `call`).
  function M.loop_lease(first, count, lease, budget, compact, named)
    if #A == first - 1 then return M.fresh_lease(count, lease, budget, compact) end
    local ack, ids = A[first], nil
    if #A ~= first or string.byte(ack) ~= BYTE_STAR or budget <= 1
        or not named and #ack > LIMIT.batch_ack_bytes then
      return nil
    end
    if named then
      ack, ids = M.loop_named(ack)
      if not ack then return nil end
    end
    local acked_deadline, call, jobs, batch, made = M.loop_ack(ack)
    if not acked_deadline or ids and made and made ~= A[first] then return nil end
    -- Its own reads, in read_walk_state's order: the lease list's last two elements (the
    -- acked batch, and the lease before it if any), with its length where there are two. The
    -- ring it reads by its pop alone (pop_pending, guarded): the lap's numbers say how far the
    -- pending ids reach, and the pop what is there.
    local tail = M.read('LRANGE', K.leases, '-2', '-1')
    local lease_length = M.lease_length_of(tail)
    if lease_length == 0 then return M.loop_declined(0) end
    local l = M.first_meta() or M.read('HMGET', K.meta, unpack(LOOP_FIELDS))
    local found = rcall('EXISTS', K.done, K.done_old, K.marks, K.marks_old, K.revoked, K.dead)
    -- (l by LOOP_FIELDS' places: 1 seq, 2 walk, 3 taken, 4 origin, 5 marked_n,
    -- 6 marked_n_old, 7 smin, 8 paused, 9 rate_n, 10 track_ids, 11 prio, 12 completed)
    local tn = tonumber
    local seq = l[1] and tn(l[1])
    -- (the walk's numbers; none without the field)
    local qstart, qlen, lapnext, qmin, lapguess, packed, lmin, lstop, lpass, lskip, rpasses
    local lpasses
    if l[2] and #l[2] == WALK_BYTES then
      qstart, qlen, lapnext, qmin, lapguess, packed, lmin, lstop, lpass, lskip, rpasses,
        lpasses = M.walk_values(l[2])
    end
    if found > 1 or not seq or not lmin or l[7] or l[8] == '1' or l[9]
        or l[10] and l[10] ~= '0' or l[11] and l[11] ~= '0' or l[5] and l[5] ~= '0'
        or l[6] and l[6] ~= '0' then
      return M.loop_declined(lease_length, l, found)
    end
    local now = M.now_ms()
    -- A named ack of a batch other than the tail's (workers acking out of order) takes its
    -- batch out where it is (M.takes_out, as the walk's ack_tokens does): no lease is
    -- visited, and the walk stops where it stopped, at the tail (`lstop`, known).
    local element = tail[#tail]
    local out = ids and element ~= A[first]
    -- The ack is this queue's (its call seq since the queue's origin, see refused_among), and
    -- frees the young lease the last walk stopped at, if any (frees_tail): the walk goes on.
    if lmin <= now or call < (l[4] and M.origin_number(l[4]) or 0) or call >= seq
        or out and not lstop or not out and lstop and lstop ~= acked_deadline then
      return M.loop_declined(lease_length, l, found, now)
    end
    -- One side structure may exist: the fencing set (read_sides_and_dead), and then the batch
    -- must not be in it (refused_among: by its name, or fenced whole as "<batch>*").
    local revoked, fence = 0, nil
    if found == 1 then
      revoked = M.read('ZCARD', K.revoked)
      local scores = revoked > 0 and rcall('ZMSCORE', K.revoked, batch, batch .. '*')
      if not scores or scores[1] or scores[2] then
        return M.loop_declined(lease_length, l, found, now)
      end
    end
    -- (the fencing window's settings, for its trimming, and for the memory of the payloads a
    -- named ack drops, with the count of their copies, M.forget's: read where they matter)
    if ids then
      fence = rcall('HMGET', K.meta, 'fence_ms', 'fence_max', 'copies')
    elseif found == 1 then
      fence = rcall('HMGET', K.meta, 'fence_ms', 'fence_max')
    end
    -- The lease list's tail is the acked batch, of as many ids as the ack says, well formed
    -- (fast_window's place, own_deadline): the one this library made, when it knew the ack
    -- (strings are interned: one pointer's comparison), or else checked as it is. A named
    -- ack is that very element, or one the list holds once, not at its tail (`out`).
    if out then
      if not M.takes_out(A[first], lease_length) then
        return M.loop_declined(lease_length, l, found, now)
      end
    elseif made then
      if element ~= made then return M.loop_declined(lease_length, l, found, now) end
    else
      local start = #batch + 2
      local ids = KEPT.leased[element]
      if string.sub(element, 1, start - 1) ~= batch .. '*' or #batch > LIMIT.stamp_bytes
          or not string.find(element, '[^*]', start)
          or (ids or M.count_ids(element, start)) ~= jobs then
        return M.loop_declined(lease_length, l, found, now)
      end
    end
    -- Several workers: the lease before it is young, and the walk, having dropped the acked
    -- batch, stops there (fast_lease's window of two, its byte limit included).
    local stop = nil
    if lease_length > 1 and not out then
      stop = M.young_stop(tail[1], batch, now)
      if not stop or #element > LIMIT.lease_bytes then
        return M.loop_declined(lease_length, l, found, now)
      end
    end
    -- The ring: `count` pending ids within the lap and the budget (one visit spent), the
    -- lap's numbers known (a call without them is the walk's, which guesses them). `completed`
    -- goes in the meta's HSET, not a command of its own (HINCRBY): read, it must be a whole
    -- number the sum keeps exact (one written by hand is the walk's, whose HINCRBY starts it
    -- again).
    local completed = tn(l[12] or '0')
    if not lapnext or not qlen or count > lapnext - seq - 1 or count > budget - 1
        or qmin and qmin <= now or not completed or completed % 1 ~= 0
        or completed + jobs >= 2^53 then
      return M.loop_declined(lease_length, l, found, now)
    end
    local deadline = now + lease
    qstart = qstart or seq
    -- The earliest deadline yet, of a lease shorter than an idle consumer may be waiting: it
    -- is woken to wait for it (deadline_wakes; lease_max read only where the deadline is).
    local before = qmin and qmin < lmin and qmin or lmin
    local wakes = deadline < before and M.deadline_wakes(deadline, before, lease,
      tn(rcall('HGET', K.meta, 'lease_max') or ''))
    if wakes then M.read('LLEN', K.wake) end -- (its type, before the first write)
    local popped, leased = M.pop_pending(count, true)
    if not popped then return M.loop_declined(lease_length, l, found, now) end
    -- Writes: the batch in the acked one's place (alone) or at the head, the wake-up, the
    -- meta's fields that change.
    local packed_element, first_stamp = M.pack_batch(popped, leased, deadline, seq)
    if out then
      rcall('LREM', K.leases, '-1', A[first])
      rcall('LPUSH', K.leases, packed_element)
    elseif stop then
      rcall('RPOP', K.leases)
      rcall('LPUSH', K.leases, packed_element)
    else
      rcall('LSET', K.leases, '0', packed_element)
    end
    M.trim_fence(found == 1 and fence, now, revoked)
    if wakes then M.wake_one() end
    if ids then -- (a named ack's batch: its payloads go, M.forget)
      M.drop_named(batch, ids)
      DROPPED.call = { now = now, revoked = revoked, copies = { tn(fence[3]) }, fence = {
        fence_ms = tn(fence[1]) or LIMIT.fence_ms, fence_max = tn(fence[2]) or LIMIT.fence_max } }
    end
    -- The lease pass (walk_leases for its one visit): it ends there when the visit uses it
    -- up (as the one batch's always does), and when the ring and the rest of the lease list
    -- were walked whole since the last ageing, the acks and marks age (none exist). The ring
    -- holds its sentinel behind the popped ids (the lap's numbers), so its length is more
    -- than 1 (walked_whole).
    -- A batch taken out is no visit: the pass, the lap and the walk's stop stay as they were.
    rpasses, lpasses = rpasses or 0, lpasses or 0
    local visited = out and 0 or 1
    if stop then
      lskip = lskip or 0
      if not lpass or lpass <= 0 then lpass, lskip = lease_length, 0 end
      if lskip > 0 then lskip = lskip - 1 else lpass = lpass - 1 end
    end
    if not out and (not stop or lpass <= 0) then
      lpasses, lpass, lskip = lpasses + 1, lease_length - 1, 0
      if rpasses >= 1 and (lpasses >= 1 or not stop) then rpasses, lpasses = -1, 0 end
    end
    -- The walk stops at the young lease, or else at the new batch.
    if out then
      lmin = lmin < deadline and lmin or deadline
    else
      lstop = stop or deadline
      lmin = stop and stop < deadline and stop or deadline
    end
    -- (the walk's numbers as write_meta would write them)
    lapguess = lapguess == 1 and 1 or 0
    packed = math.max((packed or 0) - (jobs - 1) + leased - 1, 0)
    rcall('HSET', K.meta, 'seq', seq + visited + leased,
      'taken', (l[3] and tn(l[3]) or 0) + leased,
      'walk', M.walk_packed(qstart + visited, qlen, lapnext + visited, qmin, lapguess, packed,
        lmin, lstop, lpass, lskip, rpasses, lpasses), 'completed', completed + jobs)
    local soonest = qmin and qmin < lmin and qmin or lmin
    return M.batch_reply(1, compact, packed_element, popped, leased, first_stamp, soonest - now)
  end

  -- The deadline of the young lease (`element`) before the acked batch (`acked`), where the
  -- walk stops (fast_window's place): nil when it is due, malformed, or the acked batch again.
  function M.young_stop(element, acked, now)
    local batch, deadline = M.lease_place(element)
    if batch == acked or not deadline or deadline <= now then return nil end
    return deadline
  end

  -- A named batch ack as one worker's loop takes it (`named`: the packed element a payload
  -- claim sent, "*<deadline>.1.<call seq>*<id>*<id>..."): its batch ack and its ids (a list
  -- of the call's own: M.drop_named takes it over), name_batch's checks passed; nil for
  -- any other form.
  function M.loop_named(named)
    local star = string.find(named, '*', 2, true)
    local ids = star and M.name_batch(named, star)
    if not ids then return nil end
    return string.sub(named, 1, star - 1) .. '/' .. #ids, ids
  end

  -- A FRESH START, the short way's state with nothing in flight as a path of its own, as
  -- loop_lease is for one worker's loop: the call acks nothing, the lease list is empty, no
  -- side structure exists but the fencing set, no setting that changes a claim is on, and
  -- `count` pending ids lie at the ring's tail within the lap. A consumer woken on an idle
  -- queue makes this claim (a push onto an idle ring goes ahead of its sentinel: push_ahead),
  -- as may a worker's first. fast_lease's work there comes down to fixed writes (the
  -- batch pushed onto the lease list, a wake-up for its deadline, the meta's numbers), which
  -- this makes from the meta fields read by place (LOOP_FIELDS), without the tables of the
  -- walk's state. Anything else is fast_lease's and the walk's. Returns the reply, or nil and
  -- what it read (as loop_lease does), having changed nothing.
  function M.fresh_lease(count, lease, budget, compact)
    local head = M.read('LRANGE', K.leases, '0', '1')
    if #head ~= 0 then return M.loop_declined(M.lease_length_of(head)) end
    local l = M.first_meta() or M.read('HMGET', K.meta, unpack(CLAIM_FIELDS))
    local found = rcall('EXISTS', K.done, K.done_old, K.marks, K.marks_old, K.revoked, K.dead)
    -- (l by CLAIM_FIELDS' places: LOOP_FIELDS', as in loop_lease, then lease_max)
    local seq, lease_max = l[1] and tonumber(l[1]), tonumber(l[LEASE_MAX_AT] or '')
    local qstart, qlen, lapnext, qmin, lapguess, packed, lmin, lstop, lpass, lskip, rpasses,
      lpasses
    if l[2] and #l[2] == WALK_BYTES then
      qstart, qlen, lapnext, qmin, lapguess, packed, lmin, lstop, lpass, lskip, rpasses,
        lpasses = M.walk_values(l[2])
    end
    if found > 1 or not seq or not lapnext or not qlen or lmin or lstop or l[7]
        or l[8] == '1' or l[9] or l[10] and l[10] ~= '0' or l[11] and l[11] ~= '0'
        or l[5] and l[5] ~= '0' or l[6] and l[6] ~= '0' or count > lapnext - seq - 1
        or count > budget then
      return M.loop_declined(0, l, found)
    end
    local now = M.now_ms()
    if qmin and qmin <= now then return M.loop_declined(0, l, found, now) end
    -- One side structure may exist: the fencing set (read_sides_and_dead), which the call
    -- trims (by the fencing window's settings, read where they matter).
    local revoked, fence = 0, nil
    if found == 1 then
      revoked = M.read('ZCARD', K.revoked)
      if revoked == 0 then return M.loop_declined(0, l, found, now) end
      fence = rcall('HMGET', K.meta, 'fence_ms', 'fence_max')
    end
    local deadline = now + lease
    -- The earliest deadline yet (none is in flight but one due later on the ring's lap, qmin):
    -- an idle consumer is woken to wait for it (note_leases), by the call's second write,
    -- guarded: a wake list of another type puts the pop back, and the call is the others'
    -- (which refuse it), the ring as it was.
    local popped, leased = M.pop_pending(count, true)
    if not popped then return M.loop_declined(0, l, found, now) end
    if M.deadline_wakes(deadline, qmin, lease, lease_max)
        and not M.add_wake_tokens(K, 1, nil, true) then
      M.unpop(popped, 1)
      return M.loop_declined(0, l, found, now)
    end
    local packed_element, first_stamp = M.pack_batch(popped, leased, deadline, seq)
    rcall('LPUSH', K.leases, packed_element)
    M.trim_fence(fence, now, revoked)
    -- (the walk's numbers as write_meta would write them: the lease list now holds this
    -- call's batch alone, so its earliest deadline and its stop are the batch's)
    rcall('HSET', K.meta, 'seq', seq + leased, 'taken', (l[3] and tonumber(l[3]) or 0) + leased,
      'walk', M.walk_packed(qstart or seq, qlen, lapnext, qmin, lapguess == 1 and 1 or 0,
        math.max((packed or 0) + leased - 1, 0), deadline, deadline, lpass, lskip,
        rpasses or 0, lpasses or 0))
    local soonest = qmin and qmin < deadline and qmin or deadline
    return M.batch_reply(0, compact, packed_element, popped, leased, first_stamp, soonest - now)
  end

  -- The short ways' trim of the fencing set (trim_revoked), of `revoked` members, by its
  -- settings as they read them (`fence`: the meta's fence_ms and fence_max as HMGET gave
  -- them, or nil where the set does not exist).
  function M.trim_fence(fence, now, revoked)
    if fence then
      M.trim_revoked({ fence_ms = tonumber(fence[1]) or LIMIT.fence_ms,
        fence_max = tonumber(fence[2]) or LIMIT.fence_max }, now, 0, revoked)
    end
    TRIMMED = true -- (as trim_revoked notes it)
  end

  -- The batch ack one worker's loop takes, "*<deadline>.1.<call seq>/<jobs>" (check_tokens'
  -- form): its deadline, call seq and jobs as numbers, its batch ("*<deadline>.1.<call seq>"),
  -- and the packed element it names if this library made that element (keep_packed), which
  -- spares the loop parsing the ack and checking the element (some 5% of its instructions);
  -- nil for any other form. The deadline's digits start with no 0, as a stamp's do: compared
  -- as a number, it is then the same text as the stamp's.
  function M.loop_ack(ack)
    local known = KEPT.acks[ack]
    if known then return known[1], known[2], known[3], known[4], known[5] end
    local deadline, call, jobs_text = string.match(ack, '^%*([1-9]%d*)%.1%.(%d+)/(%d+)$')
    local jobs = tonumber(jobs_text)
    if not jobs or jobs < 1 or jobs > LIMIT.count or #deadline > LIMIT.int_digits then
      return nil
    end
    return tonumber(deadline), tonumber(call), jobs, string.sub(ack, 1, -(#jobs_text + 2))
  end

  -- The lease list's length, from two of its elements read (`two`): LLEN's where they are two.
  function M.lease_length_of(two)
    return #two < 2 and #two or M.read('LLEN', K.leases)
  end

  -- What loop_lease read, completed as read_walk_state takes it, for a call it declines: the
  -- lease list's length, and the meta fields it did not read (when it read LOOP_FIELDS,
  -- `l`); the ring's length is read_walk_state's to read.
  function M.loop_declined(lease_length, l, found, now)
    if not l then return nil, nil, lease_length end
    LOOP_PLACES = LOOP_PLACES or M.loop_places()
    local from, rest = LOOP_PLACES.from, M.read('HMGET', K.meta, unpack(LOOP_PLACES.rest))
    local m = {}
    for i = 1, #META_FIELDS do
      if from[i] > 0 then m[i] = l[from[i]] else m[i] = rest[-from[i]] end
    end
    return nil, nil, lease_length, m, found, now
  end

  -- The meta fields not among LOOP_FIELDS (`rest`), and where each of META_FIELDS is found
  -- (`from`): among LOOP_FIELDS (its place there), or among the rest (minus its place there).
  function M.loop_places()
    local in_loop, rest, from = {}, {}, {}
    for i = 1, #LOOP_FIELDS do in_loop[LOOP_FIELDS[i]] = i end
    for i = 1, #META_FIELDS do
      local name = META_FIELDS[i]
      if in_loop[name] then
        from[i] = in_loop[name]
      else
        rest[#rest + 1] = name
        from[i] = -#rest
      end
    end
    return { rest = rest, from = from }
  end

  -- THE SHORT WAY of next, for the call a busy queue makes most: its acks (if any) are batch
  -- acks, nothing waits to be repaired but batches acked whole (no token acks, no nacked jobs,
  -- no revoked tokens among the acks), the lease list's tail holds acked batches (or none)
  -- and then a young lease, and `count` pending ids lie at the ring's tail within the lap. In
  -- that state the walk (ack_tokens, walk_leases, walk, finish_walk) would write the acks as
  -- marks, meet the acked batches at the tail and drop them, stop at the young lease, and
  -- lease the pending ids; this does the same writes without building the walk's state. A
  -- batch acked out of order (several consumers) stays marked, as the walk leaves it, until
  -- the tail reaches it; a named ack the walk's ack takes out of the list at once (M.take_out)
  -- is left to the walk (or one worker's loop). Returns the reply, or nil (nothing written)
  -- when the state is any other, for the walk to handle.
  function M.fast_lease(first, count, lease, budget, compact, state)
    local length, lease_length, meta, sides = state.length, state.lease_length, state.meta,
      state.sides
    local k = #A - first + 1
    local marked = sides.marked
    if length == 0 or k > LIMIT.fast_acks or k >= budget
        or sides[K.done] + sides[K.done_old] + marked[K.marks][1] + marked[K.marks_old][1] > 0 then
      return nil
    end
    local now, seq = state.now, meta.seq
    -- The acks: batch acks of distinct batches, every one accepted.
    local jobs_of, jobs_text, names = {}, {}, {}
    for i = first, #A do
      local arg = A[i]
      if string.byte(arg) ~= BYTE_STAR then return nil end
      local batch, jobs = M.split_batch_ack(arg)
      if jobs_of[batch] then return nil end
      jobs_of[batch], jobs_text[batch], names[#names + 1] = tonumber(jobs), jobs, batch
    end
    if next(M.refused_among(first, sides)) then return nil end
    -- The walk's work: a lease that may be due, or an unknown earliest deadline. Whether it
    -- walks the lease list at all is leases_due's rule, with the acks written as marks.
    local lstop = meta.lstop
    if M.frees_tail(names, lstop) then lstop = nil end
    if meta.lmin and meta.lmin <= now or lease_length > 0 and not meta.lmin
        or k > 0 and lease_length == 0 then
      return nil
    end
    local walks = lease_length > 0 and not lstop
      and (k > 0 or marked[K.marks][2] + marked[K.marks_old][2] > 0)
    local places, found = NONE, NONE
    if walks then
      places, found = M.fast_window(k, lease_length, sides)
      if not places then return nil end
    end
    -- A named ack names its element, near an end of the list (check_named: read at the tail,
    -- or found by the server); an acked batch marked already (an ack sent again) is the walk's.
    local marks = M.fast_marks(names, places, sides)
    if not marks then return nil end
    -- (a named ack the walk takes out of the lease list at once: M.take_out's)
    local lone_named = k == 1 and NAMED and NAMED[A[first]]
    if lone_named and sides[K.marks] + sides[K.marks_old] == 0
        and M.takes_out(lone_named.element, lease_length) then
      return nil
    end
    for i = 1, k do
      local batch = names[i]
      if marks[batch] then return nil end
      local named = NAMED and NAMED[batch .. '/' .. jobs_text[batch]].element
      if named and found[batch] ~= named and not M.near_an_end(named) then return nil end
    end
    local visited, dropped, unmarks = 0, 0, nil -- (unmarks: places marked acked, dropped)
    local lmin, lpass, lskip = meta.lmin, meta.lpass, meta.lskip
    local rpasses, lpasses = meta.rpasses, meta.lpasses
    local packed, completed = meta.packed, 0
    if walks then
      -- The acked batches at the tail go, with the batches marked acked behind them, up to
      -- the first young lease; anything else there is the walk's.
      local bytes, stop, stop_named = 0, nil, nil -- (as in walk_leases)
      for j = #places, 1, -1 do
        local place = places[j]
        if visited >= budget or bytes > LIMIT.lease_bytes then return nil end
        local jobs = place.batch and jobs_of[place.batch]
        local m = place.mark
        local moved = not place.batch and M.moved_deadline(m) -- (as the walk has it)
        if (not m or moved) and not jobs then
          local deadline = moved or place.deadline
          if not deadline or deadline <= now then return nil end
          stop, stop_named = deadline, place.deadline
          break
        end
        if not place.batch or not place.deadline then return nil end
        local ids = KEPT.leased[place.element] or M.count_ids(place.element, #place.batch + 2)
        if jobs then
          if jobs ~= ids then return nil end
          jobs_of[place.batch], dropped = nil, dropped + 1 -- (each batch once)
        elseif string.byte(m) ~= BYTE_A or tonumber(string.sub(m, 2)) ~= ids then
          return nil
        else
          unmarks = unmarks or {}
          unmarks[#unmarks + 1] = place
        end
        visited, bytes = visited + 1, bytes + #place.element
        packed, completed = packed - (ids - 1), completed + ids
      end
      if not stop and #places < lease_length then return nil end -- (more than it read)
      -- The pass counting of walk_leases for its visits (end_lease_pass, may_age: ageing
      -- renames nothing when no side structure holds anything).
      local skip = lskip or 0
      if not lpass or lpass <= 0 then lpass, skip = lease_length, 0 end
      -- (the pass ends at most once: at the visit that uses lpass up, or, the list walked to
      -- its end, after the last visit; end_lease_pass then counts it, and may age)
      local pass_ended, aged, ended_at = false, false, nil
      for so_far = 1, visited do
        if skip > 0 then
          skip = skip - 1
        else
          lpass = lpass - 1
          if lpass <= 0 then ended_at = so_far break end
        end
      end
      if not ended_at and visited == lease_length then ended_at = visited end
      if ended_at then -- end_lease_pass
        pass_ended, lpasses = true, lpasses + 1
        if M.walked_whole(rpasses, lpasses, length, lease_length - ended_at) then
          aged, lpasses, rpasses = true, 0, -1
        end
      end
      if aged and (sides[K.marks] + sides[K.marks_old] > 0 or dropped < k) then
        return nil -- (ageing would rename marks: the walk's)
      end
      if pass_ended then
        lpass, lskip = lease_length - visited, 0
      else
        lskip = skip
      end
      lmin, lstop = stop, stop_named
    end
    -- The ring: `count` pending ids at its tail, within the lap and the budget, the sentinel
    -- behind them; the batch stops early once its ids reach LIMIT.batch_bytes.
    local lapnext = meta.lapnext or (seq + length + 1)
    if count >= length or count > lapnext - seq - 1 or count > budget - visited then
      return nil
    end
    local deadline = now + lease
    local qmin, qstart, qlen = meta.qmin, meta.qstart or seq, meta.qlen or length
    if qmin and qmin <= now then qmin, qstart, qlen = nil, seq, length end
    local before = meta.lmin
    if qmin and (not before or qmin < before) then before = qmin end
    -- The earliest deadline yet: an idle consumer is woken to wait for it (note_leases). The
    -- wake list's type is checked before the ring's pop, the call's first write: a refusal
    -- after it would lose the popped ids.
    local wakes = M.deadline_wakes(deadline, before, lease, meta.lease_max)
    if wakes then M.check_wake(state) end
    local batch, leased = M.pop_pending(count)
    if not batch then return nil end
    -- Writes (the walk's ack_tokens, finish_walk, note_leases and write_meta, in that order).
    local new_marks -- (tables made only where there is something to write)
    for i = 1, k do
      local batch = names[i]
      if NAMED then -- (none marked before: each is dropped now)
        M.drop_named(batch, NAMED[batch .. '/' .. jobs_text[batch]].ids)
      end
      if jobs_of[batch] then -- acked out of order: marked until the walk reaches it
        local m = 'a' .. jobs_text[batch]
        new_marks = new_marks or {}
        new_marks[#new_marks + 1], new_marks[#new_marks + 2] = batch, m
        M.count_mark(sides, K.marks, m, 1)
      end
    end
    if new_marks then
      sides[K.marks] = sides[K.marks] + M.call_all('HSET', K.marks, new_marks)
    end
    if unmarks then
      local hdel = { [K.marks] = {}, [K.marks_old] = {} }
      for i = 1, #unmarks do
        local place = unmarks[i]
        table.insert(hdel[place.mark_in], place.batch)
        M.count_mark(sides, place.mark_in, place.mark, -1)
      end
      for key, fields in pairs(hdel) do
        if #fields > 0 then sides[key] = sides[key] - M.call_all('HDEL', key, fields) end
      end
    end
    local element, first_stamp = M.pack_batch(batch, leased, deadline, seq)
    if visited == 1 and lease_length == 1 then
      -- The list held the one batch this call removes (one worker's loop): the new batch
      -- takes its place, one command where trimming and pushing take two.
      rcall('LSET', K.leases, '0', element)
    else
      local keep = -(visited + 1)
      if visited > 0 then rcall('LTRIM', K.leases, '0', SMALL_TEXT[keep] or keep) end
      rcall('LPUSH', K.leases, element)
    end
    M.trim_revoked(meta, now, 0, sides.revoked)
    if state.dead_length > 0 then M.trim_dead(meta, now, state.dead_length, 0) end
    if wakes then M.wake_one() end
    if not lmin or deadline < lmin then lmin = deadline end
    -- The list holds this call's batch only: the walk stops at it, at its tokens' deadline (an
    -- earlier lmin, kept from a lease that has left the list, is not one of its leases').
    if lease_length - visited == 0 then lstop = deadline end
    M.write_meta({
      meta = meta, seq = seq + visited + leased, taken = meta.taken + leased,
      packed = packed + leased - 1, qstart = qstart + visited, qlen = qlen,
      lapnext = lapnext + visited, lapguess = meta.lapguess, qmin = qmin, lmin = lmin,
      lstop = lstop, lpass = lpass, lskip = lskip, rpasses = rpasses, lpasses = lpasses,
      sides = sides, completed = completed, redelivered = 0, reclaimed = 0, lettered = 0,
      prio = meta.prio, lease_max = meta.lease_max,
    })
    local soonest = M.soonest(qmin, lmin, meta.smin)
    return M.batch_reply(k, compact, element, batch, leased, first_stamp,
      soonest and soonest - now or -1)
  end

  -- The short ways' packed element of the first `leased` of `batch` (pop_pending's ids),
  -- leased until `deadline` by the call whose seq is `seq`: "*<deadline>.1.<seq>*<id>*...".
  -- Kept for the call's payload reads (PACKED) and a library's next claim (keep_packed).
  -- Returns it, and its stamp (its batch name), which each token of it ends with.
  function M.pack_batch(batch, leased, deadline, seq)
    local first_stamp = string.format('*%d.1.%d', deadline, seq)
    local element
    if leased == 1 then
      element = first_stamp .. '*' .. batch[1] -- (one job: no table work at all)
    else
      batch[0] = first_stamp -- (one string made, not a list and then the element)
      element = table.concat(batch, '*', 0, leased)
      batch[0] = nil
    end
    PACKED, PACKED_IDS = element, batch
    M.keep_packed(element, batch, leased, first_stamp, deadline, seq)
    return element, first_stamp
  end

  -- The short ways' reply: next's (k acks accepted, `wait` ms to the earliest deadline or
  -- -1), its first deliveries as their packed element (`compact`) or a token each.
  function M.batch_reply(k, compact, element, batch, leased, first_stamp, wait)
    if compact then return { 0, wait, k, element } end
    local reply = { 0, wait, k }
    for place = 1, leased do
      reply[#reply + 1] = batch[place] .. first_stamp .. PAD[place]
      reply[#reply + 1] = 0
    end
    return reply
  end

  -- Remembers, a library only, a packed element this call made (of the first `n` of `ids`) by
  -- its text, in KEPT: a worker's next claim finds the batch acked at the lease list's tail
  -- and need not count its ids, a search each; a payload claim that drops what its acks
  -- complete (FRESH_ACKS) gets the element back as a named batch ack, whose ids then need not
  -- be cut out of it again (a find and a new string each: at a batch of 100, some 40% of
  -- the claim's Lua instructions). The copy costs one unpack, in C. When the caller gives the
  -- element's stamp ("*<deadline>.1.<seq>"), its `deadline` and `seq`, the batch's whole ack
  -- is kept too (loop_ack). An EVAL call's KEPT ends with the call, so it keeps nothing.
  -- Every LIMIT.known_batches batches the tables start again, the full ones kept behind them
  -- for their look-ups (__index), the ones before those dropped: the batches several workers
  -- hold when the tables start again stay known (each element names its own ids, so what is
  -- kept is never wrong, only old).
  function M.keep_packed(element, ids, n, stamp, deadline, seq)
    if not LIBRARY then return end
    local kept = KEPT
    if kept.nleased >= LIMIT.known_batches then
      kept.leased, kept.named, kept.acks, kept.nleased =
        M.behind(kept.leased), M.behind(kept.named), M.behind(kept.acks), 0
    end
    kept.leased[element], kept.nleased = n, kept.nleased + 1
    if FRESH_ACKS then kept.named[element] = { unpack(ids, 1, n) } end
    if stamp then
      kept.acks[stamp .. '/' .. (SMALL_TEXT[n] or string.format('%d', n))] =
        { deadline, seq, n, stamp, element }
    end
  end

  -- A new table whose misses look in `full` (its own look-ups no further: the generation
  -- before it is dropped).
  function M.behind(full)
    return setmetatable({}, { __index = setmetatable(full, nil) })
  end

  -- The short ways' batch of first deliveries: `count` pending ids popped off the ring's
  -- tail (popped, not read and trimmed: one command less). The batch stops early once its ids
  -- reach LIMIT.batch_bytes, and what it does not take goes back; all of it goes back when an
  -- element is not a pending id (the walk's then). Returns the ids in the order popped (the
  -- tail first) and how many, or nil, the ring as it was. `guarded`: the caller has not read
  -- the ring (M.loop_lease), so the pop is its type check, and it may find fewer than `count`.
  function M.pop_pending(count, guarded)
    local ids
    if guarded then
      ids = M.attempt('RPOP', K.ring, SMALL_TEXT[count] or count)
      if not ids or ids.err then return nil end
      if #ids < count then
        M.unpop(ids, 1)
        return nil
      end
    else
      ids = rcall('RPOP', K.ring, SMALL_TEXT[count] or count)
    end
    local most, id_bytes, n = LIMIT.batch_bytes, LIMIT.id_bytes, #ids
    for i = 1, n do
      local size = #ids[i]
      if size == 0 or size > id_bytes then
        M.unpop(ids, 1)
        return nil
      end
    end
    -- (only a batch of more ids than batch_bytes / id_bytes may reach batch_bytes: it stops at
    -- the id that does, its bytes summed apart, so the commonest batch's loop is the check
    -- alone, where the sum and count took some 40% of its steps)
    if n * id_bytes >= most then
      local bytes = 0
      for i = 1, n do
        bytes = bytes + #ids[i]
        if bytes >= most then
          n = i
          break
        end
      end
    end
    -- A pending id holds no "*" (a lease, a packed batch and the sentinel do): one search
    -- over the batch's ids joined costs a tenth of a search per id at a batch of 100.
    if string.find(table.concat(ids, '', 1, n), '*', 1, true) then
      M.unpop(ids, 1)
      return nil
    end
    if n < #ids then
      M.unpop(ids, n + 1)
      for i = #ids, n + 1, -1 do ids[i] = nil end
    end
    return ids, n
  end

  -- Puts back at the ring's tail what RPOP took from it, from ids[from] on (ids: in the order
  -- popped, the tail first), so that the ring is as it was before.
  function M.unpop(ids, from)
    local back = {}
    for i = #ids, from, -1 do back[#back + 1] = ids[i] end
    M.call_all('RPUSH', K.ring, back)
  end

  -- The lease list's tail as the short way reads it: the k acked batches may lie there, then
  -- the batches marked acked behind them (at most LIMIT.fast_acks of them: a longer run is
  -- the walk's), then a young lease. Returns
  -- its places from the head of the window to the tail, each {element, batch (packed) or
  -- name (a token), deadline (nil: corrupt)}, and the window's packed elements by batch; nil
  -- when a batch is there twice.
  function M.fast_window(k, lease_length, sides)
    local behind = math.min(sides[K.marks] + sides[K.marks_old], LIMIT.fast_acks)
    local from = -math.min(lease_length, k + 1 + behind)
    local slice = rcall('LRANGE', K.leases, SMALL_TEXT[from] or from, '-1')
    local places, found = {}, {}
    for j = 1, #slice do
      local element = slice[j]
      local batch, deadline, starred = M.lease_place(element)
      if batch then
        if found[batch] then return nil end -- (a copy written by hand: the walk's)
        found[batch] = element
      end
      places[j] = { element = element, batch = batch, deadline = deadline,
        name = starred and not batch and element or nil }
    end
    return places, found
  end

  -- A lease list element as the short ways read it: its batch name when it is a packed batch
  -- (nil for a lease of one job), its deadline (own_deadline: nil when malformed), and
  -- whether it holds a "*" after its first byte (neither: nothing the module writes there).
  function M.lease_place(element)
    local star = string.find(element, '*', 2, true)
    if not star then return nil, nil, false end
    if string.byte(element) == BYTE_STAR then
      local batch = string.sub(element, 1, star - 1)
      return batch, M.own_deadline(element, batch), true
    end
    return nil, M.own_deadline(element), true
  end

  -- The marks of the acked batches (`names`) and of the places read (fast_window), into each
  -- place's `mark` and `mark_in` as look_up finds them. Returns the marks by name, or nil when
  -- a name is marked in both generations (the walk's to sort out).
  function M.fast_marks(names, places, sides)
    if sides[K.marks] + sides[K.marks_old] == 0 then return NONE end
    local marks = {}
    local look = {}
    for i = 1, #names do look[i] = names[i] end
    for j = 1, #places do
      local name = places[j].batch or places[j].name
      if name then look[#look + 1] = name end
    end
    if #look == 0 then return marks end
    local mark_in = {}
    for _, key in ipairs({ K.marks, K.marks_old }) do
      if sides[key] > 0 then
        local values = rcall('HMGET', key, unpack(look))
        for j = 1, #look do
          local name, value = look[j], values[j]
          if value then
            if mark_in[name] and mark_in[name] ~= key then return nil end
            marks[name], mark_in[name] = value, key
          end
        end
      end
    end
    for j = 1, #places do
      local place = places[j]
      local name = place.batch or place.name
      place.mark, place.mark_in = name and marks[name], name and mark_in[name]
    end
    return marks
  end

  -- 8. ON FIRST USE: PUSH AND ACK BY TOKEN --------------------------------------------------------
  -- push, its check of the ids and its bookkeeping (which pushes of other sections share:
  -- push_later, promote, pushp, a topic's publish), and acks one by one: the ack command, and
  -- the acks a claim that walks makes (ack_tokens). Defined on first use (see ON_FIRST_USE): a worker's busy loop, the short
  -- way of next with batch acks, calls none of them, so an EVAL call of it does not create them.
  function M.define_push_ack()
    function M.push()
      if FAST_LEASE and not UNIQUE then
        local pushed = M.plain_push(2)
        if pushed then return pushed end
      end
      return (M.push_ids(2))
    end

    -- A PLAIN PUSH, push's commonest state as a path of its own, as loop_lease is for one
    -- worker's loop: at most LIMIT.batch valid ids onto a queue that exists (a ring, and its
    -- meta's seq, layout and stored walk field) and does not track ids. push_ids' work there
    -- comes down to fixed commands (the ring's length, the meta's fields, the push log's
    -- head, the wake list's length, the time; the push, the meta's numbers, a wake-up, and a
    -- checkpoint once a second; onto an idle ring the wake-up first, without the length),
    -- which this makes without the meta's table or its unpacking.
    -- Its reads are guarded: anything else, or anything that looks wrong (a key of another
    -- type), it leaves to push_ids, which then pushes or refuses as it always has. The ids
    -- are A[first..] (push's from 2, push_chunk's from 4). Returns how many it pushed, or nil,
    -- having written nothing.
    function M.plain_push(first)
      local n = #A - first + 1
      if n < 1 or n > LIMIT.batch then return nil end
      for i = first, #A do
        if not M.valid_id(A[i]) then return nil end
      end
      local length = M.attempt('LLEN', K.ring)
      local m = M.first_meta() or M.attempt('HMGET', K.meta, unpack(PUSH_FIELDS))
      local head = M.attempt('LINDEX', K.pushlog, '0')
      -- (m by place: 1 seq, 2 pushed, 3 taken, 4 walk, 5 track_ids, 6 layout)
      local seq = type(m) == 'table' and not m.err and m[1] and tonumber(m[1])
      if not seq or type(length) ~= 'number' or length == 0 or type(head) == 'table'
          or not m[6] or m[5] == '1' or not m[4] or #m[4] ~= WALK_BYTES then
        return nil
      end
      local _, _, lapnext, _, lapguess = struct.unpack('<ddddd', m[4])
      local idle, wake = M.only_the_sentinel(length, seq, lapnext, lapguess), nil
      -- The wake-ups: onto an idle ring (where consumers wait, their wake list empty) as the
      -- first write, guarded; onto a busy one, whose wake list is full, after its length.
      if idle then
        if not M.add_wake_tokens(K, n, nil, true) then return nil end
      else
        wake = M.attempt('LLEN', K.wake)
        if type(wake) ~= 'number' then return nil end
      end
      local pushed = (m[2] and tonumber(m[2]) or 0) + n
      local now = M.now_ms()
      M.note_checkpoint(K, head, now, pushed, m[3])
      local ahead = nil
      if idle then
        length, ahead = M.push_ahead(K.ring, { unpack(A, first) })
      else
        length = rcall('LPUSH', K.ring, unpack(A, first))
      end
      rcall('HSET', K.meta, 'walk', M.pushed_walk(m[4], seq, length, lapnext, ahead), 'pushed',
        pushed)
      if not idle then M.add_wake_tokens(K, n, wake) end
      return n
    end

    -- push's work, with the ids starting at A[first]. Also returns the time of the push;
    -- `before_write` reads (and so checks) what a caller writes afterwards, before anything is
    -- written.
    function M.push_ids(first, before_write)
      M.check_ids(first)
      local n = #A - first + 1
      if n == 0 then return 0 end
      local length = M.read('LLEN', K.ring)
      local meta = M.read_push_meta(K)
      local head, wake = M.read_push_keys(K)
      M.check_unique(meta)
      if before_write then before_write() end
      local now = M.now_ms()
      local ids = nil
      if meta.tracked then -- each id once (see IDS)
        ids = M.admit({ unpack(A, first) }, 'p')
        n = #ids
        if n == 0 then return 0, now, ids end
      end
      M.ensure_ring(K, length, meta)
      local pushed_to = nil -- (the ring's length after the push, as the last push replies)
      if M.only_the_sentinel(length, meta.seq, meta.lapnext, meta.lapguess) then
        pushed_to, meta.ahead = M.push_ahead(K.ring, ids or { unpack(A, first) })
      elseif ids then
        M.call_all('LPUSH', K.ring, ids)
      else
        for i = first, #A, LIMIT.batch do
          pushed_to = rcall('LPUSH', K.ring, unpack(A, i, math.min(i + LIMIT.batch - 1, #A)))
        end
      end
      -- (nothing between read_push_keys and here writes the wake list: a full one stays as it is)
      M.record_push(K, meta, n, now, head, pushed_to, wake)
      return n, now, ids
    end

    -- Whether the ring of `length` elements holds its sentinel alone, by the lap's numbers
    -- (the queue's seq, the walk's lapnext and lapguess, as numbers or nil): the sentinel is
    -- the next element a claim meets, and nothing is pending before it. (Numbers some hand
    -- made wrong cost only the order: the walk meets whatever is there, and counts the lap
    -- again.)
    function M.only_the_sentinel(length, seq, lapnext, lapguess)
      return length == 1 and lapnext == seq + 1 and lapguess ~= 1
    end

    -- Pushes `ids` (at most LIMIT.batch) onto a ring that holds only its sentinel, ahead of it
    -- (see ELEMENTS OF THE RING): at the tail, the first last, so a claim meets them in push
    -- order and then the sentinel. A consumer woken by this push then leases them the short
    -- way; behind the sentinel, its claim would first cross the lap (the walk). The lap they
    -- join ends one element per id later (the caller writes lapnext on by as many: meta.ahead
    -- for record_push); no acks or marks can be waiting for ids that were never leased, so
    -- the ageing the lap's end brings loses nothing of theirs. `ring`: the queue's, or a
    -- topic group's (push_group). Returns the ring's length after the push, and how many it
    -- pushed.
    function M.push_ahead(ring, ids)
      local n, reversed = #ids, {}
      for i = 1, n do reversed[i] = ids[n + 1 - i] end
      return rcall('RPUSH', ring, unpack(reversed)), n
    end

    -- A push given as `unique ...` (see IDS) needs a queue that tracks ids: elsewhere it could
    -- not keep its promise.
    function M.check_unique(meta)
      if UNIQUE and not meta.tracked then
        M.refuse('ROTATOR_UNTRACKED', 'unique pushes need a queue that tracks ids: configure ' ..
          'track_ids 1 (on an empty queue) first')
      end
    end

    function M.check_ids(first)
      M.check_count(first, 'ids')
      for i = first, #A do
        if not M.valid_id(A[i]) then M.refuse_id(A[i]) end
      end
    end

    function M.valid_id(id)
      return #id > 0 and #id <= LIMIT.id_bytes and not string.find(id, '*', 1, true)
    end

    function M.refuse_id(value)
      M.refuse('ROTATOR_BADID', 'job id must be 1..' .. LIMIT.id_bytes ..
        ' bytes without "*", got ' .. M.printable(value))
    end

    -- Of read_meta's fields, those a push reads and writes (push_ids, pushp, and a topic's
    -- push_group: record_push, expire_backlog): a push reads none of the claim's state, so it does
    -- not pay for it, and a publish reads 7 fields a group instead of all of them.
    function M.read_push_meta(K)
      local m = M.read('HMGET', K.meta, 'seq', 'origin', 'pushed', 'taken', 'walk', 'track_ids',
        'layout')
      local seq, origin = M.seq_origin(m[1], m[2])
      -- (the walk's lap numbers alone, where the field is stored: see walk_stored)
      local packed, walk = M.walk_stored(K.meta, m[5], m[1])
      return {
        seq = seq, origin = origin, seeded = not m[1], pushed = tonumber(m[3]) or 0,
        taken = tonumber(m[4]) or 0, tracked = m[6] == '1', layout = m[7],
        lapnext = M.walk_number_at(packed, walk, 'lapnext'),
        lapguess = M.walk_number_at(packed, walk, 'lapguess'),
        walk_packed = packed, walk = walk, ahead = false, -- (ahead: see push_ahead)
      }
    end

    -- Reads (and so type-checks) what record_push will write: the push log's head, and the wake
    -- list's length (for add_wake_tokens, while nothing else is pushed onto it in between).
    function M.read_push_keys(K)
      local wake = M.read('LLEN', K.wake)
      return M.read('LINDEX', K.pushlog, 0), wake
    end

    -- A ring that does not exist (new, or deleted) gets its sentinel; lap counting restarts
    -- (`meta`: read_meta's or read_push_meta's).
    function M.ensure_ring(K, length, meta)
      if length == 0 then
        rcall('LPUSH', K.ring, SENTINEL)
        if meta.lapnext then
          local walk = M.walk_table(meta)
          meta.lapnext, walk.lapnext = nil, nil
          M.save_walk(K.meta, walk)
        end
      end
    end

    -- Notes `n` more pending ids: counters, the push checkpoint for ages, and a wake-up.
    -- `length`: the ring's length now, where the caller knows it; `wake`: see add_wake_tokens.
    -- A push within the newest checkpoint's second writes nothing to the log: that checkpoint's
    -- count is the queue's `pushed` (see queue_stats), so only a push that starts a checkpoint
    -- writes one, and drops a few fully consumed ones from the tail (at most one a second is
    -- added, up to LIMIT.pushlog_drops dropped: the log stays short).
    function M.record_push(K, meta, n, now, head, length, wake)
      meta.pushed = meta.pushed + n
      M.note_checkpoint(K, head, now, meta.pushed, meta.taken)
      -- Something new is available: consumers must visit every element the ring holds now (the
      -- new ones come last) before they may idle.
      local qlen, walk, ahead = length or rcall('LLEN', K.ring), meta.walk, meta.ahead
      if walk then
        walk.qstart, walk.qlen = meta.seq, qlen
        if ahead then walk.lapnext = walk.lapnext + ahead end
        M.save_walk(K.meta, walk, 'pushed', meta.pushed)
      else
        rcall('HSET', K.meta, 'walk',
          M.pushed_walk(meta.walk_packed, meta.seq, qlen, meta.lapnext, ahead), 'pushed',
          meta.pushed)
      end
      -- (seq and origin written once, by the push that seeds them: a queue's stored seq only
      -- moves on with its claims, and an origin not stored reads as 0, see seq_origin; on
      -- Redis 7.0 each 13-digit number a command is given costs a %.17g formatting)
      if meta.seeded then rcall('HSET', K.meta, 'seq', meta.seq, 'origin', meta.origin) end
      if not meta.layout then rcall('HSET', K.meta, 'layout', LIMIT.meta_layout) end
      M.add_wake_tokens(K, n, wake)
    end

    -- A stored walk field (`packed`) as a push leaves it: the idle lap's first two numbers,
    -- qstart and qlen, rewritten (`seq`, `qlen`), and lapnext moved on by `ahead` ids where
    -- the push went ahead of the sentinel (push_ahead); the rest as it was.
    function M.pushed_walk(packed, seq, qlen, lapnext, ahead)
      if ahead then
        return struct.pack('<ddd', seq, qlen, lapnext + ahead) .. string.sub(packed, 25)
      end
      return struct.pack('<dd', seq, qlen) .. string.sub(packed, 17)
    end

    -- The push log's checkpoint for a push at `now` after which the queue has had `pushed` ids
    -- (`head`: the log's head as read; `taken`: the meta's count, a number or its field), and
    -- the fully consumed ones it then drops (see record_push).
    function M.note_checkpoint(K, head, now, pushed, taken)
      local head_ms = head and M.checkpoint_ms(head)
      if head_ms and now - head_ms < LIMIT.pushlog_bucket_ms and now >= head_ms then return end
      local pushlog = K.pushlog
      rcall('LPUSH', pushlog, pushed .. ':' .. now)
      taken = tonumber(taken) or 0
      for _ = 1, LIMIT.pushlog_drops do
        local tail = rcall('LINDEX', pushlog, -1)
        if not tail or (tonumber(string.match(tail, '^(%d+):')) or 0) > taken then break end
        rcall('RPOP', pushlog)
      end
    end

    -- The time of a push log checkpoint "<pushed>:<ms>" (nil for another form). A new one
    -- starts at most once a second, so a library reads each once (KEPT).
    function M.checkpoint_ms(head)
      local kept = KEPT
      if head ~= kept.checkpoint then
        kept.checkpoint, kept.checkpoint_ms = head, tonumber(string.match(head, ':(%d+)$'))
      end
      return kept.checkpoint_ms
    end

    -- Starts the per-item stats (the fifteenth key, when the call has it) of ids just pushed (or
    -- scheduled): enqueued now, no delivery.
    function M.enqueued(ids, now)
      if not K.items then return end
      local fresh = now .. ':0:0:'
      local pairs_ = {}
      for i = 1, #ids do
        pairs_[#pairs_ + 1], pairs_[#pairs_ + 2] = ids[i], fresh
        if #pairs_ >= LIMIT.batch then
          rcall('HSET', K.items, unpack(pairs_))
          pairs_ = {}
        end
      end
      if #pairs_ > 0 then rcall('HSET', K.items, unpack(pairs_)) end
    end

    function M.ack()
      local times = M.durations_arg(2)
      M.check_tokens(2, true, true)
      local sides = M.ack_sides()
      local n = M.ack_tokens(2, sides.length, sides)
      M.write_acked(sides)
      M.add_durations(times)
      return n
    end

    -- What ack_tokens needs to know of the side structures (reading them checks their types),
    -- the range of call seqs this queue issued, and the length of both lists; `fence`: the
    -- fence settings too (fence_ms, fence_max), for a call that drops payloads (ackp).
    function M.ack_sides(fence)
      local sides = {
        length = M.read('LLEN', K.ring) + M.read('LLEN', K.leases),
        [K.done] = M.read('SCARD', K.done), [K.marks] = M.read('HLEN', K.marks),
        [K.marks_old] = M.read('HLEN', K.marks_old), revoked = M.read('ZCARD', K.revoked),
      }
      M.read_issued(sides, fence)
      sides.lstop_was = sides.lstop
      return sides
    end

    -- Notes in `sides` the call seqs this queue has issued tokens with (origin <= seq < seq)
    -- and the marks' counts (read_marked), in one read; with `fence`, the fence settings too
    -- (only ackp needs them: a plain ack reads two fields less).
    function M.read_issued(sides, fence)
      local c = MARK_COUNTS
      local m = fence
        and M.read('HMGET', K.meta, 'origin', 'seq', 'walk', c[1], c[2], c[3], c[4], 'fence_ms',
          'fence_max')
        or M.read('HMGET', K.meta, 'origin', 'seq', 'walk', c[1], c[2], c[3], c[4])
      sides.seq = tonumber(m[2]) or 0
      sides.origin = m[1] and M.origin_number(m[1]) or 0
      -- (the walk's lstop alone, where the field is stored: see walk_stored)
      sides.walk_packed, sides.walk = M.walk_stored(K.meta, m[3], m[2])
      sides.lstop = M.walk_number_at(sides.walk_packed, sides.walk, 'lstop')
      if fence then
        sides.fence_ms = tonumber(m[8]) or LIMIT.fence_ms
        sides.fence_max = tonumber(m[9]) or LIMIT.fence_max
      end
      local counts = {}
      for i = 1, 4 do counts[i] = tonumber(m[i + 3]) or 0 end
      return M.read_marked(sides, counts)
    end

    -- Writes what acks changed in the meta hash: the marks' counts, and the lease walk's stop.
    function M.write_acked(sides)
      local fields = M.marked_fields(sides, {})
      if sides.lstop_was and not sides.lstop then
        local walk = M.walk_table(sides)
        walk.lstop = nil
        M.save_walk(K.meta, walk, unpack(fields))
      elseif #fields > 0 then
        rcall('HSET', K.meta, unpack(fields))
      end
    end

    -- Acks A[first..] (already checked); returns how many were accepted, and the accepted
    -- tokens. A token goes into the done set; its batch, which may still be one packed element,
    -- is marked "t" (touched) so that the element is broken up at its next visit. A batch ack
    -- marks its batch "a<jobs>": the packed element then leaves the ring as a whole. `s`: a
    -- claim's walk (lease_now), whose one named batch ack may take its batch out of the lease
    -- list at once instead (take_out).
    function M.ack_tokens(first, ring_length, sides, s)
      if #A < first or ring_length == 0 then return 0 end
      local refused = M.refused_among(first, sides)
      local out = nil -- (the ack whose batch was taken out)
      if NAMED then
        M.check_named(first, refused, sides)
        if s then out = M.take_out(first, refused, sides, s) end
      end
      local accepted, batch_names, batch_marks, touched = {}, {}, {}, {}
      local n = 0
      for i = first, #A do
        local arg = A[i]
        if arg == out then
          n = n + 1
        elseif not refused[arg] then
          refused[arg] = true -- given twice, counted once
          n = n + 1
          if string.byte(arg) == BYTE_STAR then
            local batch, jobs = M.split_batch_ack(arg)
            if not batch_marks[batch] then batch_names[#batch_names + 1] = batch end
            batch_marks[batch] = 'a' .. jobs
          else
            accepted[#accepted + 1] = arg
            local batch = M.batch_of(arg)
            if batch then touched[batch] = true end
          end
        end
      end
      if FRESH_ACKS then accepted = M.not_acked_yet(accepted, sides) end
      if #accepted > 0 then
        sides[K.done] = sides[K.done] + rcall('SADD', K.done, unpack(accepted))
      end
      if M.frees_tail(accepted, sides.lstop) or M.frees_tail(batch_names, sides.lstop) then
        sides.lstop = nil
      end
      local values = {}
      for i = 1, #batch_names do values[i] = batch_marks[batch_names[i]] end
      M.write_marks(sides, batch_names, values, false)
      M.touch(touched, sides)
      return n, accepted
    end

    -- A claim's one named batch ack (A[first], NAMED) taken out of the lease list at once
    -- where M.takes_out says so, on a queue with no marks: not refused, and its payloads
    -- dropped by check_named. The walk's state (`s`) loses the element and counts its jobs
    -- completed, as a visit of the element marked acked would. Returns the ack taken out, or
    -- nil.
    function M.take_out(first, refused, sides, s)
      local ack = A[first]
      local named = #A == first and NAMED[ack]
      if not named or refused[ack] or s.tracked or sides[K.marks] + sides[K.marks_old] > 0
          or not M.takes_out(named.element, s.lease_length) then
        return nil
      end
      rcall('LREM', K.leases, '-1', named.element)
      local jobs = #named.ids
      s.lease_length, s.completed = s.lease_length - 1, s.completed + jobs
      s.packed = s.packed - (jobs - 1)
      return ack
    end

    -- Marks batches (a set of names) touched, without overwriting a batch ack.
    function M.touch(batches, sides)
      for batch in pairs(batches) do
        local added = rcall('HSETNX', K.marks, batch, 't')
        if sides then sides[K.marks] = sides[K.marks] + added end
      end
    end

    -- Writes marks (distinct fields -> values) into the current marks hash, counting what they
    -- replace; with `old_too`, also removes the fields from the old hash.
    function M.write_marks(sides, fields, values, old_too)
      if #fields == 0 then return end
      local before = M.hmget_all(K.marks, fields)
      local pairs_ = {}
      for i = 1, #fields do
        M.count_mark(sides, K.marks, before[i], -1)
        M.count_mark(sides, K.marks, values[i], 1)
        pairs_[#pairs_ + 1], pairs_[#pairs_ + 2] = fields[i], values[i]
      end
      sides[K.marks] = sides[K.marks] + M.call_all('HSET', K.marks, pairs_)
      if old_too then
        local older = M.hmget_all(K.marks_old, fields)
        for i = 1, #fields do M.count_mark(sides, K.marks_old, older[i], -1) end
        sides[K.marks_old] = sides[K.marks_old] - M.call_all('HDEL', K.marks_old, fields)
      end
    end
  end

  -- 9. ON FIRST USE: NACK, BURY, EXTEND -----------------------------------------------------------
  -- A worker's calls for a job that failed or runs long. Defined on first use (see
  -- ON_FIRST_USE): a worker's busy loop makes none of them, so an EVAL call of it, or of push or
  -- ack, does not create these functions each time.
  function M.define_setbacks()
    function M.nack()
      return M.give_back(3)
    end

    -- nack's work, with the tokens starting at A[first]; `before_write` reads what a caller
    -- writes afterwards (checked before anything is written). A job given back keeps its place:
    -- its lease is marked "n<due>" (deferred); the lease list's walk takes it on from there (it
    -- moves to the ring to wait, or is leased again when due).
    function M.give_back(first, before_write)
      local delay = M.int_arg(2, 'DELAY_MS', 0, LIMIT.lease_ms)
      M.check_tokens(first, true)
      local alive, sides = M.live_tokens(first)
      local meta = M.read_meta(K)
      M.read('LLEN', K.wake)
      if before_write then before_write() end
      local now = M.now_ms()
      local due = now + delay
      local reply = {}
      local any = false
      local touched, given, marks = {}, {}, {}
      for i = first, #A do
        local token = A[i]
        if alive[token] then
          alive[token] = nil -- a token given twice is requeued once
          given[#given + 1], marks[#marks + 1] = token, 'n' .. due
          rcall('ZADD', K.revoked, now, token)
          -- Its batch can no longer be acked as a whole, and its packed element must be broken
          -- up so that this job waits on its own.
          local batch = M.batch_of(token)
          if batch then
            rcall('ZADD', K.revoked, now, batch)
            touched[batch] = true
          end
          reply[#reply + 1] = 1
          any = true
        else
          reply[#reply + 1] = 0
        end
      end
      M.mark_leases(sides, given, marks, touched)
      if any then
        -- Due work restarts the ring's lap and wakes idle consumers; the lease list's walk looks
        -- for the jobs when they fall due (and at once if one is its tail, see frees_tail).
        local qmin = meta.qmin and math.min(meta.qmin, due) or due
        local lmin = meta.lmin and math.min(meta.lmin, due) or due
        local walk = meta.walk
        walk.qmin, walk.lmin, walk.qstart, walk.qlen = qmin, lmin, meta.seq, rcall('LLEN', K.ring)
        if M.frees_tail(given, meta.lstop) then walk.lstop = nil end
        M.save_walk(K.meta, walk, 'seq', meta.seq, 'origin', meta.origin)
        M.add_count(K.meta, 'retried', #given)
        M.wake_one()
        local added = 2 * (#A - first + 1) -- each token, and maybe its batch
        M.trim_revoked(meta, now, added, sides.revoked + added)
      end
      return reply
    end

    function M.bury()
      local message = M.error_arg(2)
      M.check_tokens(3, true)
      local alive, sides = M.live_tokens(3)
      local meta = M.read_meta(K)
      if K.items then M.read('HLEN', K.items) end
      local now = M.now_ms()
      local reply, buried, marks, revoke, touched = {}, {}, {}, {}, {}
      for i = 3, #A do
        local token = A[i]
        if alive[token] then
          alive[token] = nil -- a token given twice is buried once
          buried[#buried + 1], marks[#marks + 1] = token, 'f' .. message
          revoke[#revoke + 1], revoke[#revoke + 2] = now, token
          local batch = M.batch_of(token)
          if batch and not touched[batch] then
            touched[batch] = true
            revoke[#revoke + 1], revoke[#revoke + 2] = now, batch
          end
          reply[#reply + 1] = 1
        else
          reply[#reply + 1] = 0
        end
      end
      if #buried == 0 then return reply end
      -- Marked, fenced as a nack is; the walk that reaches its element writes the letter (a
      -- token whose element is gone, acked and removed, writes none: its mark is a leftover).
      M.mark_leases(sides, buried, marks, touched)
      M.call_all('ZADD', K.revoked, revoke)
      M.trim_revoked(meta, now, #revoke / 2, sides.revoked + #revoke / 2)
      local walk = meta.walk
      walk.lmin = meta.lmin and math.min(meta.lmin, now) or now
      if M.frees_tail(buried, meta.lstop) then walk.lstop = nil end
      M.save_walk(K.meta, walk)
      if K.items then M.note_errors(3, reply, message) end
      return reply
    end

    -- Records `message` as the last error in the item stats (K.items) of the jobs whose tokens,
    -- A[first..], have a 1 in `reply` (nackp; bury given the item-stats KEYS).
    function M.note_errors(first, reply, message)
      local ids = {}
      for i = first, #A do
        if reply[i - first + 1] == 1 then
          ids[#ids + 1] = string.sub(A[i], 1, string.find(A[i], '*', 2, true) - 1)
        end
      end
      if #ids == 0 then return end
      local old = rcall('HMGET', K.items, unpack(ids))
      local writes = {}
      for j = 1, #ids do
        local kept = string.match(old[j] or '', '^(%d+:%d+:%d+):') or '0:0:0'
        writes[#writes + 1], writes[#writes + 2] = ids[j], kept .. ':' .. message
      end
      M.call_all('HSET', K.items, writes)
    end

    -- A job's error text at A[index]: at most LIMIT.error_bytes (checked before anything is read).
    function M.error_arg(index)
      local message = A[index]
      if type(message) ~= 'string' or #message > LIMIT.error_bytes then
        M.refuse('ROTATOR_BADARG', 'ERROR must be at most ' .. LIMIT.error_bytes .. ' bytes')
      end
      return message
    end

    -- nack's and extend's marks on live leases (replacing any in the old generation), their
    -- counts, and a touch for the batch of each first delivery among them.
    function M.mark_leases(sides, tokens, values, touched)
      M.write_marks(sides, tokens, values, true)
      M.write_marked(sides)
      M.touch(touched)
    end

    function M.write_marked(sides)
      local fields = M.marked_fields(sides, {})
      if #fields > 0 then rcall('HSET', K.meta, unpack(fields)) end
    end

    -- Which tokens in A[first..] still hold a live lease: not revoked, not acked. Also returns the
    -- sides.
    function M.live_tokens(first)
      local alive = {}
      local length = M.read('LLEN', K.ring)
      local sides = M.read_issued(M.read_sides())
      if length + M.read('LLEN', K.leases) == 0 then return alive, sides end
      local refused = M.refused_among(first, sides)
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
      -- A first delivery is also acked when its whole batch was.
      local batches, of = {}, {}
      for i = 1, #tokens do
        local batch = M.batch_of(tokens[i])
        if batch then batches[#batches + 1], of[#batches + 1] = batch, tokens[i] end
      end
      for _, key in ipairs({ K.marks, K.marks_old }) do
        if #batches > 0 and sides[key] > 0 then
          local values = rcall('HMGET', key, unpack(batches))
          for i = 1, #values do
            if values[i] and string.byte(values[i]) == BYTE_A then acked[of[i]] = true end
          end
        end
      end
      for _, token in ipairs(tokens) do
        if not refused[token] and not acked[token] then alive[token] = true end
      end
      return alive, sides
    end

    function M.extend()
      local lease = M.int_arg(2, 'LEASE_MS', 1, LIMIT.lease_ms)
      M.check_tokens(3, true)
      local alive, sides = M.live_tokens(3)
      local meta = M.read_meta(K)
      local deadline = M.now_ms() + lease
      local reply = { deadline }
      local any = false
      local touched, extended, marks, seen = {}, {}, {}, {}
      for i = 3, #A do
        local token = A[i]
        if alive[token] then
          if not seen[token] then
            seen[token] = true
            extended[#extended + 1], marks[#marks + 1] = token, 'e' .. deadline
          end
          local batch = M.batch_of(token)
          if batch then touched[batch] = true end -- its packed element keeps no marks: break it up
          reply[#reply + 1] = 1
          any = true
        else
          reply[#reply + 1] = 0
        end
      end
      if meta.tracked then M.note_cancelled(reply, 3) end
      M.mark_leases(sides, extended, marks, touched)
      -- A shortened lease may now be the first thing to fall due: idle consumers wait for it.
      if any and (not meta.lmin or deadline < meta.lmin) then
        meta.walk.lmin = deadline
        M.save_walk(K.meta, meta.walk)
      end
      return reply
    end
  end

  -- 10. ON FIRST USE: THE WALK ENGINE -------------------------------------------------------------
  -- next and sweep walk two lists from their tails: start_walk reads the state; walk_leases
  -- visits the lease list while what it finds there is due or done with (LEASES in the header);
  -- walk visits a budget of ring elements (leasing pending ids into the call's batch, leasing
  -- due deferred jobs again, ending laps at the sentinel); both collect what to write, and
  -- finish_walk writes it all at once. What a walk keeps goes where it waits: a lease to the
  -- lease list's head while it is young (to its tail when it is due but this call has no room
  -- to lease it), a deferred job to the ring's head.
  --
  -- Defined on first use (see ON_FIRST_USE): a worker's call on a busy queue takes the short
  -- way of next (M.fast_lease), which never walks, so an EVAL call of it does not create
  -- these functions each time.
  function M.define_walk()
    -- A lap's end: the marks hash becomes the old one, the old one goes.
    function M.age_marked(sides)
      local marked = sides.marked
      marked[K.marks_old] = marked[K.marks]
      marked[K.marks] = { 0, 0 }
    end

    -- Notes that `id` is now in flight with the token `id*stamp`, on a queue that tracks ids (see
    -- IDS; the index's other functions, which a plain queue never calls, are in section 11).
    function M.note_id(s, id, stamp)
      if not s.tracked then return end
      s.leased_ids[#s.leased_ids + 1] = id
      s.leased_ids[#s.leased_ids + 1] = stamp
    end

    -- The deadline a "w" mark holds: an extended lease moved to the lease list's head waits by it
    -- (see keep); nil for any other mark.
    function M.moved_deadline(m)
      return m and string.byte(m) == BYTE_W and tonumber(string.sub(m, 2)) or nil
    end

    function M.start_walk(lease, max_deliveries, state)
      state = state or M.read_walk_state()
      M.check_wake(state) -- (every walk may write it)
      local length, lease_length, meta = state.length, state.lease_length, state.meta
      local sides, dead_length, now = state.sides, state.dead_length, state.now
      local lapnext = meta.lapnext or (meta.seq + length + 1)
      -- Tokens end in this call's first visit number and the visit's place in the call (PAD):
      -- unique, because the next call that leases starts at a higher visit number.
      local seq_base = tostring(meta.seq)
      local s = {
        now = now, deadline = now + lease, lease = lease, max_deliveries = max_deliveries,
        sides = sides,
        seq_base = seq_base, first = '*' .. (now + lease) .. '.1.' .. seq_base, meta = meta,
        length = length, live = length, -- ring length as it is at this point of the visits
        -- The lease list: its length, the elements the walk took from its tail, those it puts
        -- back there and those it pushes at its head, and the earliest deadline among those.
        lease_length = lease_length, lease_visited = 0, back = {}, to_leases = {},
        pushed_min = nil, lmin = meta.lmin, lstop = meta.lstop, lpass = meta.lpass,
        lskip = meta.lskip,
        rpasses = meta.rpasses, lpasses = meta.lpasses, lease_more = false,
        seq = meta.seq, lapnext = lapnext, qmin = meta.qmin,
        -- With the lap position unknown (new ring, lost meta), guess that the sentinel is within
        -- one ring length: a sentinel seen before then is accepted, none seen means it is gone.
        lapguess = meta.lapguess,
        qstart = meta.qstart or meta.seq, qlen = meta.qlen or length, taken = meta.taken,
        reply = {}, rotated = {}, revoke = {}, letters = {}, keep_marks = {}, batch = {},
        dead_length = dead_length,
        packed = meta.packed, released = 0, count = 0, expanded = 0, batch_bytes = 0,
        srem = { [K.done] = {}, [K.done_old] = {} }, hdel = { [K.marks] = {}, [K.marks_old] = {} },
        visited = 0, leased = 0, soonest = nil, sweeping = false,
        -- What this call adds to the queue's counters (see add_counts).
        completed = 0, redelivered = 0, reclaimed = 0, lettered = 0,
        -- On a queue that tracks ids: copies gone (id, and the stamp the index must still hold
        -- for its entry to go) and leases made (id, stamp), written by write_ids.
        tracked = meta.tracked, gone = {}, gone_stamp = {}, leased_ids = {},
        stale_count = meta.stale, stale_recs = {}, -- cancelled copies' records (see parse_stale)
        prio = meta.prio, -- jobs waiting at a priority (see PRIORITIES)
      }
      return s
    end

    -- Visits at most `limit` elements from the tail (never more than the ring holds), leasing up
    -- to `count` jobs; visits plus the leases of broken-up batches stay within `budget`.
    function M.walk(s, count, limit, budget)
      local PAD, SENTINEL, BYTE_STAR = PAD, SENTINEL, BYTE_STAR
      local byte, find, id_bytes = string.byte, string.find, LIMIT.id_bytes
      -- A pending id's first delivery: its token is id .. first .. PAD[its place in the batch].
      local first, compact = s.first, s.compact
      local rotated, reply, batch = s.rotated, s.reply, s.batch
      local n_rotated, n_reply = #rotated, #reply
      s.count = count
      -- Slices start just larger than what is wanted (every element fetched costs a string
      -- conversion) and double while the walk finds elements to skip.
      local extra = 2
      while s.visited < limit and s.visited + s.expanded < budget and s.leased < count do
        local want = math.min(limit - s.visited, budget - s.visited - s.expanded,
          count - s.leased + extra, LIMIT.batch)
        extra = extra * 2
        local slice = rcall('LRANGE', K.ring, -(s.visited + want), -(s.visited + 1))
        -- Where the slice's acks and marks are (look_up) is needed only once the walk meets an
        -- element that is not a pending id; a slice of pending ids alone never looks them up.
        local stamped, done_in, mark, mark_in, packed = {}, {}, {}, {}, {}
        local looked, stale = false, {}
        if s.tracked then
          M.look_up(slice, s.sides, stamped, done_in, mark, mark_in, packed)
          looked, stale = true, M.stale_pending(s, slice, stamped, packed)
        end
        local i = #slice
        while true do
          if not s.sweeping then
            -- The common case first: a run of pending ids within the lap (no "*" in them), each
            -- leased into this call's batch, the counters moved once for the run. Anything else
            -- ends the run and is visited below.
            local last = math.min(budget - s.expanded, s.lapnext - s.seq - 1) -- visits allowed
            local place, bytes, most = #batch, s.batch_bytes, LIMIT.batch_bytes
            local from = i
            local lowest = math.max(i - math.min(count - s.leased, last - s.visited), 0)
            while i > lowest do
              local element = slice[i]
              if element == '' or #element > id_bytes or find(element, '*', 1, true)
                  or stale[i] then
                break
              end
              place = place + 1
              batch[place] = element
              if not compact then
                reply[n_reply + 1], reply[n_reply + 2] = element .. first .. PAD[place], 0
                n_reply = n_reply + 2
              end
              bytes = bytes + #element
              i = i - 1
              if bytes >= most then break end
            end
            local run = from - i
            s.visited, s.leased = s.visited + run, s.leased + run
            s.live, s.taken = s.live - run, s.taken + run
            if bytes >= most then count = s.leased end -- the batch is big enough: no more
            s.batch_bytes, s.count = bytes, count
          end
          if i < 1 or s.leased >= count or s.visited + s.expanded >= budget then break end
          if not looked then
            M.look_up(slice, s.sides, stamped, done_in, mark, mark_in, packed)
            looked = true
          end
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
            if packed[i] then
              M.visit_packed(s, element, packed[i], mark[i], mark_in[i])
              n_rotated, n_reply = #rotated, #reply
            elseif not stamped[i] then
              if element == '' or #element > id_bytes or byte(element) == BYTE_STAR then
                s.taken = s.taken + 1 -- empty, too long, or starting with "*": not an id
                M.dead_letter(s, 'corrupt', 0, element)
              elseif stale[i] and M.take_stale(s, element, nil) then
                -- a cancelled copy: dropped
              elseif s.sweeping then
                n_rotated = n_rotated + 1
                rotated[n_rotated] = element
              else
                -- Leased: it joins this call's batch, which goes back as one element.
                s.taken = s.taken + 1
                local place = #batch + 1
                batch[place] = element
                if not compact then
                  reply[n_reply + 1], reply[n_reply + 2] = element .. first .. PAD[place], 0
                  n_reply = n_reply + 2
                end
                s.leased = s.leased + 1
                s.live = s.live - 1
                s.batch_bytes = s.batch_bytes + #element
                if s.batch_bytes >= LIMIT.batch_bytes then count, s.count = s.leased, s.leased end
              end
            elseif done_in[i] ~= nil then
              M.completed(s, done_in[i], element)
            else
              M.visit_lease(s, element, mark[i], mark_in[i])
              n_rotated, n_reply = #rotated, #reply
            end
          end
          i = i - 1
        end
      end
    end

    -- Looks up, for a slice of ring elements, where their ack and mark live. Fills, per index:
    -- done_in[i] = key of the done set holding it; mark[i] = mark value; mark_in[i] = its key;
    -- packed[i] = the batch name of a packed element (whose mark is its batch's: a batch ack wins
    -- over a touch, whichever generation holds them). One command per structure for the whole
    -- slice, whatever its size.
    function M.look_up(slice, sides, stamped, done_in, mark, mark_in, packed)
      local find, byte, BYTE_STAR, BYTE_A = string.find, string.byte, BYTE_STAR, BYTE_A
      local names, at = {}, {} -- tokens first (n of them), then batch names
      local n = 0
      local batches = {}
      for i = 1, #slice do
        local element = slice[i]
        -- A "*" after the first byte: a lease, a packed batch, or a corrupt element.
        local star = find(element, '*', 2, true)
        if star then
          if byte(element) == BYTE_STAR then
            local batch = string.sub(element, 1, star - 1)
            packed[i] = batch
            batches[#batches + 1] = i
          else
            n = n + 1
            names[n], at[n] = element, i
            stamped[i] = true
          end
        end
      end
      for j = 1, #batches do
        names[n + j], at[n + j] = packed[batches[j]], batches[j]
      end
      if #names == 0 then return end
      for _, key in ipairs({ K.done, K.done_old }) do
        if n > 0 and sides[key] > 0 then
          local flags = rcall('SMISMEMBER', key, unpack(names, 1, n))
          for j = 1, #flags do
            if flags[j] == 1 and not done_in[at[j]] then done_in[at[j]] = key end
          end
        end
      end
      for _, key in ipairs({ K.marks, K.marks_old }) do
        if sides[key] > 0 then
          local values = rcall('HMGET', key, unpack(names))
          for j = 1, #names do
            local i, value = at[j], values[j]
            if value and not done_in[i] and (not mark[i]
                or (j > n and byte(value) == BYTE_A and byte(mark[i]) ~= BYTE_A)) then
              mark[i] = value
              mark_in[i] = key
            end
          end
        end
      end
    end

    -- A leased element that is not acked: keep it, or lease it again once it is due.
    function M.visit_lease(s, element, m, m_key)
      local kind = m and string.sub(m, 1, 1)
      local id, deadline, n = M.parse_token(element)
      local when = m and tonumber(string.match(m, '^[enw](%d+)$'))
      if not id then
        M.unmark(s, m_key, element, m)
        M.dead_letter(s, 'corrupt', 0, element)
        return
      end
      local stamp = s.tracked and string.sub(element, #id + 2)
      if stamp and M.take_stale(s, id, stamp) then -- cancelled (see IDS)
        M.unmark(s, m_key, element, m)
        return
      end
      if kind == 'f' then -- buried: to the dead letters now, with its error (revoked by bury)
        M.unmark(s, m_key, element, m)
        M.dead_letter(s, 'failed', n, id .. '*' .. string.sub(m, 2))
        if stamp then M.forget_id(s, id, stamp) end
        return
      end
      if when and (kind == 'e' or kind == 'w') then deadline = when end
      local due = (when and kind == 'n') and when or deadline
      if due > s.now or s.sweeping or s.leased >= s.count
          or (kind ~= 'n' and #s.revoke >= LIMIT.revokes) then
        -- A lease extended beyond a lease made now (this call's deadline) would hold up the
        -- lease list behind it: it waits in the ring instead, as a nacked job does, visited once
        -- a lap, until it is near enough to go to the lease list in its order (see keep).
        local waits = kind == 'n'
          or ((kind == 'e' or kind == 'w') and not s.sweeping and due > s.deadline)
        M.keep(s, element, due, m, m_key, waits)
      else
        -- (a deferred job's copy was never handed out: its token needs no fencing)
        if kind ~= 'n' then s.revoke[#s.revoke + 1] = element end
        M.lease_again(s, id, n, element, (kind == 'n') and 0 or 1, m, m_key)
      end
    end

    -- A packed batch "*<deadline>.1.<call seq>*<id>*<id>...": the first deliveries one call
    -- leased, job k's token being <id k> .. batch .. PAD[k]. Acked as a whole, it leaves the ring;
    -- young and untouched, it stays as it is (one visit for the whole batch); touched (one of
    -- its jobs acked, nacked or extended on its own) or expired, it is broken up into the
    -- elements it stands for, which are visited in its place.
    function M.visit_packed(s, element, batch, m, m_key)
      -- Well formed: a batch name, then at least one id (a byte other than "*").
      local due = M.own_deadline(element, batch)
      if not due then
        M.unmark(s, m_key, batch, m)
        M.dead_letter(s, 'corrupt', 0, element)
        return
      end
      if not m and (due > s.now or s.sweeping) then
        -- Young and untouched, the common case: kept without reading its ids (O(1) per lap).
        M.keep(s, element, due)
        return
      end
      -- A batch ack names its batch's size: one naming another size (a hand-written ack) acks
      -- nothing, and counts as a touch. (Counted only for a batch ack: a break-up splits them.)
      local jobs = m and string.byte(m) == BYTE_A and M.count_ids(element, #batch + 2)
      if jobs and tonumber(string.sub(m, 2)) == jobs then
        M.unmark(s, m_key, batch, m)
        s.live = s.live - 1
        s.packed = s.packed - (jobs - 1)
        s.completed = s.completed + jobs
        if s.tracked then
          local ids = M.split_ids(element, #batch + 2)
          for k = 1, #ids do M.forget_id(s, ids[k], string.sub(batch, 2) .. PAD[k]) end
        end
        return
      end
      local ids = M.split_ids(element, #batch + 2)
      if not m and not s.sweeping and s.count - s.leased >= #ids then
        -- Expired and never touched: none of its jobs was acked, given back or extended on its
        -- own (each would have touched it), so every one is leased again, and one revocation
        -- fences all their tokens (refused_among), as a crashed worker's batch needs.
        s.revoke[#s.revoke + 1] = batch .. '*'
        s.live = s.live + #ids - 1
        s.packed = s.packed - (#ids - 1)
        s.expanded = s.expanded + #ids
        for k = 1, #ids do M.lease_again(s, ids[k], 1, ids[k] .. batch .. PAD[k], 1) end
        return
      end
      M.unmark(s, m_key, batch, m) -- the touch (or a batch ack of another size) is used up
      s.revoke[#s.revoke + 1] = batch -- from now on its jobs are acked one by one
      s.in_place = s.in_place or (s.leases_walk and due > s.now)
      local tokens = {}
      for k = 1, #ids do tokens[k] = ids[k] .. batch .. PAD[k] end
      s.live = s.live + #ids - 1
      s.packed = s.packed - (#ids - 1)
      s.expanded = s.expanded + #ids
      local stamped, done_in, marks, marks_in = {}, {}, {}, {}
      M.look_up(tokens, s.sides, stamped, done_in, marks, marks_in, {})
      for k = 1, #tokens do
        if done_in[k] ~= nil then
          M.completed(s, done_in[k], tokens[k])
        else
          M.visit_lease(s, tokens[k], marks[k], marks_in[k])
        end
      end
      s.in_place = s.sweeping
    end

    -- An acked lease leaves, and its token its done set (`key`; false: that generation is gone).
    function M.completed(s, key, token)
      if key then table.insert(s.srem[key], token) end
      if s.tracked then
        local star = string.find(token, '*', 2, true)
        M.forget_id(s, string.sub(token, 1, star - 1), string.sub(token, star + 1))
      end
      s.live = s.live - 1
      s.completed = s.completed + 1
    end

    -- Drops the mark `m` of `field` from the marks hash `key` (nothing when the mark has no key
    -- left: its generation is gone), with its count.
    function M.unmark(s, key, field, m)
      if not key then return end
      table.insert(s.hdel[key], field)
      M.count_mark(s.sides, key, m, -1)
    end

    -- An element that stays as it is for now, due at `at`. A deferred job waits at the ring's
    -- head. A lease or batch met in the lease list goes back to its tail, in its place, when it
    -- is due but the call has no room to lease it, or when its place is kept (a sweep, a young
    -- batch broken up); at its head when it waits longer than its place says (extended). One met
    -- in the ring (written there before leases had their own list) moves to the lease list's
    -- head while young, or stays in the ring. A mark it still needs moves to the current
    -- generation.
    function M.keep(s, element, at, m, m_key, deferred)
      local list = s.rotated
      if s.leases_walk and not deferred then
        list = (at <= s.now or s.in_place) and s.back or s.to_leases
      elseif not deferred and at > s.now then
        list = s.to_leases
      end
      list[#list + 1] = element
      if list == s.rotated then
        if at and (not s.soonest or at < s.soonest) then s.soonest = at end
        if s.leases_walk then s.moved = s.moved + 1 end -- a deferred job, to the ring
      else
        if list == s.back and at > s.now and (not s.back_young or at < s.back_young) then
          s.back_young = at
        end
        if not s.pushed_min or at < s.pushed_min then s.pushed_min = at end
        s.live = s.live - 1
      end
      -- An extended lease moved to the lease list's head is marked "w" (its deadline kept): there
      -- it is in deadline order, and the walk stops at it while it is young. Marked "e" still, it
      -- was moved again each time it came round, and with more extended leases than a call's
      -- budget (a heartbeat extends every held job) every claim spent its budget moving them, and
      -- the ring's pending jobs waited. A later extend marks it "e" again: one move per extend.
      local kept = m
      if m and list == s.to_leases and string.byte(m) == BYTE_E then
        kept = 'w' .. string.sub(m, 2)
      end
      if m and (m_key ~= K.marks or kept ~= m) then
        s.keep_marks[#s.keep_marks + 1] = element
        s.keep_marks[#s.keep_marks + 1] = kept
        if m_key ~= K.marks then
          M.count_mark(s.sides, K.marks, kept, 1)
          M.unmark(s, m_key, element, m)
        end
      end
    end

    -- Hands out a new delivery of `id` (delivered `n` times so far) in place of `old_token`,
    -- or dead-letters it when it has had its deliveries. The caller fences `old_token` (nil for a
    -- job of a batch that expired whole: it has no mark, and a count of 1 is never corrupt).
    function M.lease_again(s, id, n, old_token, reclaimed, mark, mark_key)
      M.unmark(s, mark_key, old_token, mark)
      if n >= LIMIT.stamped_deliveries then
        -- No delivery reaches this count (MAX_DELIVERIES <= LIMIT.max_deliveries): someone wrote
        -- it by hand, and the next count would not fit the grammar.
        M.dead_letter(s, 'corrupt', 0, old_token)
        return
      end
      if s.max_deliveries > 0 and n >= s.max_deliveries then
        s.letters[#s.letters + 1] = 'max_deliveries*' .. n .. '*' .. s.now .. '*' .. id
        s.live = s.live - 1
        if old_token then M.forget_id(s, id, string.sub(old_token, #id + 2)) end
        return
      end
      -- Numbered apart from the batch, and counted at least 2 (a hand-written lease may say 0):
      -- a later delivery's token never equals a first one's, nor names this call's batch.
      s.released = s.released + 1
      local token = id .. '*' .. s.deadline .. '.' .. (math.max(n, 1) + 1) .. '.' .. s.seq_base
        .. PAD[s.released]
      s.to_leases[#s.to_leases + 1] = token
      M.note_id(s, id, string.sub(token, #id + 2))
      s.live = s.live - 1
      s.reply[#s.reply + 1] = token
      s.reply[#s.reply + 1] = reclaimed
      s.leased = s.leased + 1
      s.redelivered = s.redelivered + 1
      s.reclaimed = s.reclaimed + reclaimed
    end

    function M.dead_letter(s, reason, n, element)
      s.letters[#s.letters + 1] = reason .. '*' .. n .. '*' .. s.now .. '*' .. element
      s.live = s.live - 1
    end

    -- The sentinel's visit ends a lap of the ring. Look-ups already made for slice[1..from] live
    -- one generation older if the acks and marks age here (see M.may_age).
    function M.end_lap(s, from, done_in, mark_in)
      s.rpasses = s.rpasses + 1
      if M.may_age(s) then
        M.age(s)
        s.rpasses, s.lpasses = 0, -1
        local older = { [K.done] = K.done_old, [K.marks] = K.marks_old }
        for i = from, 1, -1 do
          if done_in[i] then done_in[i] = older[done_in[i]] or false end
          if mark_in[i] then mark_in[i] = older[mark_in[i]] or false end
        end
      end
      s.rotated[#s.rotated + 1] = SENTINEL
      s.lapnext, s.lapguess = s.seq + s.visited + s.live, false
    end

    -- Whether the acks and marks may age (the current generation becoming the old one, the old
    -- one going). Whatever the old generation holds was written before the last ageing; once both
    -- lists have been walked whole since (a pass of each that began after it), every element it
    -- could concern has been visited and has taken what it needed: what is left is a leftover
    -- (late ack, stale mark). A list with nothing to walk needs no pass.
    function M.may_age(s)
      if s.aged then return false end -- once a call: a second would be work for nothing
      local ring = s.leases_walk and s.ring_live or s.live -- (the lease walk borrows s.live)
      return M.walked_whole(s.rpasses, s.lpasses, ring, M.leases_left(s))
    end

    -- The lease list's length as this call leaves it, with what it has pushed there so far.
    function M.leases_left(s)
      return s.lease_length - s.lease_visited + #s.back + #s.to_leases
    end

    function M.age(s)
      s.aged = true
      M.flush_side_writes(s)
      -- UNLINK frees a large leftover set in the background: the call stays short.
      rcall('UNLINK', K.done_old, K.marks_old)
      local sides = s.sides
      if sides[K.done] > 0 then rcall('RENAME', K.done, K.done_old) end
      if sides[K.marks] > 0 then rcall('RENAME', K.marks, K.marks_old) end
      sides[K.done_old], sides[K.done] = sides[K.done], 0
      sides[K.marks_old], sides[K.marks] = sides[K.marks], 0
      M.age_marked(sides)
    end

    -- The lease list's walk: from its tail, where the earliest deadlines are (leases are pushed at
    -- its head as they are made, so in deadline order while every lease has the same length),
    -- while what it finds is done with or due. An acked lease or batch, or one given back, goes;
    -- a due lease is leased again (while the call has room) or dead-lettered; a due or touched
    -- batch is broken up into its leases, visited in its place. It stops at the first element
    -- whose own deadline is still ahead (everything behind it is younger), at the first due one
    -- the call has no room for, at the budget, or past LIMIT.lease_bytes. It never moves a young
    -- lease, so a claim costs the same however many are in flight. A sweep does not stop at live
    -- elements: it puts them back at the tail, in their places, and goes on.
    -- A pass of the list (see M.may_age) ends once the elements it held when the pass began have
    -- all been visited: `lpass` counts those left, after the `lskip` at the tail that were
    -- visited and put back.
    function M.walk_leases(s, budget)
      local live, expanded = s.live, s.expanded
      s.leases_walk, s.in_place, s.ring_live, s.moved = true, s.sweeping, live, 0
      local skip = s.meta.lskip or 0
      if not s.lpass or s.lpass <= 0 then s.lpass, skip = s.lease_length, 0 end -- a pass begins
      local byte, now, want, bytes = string.byte, s.now, 2, 0
      -- stop: the deadline of the young lease it stopped at; stop_named: the deadline its tokens
      -- carry (meta lstop, which an ack of it clears), older when it is an extended lease ("w")
      local stop, stop_named, pass_ended = nil, nil, false
      while true do
        local aged = false
        local slice = rcall('LRANGE', K.leases, -(s.lease_visited + want), -(s.lease_visited + 1))
        local stamped, done_in, mark, mark_in, packed = {}, {}, {}, {}, {}
        M.look_up(slice, s.sides, stamped, done_in, mark, mark_in, packed)
        for i = #slice, 1, -1 do
          if s.lease_visited + s.expanded - expanded >= budget or bytes > LIMIT.lease_bytes
              or (s.leased >= s.count and not s.sweeping) or #s.revoke >= LIMIT.revokes then
            s.lease_more = true
            break
          end
          local element, m = slice[i], mark[i]
          -- Acked, given back (nacked: leased again when due, else off to wait in the ring),
          -- extended (it waits at the head: out of its place, it must not hold up those behind
          -- it), or a batch marked (acked whole, or touched: broken up now, its acked leases go
          -- and its live ones wait at the tail in its place).
          local gone = done_in[i] ~= nil
            or (m and (byte(m) == BYTE_N or byte(m) == BYTE_E or byte(m) == BYTE_F or packed[i]))
          local deadline = not gone and (M.moved_deadline(m) or M.own_deadline(element, packed[i]))
          if deadline and deadline > now and not s.sweeping then
            stop, stop_named = deadline, M.own_deadline(element, packed[i])
            break
          end
          s.lease_visited = s.lease_visited + 1
          bytes = bytes + #element
          if deadline and deadline > now then
            M.keep(s, element, deadline, m, mark_in[i]) -- a sweep: back in its place
          elseif done_in[i] ~= nil then
            M.completed(s, done_in[i], element)
          elseif packed[i] then
            M.visit_packed(s, element, packed[i], m, mark_in[i])
          elseif stamped[i] then
            M.visit_lease(s, element, m, mark_in[i])
          elseif element ~= SENTINEL then
            M.dead_letter(s, 'corrupt', 0, element) -- nothing the module writes here
          end
          if skip > 0 then
            skip = skip - 1
          elseif not pass_ended then
            s.lpass = s.lpass - 1
            if s.lpass <= 0 then
              -- The look-ups of this slice may be a generation off now: read on afresh.
              pass_ended, aged = M.end_lease_pass(s), true
              break
            end
          end
        end
        if stop or s.lease_more or (#slice < want and not aged) then break end
        if not aged then want = math.min(want * 2, LIMIT.budget) end
      end
      if not pass_ended and s.lease_visited == s.lease_length then
        pass_ended = M.end_lease_pass(s) -- the whole list was visited, whatever the count said
      end
      s.live, s.leases_walk, s.in_place = live + s.moved, nil, nil
      if pass_ended then
        -- The next pass counts everything the list holds after this call, put back or not
        -- (visited or not: counting more than needed only makes a pass longer).
        s.lpass, s.lskip = M.leases_left(s), 0
      else
        s.lskip = #s.back + skip
      end
      -- What the list may hold that is due soonest: the element it stopped at (the list is in
      -- deadline order), now when it stopped for want of room, nothing when it ran out; and the
      -- young leases it put back at the tail, which the next walk meets first.
      s.lmin = stop or (s.lease_more and now) or nil
      s.lstop = stop_named
      if s.back_young and (not s.lstop or s.back_young < s.lstop) then
        s.lstop = s.back_young
        if not s.lmin or s.back_young < s.lmin then s.lmin = s.back_young end
      end
      -- The visits count as the ring's do (they number this call's tokens): the ring's own
      -- positions, counted in the same sequence, move along.
      local n = s.lease_visited
      s.seq, s.lapnext, s.qstart = s.seq + n, s.lapnext + n, s.qstart + n
    end

    -- Every element a pass of the lease list began with has been visited: the acks and marks may
    -- age. Returns true.
    function M.end_lease_pass(s)
      s.lpasses = s.lpasses + 1
      if M.may_age(s) then
        M.age(s)
        s.lpasses, s.rpasses = 0, -1
      end
      return true
    end

    -- Applies the side-structure writes collected so far by a walk, keeping the sizes in
    -- s.sides true (end_lap renames only what exists).
    function M.flush_side_writes(s)
      local sides, srem, hdel = s.sides, s.srem, s.hdel
      for key, list in pairs(srem) do
        if #list > 0 then
          sides[key] = sides[key] - M.call_all('SREM', key, list)
          srem[key] = {}
        end
      end
      for key, list in pairs(hdel) do
        if #list > 0 then
          sides[key] = sides[key] - M.call_all('HDEL', key, list)
          hdel[key] = {}
        end
      end
      if #s.keep_marks > 0 then
        sides[K.marks] = sides[K.marks] + M.call_all('HSET', K.marks, s.keep_marks)
        s.keep_marks = {}
      end
    end

    -- Writes what a walk decided: the ring and the lease list (visited tails dropped, what stays
    -- pushed back at the heads in visit order, due leases the call had no room for back at the
    -- lease list's tail), side structures, revocations, dead letters and counters.
    function M.finish_walk(s)
      local batch, to_leases = s.batch, s.to_leases
      if #batch > 0 then
        -- The call's first deliveries, packed into one element: "<first>*<id>*<id>...".
        batch[0] = s.first -- (one string made, not a list and then the element)
        s.packed_element = table.concat(batch, '*', 0, #batch)
        batch[0] = nil
        PACKED, PACKED_IDS = s.packed_element, batch
        M.keep_packed(s.packed_element, batch, #batch)
        to_leases[#to_leases + 1] = s.packed_element
        s.packed = s.packed + #batch - 1
      end
      if s.length > 0 and s.live <= 0 and #s.rotated == 0 then
        -- The ring had no sentinel (someone removed it) and is left empty: it gets one back.
        s.rotated[1], s.lapnext, s.lapguess = SENTINEL, s.seq + s.visited + 1, false
      end
      rcall('LTRIM', K.ring, 0, -(s.visited + 1))
      M.call_all('LPUSH', K.ring, s.rotated)
      if s.lease_visited > 0 then rcall('LTRIM', K.leases, 0, -(s.lease_visited + 1)) end
      local back = s.back
      if #back > 0 then
        local reversed = {} -- the first put back is the next visited
        for i = #back, 1, -1 do reversed[#reversed + 1] = back[i] end
        M.call_all('RPUSH', K.leases, reversed)
      end
      M.call_all('LPUSH', K.leases, to_leases)
      M.flush_side_writes(s)
      if #s.revoke > 0 then
        local args = {}
        for j = 1, #s.revoke do
          args[#args + 1] = s.now
          args[#args + 1] = s.revoke[j]
        end
        M.call_all('ZADD', K.revoked, args)
      end
      M.trim_revoked(s.meta, s.now, #s.revoke, s.sides.revoked + #s.revoke)
      if s.tracked then
        M.write_ids(s)
        M.write_stale(s)
      end
      if #s.letters > 0 then M.call_all('RPUSH', K.dead, s.letters) end
      s.lettered = s.lettered + #s.letters
      if s.dead_length + #s.letters > 0 then
        M.trim_dead(s.meta, s.now, s.dead_length + #s.letters, #s.letters)
      end
      s.seq = s.seq + s.visited
      if s.soonest and (not s.qmin or s.soonest < s.qmin) then s.qmin = s.soonest end
      M.note_leases(s)
      s.lease_max = M.raised_lease_max(s.lease, s.leased, s.meta.lease_max)
      M.write_meta(s)
    end

    -- The earliest deadline the lease list may hold now: what its walk left (see walk_leases),
    -- and what this call pushed. A call whose new leases fall due before anything known so far
    -- wakes an idle consumer, which then waits for them rather than for what it was told.
    function M.note_leases(s)
      local lmin = s.lmin
      if s.leased > 0 then
        local before = s.meta.lmin
        if s.qmin and (not before or s.qmin < before) then before = s.qmin end
        if M.deadline_wakes(s.deadline, before, s.lease, s.meta.lease_max) then
          M.wake_one()
        end
        if not lmin or s.deadline < lmin then lmin = s.deadline end
      end
      local pushed = s.pushed_min
      if pushed and (not lmin or pushed < lmin) then lmin = pushed end
      local left = M.leases_left(s)
      if left == 0 then lmin = nil end
      -- Pushed onto an empty list, the young leases of this call are its tail: a walk for acks
      -- need not read them before they may be due (see leases_due), or before an ack names the
      -- first of them (lstop: by the deadline its tokens carry, see frees_tail).
      if left == #s.to_leases and left > 0 then
        s.lstop = tonumber(M.named_deadline(s.to_leases[1]))
      end
      s.lmin = lmin
    end

    -- Drops the oldest dead letters beyond the count kept or older than the age kept, at most
    -- what this call added plus LIMIT.trim_step. `length`: the dead list's length now.
    function M.trim_dead(meta, now, length, added)
      local drop = math.min(math.max(length - meta.dead_max, 0), added + LIMIT.trim_step)
      if meta.dead_age_ms > 0 then
        local cutoff = now - meta.dead_age_ms
        while drop < length and drop < added + LIMIT.trim_step do
          local letter = rcall('LINDEX', K.dead, drop) or ''
          local died = tonumber(string.match(letter, '^[^*]*%*%d+%*(%d+)%*'))
          if not died or died >= cutoff then break end
          drop = drop + 1
        end
      end
      if drop > 0 then
        rcall('LTRIM', K.dead, drop, -1)
        rcall('HINCRBY', K.meta, 'dead_dropped', drop)
      end
    end

    -- A call's walks: the lease list's when it is due, then the ring's, within one budget.
    function M.walk_lists(s, count, budget)
      s.count = count
      if M.leases_due(s) then M.walk_leases(s, budget) end
      local left = budget - s.lease_visited
      M.walk(s, count, math.min(left, s.length), left)
    end

    -- After the ring's walk: leases jobs waiting at a priority (see PRIORITIES) into the call's
    -- batch, the most urgent first, while the call has room, once no pending id is left in the
    -- ring (the counters say none is, or the walk visited the whole ring). O(log n) per job.
    function M.lease_prioritized(s)
      if s.prio <= 0 or s.sweeping or s.leased >= s.count then return end
      if s.meta.pushed - s.taken - s.prio > 0 and s.visited < s.length then return end
      local found = rcall('ZRANGEBYSCORE', K.scheduled, '-inf', '(0', 'LIMIT', 0,
        s.count - s.leased)
      if #found == 0 then return end
      local batch, reply, first, compact = s.batch, s.reply, s.first, s.compact
      local taken = {}
      for i = 1, #found do
        local member = found[i]
        taken[i] = member
        local _, id = M.ranked_member(member)
        if id and M.valid_id(id) then
          local place = #batch + 1
          batch[place] = id
          if not compact then
            reply[#reply + 1], reply[#reply + 2] = id .. first .. PAD[place], 0
          end
          s.leased = s.leased + 1
          s.batch_bytes = s.batch_bytes + #id
          if s.batch_bytes >= LIMIT.batch_bytes then break end
        else -- (a member written by hand)
          s.letters[#s.letters + 1] = 'corrupt*0*' .. s.now .. '*' .. member
        end
      end
      rcall('ZREM', K.scheduled, unpack(taken))
      s.taken, s.prio = s.taken + #taken, s.prio - #taken
    end

    -- Whether this call walks the lease list: when its earliest deadline may have come, or when
    -- acks wait for their elements (or jobs given back for theirs) and the list's tail is not a
    -- young lease known to be live, whose deadline the walk would wait for (see ack_tokens).
    function M.leases_due(s)
      if s.lease_length == 0 then return false end
      if s.sweeping or not s.lmin or s.lmin <= s.now then return true end
      if s.lstop then return false end
      local sides, marked = s.sides, s.sides.marked
      return sides[K.done] + sides[K.done_old] + marked[K.marks][1] + marked[K.marks][2]
        + marked[K.marks_old][1] + marked[K.marks_old][2] > 0
    end
  end

  -- 11. ON FIRST USE: tracked ids, scheduled and prioritized jobs, flow control, administration ---

  -- What a worker's push, next, ack, nack, bury and extend never call on a plain queue:
  -- defined on first use (M's lookup of a function it does not hold yet, see ON_FIRST_USE), so
  -- an EVAL call of those commands does not create these functions each time.
  function M.define_later()
    -- A queue that tracks ids (configure track_ids 1, see IDS): K.ids names where each id's
    -- one copy is. These run only on such a queue.

    -- Of `ids` (checked, in order), those the queue may take now as `value` ("p": pushed to the
    -- ring, "s"/"s<level>": scheduled, "q<level>": waiting at a priority): an id is taken once
    -- however often it is given, and not while the queue holds it, except that a job scheduled
    -- may be scheduled again (it moves: its old member goes). Writes the index for them and
    -- returns them.
    function M.admit(ids, value)
      local held = M.hmget_all(K.ids, ids)
      local acked = M.acked_copies(ids, held)
      local fresh, writes, seen, moved = {}, {}, {}, {}
      local scheduling = string.byte(value) == BYTE_S
      for i = 1, #ids do
        local id, v = ids[i], held[i]
        if not seen[id] then
          seen[id] = true
          local rescheduled = v and scheduling and string.byte(v) == BYTE_S
          if not v or acked[i] or rescheduled then
            fresh[#fresh + 1] = id
            writes[#writes + 1], writes[#writes + 2] = id, value
            if rescheduled and v ~= value then moved[#moved + 1] = M.waiting_member(id, v) end
          end
        end
      end
      M.call_all('HSET', K.ids, writes)
      M.call_all('ZREM', K.scheduled, moved)
      return fresh
    end

    -- The member of K.scheduled that holds `id`, by its index value: "s" (scheduled) is the id
    -- itself, "s<level>" and "q<level>" (scheduled, or waiting, at a priority) "*<level>*<id>".
    function M.waiting_member(id, v)
      local level = string.sub(v, 2)
      return level == '' and id or '*' .. level .. '*' .. id
    end

    -- Which of `ids` the index `held` (their values) places in a lease that is acked already:
    -- its token in a done set, or its batch acked whole. Such a copy is complete, though its
    -- element may wait for a walk to remove it. A set of indexes into `ids`.
    function M.acked_copies(ids, held)
      local tokens, at, batches, of = {}, {}, {}, {}
      for i = 1, #ids do
        local v = held[i]
        if v and string.find(v, '^%d') then
          local token = ids[i] .. '*' .. v
          tokens[#tokens + 1], at[#tokens + 1] = token, i
          local batch = M.batch_of(token)
          if batch then batches[#batches + 1], of[#batches + 1] = batch, i end
        end
      end
      local acked = {}
      if #tokens == 0 then return acked end
      for _, key in ipairs({ K.done, K.done_old }) do
        local flags = M.read('SMISMEMBER', key, unpack(tokens))
        for j = 1, #flags do
          if flags[j] == 1 then acked[at[j]] = true end
        end
      end
      if #batches > 0 then
        for _, key in ipairs({ K.marks, K.marks_old }) do
          local marks = M.read('HMGET', key, unpack(batches))
          for j = 1, #marks do
            if marks[j] and string.byte(marks[j]) == BYTE_A then acked[of[j]] = true end
          end
        end
      end
      return acked
    end

    -- Notes in the walk's state that the copy of `id` whose token ends in `stamp` has left the
    -- queue (acked and removed, dead-lettered, dropped): its index entry goes, unless it already
    -- names another copy (the id pushed again once this one was acked or cancelled).
    function M.forget_id(s, id, stamp)
      if not s.tracked then return end
      s.gone[#s.gone + 1], s.gone_stamp[#s.gone + 1] = id, stamp
    end

    -- Writes what the walk noted: entries of copies gone (each only if it still names that
    -- copy), then the stamps of this call's leases.
    function M.write_ids(s)
      local gone, batch = s.gone, s.batch
      if #gone > 0 then
        local held = M.hmget_all(K.ids, gone)
        local drop = {}
        for i = 1, #gone do
          if held[i] == s.gone_stamp[i] then drop[#drop + 1] = gone[i] end
        end
        M.call_all('HDEL', K.ids, drop)
      end
      local writes = s.leased_ids
      local stamp = string.sub(s.first, 2)
      for k = 1, #batch do
        writes[#writes + 1], writes[#writes + 2] = batch[k], stamp .. PAD[k]
      end
      M.call_all('HSET', K.ids, writes)
    end

    -- A cancelled copy that still has an element (a pending id in the ring, a lease or a deferred
    -- job) is recorded under the field "*<id>" of K.ids (no id holds "*"): "<n>" pending copies,
    -- then ",<stamp>" for each lease or deferred job, until the walk meets and drops it; meta
    -- `stale` counts what all records hold, so a walk reads them only while there are some.
    -- A record as the walk keeps it: {n = pending copies, stamps = {stamp = true}, dirty}.
    function M.parse_stale(raw)
      local rec = { n = 0, stamps = {} }
      if not raw then return rec end
      local first = true
      for part in string.gmatch(raw, '[^,]+') do
        if first then
          rec.n, first = tonumber(part) or 0, false
        else
          rec.stamps[part] = true
        end
      end
      return rec
    end

    function M.format_stale(rec)
      local parts = { tostring(rec.n) }
      for stamp in pairs(rec.stamps) do parts[#parts + 1] = stamp end
      if #parts == 1 and rec.n == 0 then return nil end
      return table.concat(parts, ',')
    end

    -- The record of `id` as this walk has it (`raw`: its field, when the caller read it), read
    -- once per walk.
    function M.stale_of(s, id, raw)
      local rec = s.stale_recs[id]
      if not rec then
        if raw == nil then raw = rcall('HMGET', K.ids, '*' .. id)[1] end
        rec = M.parse_stale(raw)
        s.stale_recs[id] = rec
      end
      return rec
    end

    -- For a slice of the ring on a tracked queue with records: index -> true for each pending id
    -- with a cancelled pending copy recorded (one HMGET for the slice). Which of its copies the
    -- walk drops does not matter: they are the same id.
    function M.stale_pending(s, slice, stamped, packed)
      local stale = {}
      if s.stale_count <= 0 then return stale end
      local fields, at = {}, {}
      for i = 1, #slice do
        local element = slice[i]
        if not stamped[i] and not packed[i] and element ~= SENTINEL and element ~= ''
            and string.byte(element) ~= BYTE_STAR and not s.stale_recs[element] then
          fields[#fields + 1], at[#fields + 1] = '*' .. element, i
        end
      end
      local raws = #fields > 0 and M.hmget_all(K.ids, fields) or {}
      for j = 1, #fields do M.stale_of(s, slice[at[j]], raws[j]) end
      for i = 1, #slice do
        local rec = not stamped[i] and not packed[i] and s.stale_recs[slice[i]]
        if rec and rec.n > 0 then stale[i] = true end
      end
      return stale
    end

    -- Whether the walk drops this element of `id` (stamp: its token after "*", or nil for a
    -- pending id) as a cancelled copy; if so, the record no longer holds it.
    function M.take_stale(s, id, stamp, raw)
      if s.stale_count <= 0 then return false end
      local rec = M.stale_of(s, id, raw)
      if stamp then
        if not rec.stamps[stamp] then return false end
        rec.stamps[stamp] = nil
      else
        if rec.n <= 0 then return false end
        rec.n = rec.n - 1
      end
      rec.dirty, s.stale_count = true, s.stale_count - 1
      s.live = s.live - 1
      if not stamp then s.taken = s.taken + 1 end -- (a pending one was counted as pending)
      return true
    end

    -- Writes the records the walk changed.
    function M.write_stale(s)
      local writes, drops = {}, {}
      for id, rec in pairs(s.stale_recs) do
        if rec.dirty then
          local value = M.format_stale(rec)
          if value then
            writes[#writes + 1], writes[#writes + 2] = '*' .. id, value
          else
            drops[#drops + 1] = '*' .. id
          end
        end
      end
      M.call_all('HSET', K.ids, writes)
      M.call_all('HDEL', K.ids, drops)
    end

    -- push, once per chunk of a bulk load whose progress the marker hash (the fourteenth key)
    -- records in its field `chunks`: a retried or duplicated loader (a Spark task run twice)
    -- pushes nothing twice, however its attempts interleave.
    function M.push_chunk()
      local chunk = M.int_arg(2, 'CHUNK', 0, LIMIT.no_bound)
      local ttl = M.int_arg(3, 'TTL_MS', 1, LIMIT.no_bound)
      -- The fourteenth key: push_chunk takes its marker hash there (the call's own: K is the
      -- last call's when its thirteen keys were the same, see M.checked_before).
      return M.marked(KS[QUEUE_KEYS + 1], chunk, ttl, { 'pushed' }, function()
        -- (a plain push's own path where it applies, as push takes it)
        local pushed = FAST_LEASE and not UNIQUE and M.plain_push(4) or M.push_ids(4)
        return { pushed, chunk + 1, 0 }, { 'pushed', pushed }
      end, function(recorded, last, chunks)
        M.check_ids(4)
        return { 0, chunks, last and tonumber(recorded[1]) or 0 }
      end)
    end

    -- push_later's arguments: the due time (ms, server TIME) of IN DELAY_MS or AT AT_MS at
    -- A[2..3], checked, and the time now.
    function M.due_arg(at)
      at = at or 2
      local mode = A[at]
      if mode ~= 'IN' and mode ~= 'AT' then
        M.refuse('ROTATOR_BADARG', 'expected IN DELAY_MS or AT AT_MS, got ' .. M.printable(mode))
      end
      local most = LIMIT.schedule_ms
      local time = M.int_arg(at + 1, mode == 'IN' and 'DELAY_MS' or 'AT_MS', 0,
        mode == 'IN' and most or LIMIT.no_bound)
      local now = M.now_ms()
      local due = mode == 'IN' and now + time or time
      if due > now + most then
        M.refuse('ROTATOR_BADARG', 'AT_MS ' .. time .. ' is more than ' .. most ..
          ' ms after the server\'s time ' .. now)
      end
      return due, now
    end

    function M.push_later()
      local due, now = M.due_arg()
      M.check_ids(4)
      local ids = { unpack(A, 4) }
      if #ids == 0 then return 0 end
      local smin = M.read_schedule_keys()
      if K.items then M.read('HLEN', K.items) end
      if M.read_tracked() then
        ids = M.admit(ids, 's')
        if #ids == 0 then return 0 end
      end
      M.schedule_ids(ids, due, smin)
      M.enqueued(ids, now)
      return #ids
    end

    -- Whether the queue tracks ids (see IDS), for a command that reads no other meta; refuses a
    -- unique push on a queue that does not (check_unique).
    function M.read_tracked()
      local meta = { tracked = M.read('HMGET', K.meta, 'track_ids')[1] == '1' }
      M.read('HLEN', K.ids)
      M.check_unique(meta)
      return meta.tracked
    end

    -- Reads (and so checks) what schedule_ids writes.
    function M.read_schedule_keys()
      M.read('ZCARD', K.scheduled)
      M.read('LLEN', K.wake)
      return tonumber(M.read('HMGET', K.meta, 'smin')[1])
    end

    -- Schedules `ids` (checked) for `due`: an id scheduled already moves to `due`. A due time
    -- sooner than any before (`smin`, from read_schedule_keys) wakes an idle consumer, which
    -- then waits for it.
    function M.schedule_ids(ids, due, smin)
      local args = {}
      for i = 1, #ids do
        args[#args + 1] = due
        args[#args + 1] = ids[i]
      end
      M.call_all('ZADD', K.scheduled, args)
      if not smin or due < smin then
        rcall('HSET', K.meta, 'smin', due)
        M.wake_one()
      end
    end

    -- push_priority LEVEL IN|AT TIME ID...: ids that wait at priority LEVEL (1..9, behind the
    -- ring's pending ids, which are level 0), now or once due (see PRIORITIES).
    function M.push_priority()
      local level = M.int_arg(2, 'LEVEL', 1, LIMIT.priority_levels)
      local due, now = M.due_arg(3)
      M.check_ids(5)
      local ids = { unpack(A, 5) }
      if #ids == 0 then return 0 end
      local length = M.read('LLEN', K.ring)
      local meta = M.read_meta(K)
      local head = M.read_push_keys(K)
      local smin = M.read_schedule_keys()
      M.read('HLEN', K.ids)
      if K.items then M.read('HLEN', K.items) end
      M.check_unique(meta)
      local later = due > now
      if meta.tracked then -- each id once (see IDS)
        ids = M.admit(ids, (later and 's' or 'q') .. level)
        if #ids == 0 then return 0 end
      end
      local members = {}
      for i = 1, #ids do members[i] = '*' .. level .. '*' .. ids[i] end
      M.enqueued(ids, now)
      if later then
        -- A job waiting at this level leaves it for the schedule: no longer pending (as if
        -- taken), to be pushed again when due.
        local scores = rcall('ZMSCORE', K.scheduled, unpack(members))
        local waiting, seen = 0, {}
        for i = 1, #scores do
          if scores[i] and tonumber(scores[i]) < 0 and not seen[members[i]] then
            waiting, seen[members[i]] = waiting + 1, true
          end
        end
        if waiting > 0 then
          rcall('HSET', K.meta, 'prio', meta.prio - waiting, 'taken', meta.taken + waiting)
        end
        M.schedule_ids(members, due, smin)
        return #ids
      end
      local jobs = {}
      for i = 1, #ids do jobs[i] = { level, ids[i], members[i] } end
      M.ensure_ring(K, length, meta) -- (a claim of a queue without a ring answers idle at once)
      local added = M.rank(meta, jobs)
      if added > 0 then M.record_push(K, meta, added, now, head) end
      return added
    end

    function M.pause()
      local was = M.read('HMGET', K.meta, 'paused')[1]
      rcall('HSET', K.meta, 'paused', '1')
      return was == '1' and 0 or 1
    end

    function M.resume()
      local was = M.read('HMGET', K.meta, 'paused')[1]
      M.read('LLEN', K.wake)
      if was ~= '1' then return 0 end
      rcall('HDEL', K.meta, 'paused')
      M.add_wake_tokens(K, LIMIT.wake_tokens)
      return 1
    end

    -- next on a queue that may lease nothing now (paused, or at its rate limit): takes the acks
    -- and idles for `wait_ms` (-1: until woken; M.lease caps either at the call's lease time).
    -- Wake-ups pushed meanwhile would only spin the idle consumers: resume wakes them, and the
    -- rate limit's wait ends by itself.
    -- `lease`: the call's LEASE_MS, to which it raises lease_max (see deadline_wakes).
    function M.lease_held(first, compact, state, wait_ms, lease)
      M.check_wake(state)
      local sides = state.sides
      sides.lstop_was = sides.lstop
      local acked, accepted = M.ack_tokens(first, state.length + state.lease_length, sides)
      M.write_acked(sides)
      rcall('DEL', K.wake)
      local lease_max = state.meta.lease_max
      if M.raised_lease_max(lease, 0, lease_max) ~= lease_max then
        rcall('HSET', K.meta, 'lease_max', lease)
      end
      return compact and { 1, wait_ms, acked, '' } or { 1, wait_ms, acked }, accepted
    end

    -- The rate limit (rate_limit) as a generic cell rate: each job leased moves the theoretical
    -- arrival time `tat` on by per / jobs ms, and a call may lease while tat stays within `per`
    -- ahead of now, so at most `jobs` go in any burst and `jobs` per `per` on average, across
    -- every consumer. Returns {allowed, wait (ms until one more may go), tat, step}.
    function M.rate_allowance(meta, now)
      local step, per = meta.rate_ms / meta.rate_n, meta.rate_ms
      local tat = math.max(meta.rate_tat or now, now)
      -- (tat near 1.7e12 ms is exact to about 2e-4 ms: the wait is checked with the very sum
      -- the allowance makes, so a consumer told to wait is not held again when it comes)
      local function allowed_at(t) return math.floor((t + per - tat) / step + 1e-9) end
      local wait = math.max(math.ceil(tat + step - per - now), 1)
      while allowed_at(now + wait) < 1 do wait = wait + 1 end
      return { allowed = math.max(allowed_at(now), 0), wait = wait, tat = tat, step = step }
    end

    function M.note_rate(rate, leased)
      if leased > 0 then rcall('HSET', K.meta, 'rate_tat', rate.tat + leased * rate.step) end
    end

    -- How many jobs a next reply leased (next_packed's packed element holds its first ones).
    function M.leased_count(reply, compact)
      if not compact then return (#reply - 3) / 2 end
      local packed = reply[4] ~= '' and select(2, string.gsub(reply[4], '%*', '')) - 1 or 0
      return packed + (#reply - 4) / 2
    end

    function M.durations()
      if #A == 2 or (#A > 1 and #A % 2 == 1) then
        M.refuse('ROTATOR_BADARG', 'durations takes TOTAL_MS and BUCKET COUNT pairs, or nothing')
      end
      local adds = {}
      if #A > 1 then adds[1] = { 'dsum', M.int_arg(2, 'TOTAL_MS', 0, LIMIT.no_bound) } end
      for i = 3, #A, 2 do
        local bucket = M.int_arg(i, 'BUCKET', 0, LIMIT.duration_buckets - 1)
        adds[#adds + 1] = { 'd' .. bucket, M.int_arg(i + 1, 'COUNT', 1, LIMIT.rate_jobs) }
      end
      local fields = {}
      for b = 0, LIMIT.duration_buckets - 1 do fields[#fields + 1] = 'd' .. b end
      fields[#fields + 1] = 'dsum'
      M.read('HLEN', K.meta)
      for i = 1, #adds do rcall('HINCRBY', K.meta, adds[i][1], adds[i][2]) end
      local counts = rcall('HMGET', K.meta, unpack(fields))
      for i = 1, #counts do counts[i] = tonumber(counts[i]) or 0 end
      return counts
    end

    function M.rate_limit()
      local jobs = M.int_arg(2, 'JOBS', 0, LIMIT.rate_jobs)
      local per = M.int_arg(3, 'PER_MS', 1, LIMIT.lease_ms)
      M.read('HLEN', K.meta)
      if jobs == 0 then
        rcall('HDEL', K.meta, 'rate_n', 'rate_ms', 'rate_tat')
      else
        rcall('HSET', K.meta, 'rate_n', jobs, 'rate_ms', per)
      end
      return 1
    end

    -- Moves the scheduled jobs that are due (at most LIMIT.promote, earliest first) to the ring,
    -- as push does, and notes the next due time. `length`: the ring's length.
    function M.promote(meta, length, now)
      local found = M.read('ZRANGEBYSCORE', K.scheduled, 0, now, 'WITHSCORES', 'LIMIT', 0,
        LIMIT.promote)
      local head = M.read_push_keys(K)
      local due, members, ticks, ranked = {}, {}, {}, {}
      for i = 1, #found, 2 do
        local member = found[i]
        local level, id = M.ranked_member(member)
        if level then -- scheduled at a priority level: now waiting at it
          ranked[#ranked + 1] = { level, id, member }
        elseif string.byte(member) == BYTE_STAR then
          members[#members + 1] = member
          ticks[#ticks + 1] = string.sub(member, 2)
          ticks[#ticks + 1] = string.format('%.0f', tonumber(found[i + 1]))
        else
          members[#members + 1] = member
          due[#due + 1] = member
        end
      end
      if #members > 0 then rcall('ZREM', K.scheduled, unpack(members)) end
      if #ticks > 0 then
        local ids = M.tick(ticks, now)
        for i = 1, #ids do due[#due + 1] = ids[i] end
      end
      if #due + #ranked > 0 then
        M.ensure_ring(K, length, meta)
        if #due > 0 then rcall('LPUSH', K.ring, unpack(due)) end
        M.rank(meta, ranked)
        M.record_push(K, meta, #due + #ranked, now, head)
        if meta.tracked then -- scheduled ("s") or a tick's new id: now waiting
          local writes = {}
          for i = 1, #due do writes[#writes + 1], writes[#writes + 2] = due[i], 'p' end
          for i = 1, #ranked do
            writes[#writes + 1], writes[#writes + 2] = ranked[i][2], 'q' .. ranked[i][1]
          end
          rcall('HSET', K.ids, unpack(writes))
        end
      end
      M.note_scheduled()
    end

    -- The level and id of a member "*<level>*<id>" of K.scheduled (see PRIORITIES); nil for
    -- another member.
    function M.ranked_member(member)
      local level, id = string.match(member, '^%*([1-9])%*(.+)$')
      return tonumber(level), id
    end

    -- Puts jobs ({level, id, member} each) to wait at their levels, in this order, behind the
    -- jobs waiting there: their members scored (level - 10) * prio_span + their push order.
    -- Counts them in meta prio (meta.prio and meta.pseq move on); returns how many were not
    -- waiting at a priority already (an id waiting again moves to the back of its level).
    function M.rank(meta, jobs)
      if #jobs == 0 then return 0 end
      local args, members, seen = {}, {}, {}
      for i = 1, #jobs do
        local level, member = jobs[i][1], jobs[i][3]
        if not seen[member] then -- (an id given twice waits once)
          seen[member] = true
          members[#members + 1] = member
          args[#args + 1] = (level - 10) * LIMIT.prio_span + meta.pseq + i
          args[#args + 1] = member
        end
      end
      -- (ZMSCORE tells members waiting already, below 0, from those scheduled, at or above it)
      local scores = rcall('ZMSCORE', K.scheduled, unpack(members))
      local added = 0
      for i = 1, #scores do
        if not scores[i] or tonumber(scores[i]) >= 0 then added = added + 1 end
      end
      M.call_all('ZADD', K.scheduled, args)
      meta.prio, meta.pseq = meta.prio + added, meta.pseq + #jobs
      rcall('HSET', K.meta, 'prio', meta.prio, 'pseq', meta.pseq)
      return added
    end

    -- Notes in meta smin the earliest due time of the scheduled jobs (none: no field).
    function M.note_scheduled()
      -- (the jobs waiting at a priority, scored below 0, are not scheduled)
      local first = rcall('ZRANGEBYSCORE', K.scheduled, 0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if first[2] then
        rcall('HSET', K.meta, 'smin', first[2])
      else
        rcall('HDEL', K.meta, 'smin')
      end
    end

    -- extend's reply on a queue that tracks ids: a lease lost (0) because its job was cancelled
    -- is -1, so the worker stops the job. `reply[i - first + 2]` answers A[i].
    function M.note_cancelled(reply, first)
      local ids, at = {}, {}
      for i = first, #A do
        local token = A[i]
        local star = reply[i - first + 2] == 0 and string.find(token, '*', 2, true)
        if star then ids[#ids + 1], at[#ids + 1] = string.sub(token, 1, star - 1), i end
      end
      if #ids == 0 then return end
      local fields = {}
      for j = 1, #ids do fields[j] = '*' .. ids[j] end
      local raws = M.read('HMGET', K.ids, unpack(fields))
      for j = 1, #ids do
        local stamp = string.sub(A[at[j]], #ids[j] + 2)
        if M.parse_stale(raws[j]).stamps[stamp] then reply[at[j] - first + 2] = -1 end
      end
    end

    -- Records cancelled copies (`ids`, with their `stamps`, nil for a pending one) in their ids'
    -- stale records, drops their index entries, and counts them in meta `stale`.
    function M.record_stale(ids, stamps)
      local fields = {}
      for j = 1, #ids do fields[j] = '*' .. ids[j] end
      local raws = M.hmget_all(K.ids, fields)
      local writes = {}
      for j = 1, #ids do
        local rec = M.parse_stale(raws[j])
        if stamps[j] then rec.stamps[stamps[j]] = true else rec.n = rec.n + 1 end
        writes[#writes + 1], writes[#writes + 2] = fields[j], M.format_stale(rec)
      end
      M.call_all('HSET', K.ids, writes)
      M.call_all('HDEL', K.ids, ids)
      rcall('HINCRBY', K.meta, 'stale', #ids)
    end

    -- Cancels jobs by id on a queue that tracks ids (see IDS): a scheduled one leaves at once; a
    -- waiting one is marked, and the walk drops it at its visit; one in flight has its token
    -- revoked (and its batch touched, so no batch ack covers it), and its lease is dropped at
    -- the walk's visit instead of being leased again. Returns how many were found.
    function M.cancel()
      M.check_ids(2)
      local meta = M.read_meta(K)
      local sides = M.read_sides()
      M.read('ZCARD', K.scheduled)
      if not meta.tracked then
        M.refuse('ROTATOR_UNTRACKED', 'cancel needs a queue that tracks ids: configure ' ..
          'track_ids 1 (on an empty queue) first')
      end
      local ids, seen = {}, {}
      for i = 2, #A do
        if not seen[A[i]] then ids[#ids + 1], seen[A[i]] = A[i], true end
      end
      local held = M.hmget_all(K.ids, ids)
      local acked = M.acked_copies(ids, held)
      local now = M.now_ms()
      local scheduled, copies, stamps, revoke, touched, gone, waiting = {}, {}, {}, {}, {}, {}, 0
      for i = 1, #ids do
        local id, v = ids[i], held[i]
        local kind = v and string.sub(v, 1, 1)
        if kind == 's' or kind == 'q' then -- scheduled, or waiting at a priority: gone at once
          gone[#gone + 1], scheduled[#scheduled + 1] = id, M.waiting_member(id, v)
          if kind == 'q' then waiting = waiting + 1 end
        elseif v == 'p' then -- its element waits in the ring: recorded, dropped at its visit
          copies[#copies + 1], stamps[#copies + 1] = id, nil
        elseif v and string.find(v, '^%d') and not acked[i] then -- in flight, or deferred
          local token = id .. '*' .. v
          copies[#copies + 1], stamps[#copies + 1] = id, v
          revoke[#revoke + 1], revoke[#revoke + 2] = now, token
          local batch = M.batch_of(token)
          if batch then touched[batch] = true end
        end
      end
      local found = #scheduled + #copies
      if found == 0 then return 0 end
      if #copies > 0 then M.record_stale(copies, stamps) end
      if #scheduled > 0 then
        M.call_all('ZREM', K.scheduled, scheduled)
        M.call_all('HDEL', K.ids, gone)
        if waiting > 0 then -- (no longer waiting, nor pushed: as if leased and gone)
          rcall('HSET', K.meta, 'prio', meta.prio - waiting, 'taken', meta.taken + waiting)
        end
      end
      if #revoke > 0 then
        M.call_all('ZADD', K.revoked, revoke)
        M.trim_revoked(meta, now, #revoke / 2, sides.revoked + #revoke / 2)
        M.touch(touched, sides)
        local tokens = {}
        for j = 2, #revoke, 2 do tokens[#tokens + 1] = revoke[j] end
        -- (the walk waits at a young live lease: one of these may be it, and is done with)
        if M.frees_tail(tokens, meta.lstop) then
          meta.walk.lstop = nil
          M.save_walk(K.meta, meta.walk)
        end
      end
      M.add_count(K.meta, 'cancelled', found)
      return found
    end

    function M.sweep()
      local budget = M.int_arg(2, 'BUDGET', 1, LIMIT.budget)
      local s = M.start_walk(0, 0)
      if s.length == 0 and s.lease_length == 0 then return { 0, 0, 0 } end
      s.sweeping = true
      local packed = s.packed
      M.walk_lists(s, 1, budget)
      -- A sweep leases nothing, so what it passed may still be pending: consumers must look at
      -- a whole lap again before they idle.
      s.qstart, s.qlen = s.seq + s.visited, s.live
      M.finish_walk(s)
      -- In jobs, not elements (a packed batch holds several).
      local leases = M.leases_left(s)
      local before = s.length + s.lease_length + packed
      local after = math.max(s.live, 0) + leases + s.packed
      return { s.visited + s.lease_visited, math.max(before - after, 0),
        math.max(after - (s.live > 0 and 1 or 0), 0) }
    end

    -- Removes the queue, in the background (UNLINK), but for its seq: a queue made again under
    -- its name goes on numbering visits from there, so no token of this one is handed out again
    -- and a late ack from before cannot complete a new delivery.
    function M.delete()
      local forget = #A >= 2 and M.int_arg(2, 'FORGET', 0, 1) == 1
      local seq = not forget and M.read('HMGET', K.meta, 'seq')[1] or nil
      local fields = M.read('HLEN', K.meta)
      local others = {}
      for i = 1, #KS do
        if KS[i] ~= K.meta then others[#others + 1] = KS[i] end
      end
      local removed = rcall('UNLINK', unpack(others))
      rcall('UNLINK', K.meta)
      -- Tokens of the queue as it was are refused from now on (origin), and none repeats (seq).
      if seq then rcall('HSET', K.meta, 'seq', seq, 'origin', seq) end
      return (removed > 0 or fields > (seq and 1 or 0)) and 1 or 0
    end

    -- The queue's settings, stored in its meta hash: NAME VALUE pairs set (each checked before
    -- any is written), then all of them answered, each with its value or its default.
    -- configure's settings, in the order of its reply, and the range of each (the defaults are
    -- in LIMIT; the ranges only configure reads, so an EVAL call of any other command does not
    -- build them).
    local SETTINGS = { 'fence_ms', 'fence_max', 'dead_max', 'dead_age_ms', 'track_ids' }
    local SETTING_RANGES = {
      fence_ms = { 1000, 30 * 86400000 }, fence_max = { 1000, 1e9 },
      -- (at most a million dead letters: requeue_dead's LREM walks that far at the most)
      dead_max = { 1, 1000000 },
      dead_age_ms = { 0, 3650 * 86400000 }, -- 0: no age limit
      track_ids = { 0, 1 },
    }

    -- configure's track_ids (see IDS): turned on only while the queue holds no job, so the index
    -- knows every id from the start; turned off, the index goes.
    function M.change_tracking(meta, writes)
      local wanted = nil
      for i = 1, #writes, 2 do
        if writes[i] == 'track_ids' then wanted = writes[i + 1] end
      end
      M.read('HLEN', K.ids)
      if wanted == nil or wanted == meta.track_ids then return end
      if wanted == 0 then
        rcall('UNLINK', K.ids)
        rcall('HDEL', K.meta, 'stale')
        return
      end
      local ring = M.read('LLEN', K.ring)
      local jobs = M.read('LLEN', K.leases) + M.read('ZCARD', K.scheduled)
        - (tonumber(M.read('HMGET', K.meta, 'ticking')[1]) or 0)
      if ring > 1 or (ring == 1 and M.read('LINDEX', K.ring, 0) ~= SENTINEL) or jobs > 0 then
        M.refuse('ROTATOR_BADARG', 'track_ids 1 needs a queue that holds no job (nothing ' ..
          'pending, in flight, deferred or scheduled): the index must know every id')
      end
    end

    function M.configure()
      if #A % 2 == 0 then M.refuse('ROTATOR_BADARG', 'configure takes NAME VALUE pairs') end
      local writes = {}
      for i = 2, #A, 2 do
        local range = SETTING_RANGES[A[i]]
        if not range then
          M.refuse('ROTATOR_BADARG', 'no setting ' .. M.printable(A[i]) .. ': one of ' ..
            table.concat(SETTINGS, ' '))
        end
        local value = M.int_arg(i + 1, A[i], range[1], range[2])
        if A[i] == 'dead_age_ms' and value > 0 and value < 1000 then
          M.refuse('ROTATOR_BADARG', 'dead_age_ms must be 0 (no limit) or at least 1000')
        end
        writes[#writes + 1], writes[#writes + 2] = A[i], value
      end
      local meta = M.read_meta(K)
      M.change_tracking(meta, writes)
      if #writes > 0 then rcall('HSET', K.meta, unpack(writes)) end
      local reply = {}
      for _, name in ipairs(SETTINGS) do
        local value = meta[name]
        for i = 1, #writes, 2 do
          if writes[i] == name then value = writes[i + 1] end
        end
        reply[#reply + 1], reply[#reply + 2] = name, value
      end
      return reply
    end

    function M.stats()
      local reply = M.queue_stats(K)
      local m = M.read('HMGET', K.meta, 'paused', 'ticking', 'schedules', 'rate_n', 'rate_ms',
        'pushed', 'taken', 'redelivered', 'completed', 'retried', 'reclaimed', 'lettered',
        'cancelled', 'prio')
      -- (the members of ticking schedules are no jobs; jobs waiting at a priority are pending)
      local prioritized = tonumber(m[14]) or 0
      local scheduled = M.read('ZCARD', K.scheduled) - (tonumber(m[2]) or 0) - prioritized
      reply[#reply + 1], reply[#reply + 2] = 'scheduled', math.max(scheduled, 0)
      reply[#reply + 1], reply[#reply + 2] = 'paused', m[1] == '1' and 1 or 0
      reply[#reply + 1], reply[#reply + 2] = 'schedules', tonumber(m[3]) or 0
      reply[#reply + 1], reply[#reply + 2] = 'rate_limit_jobs', tonumber(m[4]) or 0
      reply[#reply + 1], reply[#reply + 2] = 'rate_limit_ms', tonumber(m[5]) or 0
      -- Counts since the queue was made (see read_meta): every delivery, first or not.
      local counts = {}
      for i = 6, 13 do counts[i] = tonumber(m[i]) or 0 end
      local totals = { 'pushed', counts[6], 'delivered', counts[7] + counts[8],
        'completed', counts[9], 'retried', counts[10], 'reclaimed', counts[11],
        'dead_lettered', counts[12], 'cancelled', counts[13], 'prioritized', prioritized }
      for i = 1, #totals do reply[#reply + 1] = totals[i] end
      -- The processing-time histogram (see durations): d0..d25, then dsum.
      local buckets = {}
      for b = 0, LIMIT.duration_buckets - 1 do buckets[#buckets + 1] = 'd' .. b end
      buckets[#buckets + 1] = 'dsum'
      local counts_of = rcall('HMGET', K.meta, unpack(buckets))
      for i = 1, #buckets do
        reply[#reply + 1], reply[#reply + 2] = buckets[i], tonumber(counts_of[i]) or 0
      end
      return reply
    end

    -- stats of the queue whose keys are K (this call's, or a topic group's for tstats).
    function M.queue_stats(K)
      local now = M.now_ms()
      local meta = M.read_meta(K)
      local ring_length = M.read('LLEN', K.ring)
      -- The marks' counts (see read_marked), not the marks: O(1) however many are deferred.
      M.read('HLEN', K.marks)
      M.read('HLEN', K.marks_old)
      local marked = meta.marked
      -- Jobs, not elements: a packed batch holds several.
      local lease_length = M.read('LLEN', K.leases)
      local elements = math.max(ring_length - 1, 0) + lease_length
      -- (jobs waiting at a priority wait outside the ring, and are pending)
      local length = elements + meta.packed + meta.prio
      local pending = math.max(0, math.min(length, meta.pushed - meta.taken))
      local done = M.read('SCARD', K.done)
      local done_old = M.read('SCARD', K.done_old)
      local acked = done + done_old + marked[2] + marked[4]
      local deferred = marked[1] + marked[3]
      local overdue, capped = 0, false
      if lease_length > 0 then
        overdue, capped = M.overdue(K, now, lease_length, done + done_old > 0)
      end
      local in_flight = math.max(0, length - pending - acked - deferred - overdue)
      -- The push log holds cumulative push counts, newest first: the oldest pending job was
      -- pushed in the oldest checkpoint whose count exceeds what was taken. Binary search. The
      -- newest checkpoint holds the count of the push that made it; every push since was within
      -- its second (record_push), so its count is the queue's `pushed`.
      local oldest = -1
      local lo, hi = 0, M.read('LLEN', K.pushlog) - 1
      local found = nil
      while pending > 0 and lo <= hi do
        local mid = math.floor((lo + hi) / 2)
        local pushed, at = string.match(rcall('LINDEX', K.pushlog, mid) or '', '^(%d+):(%d+)$')
        if pushed and mid == 0 then pushed = meta.pushed end
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
        'overdue', overdue, 'overdue_capped', capped and 1 or 0,
      }
    end

    -- Leased jobs whose deadline has passed and that no consumer has reclaimed yet (nor acked,
    -- given back or extended), counted from the lease list's tail, where the earliest deadlines
    -- are, up to its first young lease: an expired lease waits there for the next claim. Reads at
    -- most LIMIT.overdue_look elements (a few at first: the tail is young in a healthy queue),
    -- LIMIT.batch_bytes of them and LIMIT.count tokens; `capped` when it stopped for these bounds
    -- (the count is then a lower bound). A lease behind a young one (a shorter LEASE_MS after a
    -- longer) is not counted, as the walk does not reach it yet either.
    function M.overdue(K, now, length, any_done)
      local names, owner, batches = {}, {}, {} -- tokens to look up, then batch names
      local seen, bytes, want, young, capped = 0, 0, 1, false, false
      while not young and not capped and seen < math.min(length, LIMIT.overdue_look) do
        want = math.min(want, LIMIT.overdue_look - seen)
        local slice = rcall('LRANGE', K.leases, -(seen + want), -(seen + 1))
        for i = #slice, 1, -1 do
          local element = slice[i]
          local star = string.find(element, '*', 2, true)
          local batch = star and string.byte(element) == BYTE_STAR
            and string.sub(element, 1, star - 1)
          local deadline = star and M.own_deadline(element, batch or nil)
          if deadline and deadline > now then
            young = true
            break
          end
          local ids = {}
          if deadline and batch then
            M.split_ids(element, #batch + 2, ids)
          end
          if bytes + #element > LIMIT.batch_bytes or #names + #ids + 1 > LIMIT.count then
            capped = true
            break
          end
          seen, bytes = seen + 1, bytes + #element
          if deadline and batch then
            batches[#batches + 1] = batch
            for k = 1, #ids do
              names[#names + 1], owner[#names + 1] = ids[k] .. batch .. PAD[k], batch
            end
          elseif deadline then
            names[#names + 1] = element
          end
        end
        want = want * 4
      end
      if not young and not capped and seen < length then capped = true end
      local n = #names
      if n == 0 then return 0, capped end
      local gone = {} -- acked, given back, or extended past now
      if any_done then
        for _, key in ipairs({ K.done, K.done_old }) do
          local flags = rcall('SMISMEMBER', key, unpack(names))
          for j = 1, n do
            if flags[j] == 1 then gone[j] = true end
          end
        end
      end
      for j = 1, #batches do names[n + j] = batches[j] end
      local acked_whole = {}
      for _, key in ipairs({ K.marks, K.marks_old }) do
        local marks = rcall('HMGET', key, unpack(names))
        for j = 1, n do
          local m = marks[j]
          if m and (string.byte(m) == BYTE_N or string.byte(m) == BYTE_F
              or ((string.byte(m) == BYTE_E or string.byte(m) == BYTE_W)
                and (tonumber(string.sub(m, 2)) or 0) > now)) then
            gone[j] = true
          end
        end
        for j = 1, #batches do
          local m = marks[n + j]
          if m and string.byte(m) == BYTE_A then acked_whole[batches[j]] = true end
        end
      end
      local overdue = 0
      for j = 1, n do
        if not gone[j] and not (owner[j] and acked_whole[owner[j]]) then overdue = overdue + 1 end
      end
      return overdue, capped
    end

    function M.peek()
      local count = M.int_arg(2, 'COUNT', 1, LIMIT.count)
      local sides = M.read_sides()
      local rows = M.ring_rows(M.read('LRANGE', K.ring, -count, -1), sides, count)
      local room = count - #rows / 3
      if room > 0 then
        local leases = M.ring_rows(M.read('LRANGE', K.leases, -room, -1), sides, room)
        for i = 1, #leases do rows[#rows + 1] = leases[i] end
      end
      for i = #rows, count * 3 + 1, -1 do rows[i] = nil end
      return rows
    end

    -- The elements START..STOP-1 counted from the ring's tail on into the lease list's (0: the
    -- next to be visited), as peek shows them: read page by page, both lists in bounded calls.
    function M.scan()
      local start = M.int_arg(2, 'START', 0, LIMIT.no_bound)
      local stop = M.int_arg(3, 'STOP', 0, LIMIT.no_bound)
      local count = M.int_arg(4, 'COUNT', 1, LIMIT.count)
      local ring_length = M.read('LLEN', K.ring)
      local length = ring_length + M.read('LLEN', K.leases)
      local sides = M.read_sides()
      local meta = M.read_meta(K)
      stop = math.min(stop, length)
      -- At most COUNT elements, and fewer where packed batches bring the rows past COUNT (a
      -- first element alone gives all its rows: a batch holds at most LIMIT.count jobs).
      local rows, at = {}, start
      while at < stop and #rows < count * 3 do
        local key, from, ends = K.ring, at, ring_length
        if at >= ring_length then key, from, ends = K.leases, at - ring_length, length end
        local want = math.min(math.min(stop, ends) - at, count - #rows / 3)
        local slice = rcall('LRANGE', key, -(from + want), -(from + 1))
        local page = M.ring_rows(slice, sides, nil, count * 3 - #rows)
        for i = 1, #page do rows[#rows + 1] = page[i] end
        at = at + (page.elements or #slice)
        if page.elements and page.elements < #slice then break end
      end
      local reply = { math.max(at, start), length, meta.seq, meta.pushed }
      for i = 1, #rows do reply[#reply + 1] = rows[i] end
      return reply
    end

    -- Rows {element, state, time, ...} for a slice of the ring (tail last), tail first. A packed
    -- batch shows as the leases it stands for, first job first. With `count`, stops at count
    -- rows; with `room`, stops before an element whose rows would not fit in `room` reply
    -- entries (the first always fits), and says in rows.elements how many elements it showed.
    function M.ring_rows(slice, sides, count, room)
      local mark, packed = {}, {}
      M.look_up(slice, sides, {}, {}, mark, {}, packed)
      local rows, batch_acked = {}, {}
      local elements = 0
      for i = #slice, 1, -1 do
        local element, batch = slice[i], packed[i]
        local before = #rows
        if batch and string.find(batch, '^%*%d+%.1%.%d+$') then
          local ids = M.split_ids(element, #batch + 2)
          for k = 1, #ids do
            rows[#rows + 1] = ids[k] .. batch .. PAD[k]
            batch_acked[#rows] = mark[i] and string.byte(mark[i]) == BYTE_A
          end
        else
          rows[#rows + 1] = element
        end
        if room and elements > 0 and #rows * 3 > room then
          for j = #rows, before + 1, -1 do rows[j] = nil end
          break
        end
        elements = elements + 1
        if count and #rows >= count then break end
      end
      local done_in = {}
      mark = {}
      M.look_up(rows, sides, {}, done_in, mark, {}, {})
      local reply = { elements = elements }
      for i = 1, #rows do
        local element = rows[i]
        local state, at = 'pending', 0
        if element == SENTINEL then
          state = 'lap'
        elseif string.find(element, '*', 1, true) or not M.valid_id(element) then
          local id, deadline = M.parse_token(element)
          local when = mark[i] and tonumber(string.match(mark[i], '^[enw](%d+)$'))
          if not id then
            state = 'corrupt'
          elseif done_in[i] or batch_acked[i] then
            state = 'done'
          elseif when and string.sub(mark[i], 1, 1) == 'n' then
            state, at = 'deferred', when
          elseif mark[i] and string.byte(mark[i]) == BYTE_F then
            state = 'buried'
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
      local start = M.int_arg(2, 'START', 0, LIMIT.no_bound)
      local count = M.int_arg(3, 'COUNT', 1, LIMIT.count)
      return M.read('LRANGE', K.dead, start, start + count - 1)
    end

    function M.requeue_dead()
      return (M.requeue_letters(0, 2))
    end

    function M.requeue_dead_from()
      local start = M.int_arg(2, 'START', 0, LIMIT.no_bound)
      local requeued, following = M.requeue_letters(start, 3)
      return { requeued, following }
    end

    -- requeue_dead's work on the dead letters from index START on, COUNT at A[at] and the ids
    -- after it: examines at most LIMIT.dead_scan letters, so a call stays short however many
    -- there are. Returns how many were requeued, and where to go on (-1: the list's end).
    function M.requeue_letters(start, at)
      local count = M.int_arg(at, 'COUNT', 1, LIMIT.batch)
      M.check_ids(at + 1)
      local wanted = nil
      if #A > at then
        wanted = {}
        for i = at + 1, #A do wanted[A[i]] = true end
      end
      local dead_length = M.read('LLEN', K.dead)
      local letters = M.read('LRANGE', K.dead, start, start + LIMIT.dead_scan - 1)
      local length = M.read('LLEN', K.ring)
      local meta = M.read_meta(K)
      local head = M.read_push_keys(K)
      local ids, places = {}, {}
      for i = 1, #letters do
        local id = #ids < count and M.dead_letter_id(letters[i])
        if id and (not wanted or wanted[id]) then
          ids[#ids + 1], places[#places + 1] = id, start + i - 1
        end
      end
      local examined = #ids < count and #letters or places[#places] - start + 1
      local following = start + examined - #ids
      if start + examined >= dead_length then following = -1 end
      if #ids == 0 then return 0, following end
      -- The requeued letters leave the list where they are: marked, then removed by LREM, which
      -- walks the list only as far as the last of them.
      local tomb = '*requeued*' .. M.now_ms()
      for i = 1, #places do rcall('LSET', K.dead, places[i], tomb) end
      rcall('LREM', K.dead, #places, tomb)
      local requeued = #ids
      -- (a letter whose id the queue holds again goes all the same: that job will run)
      if meta.tracked then ids = M.admit(ids, 'p') end
      if #ids > 0 then
        M.ensure_ring(K, length, meta)
        M.call_all('LPUSH', K.ring, ids)
        M.record_push(K, meta, #ids, M.now_ms(), head)
      end
      return requeued, following
    end

    function M.dead_letter_id(letter)
      local element = string.match(letter, '^[^*]*%*%d+%*%d+%*(.*)$')
      if not element then return nil end
      local star = string.find(element, '*', 1, true)
      local id = star and string.sub(element, 1, star - 1) or element
      return M.valid_id(id) and id or nil
    end

    -- SCHEDULES: recurring jobs (see the header's SCHEDULES). A schedule is the meta field
    -- "schedule:<name>" = "<job_id>*<last tick ms>*<every ms>*<due,due,...>*<spec>" (neither a
    -- name nor a job id holds "*"; the spec, last, may), and while it has a next tick, the
    -- member "*<name>" of K.scheduled scored by it. meta `schedules` counts the schedules,
    -- `ticking` the members.
    function M.schedule_field(name)
      return 'schedule:' .. name
    end

    function M.parse_schedule(text)
      local job_id, last, every, dues, spec =
        string.match(text or '', '^([^*]+)%*(%d+)%*(%d+)%*([%d,]*)%*(.*)$')
      if not job_id then return nil end
      local list = {}
      for due in string.gmatch(dues, '%d+') do list[#list + 1] = tonumber(due) end
      return { job_id = job_id, last = tonumber(last), every = tonumber(every), dues = list,
        spec = spec }
    end

    function M.format_schedule(d)
      return d.job_id .. '*' .. d.last .. '*' .. d.every .. '*' .. table.concat(d.dues, ',') ..
        '*' .. d.spec
    end

    -- The schedule NAME's next tick after `after` (ms): for an interval, the first of
    -- due + k * every beyond it; for due times, the first given beyond it (dropping those
    -- passed), nil when none is left.
    function M.next_tick(d, due, after)
      if d.every > 0 then
        return due + d.every * (math.floor((after - due) / d.every) + 1)
      end
      local left = {}
      for i = 1, #d.dues do
        if d.dues[i] > after then left[#left + 1] = d.dues[i] end
      end
      d.dues = left
      return left[1]
    end

    -- Ticks of the schedules whose members promote found due ({name, due} pairs, names without
    -- their "*"): each pushes one job "<job_id>@<due ms>" (its id names the schedule's job and
    -- the tick) and moves the member to the next tick after now, so ticks missed while nothing
    -- ran make one job (a catch-up), not one each. Returns the ids to push.
    function M.tick(due_schedules, now)
      local ids, ticking = {}, 0
      for i = 1, #due_schedules, 2 do
        local name, due = due_schedules[i], due_schedules[i + 1]
        local field = M.schedule_field(name)
        local d = M.parse_schedule(rcall('HGET', K.meta, field))
        if d then
          ids[#ids + 1] = d.job_id .. '@' .. due
          d.last = due
          local next_due = M.next_tick(d, due, now)
          rcall('HSET', K.meta, field, M.format_schedule(d))
          if next_due then
            rcall('ZADD', K.scheduled, next_due, '*' .. name)
          else
            ticking = ticking - 1 -- due times ran out: idle until given more
          end
        else
          ticking = ticking - 1 -- (a member left without its schedule: written by hand)
        end
      end
      if ticking ~= 0 then rcall('HINCRBY', K.meta, 'ticking', ticking) end
      return ids
    end

    function M.schedule()
      local mode = A[2]
      if mode ~= 'SET' and mode ~= 'FILL' then
        M.refuse('ROTATOR_BADARG', 'expected SET or FILL, got ' .. M.printable(mode))
      end
      local name, job_id, spec = A[3] or '', A[4] or '', A[6] or ''
      if #name > LIMIT.schedule_name or not string.find(name, '^[%w%._:@/%-]+$') then
        M.refuse('ROTATOR_BADARG', 'schedule name must be 1..' .. LIMIT.schedule_name ..
          ' of A-Z a-z 0-9 . _ : @ / -, got ' .. M.printable(name))
      end
      if not M.valid_id(job_id) or #job_id > LIMIT.id_bytes - LIMIT.int_digits - 1 then
        M.refuse('ROTATOR_BADID', 'a schedule\'s job id must be 1..' ..
          (LIMIT.id_bytes - LIMIT.int_digits - 1) .. ' bytes without "*", got ' ..
          M.printable(job_id))
      end
      local every = M.int_arg(5, 'EVERY_MS', 0, LIMIT.schedule_ms)
      if #spec > LIMIT.spec_bytes then
        M.refuse('ROTATOR_BADARG', 'SPEC must be at most ' .. LIMIT.spec_bytes .. ' bytes')
      end
      local count = #A - 6 -- (SPEC is not optional: -1 without it)
      if count < 0 or (every > 0) ~= (count == 0) or count > LIMIT.schedule_dues then
        M.refuse('ROTATOR_BADARG', 'EVERY_MS > 0 takes no DUE; EVERY_MS 0 takes 1..' ..
          LIMIT.schedule_dues .. ' DUEs, got ' .. count)
      end
      local now = M.now_ms()
      local dues = {}
      for i = 7, #A do
        dues[#dues + 1] = M.int_arg(i, 'DUE', 0, now + LIMIT.schedule_ms)
        if #dues > 1 and dues[#dues] <= dues[#dues - 1] then
          M.refuse('ROTATOR_BADARG', 'DUEs must be ascending')
        end
      end
      local field = M.schedule_field(name)
      local m = M.read('HMGET', K.meta, field, 'schedules', 'smin')
      M.read('ZCARD', K.scheduled)
      M.read('LLEN', K.wake)
      local old = M.parse_schedule(m[1])
      local same = old and old.job_id == job_id and old.every == every and old.spec == spec
      if mode == 'FILL' and not same then return 0 end
      if not old and tonumber(m[2] or 0) >= LIMIT.schedules then
        M.refuse('ROTATOR_TOOMANY', 'at most ' .. LIMIT.schedules .. ' schedules per queue')
      end
      local member = '*' .. name
      local current = tonumber(rcall('ZSCORE', K.scheduled, member))
      local d = { job_id = job_id, last = old and old.last or 0, every = every, dues = dues,
        spec = spec }
      local next_due = current
      if not same or not current then
        next_due = every > 0 and now + every or nil
      end
      if every == 0 then next_due = M.next_tick(d, 0, d.last) end
      rcall('HSET', K.meta, field, M.format_schedule(d))
      if not old then rcall('HINCRBY', K.meta, 'schedules', 1) end
      if next_due then
        rcall('ZADD', K.scheduled, next_due, member)
        local smin = tonumber(m[3])
        if not smin or next_due < smin then
          rcall('HSET', K.meta, 'smin', next_due)
          M.wake_one()
        end
      elseif current then
        rcall('ZREM', K.scheduled, member)
      end
      local ticking = (next_due and 1 or 0) - (current and 1 or 0)
      if ticking ~= 0 then rcall('HINCRBY', K.meta, 'ticking', ticking) end
      return same and 0 or 1
    end

    function M.unschedule()
      local name = A[2] or ''
      local field = M.schedule_field(name)
      local m = M.read('HMGET', K.meta, field)
      M.read('ZCARD', K.scheduled)
      if not m[1] then return 0 end
      rcall('HDEL', K.meta, field)
      rcall('HINCRBY', K.meta, 'schedules', -1)
      if rcall('ZREM', K.scheduled, '*' .. name) == 1 then
        rcall('HINCRBY', K.meta, 'ticking', -1)
      end
      return 1
    end

    function M.schedules()
      local all = M.read('HGETALL', K.meta)
      M.read('ZCARD', K.scheduled)
      local names, defs = {}, {}
      for i = 1, #all, 2 do
        local name = string.match(all[i], '^schedule:(.+)$')
        if name then
          names[#names + 1], defs[name] = name, M.parse_schedule(all[i + 1])
        end
      end
      table.sort(names)
      local reply = {}
      for _, name in ipairs(names) do
        local d = defs[name]
        if d then
          local next_due = rcall('ZSCORE', K.scheduled, '*' .. name)
          local row = { name, d.job_id, d.every, d.spec, tonumber(next_due) or -1, d.last, #d.dues,
            d.dues[#d.dues] or -1 }
          for k = 1, #row do reply[#reply + 1] = row[k] end
        end
      end
      return reply
    end
  end

  -- 12. PAYLOADS AND ITEM STATS -------------------------------------------------------------------

  -- The payload, item-stats and topic commands (this section and the next): defined on their
  -- first use (see ON_FIRST_USE), so an EVAL call of a core command does not pay for creating
  -- their functions (a library defines them once).
  function M.define_extensions()
    -- pushp nextp ackp keep payloads in the fourteenth key; pushi nackp items keep per-item stats
    -- in the fifteenth, which pushp nextp ackp also keep when given it.

    -- A payload call's acks name their batches (NAMED) and drop what they complete (FRESH_ACKS):
    -- what check_tokens, ack_tokens and the short way of next call for them.

    -- A named batch acked whole now: its ids' payloads go (DROPPED). The first batch's list of
    -- ids is taken over, not copied (a batch of 100 is the common call): nothing reads a named
    -- batch's ids once they are dropped.
    function M.drop_named(batch, ids)
      local dropped = M.dropped()
      if #dropped.ids == 0 then
        dropped.ids = ids -- (as it is: it may be a list the library keeps, see name_batch)
      else
        if not dropped.own then dropped.ids, dropped.own = { unpack(dropped.ids) }, true end
        local into = dropped.ids
        for j = 1, #ids do into[#into + 1] = ids[j] end
      end
      dropped.batches[#dropped.batches + 1] = batch
    end

    -- This call's DROPPED, made on first use: the ids whose payloads go, the batches acked by
    -- name, and (one worker's loop's: M.loop_lease) `call`, what M.forget needs to know of it.
    function M.dropped()
      DROPPED = DROPPED or { ids = {}, batches = {} }
      return DROPPED
    end

    -- Each named batch ack of A[first..] (`named`: argument -> the ids it names, all checked)
    -- becomes its batch ack, what it named kept in NAMED; a call naming more than LIMIT.batch
    -- jobs, tokens and ids together, is refused (their payloads are looked up in one call).
    function M.take_names(first, named)
      local jobs = #A - first + 1
      for _, ids in pairs(named) do jobs = jobs + #ids - 1 end
      if jobs > LIMIT.batch then
        M.refuse('ROTATOR_TOOMANY',
          'at most ' .. LIMIT.batch .. ' jobs named per call, got ' .. jobs)
      end
      NAMED = {}
      for i = first, #A do
        local ids = named[i]
        if ids then
          local ack = string.sub(A[i], 1, string.find(A[i], '*', 2, true) - 1) .. '/' .. #ids
          NAMED[ack] = { element = A[i], ids = ids }
          A[i] = ack
        end
      end
    end

    -- The ids of a named batch ack "*<deadline>.1.<call seq>*<id>*<id>..." (`star`: its second
    -- "*"), nil when it is not one: a batch name, then 1..LIMIT.count valid ids whose bytes stay
    -- within what one call's batch may hold.
    function M.name_batch(token, star)
      local find = string.find
      if not star or star - 1 > LIMIT.stamp_bytes or not find(token, '^%*%d+%.1%.%d+%*')
          or #token - star > LIMIT.batch_bytes + LIMIT.id_bytes + LIMIT.count
          or find(token, '**', star, true) or string.byte(token, -1) == BYTE_STAR then
        return nil -- (or an empty id: "**", or an ending "*")
      end
      -- (one this library made lately: the ids it was made of, which the split would give;
      -- the list it keeps, which no caller adds to: drop_named copies it first)
      local known = KEPT.named[token]
      if known then return known end
      local ids = M.split_ids(token, star + 1, nil, LIMIT.id_bytes)
      if ids and #ids > LIMIT.count then return nil end
      return ids
    end

    -- The named batch acks (see NAMED) not refused yet: refused unless their packed element is
    -- in the lease list as named, near one of its ends (LIMIT.named_look elements), so the ids
    -- are the batch's own; the ids of those not acked whole before (no "a" mark) go to
    -- DROPPED. A batch acked and removed before is not found: its ack is refused, and the client
    -- acks token by token (which not_acked_yet then knows, from the call's memory of it).
    function M.check_named(first, refused, sides)
      local batches, acks, seen = {}, {}, {}
      for i = first, #A do
        local ack = A[i]
        local named = NAMED[ack]
        if named and not refused[ack] and not seen[ack] then
          seen[ack] = true
          if not M.near_an_end(named.element) then
            refused[ack] = true
          else
            batches[#batches + 1], acks[#batches + 1] = M.split_batch_ack(ack), ack
          end
        end
      end
      local before = {}
      for _, key in ipairs({ K.marks, K.marks_old }) do
        if #batches > 0 and (sides[key] or 0) > 0 then
          local marks = M.hmget_all(key, batches)
          for i = 1, #batches do
            if marks[i] and string.byte(marks[i]) == BYTE_A then before[i] = true end
          end
        end
      end
      for i = 1, #batches do
        if not before[i] then M.drop_named(batches[i], NAMED[acks[i]].ids) end
      end
    end

    -- Whether a packed element is in the lease list near one of its ends (LIMIT.named_look
    -- elements), where a named batch ack looks for it: compared by the server, not read.
    function M.near_an_end(element)
      return rcall('LPOS', K.leases, element, 'MAXLEN', LIMIT.named_look)
        or rcall('LPOS', K.leases, element, 'RANK', -1, 'MAXLEN', LIMIT.named_look)
    end

    -- Whether a named batch ack's element (`element`, name_batch's checks passed) is taken
    -- out of the lease list (of `lease_length` elements) where it lies, at once, rather than
    -- marked acked until the walk reaches it: the list is at most LIMIT.take_out_look long and
    -- holds the element once, not at its tail (the tail's batch the walk drops by its visit).
    -- Several workers ack out of order: a mark costs their claims more (written, looked up at
    -- each later claim, deleted) than an LREM of a short list, and with none written the
    -- claims stay on one worker's loop (M.loop_lease). The one ack of a call only, on a queue
    -- with no marks: where it is taken out, the walk and the short ways agree by the same test.
    function M.takes_out(element, lease_length)
      if lease_length < 2 or lease_length > LIMIT.take_out_look then return false end
      local at = rcall('LPOS', K.leases, element, 'COUNT', '2', 'MAXLEN', LIMIT.take_out_look)
      return #at == 1 and at[1] < lease_length - 1
    end

    -- Of `tokens`, those in neither done set, nor of a batch acked whole (an "a" mark: a named
    -- batch ack took its payloads, and a client whose other batch ack was refused sends the
    -- tokens of both), nor remembered with their batch as dropped (M.remember_dropped: acked,
    -- and their lease removed since): acked now for the first time.
    function M.not_acked_yet(tokens, sides)
      local fresh, seen = {}, {}
      for _, key in ipairs({ K.done, K.done_old }) do
        if #tokens > 0 and (sides[key] or 1) > 0 then -- (size unknown: look)
          local flags = rcall('SMISMEMBER', key, unpack(tokens))
          for i = 1, #flags do
            if flags[i] == 1 then seen[tokens[i]] = true end
          end
        end
      end
      local batches, of = {}, {}
      for i = 1, #tokens do
        local batch = M.batch_of(tokens[i])
        if batch and not of[batch] then batches[#batches + 1], of[batch] = batch, {} end
        if batch then table.insert(of[batch], tokens[i]) end
      end
      for _, key in ipairs({ K.marks, K.marks_old }) do
        if #batches > 0 and (sides[key] or 1) > 0 then
          local marks = M.hmget_all(key, batches)
          for j = 1, #batches do
            if marks[j] and string.byte(marks[j]) == BYTE_A then
              for _, token in ipairs(of[batches[j]]) do seen[token] = true end
            end
          end
        end
      end
      if #tokens > 0 and (sides.revoked or 1) > 0 then
        local names, of = {}, {}
        for i = 1, #tokens do
          local token = tokens[i]
          if not seen[token] then
            names[#names + 1], of[#names + 1] = token .. DROPPED_MARK, token
            local batch = M.batch_of(token)
            if batch then names[#names + 1], of[#names + 1] = batch .. DROPPED_MARK, token end
          end
        end
        local scores = M.zmscore_all(K.revoked, names)
        for i = 1, #names do
          if scores[i] then seen[of[i]] = true end
        end
      end
      for i = 1, #tokens do
        if not seen[tokens[i]] then fresh[#fresh + 1] = tokens[i] end
      end
      return fresh
    end

    -- Remembers the acks whose payloads this call dropped (`tokens`, and `batches` acked whole by
    -- name) in K.revoked as "<name>+", which names no ack, so refused_among never meets one: an
    -- ack sent again (its reply lost, the call retried) after the walk removed its lease would
    -- otherwise be taken for a first one, and drop the payload of a copy of its id queued since.
    -- They are kept for the fence window, at most LIMIT.drop_memory_ms: scored that much before
    -- a refusal made now, so the fence's own trim (trim_revoked) drops them in time. `call`:
    -- what the call read, {fence = its fence_ms and fence_max, now = ms, revoked = the set's size,
    -- copies = {meta copies as a number, or none} where it read that too}.
    function M.remember_dropped(tokens, batches, call)
      local n = #tokens + #batches
      if n == 0 then return end
      local fence, now = call.fence, call.now
      local score = now - fence.fence_ms + math.min(fence.fence_ms, LIMIT.drop_memory_ms)
      local args = {}
      for _, names in ipairs({ tokens, batches }) do
        for i = 1, #names do
          args[#args + 1], args[#args + 2] = score, names[i] .. DROPPED_MARK
        end
      end
      M.call_all('ZADD', K.revoked, args)
      -- (a claim trimmed already, LIMIT.trim_step at least: more than most calls add)
      if not TRIMMED or n > LIMIT.trim_step then M.trim_revoked(fence, now, n, call.revoked + n) end
    end

    -- Ids of accepted tokens (checked tokens: each has a "*" after its id).
    function M.token_ids(tokens)
      local ids = {}
      for i = 1, #tokens do
        ids[i] = string.sub(tokens[i], 1, string.find(tokens[i], '*', 2, true) - 1)
      end
      return ids
    end

    -- An id pushed again while it is in the queue (a push retried after a lost reply) shares
    -- its payload: the field "<id>*" (no id holds "*") counts the copies beyond the first, and
    -- the payload stays until the last copy is acked. Meta `copies` counts those fields, once
    -- a push has found the payloads hash empty (before that, on a queue of an older module or
    -- whose meta was deleted alone, it is absent: unknown), so that an ack on a queue without
    -- copies, the common case, need not look for each id's.
    function M.copies_field(id)
      return id .. '*'
    end

    -- Meta `copies` (the meta hash read, and so type-checked, before): a number, or nil when
    -- unknown.
    function M.copies_known()
      return tonumber(rcall('HGET', K.meta, 'copies'))
    end

    -- Deletes the payloads (and item stats) of the jobs whose tokens were accepted as acked,
    -- but of an id with copies still in the queue only one copy's count, and remembers the
    -- acks that did (`call`: see M.remember_dropped).
    function M.forget(accepted, call)
      accepted = accepted or {}
      local dropped = M.dropped()
      local ids = dropped.ids -- (the batches acked by name: taken over, nothing else reads them)
      if #accepted > 0 then
        ids = M.token_ids(accepted)
        for i = 1, #dropped.ids do ids[#ids + 1] = dropped.ids[i] end
      end
      if #ids == 0 then return end
      M.remember_dropped(accepted, dropped.batches, call)
      -- (meta copies, as the call read it already, or read now)
      local known
      if call.copies then known = call.copies[1] else known = M.copies_known() end
      -- (without copies, every id's payload goes; HDEL takes an id given twice as once)
      local gone = known == 0 and ids or M.forget_copies(ids, known)
      if #gone == 0 then return end
      rcall('HDEL', K.payloads, unpack(gone))
      if K.items then rcall('HDEL', K.items, unpack(gone)) end
    end

    -- forget's acked ids where copies may be (`known`: their fields counted, or nil): takes one
    -- copy each from the ids that have some, and returns the ids that had none left, whose
    -- payloads go.
    function M.forget_copies(ids, known)
      local fields = {}
      for i = 1, #ids do fields[i] = M.copies_field(ids[i]) end
      local copies = rcall('HMGET', K.payloads, unpack(fields))
      -- An id may come more than once (two copies acked in one call): each takes one copy
      -- from what is left, the last one the payload.
      local left, was = {}, {}
      for i = 1, #ids do
        was[fields[i]] = tonumber(copies[i]) or 0
        left[fields[i]] = was[fields[i]]
      end
      local gone = {}
      for i = 1, #ids do
        local field = fields[i]
        if left[field] > 0 then
          left[field] = left[field] - 1
        elseif left[field] == 0 then
          gone[#gone + 1], left[field] = ids[i], -1 -- (once)
        end
      end
      local counts, drops = {}, {}
      for i = 1, #ids do
        local field, n = fields[i], was[fields[i]]
        if n > 0 and left[field] ~= n then
          if left[field] > 0 then
            counts[#counts + 1], counts[#counts + 2] = field, left[field]
          else
            drops[#drops + 1] = field
          end
          was[field] = left[field] -- (each field written once)
        end
      end
      if #counts > 0 then rcall('HSET', K.payloads, unpack(counts)) end
      if #drops > 0 then
        rcall('HDEL', K.payloads, unpack(drops))
        if known then rcall('HSET', K.meta, 'copies', math.max(known - #drops, 0)) end
      end
      return gone
    end

    -- Counts the copies of ids pushed while a payload of theirs is stored (see copies_field);
    -- `stored`: how many fields the payloads hash held before this push.
    function M.count_copies(ids, stored)
      local known = M.copies_known()
      local starts = not known and stored == 0 -- (an empty hash: no copies, counted from now)
      if starts then known = 0 end
      local had = rcall('HMGET', K.payloads, unpack(ids))
      local seen, made = {}, 0
      for i = 1, #ids do
        local id = ids[i]
        if had[i] or seen[id] then
          if rcall('HINCRBY', K.payloads, M.copies_field(id), 1) == 1 then made = made + 1 end
        end
        seen[id] = true
      end
      if known and (made > 0 or starts) then rcall('HSET', K.meta, 'copies', known + made) end
    end

    function M.pushp()
      if (#A - 1) % 2 == 1 then
        M.refuse('ROTATOR_BADARG', 'pushp takes ID PAYLOAD pairs, got ' .. (#A - 1) .. ' arguments')
      end
      M.check_count(2, 'ids and payloads')
      local ids = {}
      for i = 2, #A, 2 do
        if not M.valid_id(A[i]) then M.refuse_id(A[i]) end
        ids[#ids + 1] = A[i]
      end
      if #ids == 0 then return 0 end
      local length = M.read('LLEN', K.ring)
      local meta = M.read_push_meta(K)
      local head, wake = M.read_push_keys(K)
      local stored = M.read('HLEN', K.payloads)
      if K.items then M.read('HLEN', K.items) end
      M.check_unique(meta)
      local now = M.now_ms()
      local pairs_ = { unpack(A, 2) }
      if meta.tracked then -- each id once (see IDS): a job held keeps its payload
        ids = M.admit(ids, 'p')
        pairs_ = M.pairs_of(ids, 2)
        if #ids == 0 then return 0 end
      end
      M.ensure_ring(K, length, meta)
      M.count_copies(ids, stored)
      M.call_all('HSET', K.payloads, pairs_)
      if M.only_the_sentinel(length, meta.seq, meta.lapnext, meta.lapguess) then
        meta.ahead = select(2, M.push_ahead(K.ring, ids))
      else
        M.call_all('LPUSH', K.ring, ids)
      end
      M.record_push(K, meta, #ids, now, head, nil, wake) -- (nothing wrote the wake list since)
      M.enqueued(ids, now)
      return #ids
    end

    -- The ID PAYLOAD pairs of A[first..] whose ids are in `ids` (the first pair of each).
    function M.pairs_of(ids, first)
      local wanted, pairs_ = {}, {}
      for i = 1, #ids do wanted[ids[i]] = true end
      for i = first, #A, 2 do
        if wanted[A[i]] then
          wanted[A[i]] = nil
          pairs_[#pairs_ + 1], pairs_[#pairs_ + 2] = A[i], A[i + 1]
        end
      end
      return pairs_
    end

    -- pushp, for later (push_later): each payload is stored now. An id scheduled again moves
    -- (one scheduled job), so only ids not scheduled yet may count as copies (copies_field).
    function M.pushp_later()
      local due, now = M.due_arg()
      if (#A - 3) % 2 == 1 then
        M.refuse('ROTATOR_BADARG', 'pushp_later takes ID PAYLOAD pairs after the time, got ' ..
          (#A - 3) .. ' arguments')
      end
      M.check_count(4, 'ids and payloads')
      local ids = {}
      for i = 4, #A, 2 do
        if not M.valid_id(A[i]) then M.refuse_id(A[i]) end
        ids[#ids + 1] = A[i]
      end
      if #ids == 0 then return 0 end
      local smin = M.read_schedule_keys()
      local stored = M.read('HLEN', K.payloads)
      if K.items then M.read('HLEN', K.items) end
      local pairs_ = { unpack(A, 4) }
      if M.read_tracked() then -- each id once (see IDS)
        ids = M.admit(ids, 's')
        pairs_ = M.pairs_of(ids, 4)
        if #ids == 0 then return 0 end
      end
      local scheduled = rcall('ZMSCORE', K.scheduled, unpack(ids))
      local fresh, seen = {}, {}
      for i = 1, #ids do
        if not scheduled[i] and not seen[ids[i]] then fresh[#fresh + 1] = ids[i] end
        seen[ids[i]] = true
      end
      if #fresh > 0 then M.count_copies(fresh, stored) end
      M.call_all('HSET', K.payloads, pairs_)
      M.schedule_ids(ids, due, smin)
      M.enqueued(ids, now)
      return #ids
    end

    -- Ids leased by a next reply ({idle, wait, acked, token, reclaimed, ...}), in reply order.
    -- The ids a next reply leased, in its order, and how many of them came packed (`compact`:
    -- next_packed's reply, whose packed element "<batch>*<id1>*<id2>..." comes first).
    function M.leased_ids(reply, compact)
      local ids, first = {}, 4
      if compact and PACKED and PACKED == reply[4] then
        first, ids = 5, PACKED_IDS -- (taken over: nothing else reads them after the lease)
      elseif compact then
        first = 5
        local star = string.find(reply[4], '*', 2, true)
        if star then
          M.split_ids(reply[4], star + 1, ids)
        end
      end
      local packed = #ids
      for i = first, #reply, 2 do
        local token = reply[i]
        ids[#ids + 1] = string.sub(token, 1, string.find(token, '*', 2, true) - 1)
      end
      return ids, packed
    end

    -- Notes a delivery of each leased job in its item stats (an id pushed without stats gets an
    -- entry with enqueued ms 0: unknown).
    -- The first `packed` ids came packed (first deliveries); the tokens of the others follow in
    -- the reply from `at` (4 for next's reply, 5 for next_packed's), with their flags.
    function M.delivered(reply, ids, packed, at)
      if not K.items or #ids == 0 then return end
      local now = M.now_ms()
      local old = rcall('HMGET', K.items, unpack(ids))
      local writes = {}
      for j = 1, #ids do
        local n = 1
        if j > packed then n = select(3, M.parse_token(reply[at + 2 * (j - packed - 1)])) end
        local enqueued, rest = string.match(old[j] or '', '^(%d+):%d+:%d+:(.*)$')
        writes[#writes + 1] = ids[j]
        writes[#writes + 1] = (enqueued or '0') .. ':' .. (n or 0) .. ':' .. now .. ':' ..
          (rest or '')
      end
      M.call_all('HSET', K.items, writes)
    end

    -- nextp's work, and nextp_packed's (`compact`): the lease, then every leased job's payload
    -- read in one HMGET. The reply's head is next's (or next_packed's, with its packed element);
    -- then, compact, the packed jobs' payloads in their order; then token, flag and payload of
    -- each other delivery.
    function M.lease_payloads(compact)
      local drop = M.int_arg(6, 'DROP', 0, 1)
      local times = M.durations_arg(7)
      M.read('HLEN', K.payloads)
      if K.items then M.read('HLEN', K.items) end
      -- Dropping payloads needs each acked job's id: batch acks only where they are kept.
      FRESH_ACKS = drop == 1
      local reply, accepted, state = M.lease(7, drop == 0 or 'named', compact)
      local at = compact and 5 or 4 -- the first token in reply
      -- (a reply of the packed batch alone, the common one, takes its payloads after it)
      local out = #reply < at and reply or { unpack(reply, 1, at - 1) }
      local ids, packed = M.leased_ids(reply, compact)
      if #ids > 0 then
        local bodies = rcall('HMGET', K.payloads, unpack(ids))
        if out == reply and compact and packed == #ids then
          -- (the packed batch alone: its payloads placed by one table constructor, in C)
          out = { reply[1], reply[2], reply[3], reply[4], unpack(bodies, 1, packed) }
        else
          for j = 1, packed do out[#out + 1] = bodies[j] end
        end
        for j = packed + 1, #ids do
          local i = at + 2 * (j - packed - 1)
          out[#out + 1] = reply[i]
          out[#out + 1] = reply[i + 1]
          out[#out + 1] = bodies[j]
        end
      end
      M.delivered(reply, ids, packed, at)
      if drop == 1 then -- (one worker's loop read what forget needs: DROPPED.call)
        local call = state and { fence = state.meta, now = state.now,
          revoked = state.sides.revoked } or DROPPED and DROPPED.call
        if call then M.forget(accepted, call) end -- (none: a fresh start, which acks nothing)
      end
      M.add_durations(times)
      return out
    end

    function M.nextp()
      return M.lease_payloads(false)
    end

    function M.nextp_packed()
      return M.lease_payloads(true)
    end

    function M.ackp()
      local times = M.durations_arg(2)
      M.check_tokens(2, true, 'named')
      local sides = M.ack_sides(true)
      M.read('HLEN', K.payloads)
      if K.items then M.read('HLEN', K.items) end
      FRESH_ACKS = true
      local n, accepted = M.ack_tokens(2, sides.length, sides)
      M.write_acked(sides)
      M.forget(accepted, { fence = sides, now = M.now_ms(), revoked = sides.revoked })
      M.add_durations(times)
      return n
    end

    function M.pushi()
      local n, now, pushed = M.push_ids(2, function() M.read('HLEN', K.items) end)
      if n > 0 then
        local ids = pushed or { unpack(A, 2) }
        M.enqueued(ids, now)
      end
      return n
    end

    function M.nackp()
      local message = M.error_arg(3)
      local reply = M.give_back(4, function() M.read('HLEN', K.items) end)
      M.note_errors(4, reply, message)
      return reply
    end

    function M.items()
      M.check_ids(2)
      if #A < 2 then return {} end
      return M.read('HMGET', K.items, unpack(A, 2))
    end

    -- 13. TOPICS ----------------------------------------------------------------------------------
    -- TOPIC KEYS, then QUEUE_KEYS per group. Every helper here serves several of the commands.

    -- The bound of an idle group's backlog (see expire_backlog): the pending ids a group keeps
    -- when the topic's retention names no count (age only), and the ring elements one publish
    -- may read, over all its groups, to find pending ids behind leases and packed batches.
    local BACKLOG = { cap = 1000000, look = LIMIT.count }

    -- The layout rotator/keys.py builds: the topic's KEYS are "<base>:topic:<role>" and group
    -- GROUP's thirteen are "<base>:group:<GROUP>:<role>", in the header's KEYS order, where
    -- <base> is "<prefix>:{<topic>}". Checked by name only (no reads) before any write: a call
    -- that got another key in a slot (another group's, a queue's, anything) would write or
    -- delete it.
    local TOPIC_SUFFIXES = { ':topic:meta', ':topic:groups', ':topic:log', ':topic:bodies' }
    -- The base the topic's four KEYS share; refuses KEYS that do not follow the layout.
    function M.topic_base()
      local first, suffix = KS[1], TOPIC_SUFFIXES[1]
      local base = #first > #suffix and string.sub(first, 1, #first - #suffix)
      for i = 1, TOPIC_KEYS do
        if not base or KS[i] ~= base .. TOPIC_SUFFIXES[i] then
          M.refuse('ROTATOR_KEYS', 'topic key ' .. i .. ' must end in ' ..
            M.printable(TOPIC_SUFFIXES[i]) .. ' after the base of the first, got ' ..
            M.printable(KS[i]))
        end
      end
      return base
    end

    -- Refuses the call unless the call's group g (1, 2, ...) has exactly group `group`'s keys.
    function M.check_group_keys(base, g, group)
      local head = base .. ':group:' .. group
      local at = TOPIC_KEYS + QUEUE_KEYS * (g - 1)
      for r = 1, QUEUE_KEYS do
        if KS[at + r] ~= head .. QUEUE_ROLES[r] then
          M.refuse('ROTATOR_KEYS', 'key ' .. (at + r) .. ' must be group ' .. M.printable(group) ..
            "'s " .. string.sub(QUEUE_ROLES[r], 2) .. ' key, got ' .. M.printable(KS[at + r]))
        end
      end
    end

    function M.group_arg(index)
      local group = A[index]
      if type(group) ~= 'string' or #group > LIMIT.group_bytes
          or not string.find(group, '^[%w._@/-]+$') then
        M.refuse('ROTATOR_BADARG', 'GROUP must be 1..' .. LIMIT.group_bytes ..
          ' of A-Z a-z 0-9 . _ @ / -, got ' .. M.printable(group))
      end
      return group
    end

    function M.read_topic()
      local m = M.read('HMGET', T.topic, 'seq', 'ms', 'bytes')
      return { seq = tonumber(m[1]) or 0, ms = tonumber(m[2]) or 0, bytes = tonumber(m[3]) or 0 }
    end

    -- The registered groups (name -> ring key), checked against the groups whose KEYS this call
    -- got: exactly the registered set, each once. Anything else means a group registered or left
    -- since the caller read the set: nothing is written, and the caller reads it again.
    function M.check_groups()
      local n = M.read('HLEN', T.groups)
      if n > LIMIT.groups then
        M.refuse('ROTATOR_BADARG', 'topic has ' .. n .. ' groups, at most ' .. LIMIT.groups)
      end
      local flat = rcall('HGETALL', T.groups)
      local name_of = {}
      for i = 1, #flat, 2 do name_of[flat[i + 1]] = flat[i] end
      local names = {}
      for g = 1, NGROUPS do
        local ring = KS[TOPIC_KEYS + QUEUE_KEYS * (g - 1) + 1]
        local name = name_of[ring]
        if not name then
          M.refuse('ROTATOR_STALE',
            'key ' .. M.printable(ring) .. ' is not a registered group ring')
        end
        name_of[ring] = nil -- a group given twice is refused below (the counts differ)
        names[g] = name
      end
      if NGROUPS ~= n then
        M.refuse('ROTATOR_STALE', 'the topic has ' .. n .. ' groups, the call named ' .. NGROUPS)
      end
      return names
    end

    -- The queue keys of the call's group g (1, 2, ...), by name.
    function M.group_keys(g)
      return M.queue_keys(KS, TOPIC_KEYS + QUEUE_KEYS * (g - 1))
    end

    -- Reads (and so type-checks) group g's keys that a push writes: the group, for push_group.
    function M.read_group(g)
      local keys = M.group_keys(g)
      local length = M.read('LLEN', keys.ring)
      local meta = M.read_push_meta(keys)
      local head, wake = M.read_push_keys(keys)
      return { keys = keys, length = length, meta = meta, head = head, wake = wake }
    end

    -- Pushes ids onto a group's ring as `push` does (read_group read its keys first); with
    -- `cap`, then bounds the group's backlog to it (expire_backlog, reading at most `look`
    -- elements beyond what it drops).
    -- Onto a ring of its sentinel alone, the ids go ahead of it as a queue's push puts them
    -- (push_ahead: a consumer woken by the publish leases them the short way), unless the
    -- backlog's bound then drops some of them again (expire_backlog counts the lap's end from
    -- the ids behind the sentinel).
    function M.push_group(group, ids, now, cap, look)
      local keys, meta, length = group.keys, group.meta, nil
      M.ensure_ring(keys, group.length, meta)
      if M.only_the_sentinel(group.length, meta.seq, meta.lapnext, meta.lapguess)
          and not (cap and M.backlog_excess(meta, #ids, cap) > LIMIT.trim_extra) then
        length, meta.ahead = M.push_ahead(keys.ring, ids)
      else
        length = rcall('LPUSH', keys.ring, unpack(ids)) -- at most LIMIT.batch ids
      end
      if cap then length = length - M.expire_backlog(group, #ids, cap, look) end
      M.record_push(keys, group.meta, #ids, now, group.head, length, group.wake)
    end

    -- A group nobody consumes would keep every id published to it: once its backlog (pending
    -- ids, pushed - taken) passes `cap` by more than LIMIT.trim_extra, the oldest pending ids
    -- leave its ring's tail down to the cap, at most what this call pushed (n) plus
    -- LIMIT.trim_extra, so the backlog converges and no call does O(backlog) work. (The margin
    -- spares the commands of a drop on most publishes of a few messages: one in 17 of single
    -- ones.) Only pending ids go: the sentinel, leases, packed batches (and anything corrupt)
    -- among the tail elements read stay there in their order, for the walk. Reads at most
    -- `look` elements past the ids it drops. A dropped id counts as taken (never delivered to
    -- this group) and in the meta's `expired`. Returns how many went.
    function M.expire_backlog(group, n, cap, look)
      local keys, meta = group.keys, group.meta
      local excess = M.backlog_excess(meta, n, cap)
      if excess <= LIMIT.trim_extra then return 0 end
      -- Pending ids are elements of their own, and the sentinel is not one: the ring's length
      -- bounds the backlog when the counters say more (a ring lost without its meta).
      local length = rcall('LLEN', keys.ring)
      excess = math.min(excess, length - 1 - cap)
      if excess <= 0 then return 0 end
      local want = math.min(excess, n + LIMIT.trim_extra)
      local limit = math.min(length, want + look)
      local find, id_bytes = string.find, LIMIT.id_bytes
      -- Where the walk expects the sentinel, counted from the tail: each element dropped before
      -- it brings that visit one earlier (a lap must never end early; see M.walk).
      local lap_at = meta.lapnext and meta.lapnext - meta.seq
      local kept, looked, dropped, before_lap = {}, 0, 0, 0
      local extra = 2 -- an idle group's tail: the sentinel, then pending ids
      while dropped < want and looked < limit do
        -- Slices just larger than what is wanted, doubling while the tail holds other elements.
        local size = math.min(limit - looked, want - dropped + extra)
        extra = extra * 2
        local slice = rcall('LRANGE', keys.ring, -(looked + size), -(looked + 1))
        for i = #slice, 1, -1 do
          local element = slice[i]
          looked = looked + 1
          if element ~= '' and #element <= id_bytes and not find(element, '*', 1, true) then
            dropped = dropped + 1
            if lap_at and looked < lap_at then before_lap = before_lap + 1 end
            if dropped == want then break end
          else
            kept[#kept + 1] = element
          end
        end
        if #slice < size then break end
      end
      if dropped == 0 then return 0 end
      rcall('LTRIM', keys.ring, 0, -(looked + 1))
      local back = {}
      for i = #kept, 1, -1 do back[#back + 1] = kept[i] end -- the tail's own element last
      if #back > 0 then M.call_all('RPUSH', keys.ring, back) end
      meta.taken = meta.taken + dropped
      local expired = tonumber(rcall('HMGET', keys.meta, 'expired')[1]) or 0
      if before_lap > 0 then -- (record_push writes it, next)
        meta.lapnext = meta.lapnext - before_lap
        M.walk_table(meta).lapnext = meta.lapnext
      end
      rcall('HSET', keys.meta, 'taken', meta.taken, 'expired', expired + dropped)
      return dropped
    end

    -- How far a group's backlog (`meta`: read_push_meta's) passes `cap` once `n` more ids are
    -- pushed.
    function M.backlog_excess(meta, n, cap)
      return meta.pushed + n - meta.taken - cap
    end

    -- The one group this call names: its ring must be registered under GROUP, and its keys
    -- must be GROUP's. Returns the registered ring key (nil: GROUP is not registered).
    function M.named_group(group)
      local ring = M.read('HMGET', T.groups, group)[1]
      local given = KS[TOPIC_KEYS + 1]
      if ring and ring ~= given then
        M.refuse('ROTATOR_BADARG', 'group ' .. M.printable(group) .. ' has another ring key')
      end
      M.check_group_keys(M.topic_base(), 1, group)
      return ring
    end

    function M.retention_args(at)
      at = at or 2
      return M.int_arg(at, 'MAXLEN', 0, LIMIT.retention),
        M.int_arg(at + 1, 'MAXAGE_MS', 0, LIMIT.retention)
    end

    -- THE LOG holds one entry per run of messages one publish stored: member
    -- "<ms>-<first>-<bytes>", scored by <first>, the seq of the run's oldest retained message;
    -- the run ends where the next entry begins, the newest at the topic's seq (seqs count up by
    -- one, and retention drops from the oldest, so the retained seqs have no gaps). <bytes> are
    -- the run's payload bytes, so a run leaves without a read per message. An entry "<ms>-<seq>"
    -- (written before runs) is a run of one whose bytes are read when it leaves. One ZADD a
    -- publish instead of one a message: a sorted-set member costs ~0.8 us and ~90 bytes.

    -- `size` runs from rank `rank`, oldest first: {member, ms, first, last, bytes (nil: not
    -- kept)}; `last_seq` ends the newest.
    function M.log_runs(rank, size, last_seq)
      local flat = rcall('ZRANGE', T.log, rank, rank + size, 'WITHSCORES')
      local runs, match = {}, string.match
      for i = 1, math.min(#flat, 2 * size), 2 do
        local member = flat[i]
        local ms, bytes = match(member, '^(%d+)%-%d+%-?(%d*)$')
        local after = flat[i + 3]
        runs[#runs + 1] = {
          member = member, ms = tonumber(ms) or 0, first = tonumber(flat[i + 1]),
          last = after and tonumber(after) - 1 or last_seq, bytes = tonumber(bytes),
        }
      end
      return runs
    end

    -- The ids of seqs a..b of `run`, appended to `ids`.
    function M.run_ids(run, a, b, ids)
      local prefix = run.ms .. '-'
      for seq = a, b do ids[#ids + 1] = prefix .. seq end
      return ids
    end

    -- Drops retained messages from the oldest: beyond MAXLEN (of `retained`), or older than
    -- MAXAGE_MS; at most `budget`. Reads about as many log entries as runs it drops, and one
    -- HSTRLEN per message only where a run leaves in part (or is of the older kind). Returns
    -- how many were dropped.
    function M.trim(topic, maxlen, maxage, now, budget, retained)
      local excess = maxlen > 0 and retained - maxlen or 0
      if excess <= 0 and maxage == 0 then return 0 end
      local before = now - maxage
      local ids, whole, gone, split = {}, 0, 0, nil
      local rank, size, done = 0, 4, false
      while not done and #ids < budget do
        local runs = M.log_runs(rank, math.min(size, budget - #ids + 1), topic.seq)
        if #runs == 0 then break end
        for _, run in ipairs(runs) do
          local count = run.last - run.first + 1
          local want = math.max(excess - #ids, 0)
          if maxage > 0 and run.ms < before then want = count end
          want = math.min(want, count, budget - #ids)
          if want <= 0 then done = true break end
          local at = #ids
          M.run_ids(run, run.first, run.first + want - 1, ids)
          if want == count and run.bytes then
            gone = gone + run.bytes
          else
            local bytes = 0
            for i = at + 1, #ids do bytes = bytes + rcall('HSTRLEN', T.bodies, ids[i]) end
            gone = gone + bytes
            if want < count then
              split = { run = run, first = run.first + want,
                bytes = run.bytes and run.bytes - bytes }
              done = true
              break
            end
          end
          whole = whole + 1
        end
        rank, size = rank + #runs, size * 2
      end
      if #ids == 0 then return 0 end
      M.call_all('HDEL', T.bodies, ids) -- in slices: a budget may pass unpack()'s limit
      if whole > 0 then rcall('ZREMRANGEBYRANK', T.log, 0, whole - 1) end
      if split then
        local run = split.run
        rcall('ZREM', T.log, run.member)
        local member = run.ms .. '-' .. split.first -- its bytes stay unknown if they were
        if split.bytes then member = member .. '-' .. math.max(split.bytes, 0) end
        rcall('ZADD', T.log, split.first, member)
      end
      topic.bytes = math.max(topic.bytes - gone, 0)
      rcall('HSET', T.topic, 'bytes', topic.bytes)
      return #ids
    end

    -- tpublish's arguments from A[at]: MAXLEN, MAXAGE_MS, then the payloads (how many: n).
    function M.publish_args(at)
      local maxlen, maxage = M.retention_args(at)
      local n = #A - at - 1
      if n < 1 then M.refuse('ROTATOR_BADARG', 'no payload given') end
      if n > LIMIT.count then
        M.refuse('ROTATOR_TOOMANY', 'at most ' .. LIMIT.count .. ' payloads per call, got ' .. n)
      end
      return maxlen, maxage, n
    end

    -- tpublish's work, its arguments from A[at]: returns the ids, their time (ms) and the seq
    -- of the first.
    function M.publish(at, maxlen, maxage, n)
      local base = M.topic_base()
      local names = M.check_groups()
      for g = 1, NGROUPS do M.check_group_keys(base, g, names[g]) end
      local topic = M.read_topic()
      M.read('ZCARD', T.log)
      local retained = M.read('HLEN', T.bodies)
      local groups = {}
      for g = 1, NGROUPS do groups[g] = M.read_group(g) end
      local now = M.now_ms()
      local ms = math.max(now, topic.ms)
      local first = topic.seq + 1
      local ids, bodies, prefix, bytes = {}, {}, ms .. '-', 0
      for i = 1, n do
        local payload = A[at + 1 + i]
        local id = prefix .. (topic.seq + i)
        ids[i] = id
        bodies[#bodies + 1], bodies[#bodies + 2] = id, payload
        bytes = bytes + #payload
      end
      topic.seq, topic.bytes = topic.seq + n, topic.bytes + bytes
      rcall('HSET', T.bodies, unpack(bodies))
      rcall('ZADD', T.log, first, prefix .. first .. '-' .. bytes) -- the run (see THE LOG)
      rcall('HSET', T.topic, 'seq', topic.seq, 'ms', ms, 'bytes', topic.bytes)
      -- Each group's backlog is bounded by the retained count (or BACKLOG.cap), the groups
      -- sharing the look-ahead past leases.
      local cap = maxlen > 0 and maxlen or BACKLOG.cap
      local look = math.max(LIMIT.trim_extra, math.floor(BACKLOG.look / math.max(NGROUPS, 1)))
      for g = 1, NGROUPS do M.push_group(groups[g], ids, now, cap, look) end
      M.trim(topic, maxlen, maxage, now, n + LIMIT.trim_extra, retained + n)
      return ids, ms, first
    end

    function M.tpublish()
      return (M.publish(2, M.publish_args(2)))
    end

    -- tpublish, once per chunk of a publish whose progress the marker hash (the last key)
    -- records: a chunk sent again after a lost reply publishes nothing, and replies with the
    -- ids its first call published (one time and consecutive seqs: the marker keeps three
    -- numbers, not the ids).
    function M.tpublish_chunk()
      local chunk = M.int_arg(2, 'CHUNK', 0, LIMIT.no_bound)
      local ttl = M.int_arg(3, 'TTL_MS', 1, LIMIT.no_bound)
      local maxlen, maxage, n = M.publish_args(4)
      local base, marker = M.topic_base(), T.marker
      local under = base .. ':publish:'
      if #marker <= #under or string.sub(marker, 1, #under) ~= under then
        M.refuse('ROTATOR_KEYS', 'tpublish_chunk\'s last key, its marker, must be under ' ..
          M.printable(under) .. ', got ' .. M.printable(marker))
      end
      return M.marked(marker, chunk, ttl, { 'ms', 'first', 'n' }, function()
        local ids, ms, first = M.publish(4, maxlen, maxage, n)
        return ids, { 'ms', ms, 'first', first, 'n', n }
      end, function(recorded, last)
        local ids = {}
        if last then
          local prefix, first = recorded[1] .. '-', tonumber(recorded[2])
          for i = 1, tonumber(recorded[3]) do ids[i] = prefix .. (first + i - 1) end
        end
        return ids
      end)
    end

    function M.tsubscribe()
      local group = M.group_arg(2)
      if NGROUPS ~= 1 then M.refuse('ROTATOR_BADARG', 'give the keys of exactly one group') end
      local known = M.named_group(group)
      local topic = M.read_topic()
      local count = M.read('HLEN', T.groups)
      local g = M.read_group(1)
      if known then return { 0, topic.seq } end
      if count >= LIMIT.groups then
        M.refuse('ROTATOR_TOOMANY', 'at most ' .. LIMIT.groups .. ' groups per topic')
      end
      rcall('HSET', T.groups, group, g.keys.ring)
      return { 1, topic.seq }
    end

    function M.tunsubscribe()
      local group = M.group_arg(2)
      if NGROUPS ~= 1 then M.refuse('ROTATOR_BADARG', 'give the keys of exactly one group') end
      if not M.named_group(group) then return 0 end
      local keys = M.group_keys(1)
      rcall('HDEL', T.groups, group)
      -- UNLINK frees the keys in the background: a million revoked tokens took 570 ms to DEL.
      rcall('UNLINK', keys.ring, keys.done, keys.done_old, keys.marks, keys.marks_old, keys.revoked,
        keys.dead, keys.wake, keys.meta, keys.pushlog, keys.leases, keys.scheduled, keys.ids)
      return 1
    end

    -- Pushes the retained messages with FROM_SEQ <= seq <= TO_SEQ (TO_SEQ 0: the latest) into one
    -- group's ring, at most COUNT (1..5000) of them, oldest first.
    function M.treplay()
      local group = M.group_arg(2)
      local from = M.int_arg(3, 'FROM_SEQ', 0, LIMIT.no_bound)
      local to = M.int_arg(4, 'TO_SEQ', 0, LIMIT.no_bound)
      local count = M.int_arg(5, 'COUNT', 1, LIMIT.batch)
      if NGROUPS ~= 1 then M.refuse('ROTATOR_BADARG', 'give the keys of exactly one group') end
      if not M.named_group(group) then
        M.refuse('ROTATOR_NOGROUP', 'no group ' .. M.printable(group) .. ' on this topic')
      end
      local topic = M.read_topic()
      if to == 0 then to = topic.seq end
      -- The run holding FROM_SEQ is the last entry scored at or below it (else the oldest).
      local rank = math.max(M.read('ZCOUNT', T.log, '-inf', from) - 1, 0)
      local ids, size, done = {}, 8, false
      while not done and from <= to and #ids < count do
        local runs = M.log_runs(rank, math.min(size, count - #ids + 1), topic.seq)
        done = #runs == 0
        for _, run in ipairs(runs) do
          local a, b = math.max(run.first, from), math.min(run.last, to, from + count - #ids - 1)
          if a > to or #ids == count then done = true break end
          if a <= b then
            M.run_ids(run, a, b, ids)
            from = b + 1
          end
        end
        rank, size = rank + #runs, size * 2
      end
      local g = M.read_group(1)
      local after = #ids == count and from or to + 1
      if #ids > 0 then M.push_group(g, ids, M.now_ms()) end
      return { #ids, after, to }
    end

    -- The seq of the oldest retained message published at or after MS (a binary search over the
    -- log's runs, which share their ms: at most ~50 look-ups); the next seq to be given out when
    -- there is none.
    function M.tseek()
      local at = M.int_arg(2, 'MS', 0, LIMIT.no_bound)
      M.topic_base()
      local topic = M.read_topic()
      local lo, hi = 0, M.read('ZCARD', T.log) - 1
      local found = nil
      while lo <= hi do
        local mid = math.floor((lo + hi) / 2)
        local entry = rcall('ZRANGE', T.log, mid, mid, 'WITHSCORES')
        local ms = tonumber(string.match(entry[1] or '', '^(%d+)%-'))
        if ms and ms >= at then
          found, hi = tonumber(entry[2]), mid - 1
        else
          lo = mid + 1
        end
      end
      return found or topic.seq + 1
    end

    function M.ttrim()
      local maxlen, maxage = M.retention_args()
      local budget = M.int_arg(4, 'BUDGET', 1, LIMIT.trim_budget)
      M.topic_base()
      local topic = M.read_topic()
      M.read('ZCARD', T.log)
      local retained = M.read('HLEN', T.bodies)
      return M.trim(topic, maxlen, maxage, M.now_ms(), budget, retained)
    end

    function M.tstats()
      local base = M.topic_base()
      local names = M.check_groups()
      for g = 1, NGROUPS do M.check_group_keys(base, g, names[g]) end
      local topic = M.read_topic()
      local reply = {
        'retained', M.read('HLEN', T.bodies), 'bytes', topic.bytes, 'last_seq', topic.seq,
        'groups', NGROUPS,
      }
      for g = 1, NGROUPS do
        local stats = M.queue_stats(M.group_keys(g))
        reply[#reply + 1] = names[g]
        for i = 2, #stats, 2 do reply[#reply + 1] = stats[i] end
      end
      return reply
    end
  end

  -- 14. DISPATCH ----------------------------------------------------------------------------------

  -- Each command, by the KEYS it takes (main checks their count and names):
  --   queue     the queue's thirteen
  --   extras    the thirteen, then its payloads and item stats when the queue keeps them
  --   chunk     the thirteen, then push_chunk's marker hash (any other key under the base)
  --   payloads  the thirteen, then its payloads (a group: the topic's bodies), then its item
  --             stats optionally
  --   items     the thirteen, its payloads and its item stats
  --   topic     the topic's four, then the thirteen of each group
  -- One string, not a table: an EVAL call runs this chunk every time, and a table of these 40
  -- entries cost it about 2 us (4% of a one-job EVALSHA call's instructions under callgrind);
  -- main looks a command up once (M.layout_of), and a library remembers what it found
  -- (LAYOUTS).
  -- The push commands `unique` and `once` may come before.
  local PUSH_COMMANDS = ' push pushi push_later push_priority pushp pushp_later '

  local COMMANDS = [[
    push=queue push_priority=extras push_chunk=chunk push_later=extras
    schedule=queue unschedule=queue schedules=queue
    rate_limit=queue durations=queue pause=queue resume=queue
    next=queue next_packed=queue ack=queue nack=queue bury=extras
    extend=queue sweep=queue cancel=queue delete=extras
    configure=queue stats=queue peek=queue scan=queue dead=queue
    requeue_dead=queue requeue_dead_from=queue
    pushp=payloads pushp_later=payloads nextp=payloads nextp_packed=payloads
    ackp=payloads
    pushi=items nackp=items items=items
    tpublish=topic tpublish_chunk=topic tsubscribe=topic tunsubscribe=topic treplay=topic
    tseek=topic ttrim=topic tstats=topic
  ]]

  -- The commands that only read: those the library's read-only function runs (read_only;
  -- durations only without counts to add, when it reads the histogram).
  local READS = ' stats peek scan dead schedules items tstats durations '

  -- A command's KEYS layout (see COMMANDS), nil for anything that is not a command.
  function M.layout_of(command)
    if type(command) ~= 'string' or not string.find(command, '^[%l_]+$') then return nil end
    local _, equals = string.find(COMMANDS, ' ' .. command .. '=', 1, true)
    return equals and string.match(COMMANDS, '^%l+', equals + 1)
  end

  -- M's sections defined on first use (8 by M.define_push_ack, 9 by M.define_setbacks, 10 by
  -- M.define_walk, 11 by M.define_later, 12 and 13 by M.define_extensions): a lookup of a
  -- function M does not hold yet runs the definers in turn, each once, until M holds it. They
  -- are tried where the name most likely is, so that a call defines no section it does not
  -- need: a payload, item-stats or topic call's own section first; nack, bury and extend section
  -- 9's; any other queue command not defined yet (push and ack aside) one of section 11's (a
  -- worker's busy loop is defined at once); any other function, and push and ack, section 8's
  -- (small, and a claim that walks acks through it) and then the walk's. A library runs them
  -- once; an EVAL call only when it needs them.
  local ON_FIRST_USE = {
    __index = function(m, name)
      local sections
      if LAYOUT == 'payloads' or LAYOUT == 'items' or LAYOUT == 'topic' then
        sections = { 'extensions', 'push_ack', 'setbacks', 'walk', 'later' }
      elseif name == 'nack' or name == 'bury' or name == 'extend' then
        sections = { 'setbacks', 'push_ack', 'walk', 'later', 'extensions' }
      elseif name == A[1] and name ~= 'push' and name ~= 'ack' then
        sections = { 'later', 'push_ack', 'setbacks', 'walk', 'extensions' }
      else
        sections = { 'push_ack', 'walk', 'later', 'extensions', 'setbacks' }
      end
      for _, section in ipairs(sections) do
        local definer = 'define_' .. section
        local define = rawget(m, definer)
        if define then
          m[definer] = false
          define()
          local found = rawget(m, name)
          if found ~= nil then return found end
        end
      end
    end,
  }

  -- The thirteen KEYS of a queue after keys[base], by name, in the order of the header.
  function M.queue_keys(keys, base)
    return {
      ring = keys[base + 1], done = keys[base + 2], done_old = keys[base + 3],
      marks = keys[base + 4], marks_old = keys[base + 5], revoked = keys[base + 6],
      dead = keys[base + 7], wake = keys[base + 8], meta = keys[base + 9],
      pushlog = keys[base + 10], leases = keys[base + 11], scheduled = keys[base + 12],
      ids = keys[base + 13],
    }
  end

  -- Refuses, before anything is read or written, queue keys that are not one queue's own in
  -- their slots (a key passed in the wrong slot, or a key of something else): names only, so
  -- it costs no command. Returns the base, or an error reply. Each key is compared with the
  -- name it must have: strings are interned, so the comparison is a pointer's, and making a
  -- right key's name again finds that string rather than a new one. 11-14k instructions an
  -- EVAL call, where two plain finds a key took 27-29k (callgrind, both servers); a library
  -- checks the keys once for as long as its calls name the same ones (checked_before).
  function M.check_queue_keys(keys, at)
    local ring = keys[at + 1]
    local n = #ring - 5 -- the base's length
    local base = string.sub(ring, 1, n)
    local ok = n >= 0 and string.find(ring, ':ring', n + 1, true) == n + 1
    for i = 2, QUEUE_KEYS do
      if not ok then break end
      ok = keys[at + i] == base .. QUEUE_ROLES[i]
    end
    if not ok then
      return nil, M.fail('ROTATOR_KEYS', 'keys ' .. (at + 1) .. '..' .. (at + QUEUE_KEYS) ..
        ' must be one queue\'s <base>:ring <base>:done ... <base>:ids, in that order')
    end
    return base
  end

  -- The keys after a queue's thirteen: its payloads (or, for a topic group, the topic's bodies)
  -- and its item stats; push_chunk's marker, any other key under the queue's base.
  function M.check_extra_keys(keys, base, marker)
    local payloads, items = keys[QUEUE_KEYS + 1], keys[QUEUE_KEYS + 2]
    local ok = true
    if marker then -- (the thirteen are <base><role>: checked already)
      ok = M.is_marker(payloads, base)
    elseif payloads then
      local topic = string.match(base, '^(.*):group:[^:]+$')
      ok = payloads == base .. ':payloads'
        or (topic ~= nil and payloads == topic .. ':topic:bodies')
    end
    if ok and items then ok = items == base .. ':items' end
    if not ok then
      return M.fail('ROTATOR_KEYS', 'keys after the queue\'s thirteen must be <base>:payloads ' ..
        '(a group: the topic\'s bodies) and <base>:items; push_chunk\'s marker a key under ' ..
        '<base>:')
    end
  end

  -- Whether `key` may be a marker hash of the queue at `base` (push_chunk's, once's): a key
  -- under "<base>:" that is none of the queue's own.
  function M.is_marker(key, base)
    if type(key) ~= 'string' or string.sub(key, 1, #base + 1) ~= base .. ':' then return false end
    local role = string.sub(key, #base + 1)
    return not QUEUE_ROLE_SET[role] and role ~= ':payloads' and role ~= ':items'
  end

  -- Whether the previous call's queue keys passed the name checks and these are the same
  -- (a library lives across calls, so a worker's calls check their names once; a script
  -- starts afresh every call). Strings are interned: each comparison is one pointer's.
  -- push_chunk's marker is new at each push call: there the thirteen must be the same, and
  -- the marker is checked on its own.
  function M.checked_before(keys, marker)
    local last = CHECKED
    if not last or last.marker ~= marker or #last.keys ~= #keys then return false end
    local names = last.keys
    for i = 1, marker and QUEUE_KEYS or #keys do
      if names[i] ~= keys[i] then return false end
    end
    return not marker or M.check_extra_keys(keys, last.base, true) == nil
  end

  -- One call, whichever way it came: EVAL/EVALSHA (KEYS, ARGV) or FCALL (keys, args).
  local function main(keys, args)
    -- `once CHUNK TTL_MS` before a push: its marker is the last key (see M.once)
    local once
    if args[1] == 'once' then
      once = { args = args, marker = keys[#keys] }
      args, keys = { unpack(args, 4) }, { unpack(keys, 1, math.max(#keys - 1, 0)) }
    end
    -- The call state of section 2: bound here, once per call, and nowhere else.
    UNIQUE, FRESH_ACKS = args[1] == 'unique', false
    NAMED, DROPPED, TRIMMED = nil, nil, false -- (DROPPED made by the calls that drop)
    PACKED, PACKED_IDS, FIRST_META = nil, nil, nil
    if UNIQUE then args = { unpack(args, 2) } end
    if (UNIQUE or once) and not string.find(PUSH_COMMANDS, ' ' .. tostring(args[1]) .. ' ', 1,
        true) then
      return M.fail('ROTATOR_BADARG', (once and 'once' or 'unique') .. ' takes push, pushi, ' ..
        'push_later, push_priority, pushp or pushp_later' .. (once and ' (after unique)' or '') ..
        ', got ' .. M.printable(args[1]))
    end
    A, KS = args, keys
    rcall = redis.call
    if not PAD then -- this chunk's first call: every EVAL call, a library's first FCALL
      PAD, LAYOUTS = M.make_pad(), {}
      KEPT = { ints = {}, nints = 0, leased = {}, named = {}, acks = {}, nleased = 0,
        second = false, second_ms = 0, origin = false, origin_n = false, checkpoint = false,
        checkpoint_ms = false } -- (every field made at once: no table grown in a call)
      setmetatable(M, ON_FIRST_USE)
    end
    local layout = LAYOUTS[args[1]]
    if not layout then
      layout = M.layout_of(args[1])
      if layout then LAYOUTS[args[1]] = layout end -- (commands only: the table stays small)
    end
    LAYOUT = layout
    local handler = layout and M[args[1]]
    if layout == 'topic' then
      local marker = args[1] == 'tpublish_chunk' and 1 or 0 -- (its marker: the last key)
      local groups = (#keys - TOPIC_KEYS - marker) / QUEUE_KEYS
      if #keys < TOPIC_KEYS + marker or groups ~= math.floor(groups) or groups > LIMIT.groups then
        return M.fail('ROTATOR_KEYS', 'expected ' .. TOPIC_KEYS .. ' topic keys and ' ..
          QUEUE_KEYS .. ' per group' .. (marker == 1 and ', then a marker' or '') .. ', got ' ..
          #keys)
      end
      K, NGROUPS = nil, groups
      T = { topic = keys[1], groups = keys[2], log = keys[3], bodies = keys[4],
        marker = marker == 1 and keys[#keys] or nil }
    else
      local low, high = QUEUE_KEYS, QUEUE_KEYS -- 'queue', and an unknown command's
      if layout == 'extras' then low, high = QUEUE_KEYS, QUEUE_KEYS + 2 end
      if layout == 'chunk' then low, high = QUEUE_KEYS + 1, QUEUE_KEYS + 1 end
      if layout == 'payloads' then low, high = QUEUE_KEYS + 1, QUEUE_KEYS + 2 end
      if layout == 'items' then low, high = QUEUE_KEYS + 2, QUEUE_KEYS + 2 end
      if #keys < low or #keys > high then
        return M.fail('ROTATOR_KEYS', 'expected ' .. (low == high and low or low .. ' or ' .. high)
          .. ' keys, got ' .. #keys)
      end
      local marker, base = layout == 'chunk', nil
      if M.checked_before(keys, marker) then
        K, base = CHECKED.queue, CHECKED.base -- (nothing writes K: the same keys, the same table)
      else
        local refused
        base, refused = M.check_queue_keys(keys, 0)
        if not base then return refused end
        refused = M.check_extra_keys(keys, base, marker)
        if refused then return refused end
        K = M.queue_keys(keys, 0)
        K.payloads = keys[14]
        K.items = keys[15]
        if LIBRARY then
          CHECKED = { keys = { unpack(keys) }, marker = marker, queue = K, base = base }
        end
      end
      T, NGROUPS = nil, 0
      if once then
        if not M.is_marker(once.marker, base) then
          return M.fail('ROTATOR_KEYS', 'once\'s marker, the last key, must be a key under ' ..
            M.printable(base .. ':') .. ' that is none of the queue\'s, got ' ..
            M.printable(once.marker))
        end
        handler = M.once(handler, once)
      end
    end
    if not handler then
      return M.fail('ROTATOR_BADCMD', 'unknown command ' .. M.printable(args[1]))
    end
    local ok, result = pcall(M.run, handler, T and T.topic or K.meta, not T and args[1])
    if ok or (type(result) == 'table' and result.err) then return result end
    -- An error from a command Redis refused (READONLY, OOM, NOPERM...) reaches pcall as a
    -- string: reply with it as it is, so its code survives for the client to see.
    if type(result) == 'string' and string.find(result, '^[A-Z]+ ') then
      return { err = result }
    end
    error(result, 0) -- a bug: let Redis report it
  end

  -- The library's read-only function, registered 'no-writes' and called by FCALL_RO: the
  -- server runs it where it refuses FCALL of a function that may write (out of memory under
  -- noeviction, a read-only replica), so stats and the other reads answer there. It runs the
  -- commands that only read (READS) and refuses any other before it reads or writes
  -- anything: ROTATOR_BADCMD, nothing changed.
  local function read_only(keys, args)
    local command = args[1]
    if type(command) ~= 'string' or not string.find(command, '^[%l_]+$')
        or not string.find(READS, ' ' .. command .. ' ', 1, true)
        or command == 'durations' and #args > 1 then
      return M.fail('ROTATOR_BADCMD', M.printable(command) ..
        ' may write: call it by FCALL, not FCALL_RO')
    end
    return main(keys, args)
  end
  return main, read_only
end

local main, read_only = define_module()

if redis.register_function then
  -- Loaded as a library: the loader's first lines name it (FUNCTION_NAME), see
  -- rotator/script.py. Registered once; FCALL then runs only `main`, FCALL_RO `read_only`.
  LIBRARY = true
  redis.register_function(FUNCTION_NAME, main)
  redis.register_function({ function_name = FUNCTION_NAME .. '_ro', callback = read_only,
    flags = { 'no-writes' } })
  return
end
return main(KEYS, ARGV)
