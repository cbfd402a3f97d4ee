//! The commands: parse → open key → core → store + TTL → replicate → reply. Each command's
//! facts (name, body, flags, arity, keys, ACL categories, docs) are one `Command` beside its
//! body; `ALL` lists them for registration (lib.rs), acl.rs and command_info.rs.

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::acl::Acl;
use crate::args::{self, wrong_arity};
use crate::command_info::{arg, flag, ArgDoc, Doc, Keys, Kind, RO_ACCESS, RW_DELETE, RW_UPDATE, RW_UPDATE_NO_ACCESS};
use crate::reply;
use crate::state::{server_ms, CellReader, Entry, Held, OpenKey, Stored, SETSTATE, WRONGTYPE};
use crate::{clock, metrics, propagation};
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::give_back::{self, Refusal};
use redis_ratelimit_core::spec::{AlgorithmMismatch, Spec, Update};
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{info as state_info, multi as multi_limits, Nanos, Request, NANOS_PER_MILLI, NANOS_PER_SEC};

/// One argument of the running command, as Redis passed it. Only `dispatch` makes these (the
/// field is private and the type neither Clone nor Copy), so an `Arg` is always an element of
/// the command's argv, alive for the command.
#[repr(transparent)]
pub struct Arg(*mut RedisModuleString);

impl Arg {
    /// The argument's bytes, borrowed from it.
    pub fn bytes(&self) -> &[u8] {
        let mut len = 0usize;
        // SAFETY: self.0 is a live argument of the running command (see the type); its buffer
        // stays put while the argument lives, and nothing here changes an argument.
        unsafe {
            let p = raw::RedisModule_StringPtrLen.unwrap()(self.0, &mut len);
            std::slice::from_raw_parts(p as *const u8, len)
        }
    }

    pub fn as_ptr(&self) -> *mut RedisModuleString {
        self.0
    }
}

/// A command's arguments (the command's name first).
pub type Args<'a> = &'a [Arg];
pub type CommandResult = Result<(), String>;
pub type Body = fn(*mut RedisModuleCtx, Args) -> CommandResult;
/// The entry point Redis calls.
pub type EntryPoint = extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// One command: everything registration, ACL categories and docs need, beside its body.
pub struct Command {
    /// Its name, lower case.
    pub name: &'static CStr,
    pub body: Body,
    /// `dispatch` of this command (made by `entry_point!`).
    pub run: EntryPoint,
    /// RedisModule_CreateCommand's flags.
    pub flags: &'static CStr,
    /// Arguments, the name included: N exactly, or -N for at least N.
    pub arity: c_int,
    pub keys: Keys,
    pub acl: Acl,
    pub doc: Doc,
}

/// The entry point of the command `$command` (a const `Command`): `dispatch` with its entry.
macro_rules! entry_point {
    ($command:ident) => {{
        extern "C" fn run(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
            dispatch(ctx, argv, argc, &$command)
        }
        run
    }};
}

/// Every command, in registration order.
pub const ALL: &[Command] = &[
    GCRA,
    TOKENBUCKET,
    SLIDING,
    SLIDINGLOG,
    FIXED,
    LEAKY,
    CL_THROTTLE,
    MULTI,
    INFO,
    RESET,
    SETSTATE_COMMAND,
    DEBUG,
    RETURN,
];

