//! The native data type `ratelimit`, its callbacks, and the key access the commands use.
//!
//! A key's value is a `core::codec::State`, boxed or packed into the value word itself (see
//! `value`: GCRA, leaky, fixed and sliding states usually need no allocation). Every callback
//! Redis 7.0 may call is implemented (it calls them without checking for null): RDB save/load,
//! AOF rewrite, free, memory usage, digest and copy; and active defragmentation where the server
//! can run it. Each runs behind `catch_unwind`: a panic must never reach redis-server.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::core::codec::{State, ENCODING_VERSION};
use crate::core::gcra;
use crate::core::spec::{Spec, Update};
use crate::core::Rate;
use crate::value::{self, Loaded};

/// The type name identifies the RDB payload for life: never change it.
pub static RL_TYPE: RedisType = RedisType::new(
    "ratelimit",
    ENCODING_VERSION as i32,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: Some(defrag),
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// The internal command that carries a state (or a sliding-log change) to replicas, the AOF
/// and AOF rewrites.
pub const SETSTATE: &std::ffi::CStr = c"RL.SETSTATE";

/// Module options, set once at load:
/// * `HANDLE_IO_ERRORS`: `rdb_load` checks `RedisModule_IsIOError` and refuses a malformed
///   value, instead of Redis aborting the whole server on a short read inside the module.
/// * `NO_IMPLICIT_SIGNAL_MODIFIED`: closing a key opened for writing is not by itself a
///   modification (that would abort other clients' WATCH and send CLIENT TRACKING
///   invalidations for calls that write nothing); `Key` signals only real writes.
pub fn set_module_options(ctx: *mut RedisModuleCtx) {
    let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    unsafe { raw::RedisModule_SetModuleOptions.unwrap()(ctx, options as c_int) };
}

fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Loads a value from an RDB file, a full sync or a RESTORE payload. The bytes are untrusted
/// (a DUMP payload only carries a checksum): with `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS` set
/// (see `set_module_options`) a short read or a wrong opcode sets the IO error instead of
/// aborting redis-server, and returning NULL makes Redis refuse the value (RESTORE answers an
/// error and stores nothing; a file that fails to load stops the load as it always did).
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        if encver < 1 || encver > ENCODING_VERSION as c_int {
            return std::ptr::null_mut();
        }
        let mut len = 0usize;
        let buf = raw::RedisModule_LoadStringBuffer.unwrap()(rdb, &mut len);
        let failed = raw::RedisModule_IsIOError.unwrap()(rdb) != 0;
        if buf.is_null() || failed {
            if !buf.is_null() {
                raw::RedisModule_Free.unwrap()(buf as *mut c_void);
            }
            return std::ptr::null_mut();
        }
        let bytes = std::slice::from_raw_parts(buf as *const u8, len);
        let state = State::decode(bytes);
        raw::RedisModule_Free.unwrap()(buf as *mut c_void);
        match state {
            Ok(s) => value::into_word(s, None),
            Err(_) => std::ptr::null_mut(),
        }
    })
}

/// The state behind a value word (boxed or inline).
unsafe fn loaded(value: *const c_void) -> Option<Loaded> {
    Loaded::from_word(value as *mut c_void)
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        let Some(state) = loaded(value) else { return };
        let bytes = state.encode();
        raw::RedisModule_SaveStringBuffer.unwrap()(rdb, bytes.as_ptr() as *const c_char, bytes.len());
    })
}

unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut RedisModuleString, value: *mut c_void) {
    guarded((), || {
        // The TTL is written by Redis itself (PEXPIREAT) after the value.
        let Some(state) = loaded(value) else { return };
        let bytes = state.encode();
        raw::RedisModule_EmitAOF.unwrap()(
            aof,
            SETSTATE.as_ptr(),
            c"sb".as_ptr(),
            key,
            bytes.as_ptr() as *const c_char,
            bytes.len(),
        );
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guarded(0, || loaded(value).map_or(0, |s| value::value_bytes(&s, value::form(value))))
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        let Some(state) = loaded(value) else { return };
        let bytes = state.encode();
        raw::RedisModule_DigestAddStringBuffer.unwrap()(md, bytes.as_ptr() as *const c_char, bytes.len());
        raw::RedisModule_DigestEndSequence.unwrap()(md);
    })
}

