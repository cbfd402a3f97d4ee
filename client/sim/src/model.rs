//! What the simulator drives on each instance: a client model. Two of them: per-request
//! checking (the baseline: one server call per request) and leases (the client crate's pure
//! lease logic, through `lease::LeaseModel`). The simulator is their driver: it carries their
//! commands to the server, enforces the call timeout, and tells them the answers.

use crate::server::{Answer, Command};
use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::spec::Spec;
use redis_ratelimit_core::{Nanos, Request};

/// A request waiting for its verdict, named by the simulator.
pub type CallerId = u64;
/// One server call, named by the simulator.
pub type CallId = u64;

/// How a request was let through, or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted against units the server granted (a lease, or a per-request check).
    Enforced,
    /// Admitted because Redis is unavailable and the policy is fail open.
    Open,
    /// Admitted by the local fallback limit while Redis is unavailable.
    Fallback,
    /// Limited (by the server, the over-limit cache, or fail closed).
    Limited,
}

/// What a call came back with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallResult {
    Answer(Answer),
    /// The connection was refused (or reset).
    Refused,
    /// No answer within the call timeout.
    Timeout,
}

/// Effects a model asks its driver for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Admission { caller: CallerId, verdict: Admission },
    Send { call: CallId, command: Command },
}

/// What to do when Redis cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    Closed,
    Open,
    /// A local limiter per instance and key with this spec (for example the limit ÷ instances).
    Fallback(Spec),
}

impl FailurePolicy {
    pub fn name(&self) -> &'static str {
        match self {
            FailurePolicy::Closed => "fail-closed",
            FailurePolicy::Open => "fail-open",
            FailurePolicy::Fallback(_) => "local-fallback",
        }
    }
}

/// Counters a model keeps about itself (the simulator keeps its own as well and compares).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCounters {
    pub units_claimed: u64,
    pub units_served: u64,
    pub units_returned: u64,
    pub units_expired: u64,
}

/// One instance's client, driven in (the instance's own) virtual time.
pub trait ClientModel {
    /// A request for one unit of `key` arrives.
    fn request(
        &mut self,
        now: i64,
        key: usize,
        caller: CallerId,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    );
    /// The outcome of call `call`.
    fn outcome(
        &mut self,
        now: i64,
        call: CallId,
        outcome: CallResult,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    );
    /// Time passes (lease expiry, background claims, returns of idle units).
    fn tick(&mut self, now: i64, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>);
    /// When `tick` next has something to do.
    fn next_tick(&self) -> Option<i64>;
    /// Graceful shutdown: give back what is held.
    fn shutdown(&mut self, now: i64, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>);
    fn counters(&self) -> ModelCounters;
}

/// A local limiter with the core's own algorithm (the fallback of per-request checking).
pub struct LocalLimiter {
    spec: Spec,
    states: std::collections::HashMap<usize, State>,
}

impl LocalLimiter {
    pub fn new(spec: Spec) -> LocalLimiter {
        LocalLimiter { spec, states: Default::default() }
    }

    pub fn admit(&mut self, key: usize, now: i64) -> bool {
        let Ok((d, update)) = self.spec.check(self.states.get(&key), Nanos::new(now), Request::new(1)) else {
            return false;
        };
        if let Some(u) = update {
            if let Ok(Some(fresh)) = u.apply(self.states.get_mut(&key)) {
                self.states.insert(key, fresh);
            }
        }
        d.allowed == 1
    }
}

/// The baseline: every request is one server call (`COST 1`); a failed call follows the policy.
pub struct PerRequest {
    policy: FailurePolicy,
    fallback: Option<LocalLimiter>,
    pending: std::collections::HashMap<CallId, (CallerId, usize)>,
    counters: ModelCounters,
}

impl PerRequest {
    pub fn new(policy: FailurePolicy) -> PerRequest {
        let fallback = match policy {
            FailurePolicy::Fallback(spec) => Some(LocalLimiter::new(spec)),
            _ => None,
        };
        PerRequest { policy, fallback, pending: Default::default(), counters: Default::default() }
    }
}

impl ClientModel for PerRequest {
    fn request(
        &mut self,
        _now: i64,
        key: usize,
        caller: CallerId,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let call = calls();
        self.pending.insert(call, (caller, key));
        out.push(Effect::Send { call, command: Command::Check { key, cost: 1, partial: false } });
    }

    fn outcome(
        &mut self,
        now: i64,
        call: CallId,
        outcome: CallResult,
        _calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let Some((caller, key)) = self.pending.remove(&call) else { return };
        let verdict = match outcome {
            CallResult::Answer(Answer::Decision(d)) if d.allowed > 0 => {
                self.counters.units_claimed += d.allowed;
                self.counters.units_served += d.allowed;
                Admission::Enforced
            }
            CallResult::Answer(_) => Admission::Limited,
            CallResult::Refused | CallResult::Timeout => match self.policy {
                FailurePolicy::Closed => Admission::Limited,
                FailurePolicy::Open => Admission::Open,
                FailurePolicy::Fallback(_) => {
                    if self.fallback.as_mut().is_some_and(|f| f.admit(key, now)) {
                        Admission::Fallback
                    } else {
                        Admission::Limited
                    }
                }
            },
        };
        out.push(Effect::Admission { caller, verdict });
    }

    fn tick(&mut self, _now: i64, _calls: &mut dyn FnMut() -> CallId, _out: &mut Vec<Effect>) {}

    fn next_tick(&self) -> Option<i64> {
        None
    }

    fn shutdown(&mut self, _now: i64, _calls: &mut dyn FnMut() -> CallId, _out: &mut Vec<Effect>) {}

    fn counters(&self) -> ModelCounters {
        self.counters
    }
}