/// Runs a command body behind `catch_unwind`: a panic becomes an error reply, never an abort
/// of redis-server. Errors are replied here; successful bodies reply themselves. A call with
/// the wrong number of arguments (Redis checks the arity it was given first) is refused.
/// Inlined into each command's entry point, where `command` is a constant.
#[inline(always)]
fn dispatch(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int, command: &Command) -> c_int {
    let argv: Args = if argv.is_null() || argc <= 0 {
        &[]
    } else {
        // SAFETY: Redis passes argc valid argument pointers, alive for the call; Arg is a
        // transparent wrapper of one, and the slice does not outlive the body (whose Args
        // lifetime is its own).
        unsafe { std::slice::from_raw_parts(argv as *const Arg, argc as usize) }
    };
    let name = || command.name.to_str().unwrap_or("?");
    let arity_ok = match command.arity {
        n if n >= 0 => argv.len() == n as usize,
        n => argv.len() >= n.unsigned_abs() as usize,
    };
    if !arity_ok {
        reply::error(ctx, &wrong_arity(name()));
        return raw::REDISMODULE_OK as c_int;
    }
    match catch_unwind(AssertUnwindSafe(|| (command.body)(ctx, argv))) {
        Ok(Ok(())) => {}
        Ok(Err(msg)) => reply::error(ctx, &msg),
        Err(_) => reply::error(ctx, &format!("ERR internal error in {}; the server is fine, please report it", name())),
    }
    raw::REDISMODULE_OK as c_int
}

/// ACL categories: the checks (an application's commands) …
const APP_WRITE: Acl = Acl { builtin: "write fast", ratelimit: true };

/// Argument bytes without allocating for the usual short command lines.
fn with_arg_bytes<T>(argv: Args, f: impl FnOnce(&[&[u8]]) -> T) -> T {
    const INLINE: usize = 16;
    if argv.len() <= INLINE {
        let mut buf: [&[u8]; INLINE] = [&[]; INLINE];
        for (slot, a) in buf.iter_mut().zip(argv) {
            *slot = a.bytes();
        }
        f(&buf[..argv.len()])
    } else {
        let v: Vec<&[u8]> = argv.iter().map(Arg::bytes).collect();
        f(&v)
    }
}

fn mismatch_error(m: AlgorithmMismatch) -> String {
    format!(
        "WRONGTYPE key holds {} state, not {} (RL.RESET it to change algorithm)",
        m.stored.name(),
        m.requested.name()
    )
}

thread_local! {
    /// Reused encoding buffer: replicating an update allocates nothing on the hot path.
    static PAYLOAD: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(128));
}

/// Stores an admitted update and propagates its effect as one RL.SETSTATE: replicas and the AOF
/// never recompute with their own clocks.
///
/// The TTL only has to cover reset_after (a state kept past its reset decides like a missing
/// key), so it is extended in steps: when the key's expiry falls short of now + reset_after it
/// is set to now + 1.5 × reset_after, and the calls in between leave it alone. Those calls
/// propagate RL.SETSTATE without PXAT, which keeps the replica's expiry, itself the one the
/// primary pinned last: replicas and the AOF keep the primary's absolute expiry.
///
/// `entry`: the key's value as read when the command opened it.
#[inline]
fn store(entry: Entry<'_>, update: Update, reset_after: Nanos) -> CommandResult {
    store_with(entry, update, reset_after, false)
}

/// `store`; with `exact`, the TTL is set to reset_after itself, shorter or longer (RL.RETURN:
/// units given back shorten the reset, and a bucket given back full expires at once).
#[inline]
fn store_with(entry: Entry<'_>, update: Update, reset_after: Nanos, exact: bool) -> CommandResult {
    // Encoded before it moves into the key (the same bytes as after), when replicas or the
    // AOF need it.
    let payload = encode_for_propagation(entry.ctx(), &update);
    let key = entry.apply(update)?.map_err(|e| format!("ERR {e}"))?;
    let now_ms = server_ms();
    let reset_ms = (reset_after.as_millis_ceil() as i64).max(1);
    let needed = now_ms.saturating_add(reset_ms);
    // (A new key, or one a user made persistent, has no expiry: -1.)
    let expire_at = if exact {
        key.expire_at(needed);
        Some(needed)
    } else if key.abs_expire_ms() < needed {
        let at = needed.saturating_add(reset_ms / 2);
        key.expire_at(at);
        Some(at)
    } else {
        None
    };
    if payload {
        PAYLOAD.with(|buf| replicate_payload(key.ctx(), key.name, &buf.borrow(), expire_at));
    }
    Ok(())
}

/// Encodes `update` into PAYLOAD when the call must propagate; says whether it did.
fn encode_for_propagation(ctx: *mut RedisModuleCtx, update: &Update) -> bool {
    if !propagation::needed(ctx) {
        return false;
    }
    PAYLOAD.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        update.encode_into(&mut buf);
    });
    true
}

