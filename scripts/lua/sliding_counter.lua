-- Seed 003 ("... Token Bucket, Leaky Bucket, Sliding Window"), snippet-4: the sliding window
-- counter that seed 001 sketches, adapted for benches/server. The seed's Go caller read its
-- own clock, computed window_start and passed the two window keys (sw:<id>:<window_start> and
-- the previous window's) as KEYS[1], KEYS[2] and now_ms as ARGV[3]. ADAPTED: now_ms comes from
-- the server's TIME and the two key names are built in the script exactly as the caller built
-- them, from KEYS[1] = the limiter's base name. Everything else is the seed's code.
--
-- KEYS[1] = base name (e.g. sw:<user>)
-- ARGV = limit, window_ms
local t         = redis.call("TIME")                                          -- ADAPTED
local now_ms    = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)   -- ADAPTED: was ARGV[3]
local limit     = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])

local window_start = now_ms - (now_ms % window_ms)
local curr_key  = KEYS[1] .. ":" .. window_start                -- ADAPTED: was KEYS[1]
local prev_key  = KEYS[1] .. ":" .. (window_start - window_ms)  -- ADAPTED: was KEYS[2]
local elapsed      = now_ms - window_start
local weight       = 1.0 - (elapsed / window_ms)

local prev_count = tonumber(redis.call("GET", prev_key) or 0)
local curr_count = tonumber(redis.call("GET", curr_key) or 0)

local estimated = math.floor(prev_count * weight) + curr_count

if estimated >= limit then
  return {0, estimated}
end

local new_count = redis.call("INCR", curr_key)
if new_count == 1 then
  redis.call("PEXPIRE", curr_key, window_ms * 2)
end
return {1, estimated + 1}
