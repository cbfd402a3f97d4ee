//! The native data type `ratelimit`, its callbacks, and the key access the commands use.
//!
//! A key's value is the core's `codec::State`, boxed or packed into the value word itself (see
//! `value`: GCRA, leaky, fixed and sliding states usually need no allocation). Every callback
//! Redis 7.0 may call is implemented (it calls them without checking for null): RDB save/load,
//! AOF rewrite, free, memory usage, digest and copy; and active defragmentation where the server
//! can run it. Each runs behind `catch_unwind`: a panic must never reach redis-server.

use std::mem::ManuallyDrop;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::value::{self, Loaded, Word};
use redis_ratelimit_core::codec::{State, ENCODING_VERSION};
use redis_ratelimit_core::gcra;
use redis_ratelimit_core::spec::{Spec, Update};
use redis_ratelimit_core::Rate;

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
///   invalidations for calls that write nothing); `OpenKey` signals only real writes.
pub fn set_module_options(ctx: *mut RedisModuleCtx) {
    let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    // SAFETY: called from OnLoad with its context, after RedisModule_Init filled the API table.
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
        // SAFETY: `rdb` is the IO handle Redis passes to this callback; LoadStringBuffer returns
        // a buffer of `len` bytes we own (freed below) or null.
        let buf = unsafe { raw::RedisModule_LoadStringBuffer.unwrap()(rdb, &mut len) };
        // SAFETY: as above.
        let failed = unsafe { raw::RedisModule_IsIOError.unwrap()(rdb) } != 0;
        let state = if buf.is_null() || failed {
            None
        } else {
            // SAFETY: a non-null buffer of `len` bytes, alive until it is freed below.
            Some(State::decode(unsafe { std::slice::from_raw_parts(buf as *const u8, len) }))
        };
        if !buf.is_null() {
            // SAFETY: the buffer LoadStringBuffer allocated, no longer borrowed (decode copies).
            unsafe { raw::RedisModule_Free.unwrap()(buf as *mut c_void) };
        }
        match state {
            Some(Ok(s)) => value::into_word(s, None),
            _ => std::ptr::null_mut(),
        }
    })
}

/// The state behind a value word Redis lends a callback.
///
/// # Safety
/// `value` is a live value of this type, lent to the callback (nothing else uses it meanwhile),
/// and the result is dropped before the callback returns.
unsafe fn loaded<'a>(value: *const c_void) -> Option<Loaded<'a>> {
    // SAFETY: the caller's contract.
    unsafe { Loaded::from_word(value as *mut c_void) }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        // SAFETY: Redis lends the key's value to this callback.
        let Some(state) = (unsafe { loaded(value) }) else { return };
        let bytes = state.encode();
        // SAFETY: `rdb` is this callback's IO handle; Redis copies the buffer.
        unsafe { raw::RedisModule_SaveStringBuffer.unwrap()(rdb, bytes.as_ptr() as *const c_char, bytes.len()) };
    })
}

unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut RedisModuleString, value: *mut c_void) {
    guarded((), || {
        // The TTL is written by Redis itself (PEXPIREAT) after the value.
        // SAFETY: Redis lends the key's value to this callback.
        let Some(state) = (unsafe { loaded(value) }) else { return };
        let bytes = state.encode();
        // SAFETY: `aof` and `key` are this callback's; the format "sb" takes a RedisModuleString
        // and a (pointer, length) buffer, which Redis copies.
        unsafe {
            raw::RedisModule_EmitAOF.unwrap()(
                aof,
                SETSTATE.as_ptr(),
                c"sb".as_ptr(),
                key,
                bytes.as_ptr() as *const c_char,
                bytes.len(),
            )
        };
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis lends the key's value to this callback.
    guarded(0, || unsafe { loaded(value) }.map_or(0, |s| value::value_bytes(&s, value::form(value))))
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        // SAFETY: Redis lends the key's value to this callback.
        let Some(state) = (unsafe { loaded(value) }) else { return };
        let bytes = state.encode();
        // SAFETY: `md` is this callback's digest; Redis reads the buffer during the call.
        unsafe {
            raw::RedisModule_DigestAddStringBuffer.unwrap()(md, bytes.as_ptr() as *const c_char, bytes.len());
            raw::RedisModule_DigestEndSequence.unwrap()(md);
        }
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
        // SAFETY: reading the API table (None where the server cannot defragment).
        let Some(defrag_alloc) = (unsafe { raw::RedisModule_DefragAlloc }) else { return 0 };
        // SAFETY: `value` points to the key's value word, lent to this callback.
        let word = unsafe { *value };
        let Some(allocation) = value::allocation(word) else {
            return 0; // an inline state owns no allocation
        };
        // DefragAlloc copies the allocation, frees the old one and returns the copy, or null
        // when it leaves it where it is.
        let moved = |p: *mut c_void| -> *mut c_void {
            // SAFETY: `p` is an allocation of this value, made by Redis's allocator (alloc.rs),
            // and nothing else refers to it while the callback runs.
            let new = unsafe { defrag_alloc(ctx, p) };
            if new.is_null() {
                p
            } else {
                DEFRAG_MOVES.fetch_add(1, Relaxed);
                new
            }
        };
        let compact = value::form(word) == value::Form::Compact;
        // SAFETY: the word now names the moved allocation, with the same tag.
        unsafe { *value = value::moved_word(word, moved(allocation)) };
        if compact {
            return 0; // a compact box is one allocation
        }
        // SAFETY: an untagged, non-inline word is a `Box<State>` (value.rs), just moved.
        if let State::SlidingLog(log) = unsafe { &mut *(*value as *mut State) } {
            // SAFETY: the log's box is read out and written back at once, moved (nothing between
            // the read and the write can unwind); no copy of it is used after `read`.
            unsafe {
                let inner = Box::into_raw(std::ptr::read(log));
                std::ptr::write(log, Box::from_raw(moved(inner.cast()).cast()));
                defrag_vec(log.log.buffer_mut(), &moved);
            }
        }
        0
    })
}