/// Propagates `RL.SETSTATE key payload [PXAT expire_at]` to replicas and the AOF. Callers
/// first ask `propagation::needed`.
fn replicate_payload(ctx: *mut RedisModuleCtx, key: *mut RedisModuleString, payload: &[u8], expire_at: Option<i64>) {
    let (p, len) = (payload.as_ptr() as *const c_char, payload.len());
    // SAFETY: reading the API table.
    let replicate = unsafe { raw::RedisModule_Replicate.unwrap() };
    // SAFETY: ctx and key are the command's; the formats match the arguments ("s" a
    // RedisModuleString, "b" a pointer and length, "c" a C string, "l" a long long), and Redis
    // copies them.
    unsafe {
        match expire_at {
            Some(at) => replicate(
                ctx,
                SETSTATE.as_ptr(),
                c"sbcl".as_ptr(),
                key,
                p,
                len,
                c"PXAT".as_ptr(),
                at as std::os::raw::c_longlong,
            ),
            None => replicate(ctx, SETSTATE.as_ptr(), c"sb".as_ptr(), key, p, len),
        };
    }
}

/// RL.GCRA, RL.TOKENBUCKET, RL.SLIDING, RL.SLIDINGLOG, RL.FIXED, RL.LEAKY.
pub fn limiter(ctx: *mut RedisModuleCtx, argv: Args, algo: Algorithm) -> CommandResult {
    let check = with_arg_bytes(&argv[2..], |a| args::check(algo, a, algo.command()))?;
    let now = clock::now();
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { OpenKey::open(ctx, argv[1].as_ptr(), true) };
    let mut entry = key.entry();
    let (decision, update) =
        check.spec.check(entry.state_for(&check.spec, CellReader::Native)?, now, check.req).map_err(mismatch_error)?;
    if let (Some(u), false) = (update, check.dryrun) {
        store(entry, u, decision.reset_after)?;
    }
    let limited = decision.limited(&check.req);
    metrics::record(algo, decision.allowed, limited);
    if limited {
        metrics::notify_limited(ctx, argv[1].as_ptr());
    }
    reply::decision(ctx, &decision, algo.delays());
    Ok(())
}

/// A limiter's arguments: `key limit period [BURST n] [COST n] [DRYRUN] [PARTIAL]`.
const RATE_ARGS: &[ArgDoc] = &[
    arg("key", Kind::Key),
    arg("limit", Kind::Integer),
    arg("period", Kind::Text),
    arg("burst", Kind::Integer).token("BURST").optional(),
    arg("cost", Kind::Integer).token("COST").optional(),
    flag("dryrun", "DRYRUN"),
    flag("partial", "PARTIAL"),
];
/// A window limiter's arguments: `key limit window [COST n] [DRYRUN] [PARTIAL]`.
const WINDOW_ARGS: &[ArgDoc] = &[
    arg("key", Kind::Key),
    arg("limit", Kind::Integer),
    arg("window", Kind::Text),
    arg("cost", Kind::Integer).token("COST").optional(),
    flag("dryrun", "DRYRUN"),
    flag("partial", "PARTIAL"),
];

/// A command's name as registered: lower case and NUL-terminated, made at compile time from
/// `$s` (an algorithm's `command`, the one place it is written).
macro_rules! lower_cstr {
    ($s:expr) => {{
        const S: &str = $s;
        const BYTES: [u8; S.len() + 1] = {
            let mut b = [0u8; S.len() + 1];
            let mut i = 0;
            while i < S.len() {
                b[i] = S.as_bytes()[i].to_ascii_lowercase();
                i += 1;
            }
            b
        };
        match CStr::from_bytes_with_nul(&BYTES) {
            Ok(c) => c,
            Err(_) => panic!("a command name holds no NUL"),
        }
    }};
}

