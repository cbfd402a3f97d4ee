//! The commands: parse → open key → core → store + TTL → replicate → reply.

use std::cell::RefCell;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::args::{self, wrong_arity};
use crate::core::codec::{Algorithm, State};
use crate::core::give_back::{self, Refusal};
use crate::core::spec::{AlgorithmMismatch, Spec, Update};
use crate::core::{ceil_ms, Decision, Nanos, Request, NANOS_PER_MILLI, NANOS_PER_SEC};
use crate::reply::{self, Field};
use crate::state::{server_ms, Entry, Held, Key, Stored, SETSTATE, WRONGTYPE};
use crate::{clock, metrics, propagation};

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

/// Runs a command body behind `catch_unwind`: a panic becomes an error reply, never an abort
/// of redis-server. Errors are replied here; successful bodies reply themselves.
pub fn dispatch(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    name: &str,
    body: fn(*mut RedisModuleCtx, Args) -> CommandResult,
) -> c_int {
    let argv: Args = if argv.is_null() || argc <= 0 {
        &[]
    } else {
        // SAFETY: Redis passes argc valid argument pointers, alive for the call; Arg is a
        // transparent wrapper of one, and the slice does not outlive the body (whose Args
        // lifetime is its own).
        unsafe { std::slice::from_raw_parts(argv as *const Arg, argc as usize) }
    };
    match catch_unwind(AssertUnwindSafe(|| body(ctx, argv))) {
        Ok(Ok(())) => {}
        Ok(Err(msg)) => reply::error(ctx, &msg),
        Err(_) => reply::error(ctx, &format!("ERR internal error in {name}; the server is fine, please report it")),
    }
    raw::REDISMODULE_OK as c_int
}

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
fn store(entry: Entry<'_>, update: &Update, reset_after: Nanos) -> CommandResult {
    store_with(entry, update, reset_after, false)
}

/// `store`; with `exact`, the TTL is set to reset_after itself, shorter or longer (RL.RETURN:
/// units given back shorten the reset, and a bucket given back full expires at once).
#[inline]
fn store_with(entry: Entry<'_>, update: &Update, reset_after: Nanos, exact: bool) -> CommandResult {
    let key = entry.apply(update)?.map_err(|e| format!("ERR {e}"))?;
    let now_ms = server_ms();
    let reset_ms = ceil_ms(reset_after).max(1);
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
    replicate(key, update, expire_at);
    Ok(())
}

fn replicate(key: &Key, update: &Update, expire_at: Option<i64>) {
    if !propagation::needed(key.ctx()) {
        return;
    }
    PAYLOAD.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        update.encode_into(&mut buf);
        replicate_payload(key.ctx(), key.name, &buf, expire_at);
    });
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
pub fn limiter(ctx: *mut RedisModuleCtx, argv: Args, algo: Algorithm, command: &str) -> CommandResult {
    if argv.len() < 4 {
        return Err(wrong_arity(command));
    }
    let check = with_arg_bytes(&argv[2..], |a| args::check(algo, a, command))?;
    let now = clock::now();
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { Key::open(ctx, argv[1].as_ptr(), true) };
    let mut entry = key.entry();
    let (decision, update) = check.spec.check(entry.state_for(&check.spec)?, now, check.req).map_err(mismatch_error)?;
    if let (Some(u), false) = (&update, check.dryrun) {
        store(entry, u, decision.reset_after)?;
    }
    let limited = decision.limited(&check.req);
    metrics::record(algo, decision.allowed, limited);
    if limited {
        metrics::notify_limited(ctx, argv[1].as_ptr());
    }
    reply::decision(ctx, &decision, algo == Algorithm::Leaky);
    Ok(())
}

macro_rules! limiter_command {
    ($fn_name:ident, $algo:expr, $command:literal) => {
        pub fn $fn_name(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
            limiter(ctx, argv, $algo, $command)
        }
    };
}

limiter_command!(gcra_command, Algorithm::Gcra, "RL.GCRA");
limiter_command!(token_bucket_command, Algorithm::TokenBucket, "RL.TOKENBUCKET");
limiter_command!(sliding_command, Algorithm::Sliding, "RL.SLIDING");
limiter_command!(sliding_log_command, Algorithm::SlidingLog, "RL.SLIDINGLOG");
limiter_command!(fixed_command, Algorithm::Fixed, "RL.FIXED");
limiter_command!(leaky_command, Algorithm::Leaky, "RL.LEAKY");

/// redis-cell's seconds: whole seconds, plus one when at least a full millisecond is left.
fn cell_seconds(ns: Option<Nanos>) -> i64 {
    match ns {
        None => -1,
        Some(ns) => ns / NANOS_PER_SEC + ((ns % NANOS_PER_SEC) / NANOS_PER_MILLI >= 1) as i64,
    }
}

