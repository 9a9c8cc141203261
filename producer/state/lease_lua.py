"""The Lua scripts of a job's lease and of the writes it fences (``worker.concerns.lease``).

A run takes the job's lease (``keys.lease``) and, with it, a new generation
(``keys.lease_generation``): its fencing token. Every shared write a run makes in Redis goes
through a script here that checks, in the same atomic step, that the lease still names the
run's token and the generation is still the run's; a run that lost its lease (taken for lost
during a partition, a stall) writes nothing there, whenever its write arrives.
"""

from __future__ import annotations

from producer.state.keys import IS_FINAL

#: KEYS: lease, generation. ARGV: token, PX, the generation's TTL (s). Take a free lease: a new
#: generation (the run's fencing token). Returns it, or 0 while another run holds the lease.
#: A lease that names the token already (the reply of a take that landed was lost) is ours.
LEASE_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return tonumber(redis.call('GET', KEYS[2]) or '0') end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local gen = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return gen
"""
#: KEYS: lease, generation, the job's result meta. ARGV: token, PX, the run's generation.
#: Returns 1 renewed, 2 taken again (it lapsed, nobody took it since, the job has not ended),
#: 0 lost: another run holds it or held it since (a newer generation), or the job ended.
LEASE_RENEW = IS_FINAL + """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if holder or is_final(KEYS[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
"""
#: KEYS: lease, generation. ARGV: dead holder as read, new token, PX, the generation's TTL.
#: Compare-and-set; a new generation (returned), or 0.
LEASE_TAKEOVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  local gen = redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
  return gen
end
return 0
"""
#: The fence every shared write in Redis goes through: the run's lease still names its token
#: AND the job's generation is still the run's. A Lua function the fenced writes start with.
_HOLDS = """
local function holds(lease, generation, token, gen)
  return redis.call('GET', lease) == token and redis.call('GET', generation) == gen
end
"""
#: KEYS: lease, generation, a hash. ARGV: token, generation, field, value, [field, value …],
#: the hash's TTL (s, last). HSET only while the run holds its lease: 1, else 0.
FENCED_HSET = _HOLDS + """
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return 0 end
for i = 3, #ARGV - 1, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[3], ARGV[#ARGV])
return 1
"""
#: KEYS: lease, generation, a Celery result key. ARGV: token, generation, the meta (JSON),
#: its TTL (s; '' none). Celery's store (SET + PUBLISH to the result's readers) only while the
#: run holds its lease: 1, else 0.
FENCED_RESULT = _HOLDS + """
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return 0 end
if ARGV[4] ~= '' then redis.call('SETEX', KEYS[3], ARGV[4], ARGV[3])
else redis.call('SET', KEYS[3], ARGV[3]) end
redis.call('PUBLISH', KEYS[3], ARGV[3])
return 1
"""

