//! The quota service's one need from Redis, behind a narrow seam: claim units of a limit
//! (`<RL.cmd> key limit period [BURST b] COST n PARTIAL`), give unused units back
//! (`RL.RETURN key n AGE ms`), and count a bucket's holders across the fleet (`RL.SLIDING
//! <key>|holders MAX_COUNT window COST ms`), each within a deadline. [`Backend`] implements it with its own
//! connections, timeout, breaker and metrics (`Backend::call_by`, the deadline passed down to the connection layer; the client crate's
//! `limit_cmd` / `give_back_cmd`), so the quota service follows the service's Redis layer as it
//! changes.

use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;
use redis_ratelimit_client::commands::{give_back_cmd, limit_cmd, Options};
use redis_ratelimit_client::spec::Limit;
use redis_ratelimit_client::{Decision, Nanos};
use redis_ratelimit_core::MAX_COUNT;

use crate::backend::{Backend, BackendError};
use crate::metrics::RedisOp;

pub trait QuotaStore: Send + Sync + 'static {
    /// Claims up to `units` of `limit` at `key`: the reply's `allowed` is what was granted.
    fn claim<'a>(
        &'a self,
        key: &'a str,
        limit: &'a Limit,
        units: u64,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Decision, BackendError>>;

    /// Gives `units` back, claimed at most `age` ago (`commands::return_age`); returns the
    /// units credited (0 for a key that is gone).
    fn give_back<'a>(
        &'a self,
        key: &'a str,
        units: u64,
        age: Nanos,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<u64, BackendError>>;

    /// Charges `held` of holder-time (whole ms, rounded up) to the holder counter at `key`, a
    /// sliding window of `window` (whole ms) with no practical limit; returns the holder-time
    /// it counts in its window, this charge included (ms). Only the module's own command: a
    /// user granted `+@ratelimit` (or the command names) on the service's key pattern can.
    fn count_holders<'a>(
        &'a self,
        key: &'a str,
        held: Nanos,
        window: Nanos,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<u64, BackendError>>;
}

impl QuotaStore for Backend {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        limit: &'a Limit,
        units: u64,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Decision, BackendError>> {
        Box::pin(async move {
            let cmd = limit_cmd(key, limit, Options::claim(units));
            let slot = self.slot_of(key);
            let v = self.call_by(RedisOp::Claim, &cmd, slot, Some(Instant::now() + deadline)).await?;
            self.parse(v)
        })
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        units: u64,
        age: Nanos,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let cmd = give_back_cmd(key, units, Some(age));
            let slot = self.slot_of(key);
            // (A key that is gone credits nothing: Backend::call_by answers 0 for it.)
            let v = self.call_by(RedisOp::Return, &cmd, slot, Some(Instant::now() + deadline)).await?;
            Ok(self.parse::<i64>(v)?.max(0) as u64)
        })
    }

    fn count_holders<'a>(
        &'a self,
        key: &'a str,
        held: Nanos,
        window: Nanos,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let limit = Limit::sliding(MAX_COUNT, Duration::from(window))
                .map_err(|e| self.invalid(format!("holder counter of {key}: {e}")))?;
            let cmd = limit_cmd(key, &limit, Options::cost(held.as_millis_ceil()));
            let slot = self.slot_of(key);
            let v = self.call_by(RedisOp::Holders, &cmd, slot, Some(Instant::now() + deadline)).await?;
            let d: Decision = self.parse(v)?;
            Ok(d.limit.saturating_sub(d.remaining))
        })
    }
}