/// CL.THROTTLE key max_burst count_per_period period [quantity]: redis-cell's command and
/// reply, on this module's exact GCRA. A key redis-cell left (a string holding the arrival
/// time in ns) is read, and taken over by the first call that writes (as by every command).
pub fn cl_throttle(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if argv.len() < 5 {
        return Err(wrong_arity("cl.throttle"));
    }
    let (rate, quantity) = with_arg_bytes(&argv[2..], args::cl_throttle)?;
    let now = clock::now();
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { Key::open(ctx, argv[1].as_ptr(), true) };
    let mut entry = key.entry();
    let spec = Spec::Gcra(rate);
    let req = Request::new(quantity);
    let (d, update) = spec.check(entry.state_for(&spec)?, now, req).map_err(mismatch_error)?;
    if let Some(u) = &update {
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

/// RL.INFO key: algorithm, parameters, state and TTL; nil for a missing key.
pub fn info(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if argv.len() != 2 {
        return Err(wrong_arity("rl.info"));
    }
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { Key::open(ctx, argv[1].as_ptr(), false) };
    let entry = key.entry();
    let state = match entry.stored()? {
        Stored::Missing => {
            reply::null(ctx);
            return Ok(());
        }
        Stored::Ours(s) => s,
        Stored::Cell { tat_ns } => {
            // redis-cell stores only the arrival time: the parameters come with each call.
            let tat_us = Field::Int(tat_ns.div_euclid(1_000) + (tat_ns.rem_euclid(1_000) != 0) as i64);
            reply::fields(
                ctx,
                &[
                    ("algorithm", Field::Text("gcra")),
                    ("source", Field::Text("redis-cell")),
                    ("tat_us", tat_us),
                    ("ttl_ms", Field::Int(entry.key().ttl_ms())),
                ],
            );
            return Ok(());
        }
    };
    let now = clock::now();
    let us = |ns: i128| Field::Int((ns / 1_000).clamp(i64::MIN as i128, i64::MAX as i128) as i64);
    let int = |v: u64| Field::Int(v.min(i64::MAX as u64) as i64);
    let mut f: Vec<(&str, Field)> = vec![("algorithm", Field::Text(state.algorithm().name()))];
    match state {
        State::Gcra(s) | State::Leaky(crate::core::leaky::State(s)) => {
            let tokens = s.tokens_scaled(now).max(0) / s.rate.period as i128;
            f.extend([
                ("limit", int(s.rate.limit)),
                ("period_us", us(s.rate.period as i128)),
                ("burst", int(s.rate.burst)),
                ("tat_us", us(s.tat_nanos())),
                ("available", int(tokens as u64)),
            ]);
        }
        State::TokenBucket(s) => {
            let tokens = s.tokens_scaled(now).max(0) / s.rate.period as i128;
            f.extend([
                ("limit", int(s.rate.limit)),
                ("period_us", us(s.rate.period as i128)),
                ("burst", int(s.rate.burst)),
                ("tokens", int((s.tokens.max(0) / s.rate.period as i128) as u64)),
                ("last_us", us(s.last as i128)),
                ("available", int(tokens as u64)),
            ]);
        }
        State::Sliding(s) => f.extend([
            ("limit", int(s.win.limit)),
            ("window_us", us(s.win.window as i128)),
            ("window_start_us", us(s.index as i128 * s.win.window as i128)),
            ("previous", int(s.prev)),
            ("current", int(s.curr)),
            ("estimate", int(s.estimate(now))),
        ]),
        State::Fixed(s) => f.extend([
            ("limit", int(s.win.limit)),
            ("window_us", us(s.win.window as i128)),
            ("window_start_us", us(s.index as i128 * s.win.window as i128)),
            ("count", int(s.count)),
        ]),
        State::SlidingLog(s) => f.extend([
            ("limit", int(s.win.limit)),
            ("window_us", us(s.win.window as i128)),
            ("entries", int(s.log.len() as u64)),
            ("units", int(s.log.total)),
            ("in_window", int(s.in_window(now))),
            ("oldest_us", Field::Int(s.log.oldest().unwrap_or(-1))),
            ("newest_us", Field::Int(s.log.newest().unwrap_or(-1))),
        ]),
    }
    f.push(("ttl_ms", Field::Int(entry.key().ttl_ms())));
    reply::fields(ctx, &f);
    Ok(())
}

/// RL.RESET key: deletes a ratelimit key (or a key redis-cell left).
pub fn reset(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if argv.len() != 2 {
        return Err(wrong_arity("rl.reset"));
    }
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { Key::open(ctx, argv[1].as_ptr(), true) };
    let entry = key.entry();
    let deleted = !matches!(entry.stored()?, Stored::Missing);
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
    let mut key = unsafe { Key::open(ctx, argv[1].as_ptr(), true) };
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
    let key = entry.apply(&update)?.map_err(|e| match log_or_missing {
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
/// several limits in one atomic call, all or nothing.
pub fn multi(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if argv.len() < 2 {
        return Err(wrong_arity("rl.multi"));
    }
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
    let mut seen = std::collections::HashSet::with_capacity(numkeys);
    if !keys.iter().all(|k| seen.insert(k.bytes())) {
        return Err("ERR RL.MULTI keys must be distinct".into());
    }
    let now = clock::now();
    // SAFETY: the command's context and key arguments, distinct (checked above).
    let mut opened: Vec<Key> = keys.iter().map(|k| unsafe { Key::open(ctx, k.as_ptr(), true) }).collect();
    let mut entries: Vec<Entry> = opened.iter_mut().map(Key::entry).collect();
    for (entry, spec) in entries.iter_mut().zip(&m.specs) {
        entry.state_for(spec)?;
    }
    let decide = |req: Request| -> Result<Vec<_>, String> {
        m.specs.iter().zip(&entries).map(|(spec, e)| spec.check(e.state(), now, req).map_err(mismatch_error)).collect()
    };
    // How many units every limit grants: all of COST, or with PARTIAL the least any grants.
    let first = decide(m.req)?;
    let grant = if m.req.partial {
        first.iter().map(|(d, _)| d.allowed).min().unwrap_or(0)
    } else if first.iter().all(|(d, _)| d.allowed == m.req.cost) {
        m.req.cost
    } else {
        0
    };
    let admitted = grant > 0;
    let outcome = if admitted && grant != m.req.cost { decide(Request::new(grant))? } else { first };
    // Refused: nothing is consumed; each limit reports its own view with its state unchanged.
    let peeks = if admitted || m.req.cost == 0 { None } else { Some(decide(Request::new(0))?) };
    if !m.dryrun {
        for (entry, (d, u)) in entries.into_iter().zip(&outcome) {
            // Refused: nothing is consumed, but a limit that refused under new parameters
            // keeps its converted state, exactly as the single-key command does.
            if let (Some(u), true) = (u, admitted || d.allowed == 0) {
                store(entry, u, d.reset_after)?;
            }
        }
    }
    let limited = m.req.cost > 0 && !admitted;
    let mut retry: Option<i64> = None;
    let mut never = false;
    let mut replies = Vec::with_capacity(numkeys);
    for (i, (d, _)) in outcome.iter().enumerate() {
        let mut d = *d;
        if let Some(p) = &peeks {
            let refused = d.allowed == 0 || (!m.req.partial && d.allowed < m.req.cost);
            if refused {
                match d.retry_after {
                    Some(r) => retry = Some(retry.map_or(r, |x| x.max(r))),
                    None => never = true,
                }
            }
            let unchanged = p[i].0;
            d = Decision {
                allowed: 0,
                remaining: unchanged.remaining,
                reset_after: unchanged.reset_after,
                delay: None,
                ..d
            };
        }
        metrics::record(m.specs[i].algorithm(), if admitted { grant } else { 0 }, limited);
        replies.push(d);
    }
    if limited {
        keys.iter().for_each(|k| metrics::notify_limited(ctx, k.as_ptr()));
    }
    let retry_ms = if never || !limited { -1 } else { reply::ms_or_minus_one(retry) };
    let allowed = if admitted && m.req.cost > 0 { grant as i64 } else { 0 };
    let resp3 = reply::resp3(ctx);
    if resp3 {
        reply::map(ctx, 3);
        reply::bulk(ctx, b"allowed");
        reply::integer(ctx, allowed);
        reply::bulk(ctx, b"retry_after_ms");
        reply::integer(ctx, retry_ms);
        reply::bulk(ctx, b"limits");
        reply::array(ctx, replies.len());
    } else {
        reply::array(ctx, 2 + replies.len());
        reply::integer(ctx, allowed);
        reply::integer(ctx, retry_ms);
    }
    for (d, spec) in replies.iter().zip(&m.specs) {
        reply::decision(ctx, d, spec.algorithm() == Algorithm::Leaky);
    }
    Ok(())
}

/// RL.RETURN key n [AGE ms]: gives unused units back to a limiter (see core::give_back);
/// replies the units credited. Crediting nothing writes and replicates nothing.
pub fn give_back(ctx: *mut RedisModuleCtx, argv: Args) -> CommandResult {
    if argv.len() < 3 {
        return Err(wrong_arity("rl.return"));
    }
    let req = with_arg_bytes(&argv[2..], args::give_back)?;
    let now = clock::now();
    // SAFETY: the command's context and key argument; the only key it opens.
    let mut key = unsafe { Key::open(ctx, argv[1].as_ptr(), true) };
    let entry = key.entry();
    let stored = match entry.stored()? {
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
        store_with(entry, &Update::Replace(new), credit.reset_after, true)?;
    }
    reply::integer(ctx, credit.credited as i64);
    Ok(())
}
