//! The lease mode: the client crate's own sans-IO engine (`redis_ratelimit_client::Engine`)
//! behind the simulator's `ClientModel`. This is an adapter only: every decision is the client
//! crate's; the simulator plays its driver (sends the claims and returns, applies the call
//! timeout, wakes the requests that wait for a claim, and runs the engine's housekeeping at the
//! deadline it names, `poll_timeout` / `handle_timeout`, as the tokio driver does).

use std::collections::HashMap;
use std::time::Duration;

use redis_ratelimit_client::engine::{CallError, Claim, Return, Source, Step, Waiter};
use redis_ratelimit_client::{Decision, Engine, FailurePolicy as ClientPolicy, Limit, LimiterConfig, Nanos};
use redis_ratelimit_core::spec::Spec;

use crate::model::{Admission, CallId, CallResult, CallerId, ClientModel, Effect, FailurePolicy, ModelCounters};
use crate::scenarios::{LeaseFactory, Scenario};
use crate::server::{Answer, Command};

/// The factory of lease models.
pub fn factory() -> Option<Box<LeaseFactory>> {
    Some(Box::new(|sc: &Scenario, policy: FailurePolicy, _instance: usize| {
        Box::new(LeaseModel::new(config(sc, policy))) as Box<dyn ClientModel>
    }))
}

/// The configuration of a scenario, built as a service would build it for the tokio driver
/// (`LimiterConfig`: the client's defaults, with the scenario's lease length, instance count,
/// call timeout and policy), and the engine configuration the driver derives from it.
pub fn config(sc: &Scenario, policy: FailurePolicy) -> LimiterConfig {
    let policy = match policy {
        FailurePolicy::Closed => ClientPolicy::FailClosed,
        FailurePolicy::Open => ClientPolicy::FailOpen,
        FailurePolicy::Fallback(Spec::Gcra(r)) => {
            ClientPolicy::LocalFallback { limit: r.limit, period: r.period, burst: r.burst }
        }
        FailurePolicy::Fallback(other) => panic!("the client's local fallback is a bucket, not {other:?}"),
    };
    LimiterConfig::new(Limit::from_spec(&sc.setup.specs[0]).expect("a scenario's spec is a valid limit"))
        .lease(Duration::from_nanos(sc.lease as u64))
        .instances(sc.setup.instances.len() as u64)
        .timeout(Duration::from_nanos(sc.setup.timeout as u64))
        .policy(policy)
}

enum Flight {
    Claim { claim: Claim<usize>, caller: Option<CallerId> },
    Return,
}

/// The engine's clock: the instance's own (its virtual time plus offset, never negative).
fn at(now: i64) -> Nanos {
    Nanos::new(now)
}

pub struct LeaseModel {
    engine: Engine<usize>,
    flights: HashMap<CallId, Flight>,
    /// Requests waiting for a claim: (key, claim id) → (caller, waiter).
    waiting: HashMap<(usize, u64), Vec<(CallerId, Waiter)>>,
}

impl LeaseModel {
    pub fn new(config: LimiterConfig) -> LeaseModel {
        LeaseModel {
            engine: Engine::new(config.engine_config().expect("a scenario's settings are in range")),
            flights: HashMap::new(),
            waiting: HashMap::new(),
        }
    }

    fn step(
        &mut self,
        key: usize,
        caller: CallerId,
        step: Step<usize>,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        match step {
            Step::Done { outcome, refill } => {
                let verdict = match (outcome.allowed, outcome.source) {
                    (false, _) => Admission::Limited,
                    (true, Source::Local | Source::Redis) => Admission::Enforced,
                    (true, Source::FailOpen) => Admission::Open,
                    (true, Source::Fallback) => Admission::Fallback,
                    (true, other) => panic!("admitted by {other:?}"),
                };
                out.push(Effect::Admission { caller, verdict });
                if let Some(c) = refill {
                    self.claim(c, None, calls, out);
                }
            }
            Step::Send(c) => self.claim(c, Some(caller), calls, out),
            Step::Wait(w) => self.waiting.entry((key, w.claim())).or_default().push((caller, w)),
        }
    }

    fn claim(
        &mut self,
        claim: Claim<usize>,
        caller: Option<CallerId>,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let call = calls();
        let command = Command::Check { key: *claim.key(), cost: claim.units(), partial: claim.partial() };
        self.flights.insert(call, Flight::Claim { claim, caller });
        out.push(Effect::Send { call, command });
    }

    /// Sends what the engine queued: returns, as the driver sends them (the AGE is the
    /// return's own, margin included, in whole milliseconds rounded up: RL.RETURN's unit).
    fn transmit(&mut self, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>) {
        while let Some(r) = self.engine.poll_transmit() {
            self.send_return(r, calls, out);
        }
    }

    fn send_return(&mut self, r: Return<usize>, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>) {
        let call = calls();
        self.flights.insert(call, Flight::Return);
        let age = (r.age().as_millis_ceil() * 1_000_000) as i64;
        out.push(Effect::Send { call, command: Command::Return { key: *r.key(), units: r.units(), age } });
    }
}

/// The core's decision as the module replies it, then parsed as the client parses a reply.
fn as_reply(d: &redis_ratelimit_core::Decision) -> Decision {
    let (v, _) = d.reply_values(true);
    Decision::from_fields(v[0], v[1], v[2], v[3], v[4], if d.delay.is_some() { Some(v[5]) } else { None })
}

impl ClientModel for LeaseModel {
    fn request(
        &mut self,
        now: i64,
        key: usize,
        caller: CallerId,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let step = self.engine.check(at(now), &key, 1);
        self.step(key, caller, step, calls, out);
        self.transmit(calls, out);
    }

    fn outcome(
        &mut self,
        now: i64,
        call: CallId,
        outcome: CallResult,
        calls: &mut dyn FnMut() -> CallId,
        out: &mut Vec<Effect>,
    ) {
        let t = at(now);
        match self.flights.remove(&call) {
            None => {}
            Some(Flight::Return) => match outcome {
                CallResult::Answer(Answer::Credited(n)) => self.engine.on_return(t, Ok(n)),
                _ => self.engine.on_return(t, Err(CallError::Unavailable)),
            },
            Some(Flight::Claim { claim, caller }) => {
                let step = match outcome {
                    CallResult::Answer(Answer::Decision(d)) => self.engine.on_reply(t, &claim, &as_reply(&d)),
                    _ => self.engine.on_error(t, &claim, CallError::Unavailable),
                };
                let key = *claim.key();
                match (caller, step) {
                    (Some(caller), Some(step)) => self.step(key, caller, step, calls, out),
                    (None, None) => {}
                    (c, s) => panic!("the engine answered {s:?} for the claim of {c:?}"),
                }
                for (waiter, w) in self.waiting.remove(&(key, claim.id())).unwrap_or_default() {
                    let step = self.engine.resume(t, &key, w);
                    self.step(key, waiter, step, calls, out);
                }
            }
        }
        self.transmit(calls, out);
    }

    fn tick(&mut self, now: i64, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>) {
        self.engine.handle_timeout(at(now));
        self.transmit(calls, out);
    }

    fn next_tick(&self) -> Option<i64> {
        self.engine.poll_timeout().map(Nanos::as_i64)
    }

    fn shutdown(&mut self, now: i64, calls: &mut dyn FnMut() -> CallId, out: &mut Vec<Effect>) {
        for r in self.engine.drain(at(now)) {
            self.send_return(r, calls, out);
        }
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