/// Moves a Vec's buffer, by its raw parts (no reallocation).
///
/// # Safety
/// `moved` returns an allocation holding the same bytes as the one it is given, of the same
/// size, from the same allocator (DefragAlloc), and frees the old one when it moves it.
unsafe fn defrag_vec<T>(vec: &mut Vec<T>, moved: &impl Fn(*mut c_void) -> *mut c_void) {
    if vec.capacity() == 0 {
        return; // no allocation (a dangling pointer)
    }
    let mut v = ManuallyDrop::new(std::mem::take(vec));
    let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: the same buffer, moved (the caller's contract): its length and capacity hold.
    *vec = unsafe { Vec::from_raw_parts(moved(ptr.cast()).cast::<T>(), len, cap) };
}

unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis frees a value it no longer holds anywhere.
    guarded((), || unsafe { value::free(value) })
}

unsafe extern "C" fn copy(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis lends the source key's value to this callback.
    guarded(std::ptr::null_mut(), || match unsafe { loaded(value) } {
        Some(s) => value::into_word((*s).clone(), s.table_id()),
        None => std::ptr::null_mut(),
    })
}

/// What a key holds.
pub enum Held<'k> {
    Missing,
    Ours(Loaded<'k>),
    /// A string (redis-cell keeps its state in one).
    String,
    /// A string holding a redis-cell arrival time, and the state a check decides against it
    /// (`Entry::state_for`).
    Cell {
        tat_ns: i64,
        state: State,
    },
    Other,
}

/// What a key holds as the commands see it: a ratelimit state, or a key redis-cell left (a
/// string holding the theoretical arrival time in ns, in decimal).
pub enum Stored<'a> {
    Missing,
    Ours(&'a State),
    Cell { tat_ns: i64 },
}

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A native command on a key redis-cell left, without REDIS_CELL_KEYS.
const CELL_KEYS_OFF: &str = "WRONGTYPE the key holds a redis-cell arrival time: CL.THROTTLE reads it; load the \
                             module with REDIS_CELL_KEYS for the RL.* commands to read it";

/// The native commands read keys redis-cell left only when the module was loaded with
/// REDIS_CELL_KEYS (a migration that mixes CL.THROTTLE and RL.* on the same keys).
static NATIVE_READS_CELL_KEYS: AtomicBool = AtomicBool::new(false);

pub fn enable_cell_keys() {
    NATIVE_READS_CELL_KEYS.store(true, Relaxed);
}

/// Which command reads a key: whether a key redis-cell left is read, or WRONGTYPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellReader {
    /// CL.THROTTLE, the drop-in: always.
    Throttle,
    /// The RL.* commands: with REDIS_CELL_KEYS.
    Native,
}

impl CellReader {
    fn reads(self) -> bool {
        self == CellReader::Throttle || NATIVE_READS_CELL_KEYS.load(Relaxed)
    }
}

