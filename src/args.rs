//! Argument parsing, in one place. Arguments arrive as raw bytes (they may be anything: empty,
//! 1 MB, not UTF-8); every error is an `ERR …` message naming the argument, and nothing is
//! parsed leniently (no signs, no spaces, no floats, no overflow).

use redis_ratelimit_core::spec::Spec;
use redis_ratelimit_core::Algorithm;
use redis_ratelimit_core::{
    Nanos, Rate, Request, MAX_COUNT, MAX_PERIOD, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SEC,
};

pub type ArgResult<T> = Result<T, String>;

/// A parsed limiter command: the limit, the request and whether to change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckArgs {
    pub spec: Spec,
    pub req: Request,
    pub dryrun: bool,
}

/// Shows a user's argument inside an error message: printable ASCII only, at most 32 bytes.
pub fn shown(arg: &[u8]) -> String {
    let mut s: String =
        arg.iter().take(32).map(|&b| if (0x20..0x7f).contains(&b) && b != b'\'' { b as char } else { '?' }).collect();
    if arg.len() > 32 {
        s.push_str("...");
    }
    s
}

/// A non-negative decimal integer: ASCII digits only, no sign, no overflow.
fn digits(arg: &[u8]) -> Option<u64> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let significant = &arg[arg.iter().position(|&d| d != b'0').unwrap_or(arg.len())..];
    if significant.len() > 20 {
        return None;
    }
    significant.iter().try_fold(0u64, |acc, &d| acc.checked_mul(10)?.checked_add((d - b'0') as u64))
}

/// Digits only, but too many for a u64: reported as too large, not as malformed.
fn overflows(arg: &[u8]) -> bool {
    !arg.is_empty() && arg.iter().all(u8::is_ascii_digit) && digits(arg).is_none()
}

/// A count from 1 to MAX_COUNT (limit, BURST).
pub fn positive(arg: &[u8], name: &str) -> ArgResult<u64> {
    match digits(arg) {
        Some(n) if (1..=MAX_COUNT).contains(&n) => Ok(n),
        Some(n) if n > MAX_COUNT => Err(format!("ERR {name} must be a positive integer no larger than {MAX_COUNT}")),
        None if overflows(arg) => Err(format!("ERR {name} must be a positive integer no larger than {MAX_COUNT}")),
        _ => Err(format!("ERR {name} must be a positive integer")),
    }
}

/// A count from 0 to MAX_COUNT (COST, quantity).
pub fn non_negative(arg: &[u8], name: &str) -> ArgResult<u64> {
    match digits(arg) {
        Some(n) if n <= MAX_COUNT => Ok(n),
        Some(_) => Err(format!("ERR {name} must be a non-negative integer no larger than {MAX_COUNT}")),
        None if overflows(arg) => Err(format!("ERR {name} must be a non-negative integer no larger than {MAX_COUNT}")),
        None => Err(format!("ERR {name} must be a non-negative integer")),
    }
}

/// A period or window: a positive integer with an optional unit (us, ms, s, m, h, d); a bare
/// number is seconds. Returns nanoseconds.
pub fn period(arg: &[u8], name: &str) -> ArgResult<Nanos> {
    let bad = || {
        format!(
            "ERR invalid {name} '{}': expected a positive integer with an optional unit us, ms, s, m, h or d",
            shown(arg)
        )
    };
    let split = arg.iter().position(|b| !b.is_ascii_digit()).unwrap_or(arg.len());
    let (num, unit) = arg.split_at(split);
    let n = digits(num).filter(|&n| n > 0).ok_or_else(bad)?;
    const UNITS: [(&[u8], i64); 7] = [
        (b"", NANOS_PER_SEC),
        (b"s", NANOS_PER_SEC),
        (b"us", NANOS_PER_MICRO),
        (b"ms", NANOS_PER_MILLI),
        (b"m", 60 * NANOS_PER_SEC),
        (b"h", 3_600 * NANOS_PER_SEC),
        (b"d", 86_400 * NANOS_PER_SEC),
    ];
    let scale = UNITS.iter().find(|(u, _)| unit.eq_ignore_ascii_case(u)).map(|(_, s)| *s).ok_or_else(bad)?;
    match (n as i128) * (scale as i128) {
        ns if ns <= MAX_PERIOD.as_i128() => Ok(Nanos::new(ns as i64)),
        _ => Err(format!("ERR invalid {name} '{}': at most 100 years (36525d)", shown(arg))),
    }
}