/// A limiter command of `$algo`: its name (the algorithm's `command`) and its arguments (a
/// rate's or a window's, by the algorithm's facts) from the algorithm.
macro_rules! limiter_command {
    ($table:ident, $fn_name:ident, $algo:expr, $complexity:literal, $summary:literal) => {
        pub fn $fn_name(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
            limiter(ctx, argv, $algo)
        }

        pub const $table: Command = Command {
            name: lower_cstr!($algo.command()),
            body: $fn_name,
            run: entry_point!($table),
            flags: c"write deny-oom fast",
            arity: -4,
            keys: Keys::First(RW_UPDATE),
            acl: APP_WRITE,
            doc: Doc {
                summary: $summary,
                complexity: $complexity,
                args: if $algo.is_bucket() { RATE_ARGS } else { WINDOW_ARGS },
            },
        };
    };
}

limiter_command!(
    GCRA,
    gcra_command,
    Algorithm::Gcra,
    "O(1)",
    "Rate-limits with GCRA: limit per period sustained, up to BURST at once"
);
limiter_command!(
    TOKENBUCKET,
    token_bucket_command,
    Algorithm::TokenBucket,
    "O(1)",
    "Rate-limits with a token bucket of BURST tokens refilled at limit per period"
);
limiter_command!(
    SLIDING,
    sliding_command,
    Algorithm::Sliding,
    "O(1)",
    "Rate-limits with a sliding window counter (two weighted window counts)"
);
limiter_command!(
    SLIDINGLOG,
    sliding_log_command,
    Algorithm::SlidingLog,
    "O(1) amortized for admitted calls",
    "Exact sliding window: admits when the units in the trailing window plus COST fit the limit"
);
limiter_command!(
    FIXED,
    fixed_command,
    Algorithm::Fixed,
    "O(1)",
    "Rate-limits with an epoch-aligned fixed window counter (quotas, daily caps)"
);
limiter_command!(
    LEAKY,
    leaky_command,
    Algorithm::Leaky,
    "O(1)",
    "Leaky bucket as a queue: admits up to BURST queued requests and replies how long to wait"
);

/// redis-cell's seconds: whole seconds, plus one when at least a full millisecond is left.
fn cell_seconds(ns: Option<Nanos>) -> i64 {
    match ns {
        None => -1,
        Some(ns) => {
            let ns = ns.as_i64();
            ns / NANOS_PER_SEC + ((ns % NANOS_PER_SEC) / NANOS_PER_MILLI >= 1) as i64
        }
    }
}

/// CL.THROTTLE key max_burst count_per_period period [quantity]: redis-cell's command and
/// reply, on this module's exact GCRA. A key redis-cell left (a string holding the arrival
/// time in ns) is read, and taken over by the first call that writes (as by every command).
pub fn cl_throttle(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    let (rate, quantity) = with_arg_bytes(&argv[2..], args::cl_throttle)?;
    let now = clock::now();
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { OpenKey::open(ctx, argv[1].as_ptr(), true) };
    let mut entry = key.entry();
    let spec = Spec::Gcra(rate);
    let req = Request::new(quantity);
    let (d, update) = spec.check(entry.state_for(&spec, CellReader::Throttle)?, now, req).map_err(mismatch_error)?;
    if let Some(u) = update {
        store(entry, u, d.reset_after)?;
    }
    let limited = d.limited(&req);
    metrics::record(Algorithm::Gcra, d.allowed, limited);
    if limited {
        metrics::notify_limited(ctx, argv[1].as_ptr());
    }
    reply::array(ctx, 5);
    for v in [
        limited as i64,
        d.limit as i64,
        d.remaining as i64,
        cell_seconds(d.retry_after),
        cell_seconds(Some(d.reset_after)),
    ] {
        reply::integer(ctx, v);
    }
    Ok(())
}

