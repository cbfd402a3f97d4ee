//! Properties of the sans-IO reservation engine over random sequences of requests, claim
//! replies (any consistent reply), errors, abandoned calls, clock advances and housekeeping:
//!
//! * accounting: per key, `served + returned + expired + held = claimed`, hence the invariant
//!   `served ≤ claimed − returned − expired`; and every admitted unit under fail-closed was
//!   claimed (nothing is admitted that was not claimed);
//! * expired units are never served: after every step no held lease is expired;
//! * one claim in flight per key per process;
//! * calls: a key never costs more Redis calls (claims and returns) than requests, except for
//!   a re-claim when the claim made for a request covered less than it needed (a partial grant
//!   short of it, or held units that expired while the claim was out); a cold key claims
//!   exactly each request (`cold_key_costs_what_per_request_checking_costs`).

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use redis_ratelimit_client::breaker::BreakerConfig;
use redis_ratelimit_client::{
    CallError, Claim, Decision, Engine, EngineConfig, FailurePolicy, LeaseConfig, Limit, Nanos, Source, Step, Waiter,
};

#[derive(Clone, Debug)]
enum Op {
    /// A request on key `k` for `cost` units.
    Request {
        k: u8,
        cost: u64,
    },
    /// The oldest outstanding claim gets a reply: grant `frac`/8 of it (exact: all or nothing).
    Reply {
        frac: u8,
        remaining: u64,
        retry_ms: i64,
        reset_ms: i64,
    },
    /// The oldest outstanding claim fails.
    Error,
    /// The oldest outstanding claim is abandoned (its task dropped).
    Abandon,
    Advance {
        ns: u64,
    },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u64..6).prop_map(|(k, cost)| Op::Request { k, cost }),
        3 => (0u8..=8, 0u64..200, -1i64..2000, 0i64..120_000).prop_map(|(frac, remaining, retry_ms, reset_ms)| Op::Reply { frac, remaining, retry_ms, reset_ms }),
        1 => Just(Op::Error),
        1 => Just(Op::Abandon),
        3 => prop_oneof![0u64..1_000_000, 0u64..2_000_000_000].prop_map(|ns| Op::Advance { ns }),
        1 => Just(Op::Tick),
    ]
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        Just(Limit::token_bucket(100, Duration::from_secs(1)).with_burst(50)),
        Just(Limit::gcra(10, Duration::from_millis(100))),
        Just(Limit::fixed(100, Duration::from_secs(60))),
        Just(Limit::sliding(100, Duration::from_secs(1))),
        Just(Limit::sliding_log(100, Duration::from_secs(1))),
        Just(Limit::leaky(100, Duration::from_secs(1))),
    ]
}

struct Pending {
    key: u8,
    /// The claim carries the cost of the request that sent it (0: background).
    claim: Claim<u8>,
}

struct Run {
    engine: Engine<u8>,
    now: Nanos,
    pending: Vec<Pending>,
    /// Requests waiting: (key, cost, waiter).
    waiting: Vec<(u8, u64, Waiter)>,
    /// Re-claims after a partial shortfall, per key.
    reclaims: HashMap<u8, u64>,
    admitted_units: u64,
    fail_closed: bool,
}

impl Run {
    fn handle(&mut self, key: u8, cost: u64, step: Step<u8>, from_reply: bool) {
        // Every engine call on a key sweeps its expired leases before serving anything.
        if let Some(st) = self.engine.key(&key) {
            assert_eq!(st.held_at(self.now), st.held(), "key {key} holds expired units at {:?}", self.now);
        }
        match step {
            Step::Done { outcome, refill } => {
                if outcome.allowed {
                    if self.fail_closed {
                        assert!(matches!(outcome.source, Source::Local | Source::Redis), "{outcome:?}");
                    }
                    self.admitted_units += cost;
                }
                if let Some(c) = refill {
                    self.pending.push(Pending { key, claim: c });
                }
            }
            Step::Send(c) => {
                if from_reply {
                    *self.reclaims.entry(key).or_default() += 1;
                }
                self.pending.push(Pending { key, claim: c });
            }
            Step::Wait(w) => self.waiting.push((key, cost, w)),
        }
    }

