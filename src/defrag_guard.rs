//! Keeps Valkey 8.0 from crashing in active defragmentation (issue 17.2). A server bug, not the
//! module's: Valkey 8.0's `kvstoreDictLUTDefrag` moves a database's dict struct to a new
//! address while the kvstore's list of rehashing dicts still holds the old one (Redis fixed the
//! same code before 7.4.0, redis/redis#13231; Valkey in valkey-io/valkey#1512, January 2025).
//! `activerehashing` then rehashes the freed copy from `serverCron` while lookups rehash the
//! live one, over the same tables: `dict.c:487` asserts or `dictRehash` dereferences a freed
//! table. It needs a dict that is rehashing when a defrag pass starts (after a burst of writes
//! or expiries) and whose struct sits in a sparse slab; any keyspace does, strings included
//! (tests/defrag_guard.rs reproduces it in seconds, with or without this module's keys).
//!
//! The freed copy is only ever read through that list, by active rehashing, and only until the
//! live dict finishes its rehash (which removes the list's node). So on Valkey 8.0 the module
//! keeps `activerehashing` off while `activedefrag` is on, and after it is turned off until no
//! dict is rehashing (`mem_overhead_db_hashtable_rehashing` 0, checked every second): it sets it
//! `no` at load and after every `CONFIG SET` that turns either on, logs a warning, and sets it
//! back to `yes` afterwards if it was the one that turned it off. Rehashing still goes on, one
//! bucket at each access to a dict, as on every server. The module argument `NO_DEFRAG_GUARD`
//! leaves the configuration alone (for a build that carries the fix); the warning and `INFO
//! ratelimit`'s `defrag_crash_risk:yes` remain.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use redis_module::raw::{self, RedisModuleCtx};

/// What the guard does on this server, for INFO ratelimit `defrag_guard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// The server has no such bug (Redis, Valkey other than 8.0).
    NotNeeded,
    /// Valkey 8.0 with `activedefrag no`: nothing to do.
    Standby,
    /// Valkey 8.0 with `activedefrag yes`, or a dict it may have moved is still rehashing:
    /// `activerehashing` is kept off.
    Active,
    /// Valkey 8.0 with the module argument `NO_DEFRAG_GUARD`.
    Disabled,
    /// Valkey 8.0 with `activedefrag yes`, and `activerehashing` could not be turned off.
    Failed,
}

impl Guard {
    pub fn name(self) -> &'static str {
        match self {
            Guard::NotNeeded => "not-needed",
            Guard::Standby => "standby",
            Guard::Active => "active",
            Guard::Disabled => "disabled",
            Guard::Failed => "failed",
        }
    }
}

/// The state as last checked: the guard, and whether the crash can happen now (Valkey 8.0,
/// `activedefrag yes` and `activerehashing yes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub guard: Guard,
    pub crash_risk: bool,
}

static STATUS: Mutex<Option<Status>> = Mutex::new(None);
/// Set by the module argument `NO_DEFRAG_GUARD`.
static DISABLED: AtomicBool = AtomicBool::new(false);
/// The module set `activerehashing no` (and sets it back when `activedefrag` goes off).
static TURNED_OFF: AtomicBool = AtomicBool::new(false);
/// Defragmentation ran and a dict it may have moved can still be rehashing.
static LEFTOVERS: AtomicBool = AtomicBool::new(false);
/// The one-second re-check while `LEFTOVERS` waits for the rehashing to end.
static TIMER_ARMED: AtomicBool = AtomicBool::new(false);
/// A check is running: its own `CONFIG SET` fires the config event again.
static CHECKING: AtomicBool = AtomicBool::new(false);

pub fn disable() {
    DISABLED.store(true, Relaxed);
}

/// The status as last checked (None before the first check).
pub fn current() -> Option<Status> {
    STATUS.lock().ok().and_then(|s| *s)
}

/// Valkey 8.0.x, whose kvstore has the stale rehashing list (8.1 replaced its dicts).
fn affected_version(server_name: Option<&str>, valkey_version: Option<&str>) -> bool {
    let mut parts = valkey_version.unwrap_or("").split('.').map(|p| p.parse::<u32>().ok());
    server_name == Some("valkey") && parts.next() == Some(Some(8)) && parts.next() == Some(Some(0))
}

