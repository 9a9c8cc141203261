"""Every Redis key framefleet writes or reads, and every Lua script that touches them.

Both sides import this module; no other module spells a key. The keys live in the result
backend's Redis, beside Celery's results (the host-loss sweep needs them on the broker's server
too: ``worker.lifecycle.recovery``).

framefleet's own keys (``framefleet:`` prefix):

- ``spec:{job}``: the claim, the spec digest a job_id was submitted with (``SET NX``);
- ``specdoc:{job}``: the spec itself (canonical JSON), written with the claim by the client,
  so a later conflict can name the fields that differ;
- ``cancel:{job}``: a cooperative cancel asked for (polled between chunks and steps);
- ``preempted:{node}``: a spot interruption notice for a worker node;
- ``runs:{job}``: the run record, a hash: ``running`` (the holder of the run in progress),
  ``losses`` and ``lost_on`` (runs whose worker died), ``started`` (a worker received it),
  ``sent_at`` (unix time the client last sent it), ``ledger_end`` (the end a run wrote to the
  ledger, "digest status": a run of the same submission that ends so again writes none);
- ``lease:{job}``: the one run allowed at a time (``SET NX PX``, renewed while it runs);
- ``leasegen:{job}``: the lease's generation, +1 at every take: the run's fencing token, which
  every shared write of a run checks (``worker.concerns.lease``);
- ``held:{job}:{token}``: a ``HeldRun``, GPU time of a run that ended without a result;
- ``undecodable_total``: messages on the queue that no worker could decode;
- ``last_taken``: unix time a worker last received a job (``status``/``wait`` hints);
- ``ledger:runs:{job}``: ``HeldRun``s of the job's runs that sent it back (retry, requeue),
  kept until its end's ledger record carries them;
- ``queued``: a sorted set, job → unix time it was last sent: sent, not yet received by a
  worker (``worker.lifecycle.reconcile`` sends again one whose message was lost);
- ``resent_total``: jobs the reconciler sent again;
- ``reconcile:lock``: the one worker scanning the queue for lost messages right now;
- ``ends``: job ends that a worker's main process decided (Celery's hard time limit), handed
  to a pool process, which counts them and writes their ledger records;
- ``api:job:{job}``, ``api:jobs:{tenant}``, ``api:inflight:{tenant}``, ``api:streams:{tenant}``,
  ``api:rate:…``: the HTTP gateway's records of the jobs it submitted, each tenant's listing,
  jobs in flight and open event streams, and the rate limiter's windows (per tenant, and per
  client address for requests without a valid key).

Keys of Celery and kombu that framefleet reads: ``celery-task-meta-{task_id}`` (a result),
``unacked`` / ``unacked_index`` (kombu's messages delivered and not acknowledged), and a
queue's priority lists.
"""

from __future__ import annotations

PREFIX = "framefleet:"
#: The claim and the run record live as long as this (a month): resubmits within it are
#: recognised.
SPEC_TTL_S = 30 * 86_400
#: Cancel and preempted flags expire after two days.
FLAG_TTL_S = 2 * 86_400
#: Pattern and prefix of the ``HeldRun`` records (``framefleet cost report`` scans them).
HELD_PREFIX = PREFIX + "held:"
UNDECODABLE = PREFIX + "undecodable_total"
#: Unix time (text) a worker last received a job of the queue.
LAST_TAKEN = PREFIX + "last_taken"
#: A list of job ends decided in a worker's main process, for a pool process to record.
ENDS = PREFIX + "ends"
#: The field of ``runs:{job}`` naming the end already in the ledger.
LEDGER_END_FIELD = "ledger_end"
#: The field of ``runs:{job}`` naming the end already counted (``framefleet_jobs_total``).
COUNTED_END_FIELD = "counted_end"
#: The field of ``runs:{job}`` naming the end whose webhook was sent.
NOTIFIED_END_FIELD = "notified_end"
#: Every field of ``runs:{job}`` that marks an end (and, as ``<field>:by``, the run that did).
END_FIELDS = (LEDGER_END_FIELD, COUNTED_END_FIELD, NOTIFIED_END_FIELD)
#: Jobs sent and not yet received (job → unix time sent): what the reconciler watches.
QUEUED = PREFIX + "queued"
#: Jobs the reconciler sent again, all time (the fleet exporter serves it).
RESENT = PREFIX + "resent_total"
#: The reconciler's lock: one worker at a time scans the queue (``SET NX PX``).
RECONCILE_LOCK = PREFIX + "reconcile:lock"
#: Celery's result key of a task id.
RESULT_PREFIX = "celery-task-meta-"
#: kombu's Redis transport: delivered, not yet acknowledged messages and their delivery times.
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
#: kombu keeps priority step N > 0 of queue Q in the list ``Q\x06\x16N`` (its default
#: separator; ``:`` with ``sep`` set in the transport options).
KOMBU_SEPARATORS = ("\x06\x16", ":")


def claim(job_id: str) -> str:
    return f"{PREFIX}spec:{job_id}"


