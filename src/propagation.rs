//! Whether an effect has anywhere to go.
//!
//! Redis drops a propagated command when the AOF is off and this server is a primary with no
//! replication backlog and no replica (`shouldPropagate` in server.c): nothing will ever read
//! it. Building the module's RL.SETSTATE for it anyway costs more than a third of a call
//! (`RM_Replicate` looks the command name up and creates its argument objects, about 3,700
//! instructions of RL.GCRA's 10,000), so the module asks the same question first and skips
//! the call when the answer is no. The state of the keys is the same either way; what is
//! skipped is only what Redis would have thrown away.
//!
//! None of this is in a call's arguments, so the answer is cached: found from the context flags
//! (the AOF, the role) and `INFO replication` (the backlog, the replicas) at the first effect,
//! and found again at the next effect after any server event that can change it:
//! - a replica's SYNC creates the backlog before anything needs it: the replica's stream starts
//!   at the fork that produces its RDB, and the fork (`FORK_CHILD` born, fired in the parent)
//!   makes the next call look again, before it writes;
//! - becoming a replica (`REPLICATION_ROLE_CHANGED`, `MASTER_LINK_CHANGE`), a replica coming
//!   or going (`REPLICA_CHANGE`), loading a dataset (`LOADING`: an RDB with replication
//!   metadata restores the backlog, so that replicas can resynchronize partially after a
//!   restart) and any `CONFIG SET` (`appendonly`) do the same;
//! - when an event cannot be subscribed to, effects are always propagated.
//!
//! Being wrong on the safe side (propagating what Redis drops) costs time only; the INFO read
//! costs a few microseconds once per event. All of this runs on Redis's main thread.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

const UNKNOWN: u8 = 0;
const NOT_NEEDED: u8 = 1;
const NEEDED: u8 = 2;

/// Whether effects are needed, as last found (UNKNOWN: find it again at the next effect).
static ANSWER: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Every event that invalidates ANSWER is subscribed to; without them, always propagate.
static WATCHING: AtomicBool = AtomicBool::new(false);

const EVENTS: [u64; 5] = [
    raw::REDISMODULE_EVENT_FORK_CHILD,
    raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
    raw::REDISMODULE_EVENT_MASTER_LINK_CHANGE,
    raw::REDISMODULE_EVENT_REPLICA_CHANGE,
    raw::REDISMODULE_EVENT_LOADING,
];

/// Subscribes to the events that can make a backlog, a replica or the AOF appear. Called at
/// load; `config_events`: the configuration-change event is subscribed to (by `eviction`,
/// whose callback calls `forget`).
pub fn watch(ctx: *mut RedisModuleCtx, config_events: bool) {
    // SAFETY: reading the API table.
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else { return };
    let all = EVENTS.iter().all(|&id| {
        let event = RedisModuleEvent { id, dataver: 1 };
        // SAFETY: OnLoad's context; the callback is a plain function that lives as long as the
        // module.
        unsafe { subscribe(ctx, event, Some(on_event)) == raw::REDISMODULE_OK as c_int }
    });
    WATCHING.store(all && config_events, Relaxed);
}

unsafe extern "C" fn on_event(_ctx: *mut RedisModuleCtx, _eid: RedisModuleEvent, _sub: u64, _data: *mut c_void) {
    forget();
}

/// The answer may have changed: find it again before the next effect.
pub fn forget() {
    ANSWER.store(UNKNOWN, Relaxed);
}

/// False when nothing would read an effect written now (no AOF, no backlog, no replica): the
/// caller then builds none. The write is still counted for the save points
/// (`rdb_changes_since_last_save`), which Redis counts in `RM_Replicate`: by
/// `RM_ReplicateVerbatim`, which costs nothing when nothing propagates. (Between a replica's
/// SYNC and the fork of its RDB, the only time a backlog exists while this answers false, that
/// puts the command's own words in the backlog, before the offset any replica is given: no
/// replica or AOF ever reads them.)
pub fn needed(ctx: *mut RedisModuleCtx) -> bool {
    let needed = effects_have_readers(ctx);
    if !needed {
        // SAFETY: ctx is the running command's context (lib.rs).
        unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx) };
    }
    needed
}

fn effects_have_readers(ctx: *mut RedisModuleCtx) -> bool {
    match ANSWER.load(Relaxed) {
        _ if !WATCHING.load(Relaxed) => true,
        NEEDED => true,
        NOT_NEEDED => false,
        _ => find(ctx),
    }
}

fn find(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: ctx is the running command's context (lib.rs).
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    if flags & raw::REDISMODULE_CTX_FLAGS_LOADING != 0 {
        return true; // (Redis drops it; found again once loaded.)
    }
    let needed = flags & raw::REDISMODULE_CTX_FLAGS_AOF != 0
        || flags & raw::REDISMODULE_CTX_FLAGS_MASTER == 0
        || backlog_or_replica(ctx).unwrap_or(true);
    ANSWER.store(if needed { NEEDED } else { NOT_NEEDED }, Relaxed);
    needed
}

/// For INFO: "yes" (effects are propagated), "no" (not built: no AOF, no backlog, no replica
/// when last checked) or "unknown" (checked again at the next effect).
pub fn describe() -> &'static str {
    match (WATCHING.load(Relaxed), ANSWER.load(Relaxed)) {
        (false, _) | (_, NEEDED) => "yes",
        (true, NOT_NEEDED) => "no",
        _ => "unknown",
    }
}

/// Whether this server keeps a replication backlog, has replicas or is not a primary, from
/// INFO replication (None when a field cannot be read).
fn backlog_or_replica(ctx: *mut RedisModuleCtx) -> Option<bool> {
    // SAFETY: ctx is the running command's context; the info object is ours until freed below,
    // and its role string is read before that.
    unsafe {
        let info = raw::RedisModule_GetServerInfo?(ctx, c"replication".as_ptr());
        if info.is_null() {
            return None;
        }
        let field = |name: &std::ffi::CStr| {
            let mut err: c_int = 0;
            let v = raw::RedisModule_ServerInfoGetFieldUnsigned.map(|f| f(info, name.as_ptr(), &mut err));
            v.filter(|_| err == 0)
        };
        let backlog = field(c"repl_backlog_active");
        let replicas = field(c"connected_slaves");
        let role = raw::RedisModule_ServerInfoGetFieldC.map(|f| f(info, c"role".as_ptr()));
        let primary = role.filter(|p| !p.is_null()).map(|p| std::ffi::CStr::from_ptr(p).to_bytes() == b"master");
        raw::RedisModule_FreeServerInfo?(ctx, info);
        Some(backlog? != 0 || replicas? != 0 || !primary?)
    }
}
