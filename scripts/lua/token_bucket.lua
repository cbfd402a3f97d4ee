-- Seed 000 ("Rate Limiting Is Not Just a Redis INCR Call"), token_bucket.lua, adapted for the
-- server benchmark (benches/server). The only change: `now` comes from the server's TIME
-- instead of ARGV[3] (lines marked ADAPTED), as the seeds recommend against clock skew. ARGV[3]
-- is still in the argument list (pass any placeholder, e.g. "-") so the other positions are the
-- seed's.
--
-- KEYS[1] = bucket key
-- ARGV = capacity, refill_rate (tokens per second), now (ignored), requested
local cap  = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t    = redis.call("TIME")                            -- ADAPTED: the server's clock
local now  = tonumber(t[1]) + tonumber(t[2]) / 1000000     -- ADAPTED: was tonumber(ARGV[3])
local req  = tonumber(ARGV[4])

local s = redis.call("HMGET", KEYS[1], "tokens", "ts")
local tokens = tonumber(s[1]) or cap
local last   = tonumber(s[2]) or now

tokens = math.min(cap, tokens + (now - last) * rate)  -- lazy refill
local ok = 0
if tokens >= req then tokens = tokens - req; ok = 1 end

redis.call("HSET", KEYS[1], "tokens", tokens, "ts", now)
redis.call("PEXPIRE", KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return { ok, tokens }