/// Redis-cell's state in a string, when the string is exactly what redis-cell writes: the
/// theoretical arrival time in ns as `u64::to_string` writes it (digits only, no sign, no
/// leading zero), on a key whose TTL redis-cell set to reach that instant (it sets the TTL to
/// the arrival time minus now at every write, and a limited call writes nothing). So the TTL
/// left (`ttl_ms`, -1 without one) still ends at the arrival time: within `CELL_TTL_SLACK` of
/// it, for the clock readings of the write (redis-cell's and the server's) and the rounding
/// to ms. Anything else (an INCR counter, with or without a TTL, "-7", "+7", "007", a
/// timestamp whose TTL ends elsewhere) is not rate-limit state.
pub fn cell_arrival(value: &[u8], ttl_ms: i64, now_ns: i64) -> Option<i64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if value[0] == b'0' && value.len() > 1 {
        return None;
    }
    let tat_ns = std::str::from_utf8(value).ok()?.parse::<i64>().ok()?;
    if ttl_ms < 0 {
        return None;
    }
    let ttl_ns = ttl_ms.checked_mul(redis_ratelimit_core::NANOS_PER_MILLI)?;
    let off = (tat_ns as i128 - now_ns as i128 - ttl_ns as i128).abs();
    (off <= CELL_TTL_SLACK as i128).then_some(tat_ns)
}

/// How far a redis-cell key's TTL may end from its arrival time: 60 s (the gap between the two
/// clock readings of one write is microseconds, or a script's run time on Redis 7.2+, where a
/// script's commands share its start time).
pub const CELL_TTL_SLACK: i64 = 60 * redis_ratelimit_core::NANOS_PER_SEC;

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
/// but with `NO_IMPLICIT_SIGNAL_MODIFIED` closing one is not a modification: only writes,
/// `delete` and `expire_at` mark the key, and a marked key is signalled (WATCH, CLIENT
/// TRACKING) once when it is closed. Its value is reached through `entry`.
pub struct OpenKey {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
    pub name: *mut RedisModuleString,
    modified: bool,
}

impl OpenKey {
    /// Opens `name` for reading (and writing with `write`).
    ///
    /// # Safety
    /// `ctx` is the running command's context and `name` a string alive while the key is
    /// (one of the command's arguments), and no other `OpenKey` on the same name is open while
    /// this one is: two would lend out the same value twice (`entry`).
    pub unsafe fn open(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString, write: bool) -> OpenKey {
        let mode = if write { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } else { raw::REDISMODULE_READ };
        // SAFETY: ctx and name are the command's (the caller's contract).
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode as c_int) };
        OpenKey { ctx, key, name, modified: false }
    }

    /// The key's value, lent until the entry is written or dropped (the key is borrowed
    /// meanwhile, so nothing else reaches the value).
    #[inline]
    pub fn entry(&mut self) -> Entry<'_> {
        // SAFETY: self.key is open (until drop); the type is compared with ours before the
        // value is read as ours. from_word's contract: the value is the key's live value, and
        // for the entry's lifetime this key is borrowed by it alone, no other OpenKey on the name
        // is open (`open`'s contract), and Redis runs nothing else on its main thread during a
        // command (the lazy-free thread only frees values already out of the keyspace).
        let held = unsafe {
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
        };
        Entry { key: self, held }
    }

    /// Stores a new value, replacing whatever the key held (Redis drops the key's TTL).
    fn set(&mut self, state: State) -> Result<(), String> {
        let word = Word::new(state, None);
        // SAFETY: an open key and our type; on success Redis owns the word (and frees the
        // value it replaces, which no Loaded borrows: the entry was consumed).
        let status = unsafe {
            raw::RedisModule_ModuleTypeSetValue.unwrap()(self.key, *RL_TYPE.raw_type.borrow(), word.as_ptr())
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err("ERR could not store the value".into()); // (the word is freed on drop)
        }
        word.into_raw();
        self.modified = true;
        Ok(())
    }

    /// Writes `state` over `prior`, the key's value of ours: in place, or by swapping in a new
    /// word and freeing the old one (the key and its TTL stay).
    fn rewrite(&mut self, prior: Loaded<'_>, state: State) -> Result<(), String> {
        if let Some(word) = prior.rewrite(state) {
            let mut old: *mut c_void = std::ptr::null_mut();
            // SAFETY: an open key holding our type. (Inline words and compact boxes, the only
            // forms that are swapped, are made only where this function exists:
            // value::enable_inline.)
            let status = unsafe {
                raw::RedisModule_ModuleTypeReplaceValue.unwrap()(
                    self.key,
                    *RL_TYPE.raw_type.borrow(),
                    word.as_ptr(),
                    &mut old,
                )
            };
            if status != raw::REDISMODULE_OK as c_int {
                return Err("ERR could not store the value".into()); // (the word is freed on drop)
            }
            word.into_raw();
            // SAFETY: the value Redis handed back is out of the keyspace, and the only borrow of
            // it, `prior`, was consumed by `rewrite`.
            unsafe { value::free(old) };
        }
        self.modified = true;
        Ok(())
    }

    /// Expires the key at `at_ms` (unix ms on the server's clock).
    pub fn expire_at(&mut self, at_ms: i64) {
        // SAFETY: an open key.
        unsafe { raw::RedisModule_SetAbsExpire.unwrap()(self.key, at_ms) };
        self.modified = true;
    }

    /// The absolute expiry in unix ms, None without one.
    pub fn expires_at(&self) -> Option<i64> {
        let at = self.abs_expire_ms();
        (at != raw::REDISMODULE_NO_EXPIRE as i64).then_some(at)
    }

    /// The absolute expiry in unix ms, -1 without one.
    pub fn abs_expire_ms(&self) -> i64 {
        // SAFETY: an open key; reads its expiry only.
        unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.key) }
    }

    /// Remaining TTL in ms, -1 without one.
    pub fn ttl_ms(&self) -> i64 {
        // SAFETY: an open key; reads its expiry only.
        unsafe { raw::RedisModule_GetExpire.unwrap()(self.key) }
    }

    pub fn ctx(&self) -> *mut RedisModuleCtx {
        self.ctx
    }

    /// A string value's bytes, read through `GET`: `RedisModule_StringDMA` would convert an
    /// int-encoded string (redis-cell's) to raw, a visible change (`OBJECT ENCODING`) made by
    /// a call that writes nothing. Only keys redis-cell left take this path.
    fn string(&self) -> Option<Vec<u8>> {
        // SAFETY: ctx and name are the command's (`open`); the reply is ours until freed below,
        // and its string is copied before that.
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
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        // SAFETY: ctx and name are the command's (`open`); the key is open and closed once.
        unsafe {
            if self.modified {
                raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx, self.name);
            }
            raw::RedisModule_CloseKey.unwrap()(self.key);
        }
    }
}