    /// Wakes the requests waiting on `claim` of `key`.
    fn wake(&mut self, key: u8, claim: u64) {
        let (woken, rest): (Vec<_>, Vec<_>) = self.waiting.drain(..).partition(|w| w.0 == key && w.2.claim() == claim);
        self.waiting = rest;
        for (k, cost, w) in woken {
            let s = self.engine.resume(self.now, &k, w);
            self.handle(k, cost, s, false);
        }
    }

    fn check_invariants(&self) {
        let mut in_flight: HashMap<u8, usize> = HashMap::new();
        for p in &self.pending {
            if self.engine.key(&p.key).and_then(|s| s.in_flight()).is_some_and(|(id, _)| id == p.claim.id()) {
                *in_flight.entry(p.key).or_default() += 1;
            }
        }
        for (k, st) in self.engine.keys() {
            let t = st.totals();
            assert_eq!(t.served + t.returned + t.expired + st.held(), t.claimed, "key {k}: {t:?}");
            assert!(t.served <= t.claimed - t.returned - t.expired);
            assert!(in_flight.get(k).copied().unwrap_or(0) <= 1);
            let reclaims = self.reclaims.get(k).copied().unwrap_or(0);
            assert!(t.calls <= t.requests + reclaims, "key {k}: {t:?}, {reclaims} re-claims");
        }
        // Every claim the engine has in flight is one the driver holds.
        for (k, st) in self.engine.keys() {
            if let Some((id, _)) = st.in_flight() {
                assert!(self.pending.iter().any(|p| p.key == *k && p.claim.id() == id), "key {k}: claim {id} lost");
            }
        }
    }
}

