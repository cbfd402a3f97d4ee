//! Typed async calls, one per command, over any `redis::aio::ConnectionLike`:
//! `MultiplexedConnection`, `ConnectionManager`, or a cluster `ClusterConnection` (every
//! command's key is at position 1 except RL.MULTI's, which the cluster client routes by
//! following the server's `MOVED` redirection; give RL.MULTI keys one hash tag).
//!
//! The builders of every limiter command, RL.MULTI and RL.RETURN are here, and are the only
//! way any crate of the workspace builds them: a limit's arguments have one encoding
//! ([`each_limit_arg`]), a return's `AGE` one rule ([`return_age`]).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisResult, Value};

use crate::decision::{Decision, MultiDecision, ThrottleDecision};
use crate::spec::{Algorithm, Limit};
use redis_ratelimit_core::Nanos;

/// The options every limiter command takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `COST n` (units this request takes; 0 peeks). `None`: 1.
    pub cost: Option<u64>,
    /// `DRYRUN`: decide without changing anything.
    pub dry_run: bool,
    /// `PARTIAL`: grant as many units as available, up to COST.
    pub partial: bool,
}

impl Options {
    pub fn cost(n: u64) -> Options {
        Options { cost: Some(n), ..Options::default() }
    }
    /// `COST n PARTIAL`: a claim of up to `n` units.
    pub fn claim(n: u64) -> Options {
        Options { cost: Some(n), partial: true, dry_run: false }
    }
    pub fn dry_run(mut self) -> Options {
        self.dry_run = true;
        self
    }
    pub fn partial(mut self) -> Options {
        self.partial = true;
        self
    }

    fn append(&self, c: &mut Cmd) {
        if let Some(n) = self.cost {
            c.arg("COST").arg(n);
        }
        if self.dry_run {
            c.arg("DRYRUN");
        }
        if self.partial {
            c.arg("PARTIAL");
        }
    }
}

/// The command for one limit: `<RL.ALGO> key limit period [BURST b] [COST n] [DRYRUN] [PARTIAL]`.
/// Built in one allocation of each of the command's two buffers (sized up front, nothing
/// formatted on the heap): a cold key's check builds one per request.
pub fn limit_cmd(key: &str, limit: &Limit, opts: Options) -> Cmd {
    let name = limit.algorithm().command();
    // 10 arguments at most; the numbers take at most 20 digits each (the period 26 and a unit).
    let mut c = Cmd::with_capacity(10, name.len() + key.len() + 96);
    c.arg(name).arg(key);
    each_limit_arg(limit, |a| {
        c.arg(a);
    });
    opts.append(&mut c);
    c
}

/// A limit's arguments, `limit period [BURST n]`, each in turn: the one encoding of a limit,
/// for every command that carries one (the limiter commands, RL.MULTI, the service's script).
/// The integers as the command formats them, the period as [`duration_arg`]; nothing on the
/// heap.
pub fn each_limit_arg(limit: &Limit, mut f: impl FnMut(&[u8])) {
    let mut n = itoa::Buffer::new();
    f(n.format(limit.limit()).as_bytes());
    f(duration_bytes(limit.period(), &mut [0; 41]));
    // (A Limit holds a BURST only for a bucket.)
    if let Some(b) = limit.burst() {
        f(b"BURST");
        f(n.format(b).as_bytes());
    }
}

/// A duration as a module argument (`250ms`, `1500us`): whole milliseconds when exact, else
/// microseconds; at least `1us`.
pub fn duration_arg(d: Duration) -> String {
    String::from_utf8_lossy(duration_bytes(d, &mut [0; 41])).into_owned()
}

/// [`duration_arg`] written into `out` (no allocation: a typed call builds one per request).
fn duration_bytes(d: Duration, out: &mut [u8; 41]) -> &[u8] {
    let us = d.as_micros().max(1);
    let (n, unit) = if us.is_multiple_of(1000) { (us / 1000, b"ms") } else { (us, b"us") };
    let mut digits = itoa::Buffer::new();
    // At most 39 digits (u128::MAX), then the unit.
    let digits = digits.format(n).as_bytes();
    let len = digits.len() + 2;
    out[..digits.len()].copy_from_slice(digits);
    out[digits.len()..len].copy_from_slice(unit);
    &out[..len]
}

/// Checks `key` against `limit` (any of the six algorithms).
pub async fn check<C: ConnectionLike>(conn: &mut C, key: &str, limit: &Limit, opts: Options) -> RedisResult<Decision> {
    limit_cmd(key, limit, opts).query_async(conn).await
}

