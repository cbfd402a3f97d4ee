//! The module's clock: the host's wall clock, read once per command with microsecond
//! resolution, or, when the module was loaded with DEBUG_CLOCK, a clock tests can set.
//!
//! Where the server offers it (Redis 7.2+, Valkey), the wall clock is the server's cached
//! time (`RedisModule_CachedMicroseconds`): the instant the current command, MULTI/EXEC block
//! or script started, which Redis itself uses for key expiry there. Every limiter call in one
//! transaction or script then decides at the same instant, as the transaction is atomic. On
//! Redis 7.0 each call reads clock_gettime. The source only changes where `now` comes from:
//! the core decides from (state, params, now) alone, and a pinned debug clock wins over both.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_ratelimit_core::{Nanos, NANOS_PER_MICRO};

/// Latest instant the debug clock accepts (µs): the sliding log's timestamp range.
pub const MAX_DEBUG_US: i64 = redis_ratelimit_core::sliding_log::MAX_TS;

static DEBUG_ENABLED: AtomicBool = AtomicBool::new(false);
/// The pinned instant in µs, or REAL when the debug clock follows the host clock.
static PINNED_US: AtomicI64 = AtomicI64::new(REAL);
const REAL: i64 = i64::MIN;

pub fn enable_debug() {
    DEBUG_ENABLED.store(true, Ordering::Relaxed);
}

pub fn debug_enabled() -> bool {
    DEBUG_ENABLED.load(Ordering::Relaxed)
}

/// Where the wall clock comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// `RedisModule_CachedMicroseconds` (Redis 7.2+, Valkey).
    ServerCached,
    /// clock_gettime(CLOCK_REALTIME) at each call (Redis 7.0).
    Realtime,
}

pub fn source() -> ClockSource {
    // SAFETY: reading the API table filled in at load (None without the function, or outside
    // Redis).
    match unsafe { redis_module::raw::RedisModule_CachedMicroseconds } {
        Some(_) => ClockSource::ServerCached,
        None => ClockSource::Realtime,
    }
}

/// The host's wall clock in µs since the Unix epoch, from `source()`.
pub fn host_us() -> i64 {
    // SAFETY: reading the API table filled in at load.
    match unsafe { redis_module::raw::RedisModule_CachedMicroseconds } {
        // SAFETY: a function of the server's API table, callable from any command.
        Some(cached) => unsafe { cached() },
        None => real_us(),
    }
}

/// clock_gettime(CLOCK_REALTIME) in µs since the Unix epoch.
pub fn real_us() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}

/// Now, in µs since the epoch.
pub fn now_us() -> i64 {
    match PINNED_US.load(Ordering::Relaxed) {
        REAL => host_us(),
        pinned => pinned,
    }
}

/// Now, in ns since the epoch (a whole number of µs).
pub fn now() -> Nanos {
    Nanos::new(now_us() * NANOS_PER_MICRO)
}

/// Pins the debug clock at `us`.
pub fn set(us: i64) -> Result<(), &'static str> {
    if !(0..=MAX_DEBUG_US).contains(&us) {
        return Err("ERR unix_us must be between 0 and 9007199254740991");
    }
    PINNED_US.store(us, Ordering::Relaxed);
    Ok(())
}

/// Moves the debug clock by `delta` µs (negative steps backwards); a clock following the
/// host clock is pinned at the host's now first.
pub fn advance(delta: i64) -> Result<(), &'static str> {
    let to = now_us().checked_add(delta).ok_or("ERR clock out of range")?;
    set(to).map_err(|_| "ERR clock out of range")
}

pub fn follow_real() {
    PINNED_US.store(REAL, Ordering::Relaxed);
}
