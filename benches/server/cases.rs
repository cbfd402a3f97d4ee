//! What is measured, as data: the server-CPU rows, the memory rows, the sliding-log rows and the
//! targets (issue 12) the report checks.
//!
//! In a command, `__rand_int__` is redis-benchmark's random key number (`-r`), `@` the key
//! number of a loading run (0 to keys − 1), and `{token_bucket}`, `{sliding_counter}`,
//! `{zset_log}`, `{log_step}` the SHA1 of a script of `scripts/lua/`.
//!
//! Parameters keep every key alive for the whole run: 1000 per day (a bucket's key lives 86.4 s
//! per admitted request, a window's key until its window ends; the Lua scripts get the same
//! rate). A limiter whose key expires between two hits would measure key churn, not a decision.

use redis_ratelimit_bench::stats::Bound;

/// One server-CPU row: a command measured by redis-benchmark over random keys.
#[derive(Debug)]
pub struct CpuCase {
    pub label: &'static str,
    /// Its line in INFO commandstats (`cmdstat_<stat>`), whose calls and usec_per_call the row
    /// reports (Lua rows: the whole script).
    pub stat: &'static str,
    /// The module's algorithm whose INFO counters give the share refused; None for no module
    /// command.
    pub algorithm: Option<&'static str>,
    /// Measured with a replica attached too.
    pub with_replica: bool,
    /// The peer's own command: shown under the peer's label (with its version).
    pub peer: bool,
    pub command: &'static str,
}

const fn case(
    label: &'static str,
    stat: &'static str,
    algorithm: Option<&'static str>,
    with_replica: bool,
    command: &'static str,
) -> CpuCase {
    CpuCase { label, stat, algorithm, with_replica, peer: false, command }
}

pub const INCR_LABEL: &str = "INCR";
pub const SET_LABEL: &str = "SET k v EX 86400";

/// The module's server's rows, in measuring order.
pub const MODULE_CASES: &[CpuCase] = &[
    case(INCR_LABEL, "incr", None, true, "INCR key:__rand_int__"),
    case(SET_LABEL, "set", None, true, "SET key:__rand_int__ 1 EX 86400"),
    case("RL.GCRA", "rl.gcra", Some("gcra"), true, "RL.GCRA key:__rand_int__ 1000 1d"),
    case("RL.TOKENBUCKET", "rl.tokenbucket", Some("tokenbucket"), true, "RL.TOKENBUCKET key:__rand_int__ 1000 1d"),
    case("RL.LEAKY", "rl.leaky", Some("leaky"), true, "RL.LEAKY key:__rand_int__ 1000 1d"),
    case("RL.SLIDING", "rl.sliding", Some("sliding"), true, "RL.SLIDING key:__rand_int__ 1000 1d"),
    case("RL.FIXED", "rl.fixed", Some("fixed"), true, "RL.FIXED key:__rand_int__ 1000 1d"),
    case("RL.SLIDINGLOG", "rl.slidinglog", Some("slidinglog"), true, "RL.SLIDINGLOG key:__rand_int__ 1000 1d"),
    case("CL.THROTTLE", "cl.throttle", Some("gcra"), true, "CL.THROTTLE key:__rand_int__ 999 1000 86400 1"),
    case(
        LUA_TOKEN_BUCKET,
        "evalsha",
        None,
        false,
        "EVALSHA {token_bucket} 1 key:__rand_int__ 1000 0.011574074074074073 - 1",
    ),
    case(LUA_SLIDING_COUNTER, "evalsha", None, false, "EVALSHA {sliding_counter} 1 key:__rand_int__ 1000 86400000"),
    case(LUA_ZSET_LOG, "evalsha", None, false, "EVALSHA {zset_log} 1 key:__rand_int__ - 86400000 1000"),
];

