//! Typed async calls, one per command, over any `redis::aio::ConnectionLike`:
//! `MultiplexedConnection`, `ConnectionManager`, or a cluster `ClusterConnection` (every
//! command's key is at position 1 except RL.MULTI's, which the cluster client routes by
//! following the server's `MOVED` redirection; give RL.MULTI keys one hash tag).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisResult, Value};

use crate::decision::{Decision, MultiDecision, ThrottleDecision};
use crate::spec::{Algorithm, Limit};

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
    let name = limit.algorithm.command();
    // 10 arguments at most; the numbers take at most 20 digits each (the period 26 and a unit).
    let mut c = Cmd::with_capacity(10, name.len() + key.len() + 96);
    c.arg(name).arg(key);
    append_limit(&mut c, limit);
    opts.append(&mut c);
    c
}

/// Appends `limit period [BURST n]` ([`Limit::args`]) without allocating: the integers as the
/// command formats them, the period in a buffer on the stack ([`crate::spec::duration_arg`]'s form).
pub fn append_limit(c: &mut Cmd, limit: &Limit) {
    c.arg(limit.limit);
    c.arg(crate::spec::duration_bytes(limit.period, &mut [0; 41]));
    if let (true, Some(b)) = (limit.algorithm.is_bucket(), limit.burst) {
        c.arg("BURST").arg(b);
    }
}