fn run(limit: Limit, batching: bool, policy: FailurePolicy, ops: Vec<Op>) {
    let mut lease = LeaseConfig::new(limit);
    lease.batching = batching;
    lease.instances = 2;
    lease.stale_claim = Nanos::MAX / 4;
    let config = EngineConfig {
        breaker: BreakerConfig { failures: 2, cool_down: Nanos::from_millis(50) },
        policy,
        // Waiters never give up here: every claim is answered (or fails, or is abandoned).
        call_timeout: Nanos::MAX / 4,
        key_totals: true,
        ..EngineConfig::from_lease(lease)
    };
    let mut r = Run {
        engine: Engine::new(config),
        now: Nanos::from_secs(1),
        pending: Vec::new(),
        waiting: Vec::new(),
        reclaims: HashMap::new(),
        admitted_units: 0,
        fail_closed: policy == FailurePolicy::FailClosed,
    };
    for op in ops {
        match op {
            Op::Request { k, cost } => {
                let s = r.engine.check(r.now, &k, cost);
                r.handle(k, cost, s, false);
            }
            Op::Reply { frac, remaining, retry_ms, reset_ms } => {
                if r.pending.is_empty() {
                    continue;
                }
                let p = r.pending.remove(0);
                let granted = if p.claim.partial() {
                    p.claim.units() * frac as u64 / 8
                } else if frac >= 4 {
                    p.claim.units()
                } else {
                    0
                };
                let retry = if granted > 0 { -1 } else { retry_ms };
                let d = Decision::from_fields(
                    granted as i64,
                    limit.capacity() as i64,
                    remaining.min(limit.capacity()) as i64,
                    retry,
                    reset_ms,
                    None,
                );
                let cost = if p.claim.background() { 0 } else { cost_of(&p) };
                if let Some(s) = r.engine.on_reply(r.now, &p.claim, &d) {
                    r.handle(p.key, cost, s, true);
                }
                r.wake(p.key, p.claim.id());
            }
            Op::Error => {
                if r.pending.is_empty() {
                    continue;
                }
                let p = r.pending.remove(0);
                let cost = if p.claim.background() { 0 } else { cost_of(&p) };
                if let Some(s) = r.engine.on_error(r.now, &p.claim, CallError::Unavailable) {
                    r.handle(p.key, cost, s, false);
                }
                r.wake(p.key, p.claim.id());
            }
            Op::Abandon => {
                if r.pending.is_empty() {
                    continue;
                }
                let p = r.pending.remove(0);
                assert!(r.engine.on_error(r.now, &p.claim, CallError::Abandoned).is_none());
                r.wake(p.key, p.claim.id());
            }
            Op::Advance { ns } => r.now += Nanos::new(ns),
            Op::Tick => {
                r.engine.handle_timeout(r.now);
                while let Some(ret) = r.engine.poll_transmit() {
                    // Sent no later than now, aged by at least the margin.
                    assert!(ret.units() > 0 && ret.age() >= Nanos::from_millis(100) && ret.age() <= r.now);
                    r.engine.on_return(r.now, Ok(0));
                }
                for (k, st) in r.engine.keys() {
                    assert_eq!(st.held_at(r.now), st.held(), "key {k} holds expired units after tick");
                }
            }
        }
        r.check_invariants();
    }
    let _ = r.engine.drain(r.now);
    r.check_invariants();
    let m = r.engine.metrics();
    if r.fail_closed {
        // Nothing was admitted that was not claimed.
        assert_eq!(m.units_served, r.admitted_units);
        assert!(m.units_served <= m.units_claimed);
    }
    assert_eq!(
        m.units_claimed,
        m.units_served + m.units_returned + m.units_expired + r.engine.keys().map(|(_, s)| s.held()).sum::<u64>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("RL_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512), ..ProptestConfig::default() })]

    #[test]
    fn accounting_expiry_and_one_claim_in_flight(limit in limit(), ops in prop::collection::vec(op(), 1..300)) {
        run(limit, true, FailurePolicy::FailClosed, ops);
    }

    #[test]
    fn exact_mode_never_costs_more_calls_than_requests(limit in limit(), ops in prop::collection::vec(op(), 1..300)) {
        run(limit, false, FailurePolicy::FailClosed, ops);
    }

    #[test]
    fn failure_policies_keep_the_accounting(limit in limit(), open in any::<bool>(), ops in prop::collection::vec(op(), 1..300)) {
        let policy = if open { FailurePolicy::FailOpen } else { FailurePolicy::local(5, Duration::from_secs(1), 5) };
        run(limit, true, policy, ops);
    }
}

/// The cost of the request a pending claim was made for (the claim carries it; the test only
/// reads it, to count admitted units).
fn cost_of(p: &Pending) -> u64 {
    p.claim.cost()
}

/// A cold key (one request per second, far below the batch horizon) claims exactly each
/// request: the same calls as per-request checking.
#[test]
fn cold_key_costs_what_per_request_checking_costs() {
    let config = EngineConfig::new(Limit::token_bucket(100, Duration::from_secs(60)));
    let mut e: Engine<&str> = Engine::new(config);
    let mut now = Nanos::ZERO;
    for i in 0..100 {
        now += Nanos::from_secs(1);
        let Step::Send(c) = e.check(now, &"k", 1) else { panic!("request {i} not a claim") };
        assert!(!c.partial() && c.units() == 1);
        let d = Decision::from_fields(1, 100, 50, -1, 600, None);
        assert!(
            matches!(e.on_reply(now + Nanos::from_micros(200), &c, &d), Some(Step::Done { outcome, refill: None }) if outcome.allowed)
        );
        e.handle_timeout(now + Nanos::from_micros(300));
        assert!(e.poll_transmit().is_none());
    }
    let m = e.metrics();
    assert_eq!((m.redis_calls, m.requests), (100, 100));
}
