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
//!   exactly each request (`cold_key_costs_what_per_request_checking_costs`); a shutdown's drain
//!   gives every lease back whatever the call credit, so its returns are outside the bound;
//! * all of it with the sightings table on or off (a key's first request a one-off claim,
//!   its key not remembered), and with admissions refunded (units back to the local pool; the
//!   calls bound is then for the keys without refunds, whose units may go back by RL.RETURN).

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use redis_ratelimit_client::breaker::BreakerConfig;
use redis_ratelimit_client::{
    CallError, Claim, Decision, Engine, EngineConfig, FailurePolicy, LeaseConfig, Limit, Nanos, Outcome, Source, Step,
    Waiter,
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
    Advance {
        ns: u64,
    },
    Tick,
    /// The newest admission not yet refunded is refunded (another limit refused its request).
    Refund,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u64..6).prop_map(|(k, cost)| Op::Request { k, cost }),
        3 => (0u8..=8, 0u64..200, -1i64..2000, 0i64..120_000).prop_map(|(frac, remaining, retry_ms, reset_ms)| Op::Reply { frac, remaining, retry_ms, reset_ms }),
        1 => Just(Op::Error),
        3 => prop_oneof![0u64..1_000_000, 0u64..2_000_000_000].prop_map(|ns| Op::Advance { ns }),
        1 => Just(Op::Tick),
        1 => Just(Op::Refund),
    ]
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        Just(Limit::token_bucket(100, Duration::from_secs(1)).unwrap().with_burst(50).unwrap()),
        Just(Limit::gcra(10, Duration::from_millis(100)).unwrap()),
        Just(Limit::fixed(100, Duration::from_secs(60)).unwrap()),
        Just(Limit::sliding(100, Duration::from_secs(1)).unwrap()),
        Just(Limit::sliding_log(100, Duration::from_secs(1)).unwrap()),
        Just(Limit::leaky(100, Duration::from_secs(1)).unwrap()),
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
    /// Admissions that took units, newest last: (key, outcome).
    admitted: Vec<(u8, Outcome)>,
    /// Refunds that put units back, per key (their units may cost RL.RETURNs later).
    refunds: HashMap<u8, u64>,
}

impl Run {
    fn handle(&mut self, key: u8, cost: u64, step: Step<u8>, from_reply: bool) {
        self.handle_of(key, cost, step, from_reply, false)
    }