def cancel(job_id: str) -> str:
    return f"{PREFIX}cancel:{job_id}"


def spec_doc(job_id: str) -> str:
    return f"{PREFIX}specdoc:{job_id}"


def ledger_runs(job_id: str) -> str:
    return f"{PREFIX}ledger:runs:{job_id}"


def preempted(node: str) -> str:
    return f"{PREFIX}preempted:{node}"


def runs(job_id: str) -> str:
    return f"{PREFIX}runs:{job_id}"


def lease(job_id: str) -> str:
    return f"{PREFIX}lease:{job_id}"


def lease_generation(job_id: str) -> str:
    """The job's lease generation: +1 each time a run takes the lease (its fencing token)."""
    return f"{PREFIX}leasegen:{job_id}"


def held(job_id: str, token: str) -> str:
    return f"{HELD_PREFIX}{job_id}:{token}"


def api_job(job_id: str) -> str:
    """Hash: the gateway's record of a fleet job (field ``record``: JSON with its owner tenant,
    public id, model, size; field ``completed_at``: first time seen finished; field
    ``percent``: the highest progress any replica has shown)."""
    return f"{PREFIX}api:job:{job_id}"


def api_listing(tenant: str) -> str:
    """Sorted set: the tenant's public ids, scored by creation time in ms (newest last)."""
    return f"{PREFIX}api:jobs:{tenant}"


def api_in_flight(tenant: str) -> str:
    """Sorted set: the tenant's fleet job ids not yet seen finished, scored by submit time."""
    return f"{PREFIX}api:inflight:{tenant}"


def api_streams(tenant: str) -> str:
    """Sorted set: the tenant's open event streams, scored by when each lapses (ms) unless
    its replica renews it."""
    return f"{PREFIX}api:streams:{tenant}"


def api_file(tenant: str, file_id: str) -> str:
    """String: a file the tenant uploaded (``POST /v1/files``): JSON of its name, size,
    purpose and where the gateway stored it."""
    return f"{PREFIX}api:file:{tenant}:{file_id}"


def api_batch(tenant: str, batch_id: str) -> str:
    """Hash: the tenant's batch (``/v1/batches``): field ``record`` (JSON), and one field per
    line of its input file (its number: JSON of its state: waiting with its request,
    submitted with its job's ids, or refused with the error)."""
    return f"{PREFIX}api:batch:{tenant}:{batch_id}"


def api_batch_lock(tenant: str, batch_id: str) -> str:
    """String: held (``SET NX PX``) while a replica submits the batch's waiting lines."""
    return f"{PREFIX}api:batchlock:{tenant}:{batch_id}"


#: Key prefix of the ``limits`` library's rate-limit windows (it appends its own parts).
API_RATE_PREFIX = PREFIX + "api:rate"
#: How long the gateway remembers a job (the job registry keeps a claim this long).
API_RECORD_TTL_S = SPEC_TTL_S


def result(task_id: str) -> str:
    return f"{RESULT_PREFIX}{task_id}"


def queue_lists(queue: str) -> list[str]:
    """The Redis lists kombu uses for ``queue``: the plain name, then one per priority step
    1-9 for each separator."""
    return [queue] + [f"{queue}{sep}{n}" for sep in KOMBU_SEPARATORS for n in range(1, 10)]


# --- Lua: the registry (producer.state.control) -------------------------------------------------

#: Claim a job_id (SET NX) and, when the claim is new, clear a stale cancel flag and keep the
#: spec (when given): one round trip. KEYS: claim, cancel, spec doc. ARGV: digest, TTL, "1" to
#: clear the cancel flag, the spec's JSON ('' to keep none).
CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  if ARGV[3] == '1' then redis.call('DEL', KEYS[2]) end
  if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[2]) end
  return false
end
return redis.call('GET', KEYS[1])
"""

#: A run starts: a ``running`` holder left behind is a run whose worker died (one loss).
#: KEYS: runs. ARGV: holder, TTL. Returns {losses, lost_on or false}.
START_RUN = """
local prev = redis.call('HGET', KEYS[1], 'running')
if prev then
  redis.call('HINCRBY', KEYS[1], 'losses', 1)
  redis.call('HSET', KEYS[1], 'lost_on', prev)
end
redis.call('HSET', KEYS[1], 'running', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {tonumber(redis.call('HGET', KEYS[1], 'losses') or '0'),
        redis.call('HGET', KEYS[1], 'lost_on') or false}
"""

#: A run ends (not lost); when the job ended for good its losses are forgotten.
#: KEYS: runs. ARGV: holder, "1" when final.
END_RUN = """
if redis.call('HGET', KEYS[1], 'running') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'running')
  if ARGV[2] == '1' then redis.call('HDEL', KEYS[1], 'losses', 'lost_on', 'stuck') end
end
return 0
"""

#: A run killed by Celery's hard time limit ends: forget it if the record still names a holder
#: of the killed process (ARGV[1]: its prefix ``"node pid "``), and say so (1; else 0: that run
#: reached its end itself, or never recorded itself). KEYS: runs.
END_KILLED_RUN = """
local holder = redis.call('HGET', KEYS[1], 'running')
if holder and string.sub(holder, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'running', 'losses', 'lost_on', 'stuck')
  return 1