pub const CL_THROTTLE: Command = Command {
    name: c"cl.throttle",
    body: cl_throttle,
    run: entry_point!(CL_THROTTLE),
    flags: c"write deny-oom fast",
    arity: -5,
    keys: Keys::First(RW_UPDATE),
    acl: APP_WRITE,
    doc: Doc {
        summary: "redis-cell compatible GCRA check: [limited, limit, remaining, retry_after_s, reset_after_s]",
        complexity: "O(1)",
        args: &[
            arg("key", Kind::Key),
            arg("max_burst", Kind::Integer),
            arg("count_per_period", Kind::Integer),
            arg("period", Kind::Integer),
            arg("quantity", Kind::Integer).optional(),
        ],
    },
};

/// RL.INFO key: algorithm, parameters, state and TTL (core::info); nil for a missing key.
pub fn info(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { OpenKey::open(ctx, argv[1].as_ptr(), false) };
    let entry = key.entry();
    let mut fields = match entry.stored(CellReader::Native)? {
        Stored::Missing => {
            reply::null(ctx);
            return Ok(());
        }
        Stored::Ours(s) => state_info::fields(s, clock::now()),
        Stored::Cell { tat_ns } => state_info::cell_fields(tat_ns).to_vec(),
    };
    fields.push(("ttl_ms", state_info::Field::Int(entry.key().ttl_ms())));
    reply::fields(ctx, &fields);
    Ok(())
}

pub const INFO: Command = Command {
    name: c"rl.info",
    body: info,
    run: entry_point!(INFO),
    flags: c"readonly fast",
    arity: 2,
    keys: Keys::First(RO_ACCESS),
    acl: Acl { builtin: "read fast", ratelimit: true },
    doc: Doc {
        summary: "Returns a ratelimit key's algorithm, parameters, state and TTL",
        complexity: "O(1)",
        args: &[arg("key", Kind::Key)],
    },
};

/// RL.RESET key: deletes a ratelimit key (or a key redis-cell left).
pub fn reset(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { OpenKey::open(ctx, argv[1].as_ptr(), true) };
    let entry = key.entry();
    let deleted = !matches!(entry.stored(CellReader::Native)?, Stored::Missing);
    if deleted {
        entry.delete();
        if propagation::needed(ctx) {
            // SAFETY: the command's context and key argument ("s": a RedisModuleString).
            unsafe { raw::RedisModule_Replicate.unwrap()(ctx, c"DEL".as_ptr(), c"s".as_ptr(), argv[1].as_ptr()) };
        }
    }
    reply::integer(ctx, deleted as i64);
    Ok(())
}

pub const RESET: Command = Command {
    name: c"rl.reset",
    body: reset,
    run: entry_point!(RESET),
    flags: c"write fast",
    arity: 2,
    keys: Keys::First(RW_DELETE),
    acl: APP_WRITE,
    doc: Doc { summary: "Deletes a ratelimit key", complexity: "O(1)", args: &[arg("key", Kind::Key)] },
};

/// RL.SETSTATE key payload [PXAT ms]: internal. Stores a state (or applies a sliding-log
/// change) exactly as the primary computed it; this is what replicas and the AOF receive.
/// The payload is validated: a forged one is an error, never a crash.
pub fn set_state(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if argv.len() != 3 && argv.len() != 5 {
        return Err(wrong_arity("rl.setstate"));
    }
    let payload = argv[2].bytes();
    let update = Update::decode(payload).map_err(|e| format!("ERR invalid state payload: {e}"))?;
    let expire_at = match argv.get(3) {
        None => None,
        Some(t) if t.bytes().eq_ignore_ascii_case(b"PXAT") => Some(args::integer(argv[4].bytes(), "PXAT")?),
        Some(t) => return Err(format!("ERR unknown option '{}'", args::shown(t.bytes()))),
    };
    if let Update::Log(c) = &update {
        if c.units > c.win.limit {
            return Err("ERR invalid state payload: more units than the limit".into());
        }
    }
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { OpenKey::open(ctx, argv[1].as_ptr(), true) };
    // Replacing another type's value drops its TTL in Redis: without PXAT it is kept.
    let kept_expiry = if expire_at.is_none() { key.expires_at() } else { None };
    let entry = key.entry();
    let log_or_missing = match entry.held() {
        Held::Ours(s) => matches!(**s, State::SlidingLog(_)),
        Held::Missing => true,
        // A replacing state takes over any key (as RESTORE REPLACE does): this is how a
        // redis-cell string becomes native on replicas.
        _ if matches!(update, Update::Replace(_)) => false,
        _ => return Err(WRONGTYPE.to_string()),
    };
    let key = entry.apply(update)?.map_err(|e| match log_or_missing {
        true => format!("ERR invalid state payload: {e}"),
        false => format!("WRONGTYPE {e}"),
    })?;
    if let Some(at) = expire_at.or(kept_expiry) {
        key.expire_at(at);
    }
    if propagation::needed(ctx) {
        replicate_payload(ctx, argv[1].as_ptr(), payload, expire_at);
    }
    reply::simple(ctx, c"OK");
    Ok(())
}