/// An open key's value, lent by `OpenKey::entry`: read it with `held`, `stored` or `state_for`,
/// write it with `apply` or `delete`, which consume the entry (so nothing reads a value
/// after it was replaced or freed) and hand the key back for its TTL.
pub struct Entry<'k> {
    key: &'k mut OpenKey,
    held: Held<'k>,
}

impl<'k> Entry<'k> {
    /// The context of the command that opened the key.
    pub fn ctx(&self) -> *mut RedisModuleCtx {
        self.key.ctx()
    }

    pub fn held(&self) -> &Held<'k> {
        &self.held
    }

    /// The key, for what is not its value (its TTL, its name).
    pub fn key(&self) -> &OpenKey {
        self.key
    }

    /// The one place that decides what a key holds for the commands: a ratelimit state, a
    /// redis-cell string, or WRONGTYPE for anything else (a string that is not an arrival
    /// time included).
    ///
    /// A string is a key redis-cell left only when it is exactly what redis-cell writes
    /// (`cell_arrival`); `reader` says whether the command reads such a key at all.
    pub fn stored(&self, reader: CellReader) -> Result<Stored<'_>, String> {
        match &self.held {
            Held::Missing => Ok(Stored::Missing),
            Held::Ours(s) => Ok(Stored::Ours(s)),
            Held::String => {
                let key = &*self.key;
                let tat_ns = key.string().and_then(|b| cell_arrival(&b, key.ttl_ms(), crate::clock::now().as_i64()));
                match tat_ns {
                    None => Err(format!("{WRONGTYPE} (not a redis-cell arrival time)")),
                    Some(_) if !reader.reads() => Err(CELL_KEYS_OFF.to_string()),
                    Some(tat_ns) => Ok(Stored::Cell { tat_ns }),
                }
            }
            Held::Cell { tat_ns, .. } => Ok(Stored::Cell { tat_ns: *tat_ns }),
            Held::Other => Err(WRONGTYPE.to_string()),
        }
    }

    /// The state a check of `spec` decides against (a redis-cell key read as `cell_state`,
    /// kept in the entry: `state` returns it again); None for a missing key.
    #[inline]
    pub fn state_for(&mut self, spec: &Spec, reader: CellReader) -> Result<Option<&State>, String> {
        if matches!(self.held, Held::String | Held::Other) {
            if let Stored::Cell { tat_ns } = self.stored(reader)? {
                self.held = Held::Cell { tat_ns, state: cell_state(tat_ns, spec) };
            }
        }
        Ok(self.state())
    }

    /// The state as `state_for` last found it (None: missing, or not read as a state).
    #[inline]
    pub fn state(&self) -> Option<&State> {
        match &self.held {
            Held::Ours(s) => Some(s),
            Held::Cell { state, .. } => Some(state),
            Held::Missing | Held::String | Held::Other => None,
        }
    }

    /// Applies an update to the key (see `Update::apply`): a whole state replaces the value
    /// (written over ours in place where it can be; anything else the key held is replaced,
    /// and Redis drops its TTL), a sliding-log commit changes the boxed log in place. The
    /// outer error: the value could not be stored; the inner one: the update does not apply
    /// to what the key holds.
    #[inline]
    pub fn apply(self, update: Update) -> Result<Result<&'k mut OpenKey, &'static str>, String> {
        let Entry { key, held } = self;
        let prior = match held {
            Held::Ours(v) => Some(v),
            Held::Missing | Held::String | Held::Cell { .. } | Held::Other => None,
        };
        // A replacing state moves into the key (no copy).
        let update = match update {
            Update::Replace(s) => {
                return match prior {
                    Some(v) => key.rewrite(v, s),
                    None => key.set(s),
                }
                .map(|()| Ok(key))
            }
            log => log,
        };
        let replaced = match prior {
            Some(mut v) => {
                // A log is always boxed; any other state refuses the commit (checked by apply).
                let mut copy;
                let slot = match v.boxed() {
                    Some(b) => b,
                    None => {
                        copy = (*v).clone();
                        &mut copy
                    }
                };
                update.apply(Some(slot))
            }
            None => update.apply(None),
        };
        match replaced {
            Err(e) => Ok(Err(e)),
            Ok(Some(new)) => key.set(new).map(|()| Ok(key)),
            Ok(None) => {
                key.modified = true;
                Ok(Ok(key))
            }
        }
    }

    /// Deletes the key.
    pub fn delete(self) -> &'k mut OpenKey {
        // SAFETY: an open key; the entry, the value's only borrow, is consumed.
        unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key.key) };
        self.key.modified = true;
        self.key
    }
}