end
return 0
"""

#: The watchdog took a run for hung (``worker.watchdog``): if the record still names a holder
#: of its process (ARGV[1]: the prefix ``"node pid "``), keep why (ARGV[2]: ``stage idle_s``)
#: for the poison cap of the job's next run, and say so (1; else 0). KEYS: runs.
MARK_STUCK = """
local holder = redis.call('HGET', KEYS[1], 'running')
if holder and string.sub(holder, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('HSET', KEYS[1], 'stuck', ARGV[2])
  return 1
end
return 0
"""

# --- Lua: the lease (worker.concerns.lease; the rest in producer.state.lease_lua) ----

#: KEYS: lease (or any lock). ARGV: token. Compare-and-delete.
LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: A Lua function both the sweep and the reconciler start with: whether the result meta at
#: ``key`` says the job has ended (SUCCESS, FAILURE or REVOKED).
IS_FINAL = """
local function is_final(key)
  local meta = redis.call('GET', key)
  if not meta then return false end
  local ok, m = pcall(cjson.decode, meta)
  return ok and type(m) == 'table' and (m.status == 'SUCCESS' or m.status == 'FAILURE'
      or m.status == 'REVOKED')
end
"""

# --- Lua: the host-loss sweep (worker.lifecycle.recovery) -----------------------------------


#: Restore an orphaned message once. KEYS: 1 unacked, 2 unacked_index, 3 destination list,
#: 4 lease, 5 claim, 6 result meta. ARGV: 1 tag, 2 entry as read, 3 newest untouched time,
#: 4 message to push, 5 backend db ('' = the broker's), 6 broker db, 7 spec digest,
#: 8 REQUEUED meta, 9 its TTL ('' none).
RESTORE = IS_FINAL + """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 'gone' end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return 'gone' end
if tonumber(score) > tonumber(ARGV[3]) then return 'touched' end
local other = ARGV[5] ~= ''
if other then redis.call('SELECT', ARGV[5]) end
local verdict = nil
if redis.call('EXISTS', KEYS[4]) == 1 then
  verdict = 'leased'
elseif redis.call('GET', KEYS[5]) ~= ARGV[7] then
  verdict = 'unclaimed'
elseif is_final(KEYS[6]) then
  verdict = 'final'
end
if verdict == nil then
  if ARGV[9] ~= '' then
    redis.call('SET', KEYS[6], ARGV[8], 'EX', ARGV[9])
  else
    redis.call('SET', KEYS[6], ARGV[8])
  end
end
if other then redis.call('SELECT', ARGV[6]) end
if verdict == 'final' then
  -- Done, but its worker died before the ack: acknowledge it for the dead worker.
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
if verdict then return verdict end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[4])
return 'restored'
"""

# --- Lua: the lost-message reconciler (worker.lifecycle.reconcile) ---------------------------

#: Decide, once, to send a job again whose message is nowhere. KEYS: 1 queued set, 2 runs,
#: 3 claim, 4 result meta. ARGV: 1 job, 2 its sent time as read, 3 now. Returns 'resend' (the
#: sent time is now ARGV[3]: no other reconciler sends it too), 'moved' (sent again meanwhile,
#: or gone from the set), or why it left the set: 'received', 'unclaimed', 'final'.
RESEND = IS_FINAL + """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 'moved' end
local verdict = nil
if redis.call('HEXISTS', KEYS[2], 'started') == 1 then
  verdict = 'received'
elseif redis.call('EXISTS', KEYS[3]) == 0 then
  verdict = 'unclaimed'
elseif is_final(KEYS[4]) then
  verdict = 'final'
end
if verdict then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return verdict
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 'resend'
"""

# --- Lua: the HTTP gateway (producer.api) ----------------------------------------------------

#: Count a job as in flight unless the tenant has the limit already. KEYS: in-flight set.
#: ARGV: job id, now (ms), limit, TTL. Returns 1 when counted (or counted already), else 0.
API_RESERVE = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""

#: The progress a job shows: the higher of ARGV[1] and what was shown before, kept in the
#: record's hash (KEYS[1]) so that no replica shows less later. Writes nothing once the
#: record is gone (a write would leave a hash without a record and without a TTL).
API_PROGRESS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return tonumber(ARGV[1]) end
local shown = tonumber(redis.call('HGET', KEYS[1], 'percent') or '0')
local now = tonumber(ARGV[1])
if now > shown then
  redis.call('HSET', KEYS[1], 'percent', ARGV[1])
  return now
end
return shown
"""

#: Open an event stream unless the tenant has the limit open. KEYS: the tenant's streams.
#: ARGV: stream id, now (ms), lapse (ms from now), limit. Lapsed streams (a replica that died
#: with them open) are dropped first. Returns 1 when opened, else 0.
API_STREAM_OPEN = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