/// Checks the server and its configuration at load and after every `CONFIG SET` (called by
/// `eviction`'s config-change subscription), and acts as described at the top.
pub fn check(ctx: *mut RedisModuleCtx, when: &str) {
    if CHECKING.swap(true, Relaxed) {
        return;
    }
    let status = decide(ctx, when);
    if let Ok(mut s) = STATUS.lock() {
        *s = Some(status);
    }
    CHECKING.store(false, Relaxed);
}

fn decide(ctx: *mut RedisModuleCtx, when: &str) -> Status {
    let (name, version) = server_identity(ctx);
    if !affected_version(name.as_deref(), version.as_deref()) {
        return Status { guard: Guard::NotNeeded, crash_risk: false };
    }
    let version = version.unwrap_or_default();
    let (Some(defrag), Some(rehashing)) = (config_bool(ctx, c"activedefrag"), config_bool(ctx, c"activerehashing"))
    else {
        log(ctx, c"warning", &format!("ratelimit: could not read activedefrag / activerehashing ({when})"));
        return Status { guard: Guard::Failed, crash_risk: true };
    };
    let bug = format!(
        "Valkey {version} can crash when active defragmentation moves a dict that is rehashing while \
         activerehashing is on (valkey-io/valkey#1512, fixed in Valkey 8.1)"
    );
    if DISABLED.load(Relaxed) {
        let risk = defrag && rehashing;
        if risk && !current().is_some_and(|s| s.crash_risk) {
            log(
                ctx,
                c"warning",
                &format!(
                    "ratelimit: {bug}; NO_DEFRAG_GUARD is set, so activedefrag and activerehashing stay on ({when}). \
                     INFO ratelimit: defrag_crash_risk"
                ),
            );
        }
        return Status { guard: Guard::Disabled, crash_risk: risk };
    }
    if defrag {
        LEFTOVERS.store(true, Relaxed);
    } else if LEFTOVERS.load(Relaxed) && rehashing_overhead(ctx) == Some(0) {
        LEFTOVERS.store(false, Relaxed);
    }
    if !LEFTOVERS.load(Relaxed) {
        if TURNED_OFF.swap(false, Relaxed) && !rehashing && config_set(ctx, c"activerehashing", c"yes") {
            log(
                ctx,
                c"notice",
                &format!(
                    "ratelimit: activedefrag is off and no dict is rehashing: activerehashing is back on ({when})"
                ),
            );
        }
        return Status { guard: Guard::Standby, crash_risk: false };
    }
    if !defrag {
        arm_timer(ctx);
    }
    if !rehashing {
        return Status { guard: Guard::Active, crash_risk: false };
    }
    let why = if defrag {
        "while activedefrag is on"
    } else {
        "until the dicts defragmentation may have moved finish rehashing"
    };
    if config_set(ctx, c"activerehashing", c"no") {
        TURNED_OFF.store(true, Relaxed);
        log(
            ctx,
            c"warning",
            &format!(
                "ratelimit: {bug}: set activerehashing no {why} ({when}); rehashing goes on at each access. Upgrade \
                 to Valkey 8.1+, or load the module with NO_DEFRAG_GUARD on a build with the fix"
            ),
        );
        Status { guard: Guard::Active, crash_risk: false }
    } else {
        log(
            ctx,
            c"warning",
            &format!("ratelimit: {bug}, and CONFIG SET activerehashing no failed ({when}): turn off activedefrag"),
        );
        Status { guard: Guard::Failed, crash_risk: true }
    }
}

/// Re-checks once a second while defragmentation's leftovers may still be rehashing.
fn arm_timer(ctx: *mut RedisModuleCtx) {
    if TIMER_ARMED.swap(true, Relaxed) {
        return;
    }
    unsafe extern "C" fn fire(ctx: *mut RedisModuleCtx, _data: *mut std::os::raw::c_void) {
        TIMER_ARMED.store(false, Relaxed);
        let _ = std::panic::catch_unwind(|| check(ctx, "rehashing check"));
    }
    // SAFETY: ctx is the live context of the caller (load, config event or timer), on the main
    // thread; the timer carries no data.
    let created = unsafe { raw::RedisModule_CreateTimer.map(|f| f(ctx, 1000, Some(fire), std::ptr::null_mut())) };
    if created.is_none() {
        TIMER_ARMED.store(false, Relaxed);
    }
}