/// The server's wall clock in ms (TTLs are the server's business, whatever the module clock).
pub fn server_ms() -> i64 {
    // SAFETY: a function of the API table, callable from any command.
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_ratelimit_core::{NANOS_PER_MILLI, NANOS_PER_SEC};

    const NOW: i64 = 1_700_000_000 * NANOS_PER_SEC;

    #[test]
    fn only_what_redis_cell_writes_is_an_arrival_time() {
        let tat = NOW + 18 * NANOS_PER_SEC;
        let v = tat.to_string();
        // The TTL redis-cell set (to the arrival time), and as far as the slack either side.
        for ttl_ms in [18_000, 17_999, 18_001, 78_000, 1] {
            assert_eq!(cell_arrival(v.as_bytes(), ttl_ms, NOW), Some(tat), "TTL {ttl_ms}");
        }
        // A TTL ending further away, or none.
        for ttl_ms in [78_001, -1, -2] {
            assert_eq!(cell_arrival(v.as_bytes(), ttl_ms, NOW), None, "TTL {ttl_ms}");
        }
        let far = (NOW + 120 * NANOS_PER_SEC).to_string();
        assert_eq!(cell_arrival(far.as_bytes(), 59_999, NOW), None);
        assert_eq!(cell_arrival(far.as_bytes(), 60_000, NOW), Some(NOW + 120 * NANOS_PER_SEC));
        // Not as u64::to_string writes a value.
        for bad in [format!("0{v}"), format!("+{v}"), format!("-{v}"), format!("{v} "), format!(" {v}"), String::new()]
        {
            assert_eq!(cell_arrival(bad.as_bytes(), 18_000, NOW), None, "{bad:?}");
        }
        // Counters: far from any TTL's end.
        for (counter, ttl_ms) in [("42", 60_000), ("0", 1), ("7", 1000), ("1", 0)] {
            assert_eq!(cell_arrival(counter.as_bytes(), ttl_ms, NOW), None, "{counter} TTL {ttl_ms}");
        }
        // Beyond an i64 instant, or a TTL in ms that overflows ns.
        assert_eq!(cell_arrival(b"18446744073709551615", 18_000, NOW), None);
        assert_eq!(cell_arrival(v.as_bytes(), i64::MAX / NANOS_PER_MILLI + 1, NOW), None);
    }
}
