//! One limit as the caller states it (algorithm and parameters), and the dispatch of a check
//! to the algorithm's core against whatever a key holds.

use super::codec::State;
use super::{
    fixed, gcra, leaky, sliding, sliding_log, token_bucket, Algorithm, Decision, LimitError, Nanos, Rate, Request,
    Window,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    Gcra(Rate),
    TokenBucket(Rate),
    Leaky(Rate),
    Sliding(Window),
    Fixed(Window),
    SlidingLog(Window),
}

/// What to store after an admitted check: a whole (small) state, or the change to a sliding
/// log (a log is changed in place, never rewritten, so an admitted call stays O(1)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    Replace(State),
    Log(sliding_log::Commit),
}

/// The key holds another algorithm's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgorithmMismatch {
    pub stored: Algorithm,
    pub requested: Algorithm,
}

impl Spec {
    /// `algorithm` at `limit` per `period` (the window of a window algorithm), with a capacity
    /// of `burst` for a bucket (a window ignores it), validated ([`Rate::new`], [`Window::new`]).
    #[inline]
    pub fn new(algorithm: Algorithm, limit: u64, period: Nanos, burst: u64) -> Result<Spec, LimitError> {
        let rate = || Rate::new(limit, period, burst);
        let window = || Window::new(limit, period);
        Ok(match algorithm {
            Algorithm::Gcra => Spec::Gcra(rate()?),
            Algorithm::TokenBucket => Spec::TokenBucket(rate()?),
            Algorithm::Leaky => Spec::Leaky(rate()?),
            Algorithm::Sliding => Spec::Sliding(window()?),
            Algorithm::Fixed => Spec::Fixed(window()?),
            Algorithm::SlidingLog => Spec::SlidingLog(window()?),
        })
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            Spec::Gcra(_) => Algorithm::Gcra,
            Spec::TokenBucket(_) => Algorithm::TokenBucket,
            Spec::Leaky(_) => Algorithm::Leaky,
            Spec::Sliding(_) => Algorithm::Sliding,
            Spec::Fixed(_) => Algorithm::Fixed,
            Spec::SlidingLog(_) => Algorithm::SlidingLog,
        }
    }

    /// Decides `req` at `now` against the stored state (None: a missing key).
    pub fn check(
        &self,
        stored: Option<&State>,
        now: Nanos,
        req: Request,
    ) -> Result<(Decision, Option<Update>), AlgorithmMismatch> {
        let mismatch = |s: &State| AlgorithmMismatch { stored: s.algorithm(), requested: self.algorithm() };
        macro_rules! run {
            ($module:ident, $variant:ident, $params:expr) => {{
                let prior = match stored {
                    None => None,
                    Some(State::$variant(s)) => Some(s),
                    Some(other) => return Err(mismatch(other)),
                };
                let (d, new) = $module::check(prior, $params, now, req);
                (d, new.map(|s| Update::Replace(State::$variant(s))))
            }};
        }
        Ok(match self {
            Spec::Gcra(r) => run!(gcra, Gcra, r),
            Spec::TokenBucket(r) => run!(token_bucket, TokenBucket, r),
            Spec::Leaky(r) => run!(leaky, Leaky, r),
            Spec::Sliding(w) => run!(sliding, Sliding, w),
            Spec::Fixed(w) => run!(fixed, Fixed, w),
            Spec::SlidingLog(w) => {
                let prior = match stored {
                    None => None,
                    Some(State::SlidingLog(s)) => Some(&**s),
                    Some(other) => return Err(mismatch(other)),
                };
                let (d, commit) = sliding_log::check(prior, w, now, req);
                (d, commit.map(Update::Log))
            }
        })
    }
}

impl Update {
    /// Applies the update to the stored state; `None` when the key is missing (the caller
    /// stores the returned state). A log commit on a key holding anything else is refused.
    pub fn apply(&self, stored: Option<&mut State>) -> Result<Option<State>, &'static str> {
        match (self, stored) {
            (Update::Replace(s), Some(slot)) => {
                *slot = s.clone();
                Ok(None)
            }
            (Update::Replace(s), None) => Ok(Some(s.clone())),
            (Update::Log(c), Some(State::SlidingLog(log))) => {
                if log.total_after(c) > super::MAX_COUNT {
                    return Err("the log would hold more units than any limit allows");
                }
                log.apply(c);
                Ok(None)
            }
            (Update::Log(c), None) => {
                let mut log = sliding_log::State::new(c.win);
                log.apply(c);
                Ok(Some(State::SlidingLog(Box::new(log))))
            }
            (Update::Log(_), Some(_)) => Err("key does not hold a sliding log"),
        }
    }
}
