//! The lease mode: the client crate's own sans-IO engine (`redis_ratelimit_client::Engine`)
//! behind the simulator's `ClientModel`. This is an adapter only: every decision is the client
//! crate's; the simulator plays its driver (sends the claims and returns, applies the call
//! timeout, wakes the requests that wait for a claim, calls `tick`).

use std::collections::HashMap;
use std::time::Duration;

use redis_ratelimit::core::spec::Spec;
use redis_ratelimit::reply::decision_values;
use redis_ratelimit_client::engine::{Source, Step};
use redis_ratelimit_client::lease::ClaimRequest;
use redis_ratelimit_client::{Decision, Engine, FailurePolicy as ClientPolicy, Limit, LimiterConfig};

use crate::model::{CallId, CallerId, ClientModel, Effect, FailurePolicy, ModelCounters, Outcome, Verdict};
use crate::scenarios::{LeaseFactory, Scenario};
use crate::server::{Answer, Command};
use crate::Nanos;

/// The factory of lease models.
pub fn factory() -> Option<Box<LeaseFactory>> {
    Some(Box::new(|sc: &Scenario, policy: FailurePolicy, _instance: usize| {
        Box::new(LeaseModel::new(config(sc, policy))) as Box<dyn ClientModel>
    }))
}

/// The client's limit for a core spec.
pub fn limit_of(spec: &Spec) -> Limit {
    let ns = |n: Nanos| Duration::from_nanos(n as u64);
    match *spec {
        Spec::Gcra(r) => Limit { burst: Some(r.burst), ..Limit::gcra(r.limit, ns(r.period)) },
        Spec::TokenBucket(r) => Limit { burst: Some(r.burst), ..Limit::token_bucket(r.limit, ns(r.period)) },
        Spec::Leaky(r) => Limit { burst: Some(r.burst), ..Limit::leaky(r.limit, ns(r.period)) },
        Spec::Fixed(w) => Limit::fixed(w.limit, ns(w.window)),
        Spec::Sliding(w) => Limit::sliding(w.limit, ns(w.window)),
        Spec::SlidingLog(w) => Limit::new(redis_ratelimit_client::Algorithm::SlidingLog, w.limit, ns(w.window)),
    }
}

/// The configuration of a scenario, built as a service would build it for the tokio driver
/// (`LimiterConfig`: the client's defaults, with the scenario's lease length, instance count,
/// call timeout and policy), and the engine configuration the driver derives from it.
pub fn config(sc: &Scenario, policy: FailurePolicy) -> LimiterConfig {
    let policy = match policy {
        FailurePolicy::Closed => ClientPolicy::FailClosed,
        FailurePolicy::Open => ClientPolicy::FailOpen,
        FailurePolicy::Fallback(Spec::Gcra(r)) => {
            ClientPolicy::LocalFallback { limit: r.limit, period_ns: r.period as u64, burst: r.burst }
        }
        FailurePolicy::Fallback(other) => panic!("the client's local fallback is a bucket, not {other:?}"),
    };
    LimiterConfig::new(limit_of(&sc.setup.specs[0]))
        .lease(Duration::from_nanos(sc.lease as u64))
        .instances(sc.setup.instances.len() as u64)
        .timeout(Duration::from_nanos(sc.setup.timeout as u64))
        .policy(policy)
}

enum Flight {
    Claim { key: usize, claim: ClaimRequest, caller: Option<CallerId> },
    Return,
}

pub struct LeaseModel {
    engine: Engine<usize>,
    flights: HashMap<CallId, Flight>,
    /// Requests waiting for a claim: (key, claim id) → callers.
    waiting: HashMap<(usize, u64), Vec<CallerId>>,
    tick_every: Nanos,
    next_tick: Nanos,
    started: bool,
    timeout: Nanos,
}

impl LeaseModel {
    pub fn new(config: LimiterConfig) -> LeaseModel {
        LeaseModel {
            engine: Engine::new(config.engine_config()),
            // The driver's housekeeping period.
            tick_every: config.tick.as_nanos() as Nanos,
            timeout: config.timeout.as_nanos() as Nanos,
            flights: HashMap::new(),
            waiting: HashMap::new(),
            next_tick: 0,
            started: false,
        }
    }