/// A limit's command name and `limit period [BURST b]` encoded once, for a driver that sends
/// many commands of one limit (a limiter's one-off claims): each command then copies the bytes
/// instead of formatting the numbers again.
#[derive(Clone, Debug)]
pub(crate) struct LimitArgs {
    name: &'static str,
    /// The arguments' bytes, one after another; `ends[i]` is where argument `i` ends.
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl LimitArgs {
    pub(crate) fn new(limit: &Limit) -> LimitArgs {
        let mut c = Cmd::new();
        append_limit(&mut c, limit);
        let (mut bytes, mut ends) = (Vec::new(), Vec::new());
        for a in c.args_iter() {
            if let redis::Arg::Simple(b) = a {
                bytes.extend_from_slice(b);
                ends.push(bytes.len());
            }
        }
        LimitArgs { name: limit.algorithm.command(), bytes, ends }
    }

    /// [`limit_cmd`]'s command for this limit.
    pub(crate) fn cmd(&self, key: &str, opts: Options) -> Cmd {
        // `COST n` takes 4 and at most 20 bytes, `DRYRUN` and `PARTIAL` 13.
        let mut c = Cmd::with_capacity(self.ends.len() + 6, self.name.len() + key.len() + self.bytes.len() + 37);
        c.arg(self.name).arg(key);
        let mut start = 0;
        for &end in &self.ends {
            c.arg(&self.bytes[start..end]);
            start = end;
        }
        opts.append(&mut c);
        c
    }
}

/// Checks `key` against `limit` (any of the six algorithms).
pub async fn check<C: ConnectionLike>(conn: &mut C, key: &str, limit: &Limit, opts: Options) -> RedisResult<Decision> {
    limit_cmd(key, limit, opts).query_async(conn).await
}

macro_rules! algorithm_calls {
    ($($(#[$doc:meta])* $name:ident => $algo:ident, $burst:tt;)*) => {$(
        $(#[$doc])*
        pub async fn $name<C: ConnectionLike>(conn: &mut C, key: &str, limit: u64, period: Duration, burst: algorithm_calls!(@burst $burst), opts: Options) -> RedisResult<Decision> {
            let b = algorithm_calls!(@value $burst burst);
            let l = Limit { algorithm: Algorithm::$algo, limit, period, burst: b };
            check(conn, key, &l, opts).await
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

/// `RL.MULTI numkeys key… ALGO limit period [BURST b]… [COST n] [DRYRUN] [PARTIAL]`: every
/// limit in one atomic all-or-nothing call (keys must share a hash slot in a cluster).
pub async fn multi<C: ConnectionLike>(
    conn: &mut C,
    limits: &[(&str, Limit)],
    opts: Options,
) -> RedisResult<MultiDecision> {
    let mut c = redis::cmd("RL.MULTI");
    c.arg(limits.len());
    for (key, _) in limits {
        c.arg(*key);
    }
    for (_, l) in limits {
        c.arg(l.algorithm.multi_name());
        append_limit(&mut c, l);
    }
    opts.append(&mut c);
    c.query_async(conn).await
}

/// `RL.INFO key`: the key's algorithm, parameters and state as (field, value) pairs; `None`
/// for a missing key.
pub async fn info<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<Option<Vec<(String, Value)>>> {
    let v: Value = redis::cmd("RL.INFO").arg(key).query_async(conn).await?;
    Ok(match v {
        Value::Nil => None,
        Value::Map(pairs) => {
            Some(pairs.into_iter().map(|(k, v)| Ok((redis::from_redis_value(&k)?, v))).collect::<RedisResult<_>>()?)
        }
        Value::Array(items) => Some(
            items
                .chunks(2)
                .filter(|p| p.len() == 2)
                .map(|p| Ok((redis::from_redis_value(&p[0])?, p[1].clone())))
                .collect::<RedisResult<_>>()?,
        ),
        other => {
            return Err(redis::RedisError::from((
                redis::ErrorKind::TypeError,
                "unexpected RL.INFO reply",
                format!("{other:?}"),
            )))
        }
    })
}

/// `RL.RESET key`: true when a limiter was deleted.
pub async fn reset<C: ConnectionLike>(conn: &mut C, key: &str) -> RedisResult<bool> {
    let n: i64 = redis::cmd("RL.RESET").arg(key).query_async(conn).await?;
    Ok(n > 0)
}

/// `RL.RETURN key n [AGE ms]`: gives `n` unused units back; returns the units credited
/// (0..=n). `age`: time since the claim the units came from was **sent** (required for the
/// window limiters, rounded up to the ms). A missing key credits nothing (a limiter that
/// expired is already full) and answers `Ok(0)`; the sliding log refuses (an error).
pub async fn give_back<C: ConnectionLike>(conn: &mut C, key: &str, n: u64, age: Option<Duration>) -> RedisResult<u64> {
    return_reply(give_back_cmd(key, n, age).query_async::<i64>(conn).await)
}

/// The command of [`give_back`]: `RL.RETURN key n [AGE ms]`, AGE rounded up to the ms.
pub fn give_back_cmd(key: &str, n: u64, age: Option<Duration>) -> Cmd {
    let mut c = redis::cmd("RL.RETURN");
    c.arg(key).arg(n);
    if let Some(a) = age {
        c.arg("AGE").arg(redis_ratelimit_core::Nanos::from(a).as_millis_ceil());
    }
    c
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
                redis::Arg::Cursor => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn builds_commands() {
        let l = Limit::gcra(10, Duration::from_secs(1)).with_burst(20);
        let args = args_of(&limit_cmd("k", &l, Options::claim(5)));
        assert_eq!(args, ["RL.GCRA", "k", "10", "1000ms", "BURST", "20", "COST", "5", "PARTIAL"]);
    }

    #[test]
    fn appended_limit_arguments_are_limit_args() {
        let periods = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(1500),
            Duration::from_millis(1),
            Duration::from_secs(60),
            Duration::from_secs(86_400 * 365),
            Duration::MAX,
        ];
        for algorithm in [Algorithm::Gcra, Algorithm::Fixed] {
            for period in periods {
                for burst in [None, Some(0), Some(u64::MAX)] {
                    let l = Limit { algorithm, limit: u64::MAX, period, burst };
                    let mut c = Cmd::new();
                    append_limit(&mut c, &l);
                    assert_eq!(args_of(&c), l.args(), "{l:?}");
                }
            }
        }
    }

    #[test]
    fn encoded_limit_args_build_the_same_command_as_limit_cmd() {
        let algorithms = [
            Algorithm::Gcra,
            Algorithm::TokenBucket,
            Algorithm::Leaky,
            Algorithm::Sliding,
            Algorithm::Fixed,
            Algorithm::SlidingLog,
        ];
        let options = [
            Options::default(),
            Options::cost(0),
            Options::cost(u64::MAX),
            Options::claim(7),
            Options::cost(3).dry_run(),
            Options { cost: Some(9), dry_run: true, partial: true },
        ];
        for algorithm in algorithms {
            for period in [Duration::from_micros(1500), Duration::from_secs(60), Duration::MAX] {
                for burst in [None, Some(0), Some(u64::MAX)] {
                    let l = Limit { algorithm, limit: u64::MAX, period, burst };
                    let encoded = LimitArgs::new(&l);
                    for key in ["", "k", "tenant:{a}:\u{e9}"] {
                        for opts in options {
                            let (a, b) = (encoded.cmd(key, opts), limit_cmd(key, &l, opts));
                            assert_eq!(a.get_packed_command(), b.get_packed_command(), "{l:?} {opts:?}");
                        }
                    }
                }
            }
        }
    }
}