/// Values active defragmentation visited, and allocations it moved, since load (INFO ratelimit).
pub static DEFRAG_VISITS: AtomicU64 = AtomicU64::new(0);
pub static DEFRAG_MOVES: AtomicU64 = AtomicU64::new(0);

/// Active defragmentation (servers built with Redis' jemalloc and `activedefrag yes`): moves the
/// value's allocations (the boxed state; for a sliding log also its box and its entry
/// buffer) where `RedisModule_DefragAlloc` says. Only addresses change, never a byte of the
/// state. Everything is moved in one call (a few allocations per key), so it returns 0: done.
unsafe extern "C" fn defrag(
    ctx: *mut raw::RedisModuleDefragCtx,
    _key: *mut RedisModuleString,
    value: *mut *mut c_void,
) -> c_int {
    guarded(0, || {
        DEFRAG_VISITS.fetch_add(1, Relaxed);
        let Some(defrag_alloc) = raw::RedisModule_DefragAlloc else { return 0 };
        let Some(allocation) = value::allocation(*value) else {
            return 0; // an inline state owns no allocation
        };
        // DefragAlloc copies the allocation, frees the old one and returns the copy, or null
        // when it leaves it where it is.
        let moved = |p: *mut c_void| -> *mut c_void {
            let new = defrag_alloc(ctx, p);
            if new.is_null() {
                p
            } else {
                DEFRAG_MOVES.fetch_add(1, Relaxed);
                new
            }
        };
        let compact = value::form(*value) == value::Form::Compact;
        *value = value::moved_word(*value, moved(allocation));
        if compact {
            return 0; // a compact token bucket is one allocation
        }
        if let State::SlidingLog(log) = &mut *(*value as *mut State) {
            // Nothing between the read and the write can unwind.
            let inner = Box::into_raw(std::ptr::read(log));
            std::ptr::write(log, Box::from_raw(moved(inner.cast()).cast()));
            defrag_vec(log.log.buffer_mut(), &moved);
        }
        0
    })
}

/// Moves a Vec's buffer, by its raw parts (no reallocation).
unsafe fn defrag_vec<T>(vec: &mut Vec<T>, moved: &impl Fn(*mut c_void) -> *mut c_void) {
    if vec.capacity() == 0 {
        return; // no allocation (a dangling pointer)
    }
    let mut v = ManuallyDrop::new(std::mem::take(vec));
    let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    *vec = Vec::from_raw_parts(moved(ptr.cast()).cast::<T>(), len, cap);
}

unsafe extern "C" fn free(value: *mut c_void) {
    guarded((), || value::free(value))
}

unsafe extern "C" fn copy(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), || match loaded(value) {
        Some(s) => value::into_word((*s).clone(), value::table_id(value)),
        None => std::ptr::null_mut(),
    })
}

/// What a key holds.
pub enum Held {
    Missing,
    Ours(Loaded),
    /// A string (redis-cell keeps its state in one).
    String,
    Other,
}

/// What a key holds as the commands see it: a ratelimit state, or a key redis-cell left (a
/// string holding the theoretical arrival time in ns, in decimal).
pub enum Stored {
    Missing,
    Ours(Loaded),
    Cell { tat_ns: i64 },
}

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A redis-cell key as the GCRA state it is under `spec`'s rate. redis-cell stores only the
/// arrival time (its parameters come with every call, as ours do), so the same instant read
/// with the caller's rate is exactly the state CL.THROTTLE would have decided on. For any
/// other algorithm the GCRA state only makes the check answer the usual algorithm mismatch.
pub fn cell_state(tat_ns: i64, spec: &Spec) -> State {
    let rate = match *spec {
        Spec::Gcra(r) | Spec::TokenBucket(r) | Spec::Leaky(r) => r,
        Spec::Sliding(w) | Spec::Fixed(w) | Spec::SlidingLog(w) => {
            Rate { limit: w.limit, period: w.window, burst: w.limit }
        }
    };
    State::Gcra(gcra::State { rate, tat: tat_ns as i128 * rate.limit as i128 })
}

/// An open key, closed on drop. Keys are opened for writing by the commands that may write,
/// but with `NO_IMPLICIT_SIGNAL_MODIFIED` closing one is not a modification: only `set`,
/// `delete` and `expire_at` mark the key, and a marked key is signalled (WATCH, CLIENT
/// TRACKING) once when it is closed.
pub struct Key {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
    pub name: *mut RedisModuleString,
    modified: Cell<bool>,
}

