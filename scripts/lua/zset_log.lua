-- Seed 002 ("Token Bucket vs Sliding Window in a Distributed System"), the sorted-set sliding
-- window log, adapted for the server benchmark (benches/server):
--  * ADAPTED: `now` (ms) comes from the server's TIME instead of ARGV[1] (the seed says it
--    uses TIME "in the script call path"); ARGV[1] stays in the argument list as a placeholder.
--  * FIXED: the seed calls 'ZREMOVEFRANGEBYSCORE', which does not exist (every call would fail
--    with "Unknown Redis command"); the command is ZREMRANGEBYSCORE.
-- Kept as in the seed: the KEYS[1]..':seq' counter key that makes members unique (one more key
-- per limiter, without a TTL): it is part of what this design costs.
--
-- KEYS[1] = window key
-- ARGV = now_ms (ignored), window_ms, limit
local t   = redis.call('TIME')                                          -- ADAPTED
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)   -- ADAPTED: was ARGV[1]
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - tonumber(ARGV[2]))     -- FIXED, ADAPTED
local count = redis.call('ZCARD', KEYS[1])
if count >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now, now .. '-' .. redis.call('INCR', KEYS[1] .. ':seq'))  -- ADAPTED
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
