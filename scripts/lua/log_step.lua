-- Benchmark helper (not a seed; needs the module loaded with DEBUG_CLOCK): steps the module's
-- debug clock by ARGV[3] µs, then makes one RL.SLIDINGLOG call. A log at its limit, stepped by
-- the spacing of its entries, evicts exactly one entry and admits one per call.
--
-- KEYS[1] = log key; ARGV = limit, window, step_us
redis.call('RL.DEBUG', 'CLOCK', 'ADVANCE', ARGV[3])
return redis.call('RL.SLIDINGLOG', KEYS[1], ARGV[1], ARGV[2])