pub const LUA_TOKEN_BUCKET: &str = "Lua token bucket (seed 000)";
pub const LUA_SLIDING_COUNTER: &str = "Lua sliding counter (seed 003)";
pub const LUA_ZSET_LOG: &str = "Lua sorted-set log (seed 002)";

/// redis-cell's server's rows (it registers CL.THROTTLE as the module does, so it runs on its
/// own server, where INCR and SET EX are measured again).
pub const CELL_CASES: &[CpuCase] = &[
    case(INCR_LABEL, "incr", None, true, "INCR key:__rand_int__"),
    case(SET_LABEL, "set", None, true, "SET key:__rand_int__ 1 EX 86400"),
    CpuCase {
        label: "CL.THROTTLE",
        stat: "cl.throttle",
        algorithm: None,
        with_replica: true,
        peer: true,
        command: "CL.THROTTLE key:__rand_int__ 999 1000 86400 1",
    },
];

/// Commands that must answer without an error before anything is measured.
pub const SANITY: &[&str] = &[
    "RL.GCRA sanity:1 1000 1d",
    "RL.SLIDINGLOG sanity:2 1000 1d",
    "CL.THROTTLE sanity:3 999 1000 86400 1",
    "EVALSHA {token_bucket} 1 sanity:4 1000 0.011574074074074073 - 1",
    "EVALSHA {sliding_counter} 1 sanity:5 1000 86400000",
    "EVALSHA {zset_log} 1 sanity:6 - 86400000 1000",
];

/// The seeds' Lua scripts (scripts/lua/), adapted minimally: the time comes from the server's
/// TIME inside the script instead of from the caller; each file says exactly what changed.
/// `log_step` is a helper for the sliding-log rows (steps the debug clock, then calls).
pub const SCRIPTS: &[(&str, &str)] = &[
    ("token_bucket", "scripts/lua/token_bucket.lua"), // seed 000's token_bucket.lua
    ("sliding_counter", "scripts/lua/sliding_counter.lua"), // seed 003's sliding window counter
    ("zset_log", "scripts/lua/zset_log.lua"),         // seed 002's sorted-set sliding log
    ("log_step", "scripts/lua/log_step.lua"),
];

/// Requests per pipeline of the pipelined runs.
pub const PIPELINE: u64 = 16;
/// Keys whose PEXPIRETIME is compared between primary and replica after every replica run.
pub const EXPIRY_SAMPLE: u64 = 200;

/// The sliding log at its limit: one key hammered, for these limits.
pub const HAMMER_LIMITS: [u64; 3] = [10, 1000, 100_000];

/// One memory row: `keys` calls of the command, one per key (`@`).
#[derive(Debug)]
pub struct MemoryCase {
    pub label: &'static str,
    pub command: &'static str,
    /// Measured again on every other server found (the compat builds).
    pub on_other_servers: bool,
}

pub const MEM_SET_LABEL: &str = "SET k 1 EX 60 (baseline)";

pub const MEMORY_CASES: &[MemoryCase] = &[
    MemoryCase { label: MEM_SET_LABEL, command: "SET mem:@ 1 EX 60", on_other_servers: true },
    MemoryCase { label: "RL.GCRA", command: "RL.GCRA mem:@ 1000 1d", on_other_servers: true },
    MemoryCase { label: "RL.TOKENBUCKET", command: "RL.TOKENBUCKET mem:@ 1000 1d", on_other_servers: true },
    MemoryCase { label: "RL.LEAKY", command: "RL.LEAKY mem:@ 1000 1d", on_other_servers: false },
    MemoryCase { label: "RL.SLIDING", command: "RL.SLIDING mem:@ 1000 1d", on_other_servers: true },
    MemoryCase { label: "RL.FIXED", command: "RL.FIXED mem:@ 1000 1d", on_other_servers: false },
    MemoryCase { label: "RL.SLIDINGLOG (1 entry)", command: "RL.SLIDINGLOG mem:@ 1000 1d", on_other_servers: false },
    MemoryCase { label: "CL.THROTTLE", command: "CL.THROTTLE mem:@ 999 1000 86400 1", on_other_servers: false },
    MemoryCase {
        label: "Lua token bucket hash (seed 000)",
        command: "EVALSHA {token_bucket} 1 mem:@ 1000 0.011574074074074073 - 1",
        on_other_servers: false,
    },
];