#[derive(Default)]
struct Options {
    burst: Option<u64>,
    cost: Option<u64>,
    dryrun: bool,
    partial: bool,
}

/// Parses the options after the positional arguments, in any order, case-insensitively;
/// unknown and repeated options are errors.
fn options(args: &[&[u8]], allow_burst: bool, command: &str) -> ArgResult<Options> {
    let mut o = Options::default();
    let mut seen = [false; 4];
    let mut i = 0;
    const NAMES: [&str; 4] = ["BURST", "COST", "DRYRUN", "PARTIAL"];
    while i < args.len() {
        // Compared in place, case-insensitively: the hot path copies no argument.
        let slot = NAMES
            .iter()
            .position(|n| args[i].eq_ignore_ascii_case(n.as_bytes()))
            .ok_or_else(|| format!("ERR unknown option '{}'", shown(args[i])))?;
        if slot == 0 && !allow_burst {
            return Err(format!("ERR BURST is not an option of {command}"));
        }
        let name = NAMES[slot];
        if std::mem::replace(&mut seen[slot], true) {
            return Err(format!("ERR option {name} given more than once"));
        }
        let mut value = || {
            i += 1;
            args.get(i).copied().ok_or_else(|| format!("ERR {name} needs a value"))
        };
        match slot {
            0 => o.burst = Some(positive(value()?, "BURST")?),
            1 => o.cost = Some(non_negative(value()?, "COST")?),
            2 => o.dryrun = true,
            _ => o.partial = true,
        }
        i += 1;
    }
    Ok(o)
}

pub fn wrong_arity(command: &str) -> String {
    format!("ERR wrong number of arguments for '{}' command", command.to_ascii_lowercase())
}

/// `limit period|window [BURST n] [COST n] [DRYRUN] [PARTIAL]`, the arguments after the key of
/// every limiter command (and of each limit in RL.MULTI).
pub fn check(algo: Algorithm, args: &[&[u8]], command: &str) -> ArgResult<CheckArgs> {
    if args.len() < 2 {
        return Err(wrong_arity(command));
    }
    let (spec, o) = spec_and_options(algo, args, command)?;
    let cost = o.cost.unwrap_or(1);
    Ok(CheckArgs { spec, req: Request { cost, partial: o.partial }, dryrun: o.dryrun })
}

fn spec_and_options(algo: Algorithm, args: &[&[u8]], command: &str) -> ArgResult<(Spec, Options)> {
    let limit = positive(args[0], "limit")?;
    let bucket = algo.is_bucket();
    let period = period(args[1], if bucket { "period" } else { "window" })?;
    let o = options(&args[2..], bucket, command)?;
    let spec = Spec::new(algo, limit, period, o.burst.unwrap_or(limit)).map_err(|e| format!("ERR {e}"))?;
    Ok((spec, o))
}

/// `CL.THROTTLE key max_burst count_per_period period [quantity]` (after the key): redis-cell's
/// arguments, with its model (limit = max_burst + 1 at count per period seconds), checked.
pub fn cl_throttle(args: &[&[u8]]) -> ArgResult<(Rate, u64)> {
    if !(3..=4).contains(&args.len()) {
        return Err(wrong_arity("cl.throttle"));
    }
    let max_burst = non_negative(args[0], "max_burst")?;
    if max_burst >= MAX_COUNT {
        return Err(format!("ERR max_burst must be a non-negative integer below {MAX_COUNT}"));
    }
    let count = positive(args[1], "count_per_period")?;
    let seconds = match digits(args[2]) {
        Some(s) if s >= 1 && (s as i128) * (NANOS_PER_SEC as i128) <= MAX_PERIOD.as_i128() => s,
        Some(s) if s >= 1 => return Err("ERR period must be at most 100 years in seconds".into()),
        _ => return Err("ERR period must be a positive integer (seconds)".into()),
    };
    let quantity = match args.get(3) {
        Some(q) => non_negative(q, "quantity")?,
        None => 1,
    };
    let rate = Rate::new(count, Nanos::from_secs(seconds), max_burst + 1).map_err(|e| format!("ERR {e}"))?;
    Ok((rate, quantity))
}