macro_rules! algorithm_calls {
    ($($(#[$doc:meta])* $name:ident => $algo:ident, $burst:tt;)*) => {$(
        $(#[$doc])*
        pub async fn $name<C: ConnectionLike>(conn: &mut C, key: &str, limit: u64, period: Duration, burst: algorithm_calls!(@burst $burst), opts: Options) -> RedisResult<Decision> {
            let l = Limit::new(Algorithm::$algo, limit, period).and_then(|l| match algorithm_calls!(@value $burst burst) {
                Some(b) => l.with_burst(b),
                None => Ok(l),
            });
            match l {
                Ok(l) => check(conn, key, &l, opts).await,
                Err(e) => Err(invalid_limit(e)),
            }
        }
    )*};
    (@burst yes) => { Option<u64> };
    (@burst no) => { () };
    (@value yes $b:ident) => { $b };
    (@value no $b:ident) => { { let () = $b; None } };
}

algorithm_calls! {
    /// `RL.GCRA key limit period [BURST b] …`.
    gcra => Gcra, yes;
    /// `RL.TOKENBUCKET key limit period [BURST b] …`.
    token_bucket => TokenBucket, yes;
    /// `RL.LEAKY key limit period [BURST b] …` (the decision carries `delay`).
    leaky => Leaky, yes;
    /// `RL.SLIDING key limit window …` (pass `()` for the burst).
    sliding => Sliding, no;
    /// `RL.FIXED key limit window …` (pass `()` for the burst).
    fixed => Fixed, no;
    /// `RL.SLIDINGLOG key limit window …` (pass `()` for the burst).
    sliding_log => SlidingLog, no;
}

/// A limit the module would refuse, as the error a call answers (no command is sent).
fn invalid_limit(e: crate::spec::LimitError) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "invalid limit", e.to_string()))
}

/// `RL.MULTI numkeys key… ALGO limit period [BURST b]… [COST n] [DRYRUN] [PARTIAL]`: every
/// limit in one atomic all-or-nothing call (keys must share a hash slot in a cluster).
pub async fn multi<C: ConnectionLike>(
    conn: &mut C,
    limits: &[(&str, Limit)],
    opts: Options,
) -> RedisResult<MultiDecision> {
    multi_cmd(limits.iter().map(|(k, l)| (*k, l)), opts).query_async(conn).await
}

/// The command of [`multi`]: the keys, then each limit's RL.MULTI word and arguments, then the
/// request's options (one COST for every limit).
pub fn multi_cmd<'a>(limits: impl ExactSizeIterator<Item = (&'a str, &'a Limit)> + Clone, opts: Options) -> Cmd {
    let mut c = redis::cmd("RL.MULTI");
    c.arg(limits.len());
    for (key, _) in limits.clone() {
        c.arg(key);
    }
    for (_, l) in limits {
        c.arg(l.algorithm().multi_name());
        each_limit_arg(l, |a| {
            c.arg(a);
        });
    }
    opts.append(&mut c);
    c
}

/// `RL.INFO key`: the key's algorithm, parameters and state as (field, value) pairs; `None`
/// for a missing key.
pub async fn info<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<Option<Vec<(String, Value)>>> {
    let v: Value = redis::cmd("RL.INFO").arg(key).query_async(conn).await?;
    Ok(match v {
        Value::Nil => None,
        Value::Map(pairs) => {
            Some(pairs.into_iter().map(|(k, v)| Ok((redis::from_redis_value(k)?, v))).collect::<RedisResult<_>>()?)
        }
        Value::Array(items) => Some(
            items
                .chunks(2)
                .filter(|p| p.len() == 2)
                .map(|p| Ok((redis::from_redis_value_ref(&p[0])?, p[1].clone())))
                .collect::<RedisResult<_>>()?,
        ),
        other => return Err(redis::ParsingError::from(format!("unexpected RL.INFO reply: {other:?}")).into()),
    })
}

/// `RL.RESET key`: true when a limiter was deleted.
pub async fn reset<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<bool> {
    let n: i64 = redis::cmd("RL.RESET").arg(key).query_async(conn).await?;
    Ok(n > 0)
}

/// `RL.RETURN key n [AGE ms]`: gives `n` unused units back; returns the units credited
/// (0..=n). `age`: an upper bound on the time since the claim the units came from was **sent**
/// (required for the window limiters, rounded up to the ms; [`return_age`] computes it). A
/// missing key credits nothing (a limiter that expired is already full) and answers `Ok(0)`;
/// the sliding log refuses (an error).
pub async fn give_back<C: ConnectionLike>(conn: &mut C, key: &str, n: u64, age: Option<Duration>) -> RedisResult<u64> {
    return_reply(give_back_cmd(key, n, age.map(Nanos::from)).query_async::<i64>(conn).await)
}