    /// `one_off`: the step answers a one-off claim, decided without the key's state (which
    /// serves nothing then, and is not swept).
    fn handle_of(&mut self, key: u8, cost: u64, step: Step<u8>, from_reply: bool, one_off: bool) {
        // Every engine call on a key's state sweeps its expired leases before serving anything.
        if let Some(st) = self.engine.key(&key).filter(|_| !one_off) {
            assert_eq!(st.held_at(self.now), st.held(), "key {key} holds expired units at {:?}", self.now);
        }
        match step {
            Step::Done { outcome, refill } => {
                if outcome.allowed {
                    if self.fail_closed {
                        assert!(matches!(outcome.source, Source::Local | Source::Redis), "{outcome:?}");
                    }
                    self.admitted_units += cost;
                    if outcome.enforced && cost > 0 {
                        self.admitted.push((key, outcome));
                    }
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

    /// `drained`: per key, the returns a shutdown drain made (one per lease, whatever the call
    /// credit: units given back at shutdown beat the calls bound).
    fn check_invariants(&self, drained: &HashMap<u8, u64>) {
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
            let reclaims = self.reclaims.get(k).copied().unwrap_or(0) + drained.get(k).copied().unwrap_or(0);
            // A key that got refunds may return their units (one RL.RETURN per lease): the
            // calls bound is for keys without.
            if !self.refunds.contains_key(k) {
                assert!(t.calls <= t.requests + reclaims, "key {k}: {t:?}, {reclaims} re-claims");
            }
        }
        // Every claim the engine has in flight is one the driver holds.
        for (k, st) in self.engine.keys() {
            if let Some((id, _)) = st.in_flight() {
                assert!(self.pending.iter().any(|p| p.key == *k && p.claim.id() == id), "key {k}: claim {id} lost");
            }
        }
    }
}

fn run(limit: Limit, batching: bool, policy: FailurePolicy, sightings: bool, ops: Vec<Op>) {
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
        sightings: if sightings { 4 } else { 0 },
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
        admitted: Vec::new(),
        refunds: HashMap::new(),
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
                    r.handle_of(p.key, cost, s, true, p.claim.one_off());
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
                    r.handle_of(p.key, cost, s, false, p.claim.one_off());
                }
                r.wake(p.key, p.claim.id());
            }
            Op::Advance { ns } => r.now += Nanos::new(ns as i64),
            Op::Tick => {
                // A refund follows its check at once in practice, never a forgetting of its
                // key (the per-key totals would then count it against the key's next life).
                r.admitted.clear();
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
            Op::Refund => {
                if let Some((k, o)) = r.admitted.pop() {
                    let before = r.engine.metrics().units_refunded;
                    let back = r.engine.refund(r.now, &k, &o);
                    let units = r.engine.metrics().units_refunded - before;
                    // The local fallback limit's units go back to its own bucket. Reserved
                    // units are refunded whether or not they go back (too late to serve again:
                    // their lease over, or their key forgotten; then they count as expired).
                    let reserved = matches!(o.source, Source::Local | Source::Redis);
                    assert_eq!(units > 0, reserved, "{o:?}");
                    if back && reserved {
                        *r.refunds.entry(k).or_default() += 1;
                        // Back in the local pool: held by the key (remembered now if it was not).
                        assert!(r.engine.key(&k).is_some_and(|st| st.held() >= units), "{o:?}");
                    }
                }
            }
        }
        r.check_invariants(&HashMap::new());
    }
    let mut drained: HashMap<u8, u64> = HashMap::new();
    for ret in r.engine.drain(r.now) {
        *drained.entry(*ret.key()).or_default() += 1;
    }
    r.check_invariants(&drained);
    let m = r.engine.metrics();
    // Units refunded were served twice (before and after their refund).
    let served = m.units_served - m.units_refunded;
    if r.fail_closed {
        // Nothing was admitted that was not claimed.
        assert_eq!(m.units_served, r.admitted_units);
        assert!(served <= m.units_claimed);
    }
    assert_eq!(
        m.units_claimed,
        served + m.units_returned + m.units_expired + r.engine.keys().map(|(_, s)| s.held()).sum::<u64>()
    );
    // Every claim in flight is one the driver still holds (one-off claims included).
    assert_eq!(m.claims_in_flight, r.pending.len() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("RL_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512), ..ProptestConfig::default() })]

    #[test]
    fn accounting_expiry_and_one_claim_in_flight(limit in limit(), sightings in any::<bool>(), ops in prop::collection::vec(op(), 1..300)) {
        run(limit, true, FailurePolicy::FailClosed, sightings, ops);
    }

    #[test]
    fn exact_mode_never_costs_more_calls_than_requests(limit in limit(), sightings in any::<bool>(), ops in prop::collection::vec(op(), 1..300)) {
        run(limit, false, FailurePolicy::FailClosed, sightings, ops);
    }

    #[test]
    fn failure_policies_keep_the_accounting(limit in limit(), open in any::<bool>(), sightings in any::<bool>(), ops in prop::collection::vec(op(), 1..300)) {
        let policy = if open { FailurePolicy::FailOpen } else { FailurePolicy::local(5, Duration::from_secs(1), 5) };
        run(limit, true, policy, sightings, ops);
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
    let config = EngineConfig::new(Limit::token_bucket(100, Duration::from_secs(60)).unwrap());
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

/// An engine with the sightings table on (the driver's default), fail open.
fn sighting_engine() -> Engine<&'static str> {
    let config = EngineConfig {
        sightings: 1024,
        policy: FailurePolicy::FailOpen,
        ..EngineConfig::new(Limit::token_bucket(100, Duration::from_secs(60)).unwrap())
    };
    Engine::new(config)
}

/// The first request of `key` at `now`: a one-off claim.
fn one_off(e: &mut Engine<&'static str>, now: Nanos, key: &'static str) -> Claim<&'static str> {
    match e.check(now, &key, 1) {
        Step::Send(c) if c.one_off() => c,
        s => panic!("not a one-off claim: {s:?}"),
    }
}

fn admit_reply() -> Decision {
    Decision::from_fields(1, 100, 50, -1, 600, None)
}

#[test]
fn a_key_seen_once_is_decided_by_an_exact_claim_and_not_remembered() {
    let mut e = sighting_engine();
    let now = Nanos::from_secs(1);
    let c = one_off(&mut e, now, "a");
    assert!(!c.partial() && c.units() == 1 && c.cost() == 1);
    let Some(Step::Done { outcome, refill: None }) = e.on_reply(now, &c, &admit_reply()) else { panic!() };
    assert!(outcome.allowed && outcome.source == Source::Redis);
    assert_eq!((outcome.limit, outcome.remaining), (Some(100), Some(50)));
    assert!(e.is_empty() && e.poll_timeout().is_none(), "nothing remembered, no timer");
    let m = e.metrics();
    assert_eq!((m.requests, m.claims, m.one_off_claims, m.claims_in_flight, m.keys), (1, 1, 1, 0, 0));
    assert_eq!((m.redis_admits, m.units_claimed, m.units_served), (1, 1, 1));
}

#[test]
fn a_key_seen_again_within_the_lease_is_remembered() {
    let mut e = sighting_engine();
    let t0 = Nanos::from_secs(1);
    let c = one_off(&mut e, t0, "a");
    let _ = e.on_reply(t0, &c, &admit_reply());
    let t1 = t0 + e.config().lease.lease / 2;
    let Step::Send(c) = e.check(t1, &"a", 1) else { panic!("a claim") };
    assert!(!c.one_off());
    let _ = e.on_reply(t1, &c, &admit_reply());
    assert!(e.key(&"a").is_some() && e.len() == 1);
}

#[test]
fn a_first_request_older_than_the_lease_counts_for_nothing() {
    let mut e = sighting_engine();
    let t0 = Nanos::from_secs(1);
    let c = one_off(&mut e, t0, "a");
    let _ = e.on_reply(t0, &c, &admit_reply());
    let later = t0 + e.config().lease.lease * 2;
    let c = one_off(&mut e, later, "a");
    let _ = e.on_reply(later, &c, &admit_reply());
    assert!(e.is_empty());
}

#[test]
fn a_refused_one_off_claim_refuses_with_the_server_retry_after() {
    let mut e = sighting_engine();
    let now = Nanos::from_secs(1);
    let c = one_off(&mut e, now, "a");
    let refused = Decision::from_fields(0, 100, 0, 700, 60_000, None);
    let Some(Step::Done { outcome, .. }) = e.on_reply(now, &c, &refused) else { panic!() };
    assert!(!outcome.allowed && outcome.source == Source::Redis);
    assert_eq!(outcome.retry_after, Some(Nanos::from_millis(700)));
    assert_eq!(e.metrics().redis_denials, 1);
    assert!(e.is_empty());
}

#[test]
fn a_refunded_one_off_admission_serves_the_next_request_locally() {
    let mut e = sighting_engine();
    let now = Nanos::from_secs(1);
    let c = one_off(&mut e, now, "a");
    let Some(Step::Done { outcome, .. }) = e.on_reply(now, &c, &admit_reply()) else { panic!() };
    assert!(e.refund(now, &"a", &outcome), "the unit goes back to the local pool");
    assert_eq!(e.key(&"a").map(|s| s.held()), Some(1));
    let Step::Done { outcome, refill: None } = e.check(now + Nanos::from_millis(1), &"a", 1) else { panic!() };
    assert!(outcome.allowed && outcome.source == Source::Local);
    assert_eq!(e.metrics().redis_calls, 1);
}

#[test]
fn a_failed_one_off_claim_falls_to_the_failure_policy() {
    let mut e = sighting_engine();
    let now = Nanos::from_secs(1);
    let c = one_off(&mut e, now, "a");
    let Some(Step::Done { outcome, .. }) = e.on_error(now, &c, CallError::Unavailable) else { panic!() };
    assert!(outcome.allowed && outcome.source == Source::FailOpen);
    let m = e.metrics();
    assert_eq!((m.redis_errors, m.claims_in_flight), (1, 0));
}

#[test]
fn a_key_sharing_an_entry_is_remembered_within_the_lease() {
    let config =
        EngineConfig { sightings: 1, ..EngineConfig::new(Limit::token_bucket(100, Duration::from_secs(60)).unwrap()) };
    let mut e: Engine<&str> = Engine::new(config);
    let lease = e.config().lease.lease;
    let mut now = Nanos::from_secs(1);
    let c = one_off(&mut e, now, "a");
    let _ = e.on_reply(now, &c, &admit_reply());
    // "b" comes every L/2: its first requests are one-off claims ("a"'s holds the one entry
    // for L; a fingerprint collision would remember "b" at once), and it is remembered within
    // L plus two requests.
    let mut requests = 0;
    while e.key(&"b").is_none() {
        requests += 1;
        assert!(requests <= 4, "\"b\" not remembered after {requests} requests");
        let Step::Send(c) = e.check(now, &"b", 1) else { panic!("a claim") };
        let _ = e.on_reply(now, &c, &admit_reply());
        now += lease / 2;
    }
}

#[test]
fn keys_seen_once_are_not_remembered_when_they_share_entries() {
    let config = EngineConfig {
        sightings: 1024,
        ..EngineConfig::new(Limit::token_bucket(100, Duration::from_secs(60)).unwrap())
    };
    let mut e: Engine<String> = Engine::new(config);
    let now = Nanos::from_secs(1);
    for i in 0..3000 {
        let key = format!("ip:{i}");
        let Step::Send(c) = e.check(now, key.as_str(), 1) else { panic!("a claim") };
        let _ = e.on_reply(now, &c, &admit_reply());
    }
    // Only a fingerprint collision in a shared entry remembers a key (1 in 2,048 per pair).
    assert!(e.len() <= 10, "{} of 3,000 keys seen once remembered", e.len());
}