pub const SETSTATE_COMMAND: Command = Command {
    name: c"rl.setstate",
    body: set_state,
    run: entry_point!(SETSTATE_COMMAND),
    flags: c"write deny-oom",
    arity: -3,
    // RW: a sliding-log commit applies to the log the key holds; no `access`: it returns
    // nothing of the key (write permission on it is enough).
    keys: Keys::First(RW_UPDATE_NO_ACCESS),
    // Like RESTORE: writes whatever valid state it is handed.
    acl: Acl { builtin: "write slow dangerous", ratelimit: false },
    doc: Doc {
        summary: "Internal: stores a limiter state as computed by the primary (replication, AOF)",
        complexity: "O(N) for a payload of N bytes",
        args: &[
            arg("key", Kind::Key),
            arg("payload", Kind::Text),
            arg("unix-time-milliseconds", Kind::Integer).token("PXAT").optional(),
        ],
    },
};

/// RL.DEBUG CLOCK SET <unix_us> | ADVANCE <us> | REAL | GET — only with DEBUG_CLOCK.
pub fn debug(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if !clock::debug_enabled() {
        return Err("ERR RL.DEBUG is disabled: load the module with the argument DEBUG_CLOCK".into());
    }
    with_arg_bytes(&argv[1..], |a| {
        let upper: Vec<Vec<u8>> = a.iter().take(2).map(|w| w.to_ascii_uppercase()).collect();
        let words: Vec<&[u8]> = upper.iter().map(|w| w.as_slice()).collect();
        match (words.as_slice(), a.len()) {
            ([b"CLOCK", b"SET"], 3) => clock::set(args::integer(a[2], "unix_us")?)?,
            ([b"CLOCK", b"ADVANCE"], 3) => clock::advance(args::integer(a[2], "us")?)?,
            ([b"CLOCK", b"REAL"], 2) => clock::follow_real(),
            ([b"CLOCK", b"GET"], 2) => {
                reply::integer(ctx, clock::now_us());
                return Ok(());
            }
            _ => return Err("ERR usage: RL.DEBUG CLOCK SET <unix_us> | ADVANCE <us> | REAL | GET".into()),
        }
        reply::simple(ctx, c"OK");
        Ok(())
    })
}

pub const DEBUG: Command = Command {
    name: c"rl.debug",
    body: debug,
    run: entry_point!(DEBUG),
    flags: c"fast",
    arity: -3,
    keys: Keys::None,
    // Like DEBUG: changes the clock every limiter reads (only loaded with DEBUG_CLOCK).
    acl: Acl { builtin: "admin slow dangerous", ratelimit: false },
    doc: Doc {
        summary: "Test clock (only when loaded with DEBUG_CLOCK): SET, ADVANCE, REAL, GET",
        complexity: "O(1)",
        args: &[
            arg("clock", Kind::Token).token("CLOCK"),
            arg("action", Kind::OneOf).of(&[
                arg("unix-us", Kind::Integer).token("SET"),
                arg("us", Kind::Integer).token("ADVANCE"),
                arg("real", Kind::Token).token("REAL"),
                arg("get", Kind::Token).token("GET"),
            ]),
        ],
    },
};