/// The command of [`give_back`]: `RL.RETURN key n [AGE ms]`, AGE rounded up to the ms (never
/// below the true age).
pub fn give_back_cmd(key: &str, n: u64, age: Option<Nanos>) -> Cmd {
    let mut c = redis::cmd("RL.RETURN");
    c.arg(key).arg(n);
    if let Some(a) = age {
        c.arg("AGE").arg(a.as_millis_ceil());
    }
    c
}

/// The `AGE` of units given back: the time since their claim was sent plus `margin`, the
/// return's own transit to the server (at most the caller's call timeout), so that the age the
/// server sees is never below the true one (docs/local-reservations.md, rule 4; a bucket then
/// credits `units − rate × AGE`: never above a key that never saw the units). The one rule, for
/// the client's engine and the service's cross-slot compensation.
pub fn return_age(claim_sent: Nanos, now: Nanos, margin: Nanos) -> Nanos {
    (now - claim_sent) + margin
}

/// RL.RETURN's answer: the units credited; a missing key credits nothing (`Ok(0)`).
pub fn return_reply(r: RedisResult<i64>) -> RedisResult<u64> {
    match r {
        Ok(n) => Ok(n.max(0) as u64),
        Err(e)
            if e.detail().is_some_and(|d| d.starts_with("no limiter at this key"))
                || e.to_string().contains("no limiter at this key") =>
        {
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

/// `CL.THROTTLE key max_burst count_per_period period_secs [quantity]` (redis-cell compatible).
pub async fn throttle<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    max_burst: u64,
    count_per_period: u64,
    period_secs: u64,
    quantity: Option<u64>,
) -> RedisResult<ThrottleDecision> {
    let mut c = redis::cmd("CL.THROTTLE");
    c.arg(key).arg(max_burst).arg(count_per_period).arg(period_secs);
    if let Some(q) = quantity {
        c.arg(q);
    }
    c.query_async(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(c: &Cmd) -> Vec<String> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    fn limits() -> Vec<Limit> {
        let mut v = Vec::new();
        for algorithm in Algorithm::ALL {
            for period in [Duration::from_micros(1), Duration::from_micros(1500), Duration::from_secs(60)] {
                for limit in [1, 10, redis_ratelimit_core::MAX_COUNT] {
                    let l = Limit::new(algorithm, limit, period).unwrap();
                    v.push(l);
                    v.extend(l.with_burst(limit).ok());
                    v.extend(l.with_burst(1).ok());
                }
            }
        }
        v
    }

    #[test]
    fn builds_commands() {
        let l = Limit::gcra(10, Duration::from_secs(1)).unwrap().with_burst(20).unwrap();
        let args = args_of(&limit_cmd("k", &l, Options::claim(5)));
        assert_eq!(args, ["RL.GCRA", "k", "10", "1000ms", "BURST", "20", "COST", "5", "PARTIAL"]);
        let s = Limit::sliding(100, Duration::from_micros(1500)).unwrap();
        assert_eq!(args_of(&limit_cmd("k", &s, Options::default())), ["RL.SLIDING", "k", "100", "1500us"]);
        let m = multi_cmd([("a", &l), ("b", &s)].into_iter(), Options::cost(3).dry_run());
        assert_eq!(
            args_of(&m),
            [
                "RL.MULTI", "2", "a", "b", "GCRA", "10", "1000ms", "BURST", "20", "SLIDING", "100", "1500us", "COST",
                "3", "DRYRUN"
            ]
        );
        assert_eq!(args_of(&give_back_cmd("k", 4, Some(Nanos::new(1_000_001)))), ["RL.RETURN", "k", "4", "AGE", "2"]);
        assert_eq!(args_of(&give_back_cmd("k", 4, None)), ["RL.RETURN", "k", "4"]);
        assert_eq!(duration_arg(Duration::from_secs(1)), "1000ms");
        assert_eq!(duration_arg(Duration::from_micros(1500)), "1500us");
    }

    #[test]
    fn a_return_age_is_the_claims_age_plus_the_margin() {
        let ms = Nanos::from_millis;
        assert_eq!(return_age(ms(10), ms(35), ms(100)), ms(125));
        // A clock read before the send (never later than the true age either way) counts 0.
        assert_eq!(return_age(ms(35), ms(10), ms(100)), ms(100));
    }

    #[test]
    fn each_limit_arg_is_the_module_syntax() {
        for l in limits() {
            let mut args = Vec::new();
            each_limit_arg(&l, |a| args.push(String::from_utf8(a.to_vec()).unwrap()));
            let mut want = vec![l.limit().to_string(), duration_arg(l.period())];
            if let Some(b) = l.burst() {
                want.extend(["BURST".to_string(), b.to_string()]);
            }
            assert_eq!(args, want, "{l:?}");
        }
    }
}