/// `RL.DEBUG CLOCK SET <unix_us>` and friends' integer argument (may be negative for ADVANCE).
pub fn integer(arg: &[u8], name: &str) -> ArgResult<i64> {
    let (neg, body) = match arg.first() {
        Some(b'-') => (true, &arg[1..]),
        _ => (false, arg),
    };
    let v = digits(body).filter(|&v| v <= i64::MAX as u64).ok_or_else(|| format!("ERR {name} must be an integer"))?;
    Ok(if neg { -(v as i64) } else { v as i64 })
}

/// The arguments of RL.MULTI after its keys: one limit spec per key
/// (`ALGO limit period|window [BURST n]`), then `[COST n] [DRYRUN] [PARTIAL]` for the request.
pub struct Multi {
    pub specs: Vec<Spec>,
    pub req: Request,
    pub dryrun: bool,
}

fn algorithm_word(word: &[u8]) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|a| a.name().as_bytes().eq_ignore_ascii_case(word))
}

/// COST, DRYRUN or PARTIAL: the options of a whole RL.MULTI request.
fn request_option(word: &[u8]) -> bool {
    [&b"COST"[..], b"DRYRUN", b"PARTIAL"].iter().any(|o| word.eq_ignore_ascii_case(o))
}

pub fn multi(args: &[&[u8]], numkeys: usize) -> ArgResult<Multi> {
    let mut specs = Vec::with_capacity(numkeys);
    let mut globals: Vec<&[u8]> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if let Some(algo) = algorithm_word(args[i]) {
            // The spec runs to the next algorithm name or request option.
            let start = i + 1;
            let mut end = start;
            while end < args.len() {
                if algorithm_word(args[end]).is_some() || request_option(args[end]) {
                    break;
                }
                end += 1;
            }
            let part = &args[start..end];
            if part.len() < 2 {
                return Err(format!("ERR {} needs a limit and a period", algo.multi_name()));
            }
            let context = format!("{} in RL.MULTI", algo.multi_name());
            let (spec, o) = spec_and_options(algo, part, &context)?;
            debug_assert!(o.cost.is_none() && !o.dryrun && !o.partial);
            specs.push(spec);
            i = end;
        } else {
            match args[i] {
                w if w.eq_ignore_ascii_case(b"COST") => {
                    globals.extend(args.get(i..i + 2).unwrap_or(&args[i..]));
                    i += 2;
                }
                w if request_option(w) => {
                    globals.push(args[i]);
                    i += 1;
                }
                _ if specs.is_empty() => {
                    let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.multi_name()).collect();
                    return Err(format!("ERR expected an algorithm ({}), got '{}'", names.join(", "), shown(args[i])));
                }
                _ => return Err(format!("ERR unknown option '{}'", shown(args[i]))),
            }
        }
    }
    if specs.len() != numkeys {
        return Err(format!("ERR RL.MULTI has {numkeys} keys but {} limits: give one limit per key", specs.len()));
    }
    let o = options(&globals, false, "RL.MULTI")?;
    Ok(Multi { specs, req: Request { cost: o.cost.unwrap_or(1), partial: o.partial }, dryrun: o.dryrun })
}

/// The arguments of RL.RETURN after the key: `n [AGE ms]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GiveBack {
    /// Units given back, 1 to MAX_COUNT.
    pub n: u64,
    /// Time since the caller sent the claim, in ns (given in ms; saturates beyond i64).
    pub age: Option<Nanos>,
}

pub fn give_back(args: &[&[u8]]) -> ArgResult<GiveBack> {
    let Some((n, mut rest)) = args.split_first() else {
        return Err(wrong_arity("rl.return"));
    };
    let n = positive(n, "n")?;
    let mut age = None;
    while let Some((word, tail)) = rest.split_first() {
        if !word.eq_ignore_ascii_case(b"AGE") {
            return Err(format!("ERR unknown option '{}'", shown(word)));
        }
        if age.is_some() {
            return Err("ERR option AGE given more than once".into());
        }
        let (ms, tail) = tail.split_first().ok_or("ERR AGE needs a value")?;
        age = Some(Nanos::from_millis(non_negative(ms, "AGE")?));
        rest = tail;
    }
    Ok(GiveBack { n, age })
}