/// Declares the key at `pos` to a getkeys request, with the flags of RL.MULTI's key spec.
fn report_key(ctx: *mut RedisModuleCtx, pos: usize) {
    let flags = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
    // SAFETY: the command's context, in a getkeys request; `pos` is an argument's index.
    unsafe {
        match raw::RedisModule_KeyAtPosWithFlags {
            Some(with_flags) => with_flags(ctx, pos as c_int, flags as c_int),
            None => raw::RedisModule_KeyAtPos.unwrap()(ctx, pos as c_int),
        }
    }
}

/// RL.MULTI numkeys key [key ...] ALGO args [ALGO args ...] [COST n] [DRYRUN] [PARTIAL]:
/// several limits in one atomic call, all or nothing (core::multi decides).
pub fn multi(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    let numkeys = match args::non_negative(argv[1].bytes(), "numkeys") {
        Ok(n) if n >= 1 && (n as usize) <= argv.len() - 2 => n as usize,
        _ => return Err("ERR numkeys must be a positive integer no larger than the number of keys given".into()),
    };
    let keys = &argv[2..2 + numkeys];
    // Parse first: the limits must match the keys before any per-key work is done.
    let parsed = with_arg_bytes(&argv[2 + numkeys..], |a| args::multi(a, numkeys));
    // SAFETY: the command's context.
    if unsafe { raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx) } != 0 {
        // Keys only for a call that parses: a numkeys past the real keys would otherwise name
        // option words as keys (a cluster node then answers CROSSSLOT). With no keys Redis
        // runs the call, which answers its own argument error.
        if parsed.is_ok() {
            (2..2 + numkeys).for_each(|pos| report_key(ctx, pos));
        }
        return Ok(());
    }
    let m = parsed?;
    if !distinct(keys) {
        return Err("ERR RL.MULTI keys must be distinct".into());
    }
    let now = clock::now();
    // SAFETY: the command's context and key arguments, distinct (checked above).
    let mut opened: Vec<OpenKey> = keys.iter().map(|k| unsafe { OpenKey::open(ctx, k.as_ptr(), true) }).collect();
    let mut entries: Vec<Entry> = opened.iter_mut().map(OpenKey::entry).collect();
    for (entry, spec) in entries.iter_mut().zip(&m.specs) {
        entry.state_for(spec, CellReader::Native)?;
    }
    let mut o = multi_limits::check(&m.specs, entries.iter().map(Entry::state), now, m.req).map_err(mismatch_error)?;
    if !m.dryrun {
        for (entry, limit) in entries.into_iter().zip(&mut o.limits) {
            if let Some(s) = limit.store.take() {
                store(entry, s.update, s.reset_after)?;
            }
        }
    }
    for spec in &m.specs {
        metrics::record(spec.algorithm(), o.allowed, o.limited);
    }
    if o.limited {
        keys.iter().for_each(|k| metrics::notify_limited(ctx, k.as_ptr()));
    }
    let retry_ms = redis_ratelimit_core::ms_or_minus_one(o.retry_after);
    let allowed = o.allowed as i64;
    if reply::resp3(ctx) {
        reply::map(ctx, 3);
        reply::bulk(ctx, b"allowed");
        reply::integer(ctx, allowed);
        reply::bulk(ctx, b"retry_after_ms");
        reply::integer(ctx, retry_ms);
        reply::bulk(ctx, b"limits");
        reply::array(ctx, o.limits.len());
    } else {
        reply::array(ctx, 2 + o.limits.len());
        reply::integer(ctx, allowed);
        reply::integer(ctx, retry_ms);
    }
    for (limit, spec) in o.limits.iter().zip(&m.specs) {
        reply::decision(ctx, &limit.decision, spec.algorithm().delays());
    }
    Ok(())
}

