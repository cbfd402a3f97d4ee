//! Counters for `INFO ratelimit` and the `rl.limited` keyspace event.
//!
//! Redis 7.0 gives modules no hook into CONFIG RESETSTAT, so the counters run from module load
//! (documented in docs/commands.md).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleInfoCtx, RedisModuleString};

use redis_ratelimit_core::Algorithm;

struct Counters {
    checks: AtomicU64,
    admitted_units: AtomicU64,
    limited: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to initialise the static array
const ZERO: Counters =
    Counters { checks: AtomicU64::new(0), admitted_units: AtomicU64::new(0), limited: AtomicU64::new(0) };
static COUNTERS: [Counters; 6] = [ZERO, ZERO, ZERO, ZERO, ZERO, ZERO];

fn slot(a: Algorithm) -> &'static Counters {
    &COUNTERS[Algorithm::ALL.iter().position(|x| *x == a).unwrap_or(0)]
}

pub fn record(algo: Algorithm, admitted: u64, limited: bool) {
    let c = slot(algo);
    c.checks.fetch_add(1, Relaxed);
    c.admitted_units.fetch_add(admitted, Relaxed);
    if limited {
        c.limited.fetch_add(1, Relaxed);
    }
}

/// Publishes `rl.limited` on the key (module event class): operators can watch what would be
/// blocked without touching the application. Costs a flag test when notifications are off.
pub fn notify_limited(ctx: *mut RedisModuleCtx, key: *mut RedisModuleString) {
    // SAFETY: ctx and key are the running command's (lib.rs); the event name is NUL-terminated.
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(ctx, raw::REDISMODULE_NOTIFY_MODULE, c"rl.limited".as_ptr(), key);
    }
}

/// The `ratelimit` section of INFO.
pub extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: i32) {
    // SAFETY: ctx is the INFO context Redis passes to this callback; every name and value is a
    // NUL-terminated string alive for its call, which Redis copies.
    let _ = std::panic::catch_unwind(|| unsafe {
        raw::RedisModule_InfoAddSection.unwrap()(ctx, c"".as_ptr());
        let version = concat!(env!("CARGO_PKG_VERSION"), "\0");
        raw::RedisModule_InfoAddFieldCString.unwrap()(ctx, c"version".as_ptr(), version.as_ptr() as *mut _);
        raw::RedisModule_InfoAddFieldULongLong.unwrap()(
            ctx,
            c"defrag_visits".as_ptr() as *mut _,
            crate::state::DEFRAG_VISITS.load(Relaxed),
        );
        raw::RedisModule_InfoAddFieldULongLong.unwrap()(
            ctx,
            c"defrag_moves".as_ptr() as *mut _,
            crate::state::DEFRAG_MOVES.load(Relaxed),
        );
        for a in Algorithm::ALL {
            let c = slot(a);
            let field = |suffix: &str, v: u64| {
                let name = format!("{}_{}\0", a.name(), suffix);
                raw::RedisModule_InfoAddFieldULongLong.unwrap()(ctx, name.as_ptr() as *mut _, v);
            };
            field("checks", c.checks.load(Relaxed));
            field("admitted_units", c.admitted_units.load(Relaxed));
            field("limited", c.limited.load(Relaxed));
        }
        let text = |name: &std::ffi::CStr, v: &str| {
            let v = std::ffi::CString::new(v).unwrap_or_default();
            raw::RedisModule_InfoAddFieldCString.unwrap()(ctx, name.as_ptr() as *mut _, v.as_ptr() as *mut _);
        };
        text(c"propagate_effects", crate::propagation::describe());
        if let Some(g) = crate::defrag_guard::current() {
            text(c"defrag_guard", g.guard.name());
            text(c"defrag_crash_risk", if g.crash_risk { "yes" } else { "no" });
        }
        if let Some(setting) = crate::eviction::current() {
            text(c"eviction_risk", if setting.at_risk() { "yes" } else { "no" });
            text(c"maxmemory_policy", &setting.policy);
            raw::RedisModule_InfoAddFieldULongLong.unwrap()(ctx, c"maxmemory".as_ptr() as *mut _, setting.maxmemory);
        }
    });
}
