//! The one place the layer calls the client: a request's rules decided against their
//! limiters. Everything else in the crate sees [`Check`] and [`decide`] only.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;

use redis_ratelimit_client::redis::aio::ConnectionLike;
use redis_ratelimit_client::{check_all, Limit, Limiter, Outcome};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A limiter as the layer uses it: object safe, so that rules over different connection types
/// can sit in one list. Implemented for every [`Limiter`].
pub trait Check: Send + Sync + 'static {
    /// Takes `cost` units of `key`.
    fn check<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Outcome>;
    /// The limit (for the policy's window in the headers).
    fn limit(&self) -> Limit;
    fn as_any(&self) -> &dyn Any;
    /// Decides every check together (the client's `check_all`: all admit or nothing is
    /// taken) when they are all limiters of this one type; `None` otherwise.
    fn check_all<'a>(
        &'a self,
        checks: &'a [(&'a dyn Check, String)],
        cost: u64,
    ) -> Option<BoxFuture<'a, Vec<Option<Outcome>>>>;
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Check for Limiter<C> {
    fn check<'a>(&'a self, key: &'a str, cost: u64) -> BoxFuture<'a, Outcome> {
        Box::pin(Limiter::check(self, key, cost))
    }

    fn limit(&self) -> Limit {
        self.config().limit()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn check_all<'a>(
        &'a self,
        checks: &'a [(&'a dyn Check, String)],
        cost: u64,
    ) -> Option<BoxFuture<'a, Vec<Option<Outcome>>>> {
        let same: Vec<(&Limiter<C>, &str)> = checks
            .iter()
            .map(|(c, k)| c.as_any().downcast_ref::<Limiter<C>>().map(|l| (l, k.as_str())))
            .collect::<Option<_>>()?;
        Some(Box::pin(async move { check_all(&same, cost).await.outcomes }))
    }
}

/// Decides `cost` units of each `(limiter, key)`: one outcome per check, in order, `None` for
/// a limit that was not consulted.
///
/// Several limiters of one connection type (the usual case) are decided together by the
/// client's `check_all`: admitted only if every limit admits, nothing taken from any when one
/// refuses. Limiters over different connection types fall back to checking in turn, stopping
/// at the first refusal (units already taken from earlier limits are then spent).
pub async fn decide(checks: &[(&dyn Check, String)], cost: u64) -> Vec<Option<Outcome>> {
    match checks {
        [] => Vec::new(),
        [(one, key)] => vec![Some(one.check(key, cost).await)],
        [(first, _), ..] => match first.check_all(checks, cost) {
            Some(all) => all.await,
            None => {
                let mut outcomes = vec![None; checks.len()];
                for (slot, (limiter, key)) in outcomes.iter_mut().zip(checks) {
                    let o = limiter.check(key, cost).await;
                    *slot = Some(o);
                    if !o.allowed {
                        break;
                    }
                }
                outcomes
            }
        },
    }
}