/// redis-cell's memory rows, on its own server: its command, then the SET baseline there.
pub const CELL_MEMORY_COMMAND: &str = "CL.THROTTLE mem:@ 999 1000 86400 1";
pub const CELL_MEMORY_SET_COMMAND: &str = "SET mem:@ 1 EX 60";

/// The logs' memory: entries per key (BENCH_LOG_KEYS gives the keys for each).
pub const LOG_SIZES: [u64; 3] = [10, 100, 1000];

/// One log kind of the logs' memory rows.
#[derive(Debug)]
pub struct LogCase {
    pub label: &'static str,
    pub command: &'static str,
}

pub const LOG_CASES: [LogCase; 2] = [
    LogCase { label: "RL.SLIDINGLOG (distinct µs)", command: "RL.SLIDINGLOG log:@ 100000 1d" },
    // The sorted-set script stamps its own time (TIME); members stay distinct through its :seq key.
    LogCase { label: "Lua sorted set (seed 002)", command: "EVALSHA {zset_log} 1 log:@ - 86400000 100000" },
];

// ---------------------------------------------------------------------------------------------
// Targets (issue 12)
// ---------------------------------------------------------------------------------------------

/// The O(1) limiters, each against SET EX on the same server and against redis-cell.
pub const O1_LIMITERS: [&str; 6] = ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.FIXED", "RL.SLIDING", "CL.THROTTLE"];
/// Server CPU per op against SET EX's.
pub const VS_SET_EX: Bound = Bound::AtMost(1.25);
/// Server CPU per op against redis-cell's CL.THROTTLE (each × its own server's SET EX).
pub const VS_REDIS_CELL: Bound = Bound::AtMost(0.67);
/// RL.SLIDINGLOG against RL.GCRA (random keys).
pub const LOG_VS_GCRA: Bound = Bound::AtMost(1.5);
/// RL.SLIDINGLOG flat from limit 10 to 100,000: within this share of the first.
pub const LOG_FLAT_WITHIN: f64 = 0.25;
/// Bytes per stored request of the sliding log (the slope from 10 to 1,000 entries).
pub const LOG_BYTES_PER_ENTRY: Bound = Bound::AtMost(8.0);
/// Bytes per key of the O(1) limiters.
pub const MEMORY_LIMITERS: [&str; 5] = ["RL.GCRA", "RL.TOKENBUCKET", "RL.LEAKY", "RL.FIXED", "RL.SLIDING"];
pub const BYTES_PER_KEY: Bound = Bound::AtMost(128.0);
/// The Lua script each command must beat, by at least `VS_LUA` in server CPU per op.
pub const LUA_PAIRS: [(&str, &str); 7] = [
    ("RL.GCRA", LUA_TOKEN_BUCKET),
    ("RL.TOKENBUCKET", LUA_TOKEN_BUCKET),
    ("RL.LEAKY", LUA_TOKEN_BUCKET),
    ("CL.THROTTLE", LUA_TOKEN_BUCKET),
    ("RL.SLIDING", LUA_SLIDING_COUNTER),
    ("RL.FIXED", LUA_SLIDING_COUNTER),
    ("RL.SLIDINGLOG", LUA_ZSET_LOG),
];
pub const VS_LUA: Bound = Bound::AtLeast(4.0);
/// The rows of the "other servers" memory table: what `on_other_servers` selects.
pub fn other_server_cases() -> impl Iterator<Item = &'static MemoryCase> {
    MEMORY_CASES.iter().filter(|c| c.on_other_servers)
}