impl Key {
    pub fn open(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString, write: bool) -> Key {
        let mode = if write { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } else { raw::REDISMODULE_READ };
        // SAFETY: ctx and name come from the command invocation.
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode as c_int) };
        Key { ctx, key, name, modified: Cell::new(false) }
    }

    pub fn held(&self) -> Held {
        unsafe {
            match raw::RedisModule_KeyType.unwrap()(self.key) as isize {
                raw::REDISMODULE_KEYTYPE_EMPTY => Held::Missing,
                raw::REDISMODULE_KEYTYPE_STRING => Held::String,
                raw::REDISMODULE_KEYTYPE_MODULE
                    if raw::RedisModule_ModuleTypeGetType.unwrap()(self.key) == *RL_TYPE.raw_type.borrow() =>
                {
                    match Loaded::from_word(raw::RedisModule_ModuleTypeGetValue.unwrap()(self.key)) {
                        Some(v) => Held::Ours(v),
                        None => Held::Other,
                    }
                }
                _ => Held::Other,
            }
        }
    }

    /// The one place that decides what a key holds for the commands: a ratelimit state, a
    /// redis-cell string, or WRONGTYPE for anything else (a string that is not an arrival
    /// time included).
    pub fn stored(&self) -> Result<Stored, String> {
        match self.held() {
            Held::Missing => Ok(Stored::Missing),
            Held::Ours(s) => Ok(Stored::Ours(s)),
            Held::String => match self.string().and_then(|b| std::str::from_utf8(&b).ok()?.parse::<i64>().ok()) {
                Some(tat_ns) => Ok(Stored::Cell { tat_ns }),
                None => Err(format!("{WRONGTYPE} (not a redis-cell arrival time)")),
            },
            Held::Other => Err(WRONGTYPE.to_string()),
        }
    }

    /// The state a check of `spec` decides against (a redis-cell key read as `cell_state`);
    /// None for a missing key.
    pub fn state_for(&self, spec: &Spec) -> Result<Option<Loaded>, String> {
        Ok(match self.stored()? {
            Stored::Missing => None,
            Stored::Ours(s) => Some(s),
            Stored::Cell { tat_ns } => Some(Loaded::Foreign(cell_state(tat_ns, spec))),
        })
    }

    /// A string value's bytes, read through `GET`: `RedisModule_StringDMA` would convert an
    /// int-encoded string (redis-cell's) to raw, a visible change (`OBJECT ENCODING`) made by
    /// a call that writes nothing. Only keys redis-cell left take this path.
    fn string(&self) -> Option<Vec<u8>> {
        unsafe {
            let reply = raw::RedisModule_Call.unwrap()(self.ctx, c"GET".as_ptr(), c"s".as_ptr(), self.name);
            if reply.is_null() {
                return None;
            }
            let mut len = 0usize;
            let value = (raw::RedisModule_CallReplyType.unwrap()(reply) == raw::REDISMODULE_REPLY_STRING as c_int)
                .then(|| {
                    let p = raw::RedisModule_CallReplyStringPtr.unwrap()(reply, &mut len);
                    std::slice::from_raw_parts(p as *const u8, len).to_vec()
                });
            raw::RedisModule_FreeCallReply.unwrap()(reply);
            value
        }
    }

    /// Stores a new value, replacing whatever the key held (Redis drops the key's TTL).
    pub fn set(&self, state: State) -> Result<(), String> {
        self.put_over(None, state)
    }

    /// Stores a new value given what the key held (`prior`: as read since the key was opened).
    /// A value of ours is swapped in place (the key and its TTL stay); anything else is
    /// replaced, as by `set`.
    pub fn put_over(&self, prior: Option<&Loaded>, state: State) -> Result<(), String> {
        let ty = *RL_TYPE.raw_type.borrow();
        let hint = match prior {
            None | Some(Loaded::Foreign(_)) => {
                let word = value::into_word(state, None);
                let status = unsafe { raw::RedisModule_ModuleTypeSetValue.unwrap()(self.key, ty, word) };
                if status != raw::REDISMODULE_OK as c_int {
                    unsafe { value::free(word) };
                    return Err("ERR could not store the value".into());
                }
                self.modified.set(true);
                return Ok(());
            }
            Some(Loaded::Inline(_, id)) => Some(*id),
            // A compact token bucket stays in its box when its rate has a table id.
            Some(Loaded::Compact(old, p)) => {
                if unsafe { value::overwrite_compact(*p, old, &state) } {
                    self.modified.set(true);
                    return Ok(());
                }
                None
            }
            Some(Loaded::Boxed(_)) => None,
        };
        let word = match (value::small_word(&state, hint), prior) {
            (Some(w), _) => w,
            // Boxed before and after: overwrite the box.
            (None, Some(Loaded::Boxed(p))) => {
                unsafe { **p = state };
                self.modified.set(true);
                return Ok(());
            }
            (None, _) => Box::into_raw(Box::new(state)) as *mut c_void,
        };
        let mut old: *mut c_void = std::ptr::null_mut();
        // (Inline words and compact boxes are only made when this function exists:
        // value::enable_inline.)
        let replace = unsafe { raw::RedisModule_ModuleTypeReplaceValue.unwrap() };
        if unsafe { replace(self.key, ty, word, &mut old) } != raw::REDISMODULE_OK as c_int {
            unsafe { value::free(word) };
            return Err("ERR could not store the value".into());
        }
        unsafe { value::free(old) };
        self.modified.set(true);
        Ok(())
    }

    /// Applies an update to the key (see `Update::apply`): a whole state replaces the value, a
    /// sliding-log commit changes the boxed log in place. The outer error: the value could not
    /// be stored; the inner one: the update does not apply to what the key holds.
    pub fn apply(&self, update: &Update) -> Result<Result<(), &'static str>, String> {
        match self.held() {
            Held::Ours(mut prior) => self.apply_over(Some(&mut prior), update),
            _ => self.apply_over(None, update),
        }
    }

    /// `apply`, given what the key held (as for `put_over`).
    pub fn apply_over(&self, prior: Option<&mut Loaded>, update: &Update) -> Result<Result<(), &'static str>, String> {
        let prior = prior.filter(|p| !matches!(p, Loaded::Foreign(_)));
        let replaced = match (update, prior) {
            (Update::Replace(s), prior) => return self.put_over(prior.map(|p| &*p), s.clone()).map(Ok),
            (Update::Log(_), Some(v)) => {
                // A log is always boxed; any other state refuses the commit (checked by apply).
                let mut copy;
                let slot = match v.boxed() {
                    Some(b) => b,
                    None => {
                        copy = (**v).clone();
                        &mut copy
                    }
                };
                update.apply(Some(slot))
            }
            (Update::Log(_), None) => update.apply(None),
        };
        match replaced {
            Err(e) => Ok(Err(e)),
            Ok(Some(new)) => self.put_over(None, new).map(Ok),
            Ok(None) => {
                self.modified.set(true);
                Ok(Ok(()))
            }
        }
    }

    /// Marks a state changed in place (through `held`/`stored`) as a modification.
    pub fn changed_in_place(&self) {
        self.modified.set(true);
    }

    /// Expires the key at `at_ms` (unix ms on the server's clock).
    pub fn expire_at(&self, at_ms: i64) {
        unsafe { raw::RedisModule_SetAbsExpire.unwrap()(self.key, at_ms) };
        self.modified.set(true);
    }

    /// The absolute expiry in unix ms, None without one.
    pub fn expires_at(&self) -> Option<i64> {
        let at = unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.key) };
        (at != raw::REDISMODULE_NO_EXPIRE as i64).then_some(at)
    }

    /// The absolute expiry in unix ms, -1 without one.
    pub fn abs_expire_ms(&self) -> i64 {
        unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.key) }
    }

    /// Remaining TTL in ms, -1 without one.
    pub fn ttl_ms(&self) -> i64 {
        unsafe { raw::RedisModule_GetExpire.unwrap()(self.key) }
    }

    pub fn delete(&self) {
        unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key) };
        self.modified.set(true);
    }

    pub fn ctx(&self) -> *mut RedisModuleCtx {
        self.ctx
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        unsafe {
            if self.modified.get() {
                raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx, self.name);
            }
            raw::RedisModule_CloseKey.unwrap()(self.key);
        }
    }
}

/// The server's wall clock in ms (TTLs are the server's business, whatever the module clock).
pub fn server_ms() -> i64 {
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}
