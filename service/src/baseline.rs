//! The benchmark's baseline only (`BENCH_BASELINE_ENVOYPROXY`, service/benches/service.rs):
//! envoyproxy/ratelimit's Redis traffic from this service, so that the benchmark compares
//! commands and CPU per request on one code base. Never for serving: it counts every
//! descriptor even when the request is refused, and its windows are fixed on this process's
//! clock.

use std::time::{Duration, Instant};

use redis_ratelimit_client::Decision;

use crate::backend::{Backend, CheckResult, DescriptorCheck, RequestResult};
use crate::connection::BackendError;
use crate::metrics::RedisOp;

/// A pipeline of `INCRBY key hits` + `EXPIRE key unit` per descriptor, on a key carrying the
/// window's start, through the same connections as the module's commands.
pub(crate) async fn decide(b: &Backend, checks: &[DescriptorCheck]) -> Result<RequestResult, BackendError> {
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut pipe = redis::pipe();
    for c in checks {
        let div = c.limit.period().as_secs().max(1);
        let key = format!("{}_{}", c.key, (now_s / div) * div);
        pipe.cmd("INCRBY").arg(&key).arg(c.cost).cmd("EXPIRE").arg(&key).arg(div).ignore();
    }
    b.metrics.redis_call(RedisOp::Check, 2 * checks.len() as u64);
    let started = Instant::now();
    let replies = b.conns.pipeline(&pipe, tokio::time::Instant::now() + b.timeout).await?;
    b.metrics.redis_latency.observe(started.elapsed());
    let mut admitted = true;
    let mut verdicts = Vec::with_capacity(checks.len());
    for (c, v) in checks.iter().zip(replies) {
        let n: u64 = b.parse(v)?;
        let ok = n <= c.limit.limit();
        admitted &= ok;
        let div = c.limit.period().as_secs().max(1);
        verdicts.push(CheckResult {
            decision: Decision {
                allowed: if ok { c.cost } else { 0 },
                limit: c.limit.limit(),
                remaining: c.limit.limit().saturating_sub(n),
                retry_after: (!ok).then(|| Duration::from_secs(div - now_s % div)),
                reset_after: Duration::from_secs(div - now_s % div),
                delay: None,
            },
            admitted: ok,
            consumed: true,
        });
    }
    Ok(RequestResult { admitted, verdicts })
}