/// `mem_overhead_db_hashtable_rehashing` from INFO memory: 0 when no database dict is rehashing.
fn rehashing_overhead(ctx: *mut RedisModuleCtx) -> Option<u64> {
    // SAFETY: the server info object is read and freed here, within the caller's context.
    unsafe {
        let info = raw::RedisModule_GetServerInfo?(ctx, c"memory".as_ptr());
        if info.is_null() {
            return None;
        }
        let mut err: c_int = 0;
        let v = raw::RedisModule_ServerInfoGetFieldUnsigned?(
            info,
            c"mem_overhead_db_hashtable_rehashing".as_ptr(),
            &mut err,
        );
        raw::RedisModule_FreeServerInfo?(ctx, info);
        (err == 0).then_some(v)
    }
}

/// `server_name` and `valkey_version` from INFO server (Redis has neither).
fn server_identity(ctx: *mut RedisModuleCtx) -> (Option<String>, Option<String>) {
    // SAFETY: as rehashing_overhead; field strings are copied before the info is freed.
    unsafe {
        let (Some(get), Some(field), Some(free)) =
            (raw::RedisModule_GetServerInfo, raw::RedisModule_ServerInfoGetFieldC, raw::RedisModule_FreeServerInfo)
        else {
            return (None, None);
        };
        let info = get(ctx, c"server".as_ptr());
        if info.is_null() {
            return (None, None);
        }
        let read = |name: &CStr| {
            let v = field(info, name.as_ptr());
            (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
        };
        let out = (read(c"server_name"), read(c"valkey_version"));
        free(ctx, info);
        out
    }
}

/// A yes/no configuration value through `CONFIG GET` (RESP2: [name, value]).
fn config_bool(ctx: *mut RedisModuleCtx, name: &CStr) -> Option<bool> {
    // SAFETY: the reply (and its element's bytes, copied) is used before it is freed; the
    // arguments are NUL-terminated C strings as the "cc" format says.
    unsafe {
        let call = raw::RedisModule_Call?;
        let reply = call(ctx, c"CONFIG".as_ptr(), c"cc".as_ptr(), c"GET".as_ptr(), name.as_ptr());
        if reply.is_null() {
            return None;
        }
        let value = raw::RedisModule_CallReplyArrayElement?(reply, 1);
        let mut len = 0usize;
        let text = (!value.is_null()).then(|| {
            let p = raw::RedisModule_CallReplyStringPtr.unwrap()(value, &mut len);
            if p.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p as *const u8, len).to_vec()
            }
        });
        raw::RedisModule_FreeCallReply.unwrap()(reply);
        match text.as_deref() {
            Some(b"yes") => Some(true),
            Some(b"no") => Some(false),
            _ => None,
        }
    }
}

fn config_set(ctx: *mut RedisModuleCtx, name: &CStr, value: &CStr) -> bool {
    // SAFETY: as config_bool ("ccc": three C strings).
    unsafe {
        let Some(call) = raw::RedisModule_Call else { return false };
        let reply = call(ctx, c"CONFIG".as_ptr(), c"ccc".as_ptr(), c"SET".as_ptr(), name.as_ptr(), value.as_ptr());
        if reply.is_null() {
            return false;
        }
        let ok = raw::RedisModule_CallReplyType.unwrap()(reply) != raw::REDISMODULE_REPLY_ERROR as c_int;
        raw::RedisModule_FreeCallReply.unwrap()(reply);
        ok
    }
}

fn log(ctx: *mut RedisModuleCtx, level: &CStr, msg: &str) {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the message is passed as the argument of a "%s" format.
    unsafe { raw::RedisModule_Log.unwrap()(ctx, level.as_ptr(), c"%s".as_ptr(), msg.as_ptr() as *const c_char) };
}

#[cfg(test)]
mod tests {
    use super::affected_version;

    #[test]
    fn only_valkey_8_0_is_affected() {
        assert!(affected_version(Some("valkey"), Some("8.0.1")));
        assert!(affected_version(Some("valkey"), Some("8.0.0")));
        assert!(affected_version(Some("valkey"), Some("8.0.6")));
        assert!(!affected_version(Some("valkey"), Some("8.1.0")));
        assert!(!affected_version(Some("valkey"), Some("7.2.5")));
        assert!(!affected_version(Some("valkey"), Some("9.0.0")));
        assert!(!affected_version(None, None));
        assert!(!affected_version(Some("redis"), Some("8.0.1")));
        assert!(!affected_version(Some("valkey"), Some("80.0.1")));
    }
}