    fn step(
        &mut self,
        now: Nanos,
        key: usize,
        caller: CallerId,
        step: Step,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        match step {
            Step::Done { outcome, refill } => {
                let verdict = match (outcome.allowed, outcome.source) {
                    (false, _) => Verdict::Limited,
                    (true, Source::Local | Source::Redis) => Verdict::Enforced,
                    (true, Source::FailOpen) => Verdict::Open,
                    (true, Source::Fallback) => Verdict::Fallback,
                    (true, other) => panic!("admitted by {other:?}"),
                };
                out.push(Effect::Verdict { caller, verdict });
                if let Some(c) = refill {
                    self.claim(key, c, None, calls, out);
                }
            }
            Step::Send(c) => self.claim(key, c, Some(caller), calls, out),
            Step::Wait { claim } => self.waiting.entry((key, claim)).or_default().push(caller),
        }
        let _ = now;
    }

    fn claim(
        &mut self,
        key: usize,
        claim: ClaimRequest,
        caller: Option<CallerId>,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let call = calls();
        self.flights.insert(call, Flight::Claim { key, claim, caller });
        out.push(Effect::Send { call, command: Command::Check { key, cost: claim.units, partial: claim.partial } });
    }

    fn returns(
        &mut self,
        now: Nanos,
        list: Vec<(usize, redis_ratelimit_client::lease::ReturnRequest)>,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        for (key, r) in list {
            let call = calls();
            self.flights.insert(call, Flight::Return);
            // As the driver sends it: from the claim's send, plus the call timeout, in whole
            // milliseconds rounded up (RL.RETURN's AGE is in ms).
            let age = (now as u64).saturating_sub(r.claim_sent_at) as Nanos + self.timeout;
            let age = (age + 999_999) / 1_000_000 * 1_000_000;
            out.push(Effect::Send { call, command: Command::Return { key, units: r.units, age } });
        }
    }
}

/// The core's decision as the module replies it, then parsed as the client parses a reply.
fn as_reply(d: &redis_ratelimit::core::Decision) -> Decision {
    let (v, _) = decision_values(d, true);
    Decision::from_fields(v[0], v[1], v[2], v[3], v[4], if d.delay.is_some() { Some(v[5]) } else { None })
}

impl ClientModel for LeaseModel {
    fn request(
        &mut self,
        now: Nanos,
        key: usize,
        caller: CallerId,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        if !self.started {
            self.started = true;
            self.next_tick = now + self.tick_every;
        }
        let step = self.engine.check(now as u64, &key, 1);
        self.step(now, key, caller, step, calls, out);
    }

    fn outcome(
        &mut self,
        now: Nanos,
        call: CallId,
        outcome: Outcome,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let t = now as u64;
        match self.flights.remove(&call) {
            None => {}
            Some(Flight::Return) => match outcome {
                Outcome::Answer(Answer::Credited(n)) => self.engine.on_return_reply(n),
                _ => self.engine.on_return_error(t),
            },
            Some(Flight::Claim { key, claim, caller }) => {
                let step = match outcome {
                    Outcome::Answer(Answer::Decision(d)) => self.engine.on_reply(t, &key, &claim, 1, &as_reply(&d)),
                    _ => self.engine.on_error(t, &key, &claim, 1),
                };
                if let (Some(caller), Some(step)) = (caller, step) {
                    self.step(now, key, caller, step, calls, out);
                }
                for waiter in self.waiting.remove(&(key, claim.id)).unwrap_or_default() {
                    let step = self.engine.resume(t, &key, 1, claim.id);
                    self.step(now, key, waiter, step, calls, out);
                }
            }
        }
    }

    fn tick(&mut self, now: Nanos, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>) {
        self.next_tick = now + self.tick_every;
        let list = self.engine.tick(now as u64);
        self.returns(now, list, calls, out);
    }

    fn next_tick(&self) -> Option<Nanos> {
        self.started.then_some(self.next_tick)
    }

    fn shutdown(&mut self, now: Nanos, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>) {
        let list = self.engine.drain(now as u64);
        self.returns(now, list, calls, out);
    }

    fn counters(&self) -> ModelCounters {
        let m = self.engine.metrics();
        ModelCounters {
            units_claimed: m.units_claimed,
            units_served: m.units_served,
            units_returned: m.units_returned,
            units_expired: m.units_expired,
        }
    }
}
