//! Whether Redis may evict limiter keys. Every limiter key has a TTL, so every
//! `maxmemory-policy` but `noeviction` (the `volatile-*` ones included) evicts them under
//! memory pressure, and an evicted key is a fresh limit for its client. With `noeviction`
//! Redis refuses the checks instead (they are `deny-oom`). Without `maxmemory` (0) nothing is
//! evicted. The risk is warned about in the server log at load and whenever a `CONFIG SET`
//! makes it appear or change, and shown in `INFO ratelimit`.

use std::os::raw::{c_char, c_int, c_void};
use std::sync::Mutex;

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

/// What the last check found: the policy and maxmemory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Setting {
    pub policy: String,
    pub maxmemory: u64,
}

impl Setting {
    pub fn at_risk(&self) -> bool {
        self.maxmemory > 0 && self.policy != "noeviction"
    }
}

static CURRENT: Mutex<Option<Setting>> = Mutex::new(None);

/// The setting as last checked (None before the first check).
pub fn current() -> Option<Setting> {
    CURRENT.lock().ok().and_then(|s| s.clone())
}

/// Checks at load, then after every `CONFIG SET` (the config-change server event, Redis 7.0
/// and newer). Returns whether configuration changes are reported. (A module subscribes to an
/// event once: the same callback also tells `propagation`, which caches the AOF setting, and
/// `defrag_guard`.)
pub fn watch(ctx: *mut RedisModuleCtx) -> bool {
    check(ctx, "at load");
    crate::defrag_guard::check(ctx, "at load");
    let event = RedisModuleEvent { id: raw::REDISMODULE_EVENT_CONFIG, dataver: 1 };
    // SAFETY: OnLoad's context; the callback is a plain function that lives as long as the module.
    let subscribed = unsafe { raw::RedisModule_SubscribeToServerEvent.map(|f| f(ctx, event, Some(on_config))) };
    if subscribed != Some(raw::REDISMODULE_OK as c_int) {
        log(
            ctx,
            c"warning",
            "ratelimit: this server reports no configuration changes: the eviction risk is checked at load only",
        );
        return false;
    }
    true
}

unsafe extern "C" fn on_config(ctx: *mut RedisModuleCtx, _eid: RedisModuleEvent, _sub: u64, _data: *mut c_void) {
    crate::propagation::forget();
    let _ = std::panic::catch_unwind(|| {
        check(ctx, "after CONFIG SET");
        crate::defrag_guard::check(ctx, "after CONFIG SET");
    });
}

/// Reads the setting from `INFO memory` and logs when it puts limiter keys at risk (or stops
/// doing so). Logs only on a change, so unrelated `CONFIG SET`s stay quiet.
fn check(ctx: *mut RedisModuleCtx, when: &str) {
    let Some(now) = read(ctx) else { return };
    let previous = CURRENT.lock().ok().and_then(|mut s| s.replace(now.clone()));
    if previous.as_ref() == Some(&now) {
        return;
    }
    if now.at_risk() {
        log(
            ctx,
            c"warning",
            &format!(
                "ratelimit: maxmemory-policy {} with maxmemory {} lets Redis evict limiter keys ({when}): an evicted key \
                 is a fresh limit for its client, so limits can be exceeded under memory pressure. Use \
                 maxmemory-policy noeviction (checks are then refused with OOM instead), or give the limiter keys \
                 their own Redis. INFO ratelimit: eviction_risk",
                now.policy, now.maxmemory
            ),
        );
    } else if previous.is_some_and(|p| p.at_risk()) {
        log(
            ctx,
            c"notice",
            &format!(
                "ratelimit: limiter keys can no longer be evicted (maxmemory-policy {}, maxmemory {}) ({when})",
                now.policy, now.maxmemory
            ),
        );
    }
}

fn read(ctx: *mut RedisModuleCtx) -> Option<Setting> {
    // SAFETY: ctx is a context Redis passed us (OnLoad's or an event's); the info object is ours
    // until freed below, and its field string is copied before that.
    unsafe {
        let info = raw::RedisModule_GetServerInfo?(ctx, c"memory".as_ptr());
        if info.is_null() {
            return None;
        }
        let policy = raw::RedisModule_ServerInfoGetFieldC?(info, c"maxmemory_policy".as_ptr());
        let policy = (!policy.is_null()).then(|| std::ffi::CStr::from_ptr(policy).to_string_lossy().into_owned());
        let mut err: c_int = 0;
        let maxmemory = raw::RedisModule_ServerInfoGetFieldUnsigned?(info, c"maxmemory".as_ptr(), &mut err);
        raw::RedisModule_FreeServerInfo?(ctx, info);
        Some(Setting { policy: policy?, maxmemory: if err == 0 { maxmemory } else { 0 } })
    }
}

fn log(ctx: *mut RedisModuleCtx, level: &std::ffi::CStr, msg: &str) {
    let msg = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a context Redis passed us; "%s" formats the one NUL-terminated string given.
    unsafe { raw::RedisModule_Log.unwrap()(ctx, level.as_ptr(), c"%s".as_ptr(), msg.as_ptr() as *const c_char) };
}