/// No two keys are the same bytes. A call names a handful of keys: comparing pairs costs no
/// allocation and no hashing; a hash set only past that.
fn distinct(keys: &[Arg]) -> bool {
    if keys.len() <= 16 {
        return keys.iter().enumerate().all(|(i, a)| keys[..i].iter().all(|b| a.bytes() != b.bytes()));
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter().all(|k| seen.insert(k.bytes()))
}

const ALGORITHM_WORDS: &[ArgDoc] = &[
    arg("GCRA", Kind::Token).token("GCRA"),
    arg("TOKENBUCKET", Kind::Token).token("TOKENBUCKET"),
    arg("LEAKY", Kind::Token).token("LEAKY"),
    arg("SLIDING", Kind::Token).token("SLIDING"),
    arg("FIXED", Kind::Token).token("FIXED"),
    arg("SLIDINGLOG", Kind::Token).token("SLIDINGLOG"),
];

pub const MULTI: Command = Command {
    name: c"rl.multi",
    body: multi,
    run: entry_point!(MULTI),
    flags: c"write deny-oom fast getkeys-api",
    arity: -6,
    // VARIABLE_FLAGS: Redis then asks the getkeys callback rather than the key spec, so a
    // malformed call declares no keys (and gets its own error, not CROSSSLOT); clients still
    // route by the spec.
    keys: Keys::Numkeys(RW_UPDATE | raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS as u64),
    acl: APP_WRITE,
    doc: Doc {
        summary: "Checks several limits atomically, all or nothing (one limit spec per key)",
        complexity: "O(N) for N limits",
        args: &[
            arg("numkeys", Kind::Integer),
            arg("key", Kind::Key).multiple(),
            arg("limit", Kind::Block).multiple().of(&[
                arg("algorithm", Kind::OneOf).of(ALGORITHM_WORDS),
                arg("limit", Kind::Integer),
                arg("period", Kind::Text),
                arg("burst", Kind::Integer).token("BURST").optional(),
            ]),
            arg("cost", Kind::Integer).token("COST").optional(),
            flag("dryrun", "DRYRUN"),
            flag("partial", "PARTIAL"),
        ],
    },
};

/// RL.RETURN key n [AGE ms]: gives unused units back to a limiter (see core::give_back);
/// replies the units credited. Crediting nothing writes and replicates nothing.
pub fn give_back(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    let req = with_arg_bytes(&argv[2..], args::give_back)?;
    let now = clock::now();
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { OpenKey::open(ctx, argv[1].as_ptr(), true) };
    let entry = key.entry();
    let stored = match entry.stored(CellReader::Native)? {
        Stored::Ours(s) => s,
        Stored::Missing => {
            return Err("ERR no limiter at this key (a limiter that expired is already full: nothing to give back)".into())
        }
        // redis-cell keeps only the arrival time; the rate comes with each call.
        Stored::Cell { .. } => {
            return Err("ERR RL.RETURN needs the key's rate: it holds a redis-cell arrival time (an admitted CL.THROTTLE or RL.GCRA stores it)".into())
        }
    };
    let credit = give_back::give_back(stored, req.n, req.age, now).map_err(|r| match r {
        Refusal::SlidingLog => {
            "ERR RL.RETURN does not support the sliding log: its entries cannot be identified".to_string()
        }
        Refusal::Leaky => {
            "ERR RL.RETURN does not support the leaky bucket: every queue slot is promised to an admitted request"
                .to_string()
        }
        Refusal::AgeRequired => {
            "ERR AGE is required for window limiters (fixed, sliding): the ms since the claim was sent".to_string()
        }
    })?;
    if let Some(new) = credit.state {
        store_with(entry, Update::Replace(new), credit.reset_after, true)?;
    }
    reply::integer(ctx, credit.credited as i64);
    Ok(())
}

pub const RETURN: Command = Command {
    name: c"rl.return",
    body: give_back,
    run: entry_point!(RETURN),
    flags: c"write deny-oom fast",
    arity: -3,
    keys: Keys::First(RW_UPDATE),
    // Gives back claimed units: for the services that enforce the limit, like the checks.
    acl: APP_WRITE,
    doc: Doc {
        summary:
            "Gives unused units back to a limiter: never above its capacity, only into the window they were taken from",
        complexity: "O(1)",
        args: &[arg("key", Kind::Key), arg("n", Kind::Integer), arg("ms", Kind::Integer).token("AGE").optional()],
    },
};
