//! Reservations (leases) for one key, sans IO: no clock reads, no tokio; `now` is virtual time
//! in nanoseconds passed in by the caller (the tokio driver, or the simulator).
//!
//! A process holds, per key, units claimed from Redis (`COST n [PARTIAL]`), each batch a
//! [`Lease`] with an expiry. A request is served from held units when there are enough
//! ([`Ruling::Admit`], no Redis call); otherwise it starts a claim ([`Ruling::Claim`]) or, when
//! a claim of this key is already in flight, waits for it ([`Ruling::Wait`]): exactly one claim
//! in flight per key per process.
//!
//! Accounting (checked by the property tests): every unit held was claimed, and leaves by
//! being served, returned (given back with RL.RETURN) or expired (dropped), so at all times
//! `served + returned + expired + held = claimed`, hence
//! `served ≤ claimed − returned − expired`.
//!
//! Expiry: a lease expires `L` after its claim was **sent** (the server received it later, so
//! the lease never outlives what the server granted), and for the window algorithms never past
//! the end of the window the units were counted in: `RL.FIXED` replies `reset_after` = the
//! window's end; `RL.SLIDING` replies the end of the next window after an admitted call, one
//! window after the current one's end. Both are rounded up to the ms by the server, so one ms is
//! taken off. Expired units are never served.
//!
//! Calls: a key never costs more Redis calls than requests on it, counting returns:
//! every request earns one call credit; a claim for a request spends its credit; a background
//! refill or a return is only sent with a credit in hand. A cold key (little demand) claims
//! exactly what each request needs, exactly as a per-request check would.

//!
//! This module is the engine's inside: [`KeyState`] is public for inspection (held units,
//! totals, the claim in flight), its transitions are the crate's own ([`crate::engine`] drives
//! them).

use crate::batch::{claim_size, BatchInput, ClaimSize, Demand, ToF64};
use crate::decision::Decision;
use crate::metrics::{add, sub, Metrics};
use crate::spec::Limit;
use redis_ratelimit_core::Nanos;
use redis_ratelimit_core::Refill;
use thin_vec::ThinVec;

/// `span` scaled by a factor in [1/2, 3/2) drawn from `seed` (splitmix64).
fn jitter(span: Nanos, seed: u64) -> Nanos {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let frac = (z >> 11) as f64 / (1u64 << 53) as f64;
    Nanos::new((span.to_f64() * (0.5 + frac)) as i64)
}

/// How a key's reservations behave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseConfig {
    pub limit: Limit,
    /// `L`: the longest a lease lives, from its claim's send time.
    pub lease: Nanos,
    /// Batch to cover the demand of this long: batch ≈ demand rate × horizon.
    pub horizon: Nanos,
    /// The largest claim.
    pub max_batch: u64,
    /// Instances expected to share a key: a key that ran dry is claimed again no sooner than
    /// this instance's fair share of the refill makes worthwhile (see [`LeaseConfig::dry_hold`]).
    pub instances: u64,
    /// Time constant of the demand estimate.
    pub demand_tau: Nanos,
    /// A key with no request for this long gives its held units back.
    pub idle_return: Nanos,
    /// A claim with no reply or error after this long is taken as lost; the driver's call
    /// timeout is shorter, so this only catches a driver that lost track of a call.
    pub stale_claim: Nanos,
    /// Batch and serve locally. False: every request is an exact claim (a per-request check,
    /// still with the over-limit cache and the breaker). Always off for RL.LEAKY, whose every
    /// admitted request needs its own `delay`, and for RL.SLIDINGLOG, which needs each
    /// request's instant (and refuses RL.RETURN).
    pub batching: bool,
    /// Added to the measured age of units given back: the return's own transit, at most the
    /// call timeout (`AGE` must never be less than the true age).
    pub return_margin: Nanos,
}

impl LeaseConfig {
    /// Defaults for a limit: L = 1 s (never more than the period), horizon 100 ms (at most
    /// L/2), batches of at most 1000, one instance, τ = 1 s, idle return after L/2, claims lost
    /// after 10 s.
    pub fn new(limit: Limit) -> LeaseConfig {
        let lease = Nanos::from_secs(1).min(limit.period_nanos());
        LeaseConfig {
            limit,
            lease,
            horizon: Nanos::from_millis(100).min(lease / 2),
            max_batch: 1000,
            instances: 1,
            demand_tau: Nanos::from_secs(1),
            idle_return: lease / 2,
            stale_claim: Nanos::from_secs(10),
            batching: limit.algorithm().leasable(),
            return_margin: Nanos::from_millis(100),
        }
    }

    pub(crate) fn batching(&self) -> bool {
        self.batching && self.limit.algorithm().leasable()
    }

    fn period(&self) -> Nanos {
        self.limit.period_nanos()
    }

    /// The limit's mean spacing of units, `period ÷ limit` (at least 1 ns).
    pub fn interval(&self) -> Nanos {
        (self.period() / self.limit.limit()).max(Nanos::new(1))
    }

    /// How long a key that ran dry (a claim granted less than it asked) waits, on average,
    /// before claiming again: the refill horizon, and with N instances at least the time for
    /// this instance's fair share of `k` units to refill (`¾ × k × N × interval`, `k` = the
    /// units its demand can use within a lease, between 1 and 3), never more than the period. The
    /// fixed window does not pace: the server names the window's end.
    pub fn dry_hold(&self, lease_demand: f64) -> Nanos {
        if self.limit.algorithm().refill() == Refill::AtWindowEnd {
            return Nanos::ZERO;
        }
        let k = if lease_demand.is_finite() { lease_demand.clamp(1.0, 3.0) } else { 1.0 };
        // ¾: the instances together ask a third more than the refill, so that it is taken.
        let share = if self.instances > 1 {
            Nanos::new((self.interval().to_f64() * self.instances as f64 * k * 0.75).min(u64::MAX as f64 / 2.0) as i64)
        } else {
            Nanos::ZERO
        };
        self.horizon.max(share).min(self.period())
    }

    /// How long the units of this reply may be served, from the claim's send time.
    pub fn lease_span(&self, d: &Decision) -> Nanos {
        let reset = Nanos::from(d.reset_after);
        let window = self.period();
        let window_end = match self.limit.algorithm().refill() {
            Refill::AtWindowEnd => Some(reset),
            Refill::WindowWeight if reset > window => Some(reset - window),
            Refill::WindowWeight => Some(reset),
            Refill::Continuous | Refill::PerUnit => None,
        };
        match window_end {
            Some(end) => (end - Nanos::from_millis(1)).min(self.lease),
            None => self.lease,
        }
    }
}

/// Units held from one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub units: u64,
    /// Served only while `now < expires_at`.
    pub expires_at: Nanos,
    /// When the claim was sent (RL.RETURN's AGE is measured from it).
    pub claim_sent_at: Nanos,
}

/// A claim the key state made: `COST units [PARTIAL]`, sent at `sent_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClaimSpec {
    pub id: u64,
    pub units: u64,
    pub partial: bool,
    pub sent_at: Nanos,
    /// Sent ahead of need (nobody waits for it).
    pub background: bool,
    /// The cost of the request that made it (0 for a background claim): it lives here, in
    /// the claim, and nowhere else.
    pub cost: u64,
}

/// Units to give back, with their `AGE`: the time since the claim was sent plus the return
/// margin. This is the one place that age is computed (docs/local-reservations.md rule 4: it
/// is never below the true age).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReturnSpec {
    pub units: u64,
    pub age: Nanos,
}

/// Units an admission took, so that [`KeyState::refund`] can put them back without making
/// them live longer than they would have: the earliest expiry and the earliest claim send
/// among the leases they came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub units: u64,
    pub expires_at: Nanos,
    pub claim_sent_at: Nanos,
    /// Taken by a one-off claim (its key was not remembered then).
    pub one_off: bool,
}

/// Why a request was refused without a Redis call, or by Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LimitedBy {
    /// The over-limit cache: a recent denial named an instant not yet reached.
    Cache,
    /// The cost is above the limit's capacity: it never passes.
    Never,
    /// Redis denied the claim made for this request.
    Redis,
}

/// What to do with a request (or, from [`KeyState::on_claim_reply`], with its initiator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ruling {
    /// Admitted. `from_claim`: served by the claim it made (a round trip); else from held
    /// units. `refill`: send this background claim now (units are running low). `delay`:
    /// RL.LEAKY's delay for a Redis admit. `taken`: what a refund would put back. `held`: the
    /// units held after it (all unexpired at the decision's `now`).
    Admit { from_claim: bool, refill: Option<ClaimSpec>, delay: Option<Nanos>, taken: Option<Taken>, held: u64 },
    /// Refused; `retry_after` is when it can pass (never early), `None` when it never can.
    /// `refill`: send this background claim now (a held key nearing the end of its hold).
    Limited { retry_after: Option<Nanos>, by: LimitedBy, refill: Option<ClaimSpec> },
    /// A claim of this key is in flight: wait for its reply (or error), then call
    /// [`KeyState::resume`] with this id.
    Wait { claim: u64 },
    /// Send this claim and report its reply or error; the request is decided by it.
    Claim(ClaimSpec),
    /// The claim this request waited for failed (or the one it made): apply the failure policy.
    Failed,
    /// Decide again with [`KeyState::resume`] (a partial claim granted less than needed).
    Retry,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    claim: ClaimSpec,
}

#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Refused locally until then: the instant the server named for the denied request, or the
    /// end of the pacing interval of a key that ran dry, whichever is later.
    until: Nanos,
    /// Requests needing at least this many units beyond what is held are refused until then.
    need: u64,
}

/// Per-key running totals (units and calls), for tests and the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub served: u64,
    pub claimed: u64,
    pub returned: u64,
    pub expired: u64,
    /// Redis calls: claims sent plus returns sent.
    pub calls: u64,
}

/// The reservation state of one key, kept small (a process may remember millions of keys):
/// sentinels instead of `Option`s, the claim in flight and the test totals boxed.
#[derive(Clone, Debug)]
pub struct KeyState {
    /// Unexpired leases with units, by expiry (a thin vector: one pointer, no allocation when
    /// empty).
    leases: ThinVec<Lease>,
    in_flight: Option<Box<InFlight>>,
    next_claim: u32,
    /// The last claim that failed (waiters on it fall back); 0: none.
    failed: u32,
    /// See [`Hold`]; `until` ZERO: no hold.
    hold_until: Nanos,
    hold_need: u32,
    /// The pacing interval while the key runs dry (0 otherwise): claims then ask for the demand
    /// of this long.
    pace: Nanos,
    demand: Demand,
    /// The newest observation's units (see [`Demand`]).
    demand_last: u32,
    /// From the last reply: capacity (0: none yet), remaining (`u64::MAX`: none yet), and the
    /// absolute instant of a fresh state (ZERO: none yet).
    capacity: u64,
    remaining: u64,
    reset_at: Nanos,
    last_request: Nanos,
    /// Smoothed round trip of claims, ns (saturating).
    rtt: u32,
    /// Requests minus Redis calls: a background claim or a return needs one.
    call_credit: u32,
    /// Per-key running totals, when recorded ([`crate::EngineConfig::key_totals`]).
    totals: Option<Box<Totals>>,
}

impl Default for KeyState {
    fn default() -> KeyState {
        KeyState {
            leases: ThinVec::new(),
            in_flight: None,
            next_claim: 0,
            failed: 0,
            hold_until: Nanos::ZERO,
            hold_need: 0,
            pace: Nanos::ZERO,
            demand: Demand::default(),
            demand_last: 0,
            capacity: 0,
            remaining: u64::MAX,
            reset_at: Nanos::ZERO,
            last_request: Nanos::ZERO,
            rtt: 0,
            call_credit: 0,
            totals: None,
        }
    }
}

impl KeyState {
    pub fn new() -> KeyState {
        KeyState::default()
    }

    /// A key state that keeps its [`Totals`] (tests and the simulator).
    pub fn with_totals() -> KeyState {
        KeyState { totals: Some(Box::default()), ..KeyState::default() }
    }

    /// The per-key totals (zeros unless recorded).
    pub fn totals(&self) -> Totals {
        self.totals.as_deref().copied().unwrap_or_default()
    }

    fn tally(&mut self, f: impl FnOnce(&mut Totals)) {
        if let Some(t) = self.totals.as_deref_mut() {
            f(t);
        }
    }

    fn flight(&self) -> Option<InFlight> {
        self.in_flight.as_deref().copied()
    }

    fn hold(&self) -> Option<Hold> {
        (!self.hold_until.is_zero()).then_some(Hold { until: self.hold_until, need: self.hold_need as u64 })
    }

    fn set_hold(&mut self, h: Option<Hold>) {
        let h = h.unwrap_or(Hold { until: Nanos::ZERO, need: 0 });
        self.hold_until = h.until;
        // A need beyond u32 only makes the hold refuse more: the safe side.
        self.hold_need = h.need.min(u32::MAX as u64) as u32;
    }

    fn failed_claim(&self) -> Option<u64> {
        (self.failed != 0).then_some(self.failed as u64)
    }

    #[inline]
    fn known_remaining(&self) -> Option<u64> {
        (self.remaining != u64::MAX).then_some(self.remaining)
    }

    fn rtt(&self) -> Nanos {
        Nanos::new(self.rtt as i64)
    }

    /// Units held (unexpired as of the last call that expired leases).
    #[inline]
    pub fn held(&self) -> u64 {
        self.leases.iter().map(|l| l.units).sum()
    }

    /// Units servable at `now` (unexpired).
    pub fn held_at(&self, now: Nanos) -> u64 {
        self.leases.iter().filter(|l| now < l.expires_at).map(|l| l.units).sum()
    }

    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The id and send instant of the claim in flight, if any.
    pub fn in_flight(&self) -> Option<(u64, Nanos)> {
        self.flight().map(|f| (f.claim.id, f.claim.sent_at))
    }

    /// When the last request came.
    pub fn last_request(&self) -> Nanos {
        self.last_request
    }

    pub(crate) fn claim_pending(&self, id: u64) -> bool {
        self.flight().is_some_and(|f| f.claim.id == id)
    }

    /// The limit's capacity, once a reply reported it.
    #[inline]
    pub fn capacity(&self) -> Option<u64> {
        (self.capacity != 0).then_some(self.capacity)
    }

    /// The units still admissible overall, as best known: the server's last `remaining` plus
    /// what is held here.
    pub fn remaining_estimate(&self, now: Nanos) -> Option<u64> {
        self.remaining_with(self.held_at(now))
    }

    /// [`KeyState::remaining_estimate`] with the units servable now already counted.
    #[inline]
    pub(crate) fn remaining_with(&self, held: u64) -> Option<u64> {
        let r = self.known_remaining()?.saturating_add(held);
        Some(self.capacity().map_or(r, |c| r.min(c)))
    }

    /// Time until the limiter is fresh again, as of the last reply.
    #[inline]
    pub fn reset_after(&self, now: Nanos) -> Option<Nanos> {
        (!self.reset_at.is_zero()).then(|| self.reset_at - now)
    }

    /// Nothing held, nothing in flight, no live denial, idle for `idle`: safe to forget.
    pub fn is_forgettable(&self, now: Nanos, idle: Nanos) -> bool {
        self.leases.is_empty()
            && self.in_flight.is_none()
            && self.hold().is_none_or(|d| d.until <= now)
            && now - self.last_request >= idle
    }

    /// When housekeeping next has something to do for this key: the claim in flight given up
    /// as lost, the first lease expiry, the idle return (while units are held and the key is
    /// not idle yet), or, with nothing held, the instant it may be forgotten.
    #[inline]
    pub(crate) fn next_deadline(&self, now: Nanos, cfg: &LeaseConfig, forget_after: Nanos) -> Nanos {
        let mut at = Nanos::MAX;
        if let Some(f) = self.flight() {
            at = at.min(f.claim.sent_at + cfg.stale_claim);
        }
        if let Some(first) = self.leases.first() {
            at = at.min(first.expires_at);
            let idle_at = self.last_request + cfg.idle_return;
            if cfg.limit.algorithm().returnable() && idle_at > now {
                at = at.min(idle_at);
            }
        } else if self.in_flight.is_none() {
            let hold = self.hold_until;
            at = at.min((self.last_request + forget_after).max(hold));
        }
        at
    }

    /// Drops expired leases (counted as expired).
    #[inline]
    pub(crate) fn expire(&mut self, now: Nanos, m: &Metrics) {
        if self.leases.first().is_none_or(|l| now < l.expires_at) {
            return;
        }
        let mut expired = 0;
        self.leases.retain(|l| {
            let live = now < l.expires_at;
            if !live {
                expired += l.units;
            }
            live
        });
        if self.leases.is_empty() {
            // Give the memory back: an idle key keeps no allocation.
            self.leases = ThinVec::new();
        }
        self.tally(|t| t.expired += expired);
        add(&m.units_expired, expired);
    }

    #[inline]
    fn take(&mut self, mut units: u64) -> Taken {
        self.tally(|t| t.served += units);
        if let Some(first) = self.leases.first_mut().filter(|l| l.units > units) {
            // The usual case: the earliest lease covers it and keeps some.
            first.units -= units;
            return Taken { units, expires_at: first.expires_at, claim_sent_at: first.claim_sent_at, one_off: false };
        }
        let first = self.leases[0];
        let mut taken =
            Taken { units, expires_at: first.expires_at, claim_sent_at: first.claim_sent_at, one_off: false };
        for l in self.leases.iter_mut() {
            if units == 0 {
                break;
            }
            let t = l.units.min(units);
            l.units -= t;
            units -= t;
            taken.claim_sent_at = taken.claim_sent_at.min(l.claim_sent_at);
        }
        self.leases.retain(|l| l.units > 0);
        if self.leases.is_empty() {
            // Give the memory back: a key that holds nothing keeps no allocation.
            self.leases = ThinVec::new();
        }
        debug_assert_eq!(units, 0, "took more units than held");
        taken
    }

    /// Puts back units an admission took (the request was refused by another limit, or not
    /// carried out): a lease that expires no later, and is aged from no later a send, than
    /// the leases they came from, so the refund never makes a unit live longer (rule 2) nor
    /// look younger to RL.RETURN (rule 4). Units that would already have expired are not put
    /// back but still un-served: refunded and expired (false).
    pub(crate) fn refund(&mut self, now: Nanos, t: Taken, m: &Metrics) -> bool {
        if t.units == 0 {
            return false;
        }
        self.tally(|x| x.served = x.served.saturating_sub(t.units));
        add(&m.units_refunded, t.units);
        if now >= t.expires_at {
            self.tally(|x| x.expired += t.units);
            add(&m.units_expired, t.units);
            return false;
        }
        let lease = Lease { units: t.units, expires_at: t.expires_at, claim_sent_at: t.claim_sent_at };
        match self
            .leases
            .iter_mut()
            .find(|l| l.expires_at == lease.expires_at && l.claim_sent_at == lease.claim_sent_at)
        {
            Some(l) => l.units += lease.units,
            None => {
                let at = self.leases.partition_point(|l| l.expires_at <= lease.expires_at);
                self.leases.insert(at, lease);
            }
        }
        true
    }

    /// A key remembered to hold the units of its one-off claim's admission, refunded: its
    /// totals count that claim, its request and the units it served.
    pub(crate) fn adopt_one_off(&mut self, units: u64) {
        self.tally(|t| {
            t.requests += 1;
            t.calls += 1;
            t.claimed += units;
            t.served += units;
        });
    }

    fn new_claim(&mut self, now: Nanos, size: ClaimSize, cost: u64, background: bool, m: &Metrics) -> ClaimSpec {
        self.next_claim = self.next_claim.wrapping_add(1).max(1);
        let claim = ClaimSpec {
            id: self.next_claim as u64,
            units: size.units,
            partial: size.partial,
            sent_at: now,
            background,
            cost,
        };
        self.in_flight = Some(Box::new(InFlight { claim }));
        self.call_credit = self.call_credit.saturating_sub(1);
        self.tally(|t| t.calls += 1);
        add(&m.claims, 1);
        add(&m.redis_calls, 1);
        add(&m.claims_in_flight, 1);
        if background {
            add(&m.background_claims, 1);
        }
        claim
    }

    fn end_flight(&mut self, m: &Metrics) -> Option<InFlight> {
        let f = self.in_flight.take().map(|b| *b);
        if f.is_some() {
            sub(&m.claims_in_flight, 1);
        }
        f
    }

    /// The claim was not sent after all (the breaker refused it): as if never made.
    pub(crate) fn cancel_claim(&mut self, id: u64, m: &Metrics) {
        if let Some(f) = self.flight().filter(|f| f.claim.id == id) {
            self.end_flight(m);
            self.call_credit = self.call_credit.saturating_add(1);
            self.tally(|t| t.calls -= 1);
            sub(&m.claims, 1);
            sub(&m.redis_calls, 1);
            if f.claim.background {
                sub(&m.background_claims, 1);
            }
        }
    }

    #[inline]
    fn hold_active(&self, now: Nanos) -> bool {
        now < self.hold_until
    }

    /// The span a claim covers: the horizon, or the pacing interval of a dry key.
    fn span(&self, cfg: &LeaseConfig) -> Nanos {
        cfg.horizon.max(self.pace)
    }

    /// The size of a claim for `need` more units (0: a background refill).
    fn size(&self, now: Nanos, need: u64, cfg: &LeaseConfig) -> ClaimSize {
        if !cfg.batching() {
            return ClaimSize { units: need, partial: false };
        }
        let span = self.span(cfg);
        // What the server can grant over the span: its last remaining plus its refill (the
        // fixed window refills only at its end).
        let refill =
            if cfg.limit.algorithm().refill() == Refill::AtWindowEnd { 0 } else { span.div_span(cfg.interval()) };
        // Never more than the demand can use before the lease expires.
        let usable = self.demand.expected(now, cfg.demand_tau, cfg.lease).max(1);
        claim_size(BatchInput {
            expected: self.demand.expected(now, cfg.demand_tau, span),
            need,
            max_batch: cfg.max_batch.min(self.capacity().unwrap_or(cfg.limit.capacity())).min(usable),
            available: self.known_remaining().map(|r| r.saturating_add(refill)),
        })
    }

    /// The refill lead: claim this long before the units are expected to run out (4 round
    /// trips, at least a quarter of the horizon).
    #[inline]
    fn lead(&self, cfg: &LeaseConfig) -> Nanos {
        (cfg.horizon / 4).max(self.rtt() * 4)
    }

    /// A background claim of at least 2 units, with a call credit and none in flight.
    fn background(&mut self, now: Nanos, cfg: &LeaseConfig, m: &Metrics) -> Option<ClaimSpec> {
        if !cfg.batching() || self.in_flight.is_some() || self.call_credit == 0 {
            return None;
        }
        let size = self.size(now, 0, cfg);
        (size.partial && size.units >= 2).then(|| self.new_claim(now, size, 0, true, m))
    }

    /// A background claim when units run low: held below the demand of the refill lead time,
    /// sized for the span, only for a demand of at least 2 units per span, with a call credit,
    /// never while a claim is in flight or the key is held.
    #[inline]
    fn refill(&mut self, now: Nanos, held: u64, cfg: &LeaseConfig, m: &Metrics) -> Option<ClaimSpec> {
        // The cheap conditions of `background` first: no demand estimate while a claim is out.
        if self.in_flight.is_some() || self.call_credit == 0 || !cfg.batching() {
            return None;
        }
        if self.hold_active(now) || !self.demand.exceeds(held, now, cfg.demand_tau, self.lead(cfg)) {
            return None;
        }
        self.background(now, cfg, m)
    }

    /// A new request for `cost` units at `now`.
    #[inline]
    pub(crate) fn on_request(&mut self, now: Nanos, cost: u64, cfg: &LeaseConfig, m: &Metrics) -> Ruling {
        self.tally(|t| t.requests += 1);
        self.call_credit = self.call_credit.saturating_add(1);
        self.last_request = self.last_request.max(now);
        self.demand.observe(now, cost, cfg.demand_tau, &mut self.demand_last);
        self.decide(now, cost, cfg, m)
    }

    /// What a request for `cost` units would get from what is known here, without taking
    /// anything or counting it as demand: `Some(Admit)` (held units cover it), `Some(Limited)`
    /// (the over-limit cache, or a cost above the capacity), or `None` (only Redis knows).
    pub(crate) fn peek(&mut self, now: Nanos, cost: u64, cfg: &LeaseConfig, m: &Metrics) -> Option<Ruling> {
        self.expire(now, m);
        if cost > self.capacity().unwrap_or(cfg.limit.capacity()) {
            return Some(Ruling::Limited { retry_after: None, by: LimitedBy::Never, refill: None });
        }
        let held = self.held();
        if held >= cost {
            return Some(Ruling::Admit { from_claim: false, refill: None, delay: None, taken: None, held });
        }
        match self.hold() {
            Some(d) if now < d.until && cost - held >= d.need => {
                Some(Ruling::Limited { retry_after: Some(d.until - now), by: LimitedBy::Cache, refill: None })
            }
            _ => None,
        }
    }

    /// The same request again, after waiting for claim `waited` (woken by its reply or error,
    /// or after a timeout), or after [`Ruling::Retry`] (pass `None`).
    pub(crate) fn resume(
        &mut self,
        now: Nanos,
        cost: u64,
        waited: Option<u64>,
        cfg: &LeaseConfig,
        m: &Metrics,
    ) -> Ruling {
        if waited.is_some() && self.failed_claim() == waited {
            self.expire(now, m);
            let held = self.held();
            if held >= cost && cost > 0 {
                let taken = self.take(cost);
                add(&m.local_admits, 1);
                add(&m.units_served, cost);
                return Ruling::Admit {
                    from_claim: false,
                    refill: None,
                    delay: None,
                    taken: Some(taken),
                    held: held - cost,
                };
            }
            return Ruling::Failed;
        }
        self.decide(now, cost, cfg, m)
    }

    #[inline]
    fn decide(&mut self, now: Nanos, cost: u64, cfg: &LeaseConfig, m: &Metrics) -> Ruling {
        self.expire(now, m);
        if cost == 0 {
            return Ruling::Admit { from_claim: false, refill: None, delay: None, taken: None, held: self.held() };
        }
        if cost > self.capacity().unwrap_or(cfg.limit.capacity()) {
            add(&m.never_denials, 1);
            return Ruling::Limited { retry_after: None, by: LimitedBy::Never, refill: None };
        }
        let held = self.held();
        if held >= cost {
            let taken = self.take(cost);
            add(&m.local_admits, 1);
            add(&m.units_served, cost);
            let held = held - cost;
            let refill = self.refill(now, held, cfg, m);
            return Ruling::Admit { from_claim: false, refill, delay: None, taken: Some(taken), held };
        }
        if let Some(f) = self.flight() {
            if now - f.claim.sent_at <= cfg.stale_claim {
                return Ruling::Wait { claim: f.claim.id };
            }
            // Lost: its reply (if it ever comes) still adds its units.
            self.give_up(m);
        }
        let need = cost - held;
        if let Some(d) = self.hold().filter(|d| now < d.until && need >= d.need) {
            add(&m.over_limit_cache_hits, 1);
            // Claim ahead of the hold's end, so that units are back when it ends.
            let refill = if now + self.lead(cfg) >= d.until { self.background(now, cfg, m) } else { None };
            return Ruling::Limited { retry_after: Some(d.until - now), by: LimitedBy::Cache, refill };
        }
        let size = self.size(now, need, cfg);
        Ruling::Claim(self.new_claim(now, size, cost, false, m))
    }

    /// Gives up the claim in flight as lost (no reply nor error after `stale_claim`): its
    /// waiters fall to the failure policy; a reply that still comes adds its units as lost.
    fn give_up(&mut self, m: &Metrics) {
        if let Some(f) = self.end_flight(m) {
            self.failed = f.claim.id as u32;
            add(&m.claims_given_up, 1);
        }
    }

    /// The reply to claim `claim` arrived at `now`. Returns the verdict for the request that made
    /// it, with that request's cost (`None` for a background claim, or a reply to a claim given
    /// up as lost).
    pub(crate) fn on_claim_reply(
        &mut self,
        now: Nanos,
        claim: &ClaimSpec,
        d: &Decision,
        cfg: &LeaseConfig,
        m: &Metrics,
    ) -> Option<(Ruling, u64)> {
        let initiator = match self.flight() {
            Some(f) if f.claim.id == claim.id => {
                self.end_flight(m);
                (!f.claim.background).then_some(f.claim.cost)
            }
            _ => {
                // A reply to a claim already given up (failed, timed out, lost): its units were
                // counted by the server, nobody serves them.
                let lost = d.allowed.min(claim.units);
                self.tally(|t| t.claimed += lost);
                self.tally(|t| t.expired += lost);
                add(&m.units_claimed, lost);
                add(&m.units_expired, lost);
                return None;
            }
        };
        let rtt = now - claim.sent_at;
        let rtt = if self.rtt == 0 { rtt } else { (self.rtt() * 7 + rtt) / 8 };
        self.rtt = rtt.as_u64().min(u32::MAX as u64) as u32;
        self.capacity = d.limit;
        self.remaining = d.remaining.min(u64::MAX - 1);
        self.reset_at = (now + d.reset_after.into()).max(Nanos::new(1));
        // Never more than asked, whatever the reply says.
        let granted = d.allowed.min(claim.units);
        self.tally(|t| t.claimed += granted);
        add(&m.units_claimed, granted);
        if granted > 0 {
            let lease =
                Lease { units: granted, expires_at: claim.sent_at + cfg.lease_span(d), claim_sent_at: claim.sent_at };
            let at = self.leases.partition_point(|l| l.expires_at <= lease.expires_at);
            self.leases.insert(at, lease);
        }
        // Dry: refused, granted less than asked, or (several instances sharing the key) granted
        // with less left than was asked, so that the same ask again would fall short: every
        // instance then claims at the same pace, each asking for its own demand, and instances
        // share an exhausted limit in proportion to their demand.
        // (Exact claims, a per-request check's, are never paced on a grant.)
        let drained = claim.partial && granted > 0 && d.remaining < claim.units && cfg.instances > 1;
        if granted >= claim.units && !drained {
            self.set_hold(None);
            self.pace = Nanos::ZERO;
        } else if granted > 0 || d.retry_after.is_some() {
            // Hold until the server-named instant (its durations run from when it decided,
            // before `now`: never early), and while paced until this instance's next claim is
            // worth making; the next claims ask for the demand of the pacing interval.
            let retry = d.retry_after.map_or(Nanos::ZERO, Nanos::from);
            let pace = if cfg.batching() {
                let lease_demand = self.demand.rate_at(now, cfg.demand_tau, self.demand_last) * cfg.lease.to_f64();
                cfg.dry_hold(lease_demand)
            } else {
                Nanos::ZERO
            };
            self.pace = pace;
            // Spread over [pace/2, 3·pace/2): instances that ran dry together must not all
            // come back together (the instant of the reply, in ns, differs between them).
            let pace = jitter(pace, now.as_u64() ^ claim.id.rotate_left(32));
            let need = if claim.partial || !pace.is_zero() { 1 } else { claim.units };
            let until = now + retry.max(pace);
            if until > now {
                self.set_hold(Some(Hold { until, need }));
            }
        }
        self.expire(now, m);
        let cost = initiator?;
        let held = self.held();
        if held >= cost {
            let taken = self.take(cost);
            add(&m.redis_admits, 1);
            add(&m.units_served, cost);
            let (delay, held) = (d.delay.map(Nanos::from), held - cost);
            Some((Ruling::Admit { from_claim: true, refill: None, delay, taken: Some(taken), held }, cost))
        } else if granted == 0 {
            add(&m.redis_denials, 1);
            // The hold's end: the server-named instant, or later while paced.
            let retry_after =
                d.retry_after.map(|r| self.hold().filter(|h| h.until > now).map_or(Nanos::from(r), |h| h.until - now));
            let by = if retry_after.is_none() { LimitedBy::Never } else { LimitedBy::Redis };
            Some((Ruling::Limited { retry_after, by, refill: None }, cost))
        } else {
            Some((Ruling::Retry, cost))
        }
    }

    /// Claim `claim` failed (error, timeout, or dropped). Returns [`Ruling::Failed`] for the
    /// request that made it (`None` for a background claim). Requests waiting on it get
    /// [`Ruling::Failed`] from [`KeyState::resume`] (unless held units now cover them).
    pub(crate) fn on_claim_error(&mut self, claim: &ClaimSpec, m: &Metrics) -> Option<(Ruling, u64)> {
        match self.flight() {
            Some(f) if f.claim.id == claim.id => {
                self.end_flight(m);
                self.failed = claim.id as u32;
                (!f.claim.background).then_some((Ruling::Failed, f.claim.cost))
            }
            _ => None,
        }
    }

    /// Housekeeping at `now`: gives up a claim in flight for `stale_claim`, drops expired
    /// leases; when the key has been idle for `idle_return`, gives its held units back (one
    /// return per lease, each with a call credit; algorithms without RL.RETURN keep them until
    /// they expire). `may_call`: false while Redis is unavailable (units are then kept until
    /// they expire).
    pub(crate) fn housekeeping(
        &mut self,
        now: Nanos,
        cfg: &LeaseConfig,
        may_call: bool,
        m: &Metrics,
        out: &mut Vec<ReturnSpec>,
    ) {
        if self.flight().is_some_and(|f| now - f.claim.sent_at > cfg.stale_claim) {
            self.give_up(m);
        }
        self.expire(now, m);
        let idle = now - self.last_request >= cfg.idle_return;
        if !idle || !may_call || !cfg.limit.algorithm().returnable() || self.leases.is_empty() {
            return;
        }
        while self.call_credit > 0 && !self.leases.is_empty() {
            let l = self.leases.remove(0);
            if let Some(r) = self.give_back(now, l, cfg, m) {
                self.call_credit -= 1;
                out.push(r);
            }
        }
        if self.leases.is_empty() {
            self.leases = ThinVec::new();
        }
    }

    /// Gives a lease back: all its units, with `AGE` = the time since the claim's send plus the
    /// return margin. The server ages a bucket return itself (it credits `units − rate × AGE`:
    /// the refill a full bucket lost while the units were out is not handed out again, which
    /// keeps the bound, docs/local-reservations.md rule 4); when that leaves nothing, no call is
    /// made and the units are dropped (counted as expired). `None` then.
    fn give_back(&mut self, now: Nanos, l: Lease, cfg: &LeaseConfig, m: &Metrics) -> Option<ReturnSpec> {
        let age = crate::commands::return_age(l.claim_sent_at, now, cfg.return_margin);
        if cfg.limit.algorithm().is_bucket() {
            let refilled =
                (age.as_u64() as u128 * cfg.limit.limit() as u128).div_ceil(cfg.limit.period_nanos().as_u64() as u128);
            if refilled >= l.units as u128 {
                self.tally(|t| t.expired += l.units);
                add(&m.units_expired, l.units);
                return None;
            }
        }
        self.tally(|t| t.returned += l.units);
        self.tally(|t| t.calls += 1);
        add(&m.units_returned, l.units);
        add(&m.returns, 1);
        add(&m.redis_calls, 1);
        Some(ReturnSpec { units: l.units, age })
    }

    /// Shutdown: every unexpired unit is given back (one return per lease, whatever the call
    /// credit); for an algorithm without RL.RETURN they are dropped (counted as expired).
    pub(crate) fn drain(&mut self, now: Nanos, cfg: &LeaseConfig, m: &Metrics, out: &mut Vec<ReturnSpec>) {
        self.expire(now, m);
        let leases = std::mem::take(&mut self.leases);
        if !cfg.limit.algorithm().returnable() {
            let n: u64 = leases.iter().map(|l| l.units).sum();
            self.tally(|t| t.expired += n);
            add(&m.units_expired, n);
            return;
        }
        out.extend(leases.into_iter().filter_map(|l| self.give_back(now, l, cfg, m)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: Nanos = Nanos::from_secs(1);
    fn n(ns: u64) -> Nanos {
        Nanos::new(ns as i64)
    }

    fn reply(allowed: u64, limit: u64, remaining: u64, retry_ms: i64, reset_ms: i64) -> Decision {
        Decision::from_fields(allowed as i64, limit as i64, remaining as i64, retry_ms, reset_ms, None)
    }

    fn cfg() -> LeaseConfig {
        LeaseConfig::new(Limit::token_bucket(10_000, Duration::from_secs(1)).unwrap())
    }

    #[test]
    fn cold_key_claims_exactly_the_request() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::with_totals();
        let Ruling::Claim(cl) = k.on_request(n(0), 1, &c, &m) else { panic!() };
        assert_eq!((cl.units, cl.partial), (1, false));
        assert_eq!(k.on_request(n(1), 1, &c, &m), Ruling::Wait { claim: cl.id });
        let v = k.on_claim_reply(n(10), &cl, &reply(1, 10_000, 9_999, -1, 1), &c, &m);
        assert!(matches!(v, Some((Ruling::Admit { from_claim: true, .. }, 1))));
        assert_eq!(k.held(), 0);
    }

    #[test]
    fn hot_key_batches_serves_locally_and_refills_in_background() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::with_totals();
        let mut t = Nanos::ZERO;
        let mut calls = 0;
        for _ in 0..5000 {
            t += S / 5000; // 5000/s
            match k.on_request(t, 1, &c, &m) {
                Ruling::Claim(cl) | Ruling::Admit { refill: Some(cl), .. } => {
                    calls += 1;
                    let _ = k.on_claim_reply(t, &cl, &reply(cl.units, 10_000, 5_000, -1, 100), &c, &m);
                }
                Ruling::Admit { .. } => {}
                v => panic!("{v:?}"),
            }
        }
        assert!(calls < 500, "{calls} calls for 5000 requests");
        let tot = k.totals();
        assert_eq!(tot.served + tot.returned + tot.expired + k.held(), tot.claimed);
    }

    #[test]
    fn denial_is_cached_until_the_named_instant() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::with_totals();
        let Ruling::Claim(cl) = k.on_request(n(0), 1, &c, &m) else { panic!() };
        let v = k.on_claim_reply(n(0), &cl, &reply(0, 10, 0, 250, 1000), &c, &m);
        assert_eq!(
            v,
            Some((Ruling::Limited { retry_after: Some(n(250_000_000)), by: LimitedBy::Redis, refill: None }, 1))
        );
        assert_eq!(
            k.on_request(S / 10, 1, &c, &m),
            Ruling::Limited { retry_after: Some(n(150_000_000)), by: LimitedBy::Cache, refill: None }
        );
        assert!(matches!(k.on_request(S / 4, 1, &c, &m), Ruling::Claim(_)));
        assert_eq!(
            k.on_request(S / 4, 11, &c, &m),
            Ruling::Limited { retry_after: None, by: LimitedBy::Never, refill: None }
        );
    }

    #[test]
    fn a_dry_key_is_paced_and_asks_for_the_demand_of_the_interval() {
        let m = Metrics::default();
        let c = LeaseConfig { instances: 40, ..cfg() };
        let mut k = KeyState::with_totals();
        let mut t = Nanos::ZERO;
        // 5000/s for a second: a hot key.
        for _ in 0..5000 {
            t += S / 5000;
            match k.on_request(t, 1, &c, &m) {
                Ruling::Claim(cl) | Ruling::Admit { refill: Some(cl), .. } => {
                    let _ = k.on_claim_reply(t, &cl, &reply(cl.units, 10_000, 5_000, -1, 100), &c, &m);
                }
                _ => {}
            }
        }
        // The server runs dry: a batch comes back short.
        k.take(k.held());
        let Ruling::Claim(cl) = k.on_request(t, 1, &c, &m) else { panic!() };
        assert!(cl.partial && cl.units > 100, "{cl:?}");
        let _ = k.on_claim_reply(t, &cl, &reply(10, 10_000, 0, -1, 100), &c, &m);
        k.take(k.held());
        // Held for about the horizon (jittered ±50%), refused locally meanwhile.
        let Ruling::Limited { retry_after: Some(r), by: LimitedBy::Cache, .. } = k.on_request(t + n(1), 1, &c, &m)
        else {
            panic!()
        };
        assert!((c.horizon / 2..c.horizon * 3 / 2).contains(&(r + n(1))), "{r:?}");
    }

    #[test]
    fn window_leases_end_before_the_window() {
        let c = LeaseConfig::new(Limit::fixed(100, Duration::from_secs(60)).unwrap());
        assert_eq!(c.lease_span(&reply(5, 100, 95, -1, 300)), Nanos::from_millis(299));
        assert_eq!(c.lease_span(&reply(5, 100, 95, -1, 30_000)), S);
        let s = LeaseConfig::new(Limit::sliding(100, Duration::from_secs(60)).unwrap());
        assert_eq!(s.lease_span(&reply(5, 100, 95, -1, 60_400)), Nanos::from_millis(399));
    }

    #[test]
    fn failed_claim_fails_its_waiters_and_idle_units_go_back() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::with_totals();
        let Ruling::Claim(cl) = k.on_request(n(0), 1, &c, &m) else { panic!() };
        let Ruling::Wait { claim } = k.on_request(n(1), 1, &c, &m) else { panic!() };
        assert_eq!(k.on_claim_error(&cl, &m), Some((Ruling::Failed, 1)));
        assert_eq!(k.resume(n(2), 1, Some(claim), &c, &m), Ruling::Failed);
        // A batch, then silence: the rest goes back after idle_return.
        let Ruling::Claim(cl) = k.on_request(n(3), 1, &c, &m) else { panic!() };
        let big = ClaimSpec { units: 50, partial: true, ..cl };
        let _ = k.on_claim_reply(n(4), &big, &reply(50, 10_000, 9_000, -1, 5), &c, &m);
        assert_eq!(k.held(), 49);
        let mut r = Vec::new();
        k.housekeeping(n(5), &c, true, &m, &mut r);
        assert!(r.is_empty());
        // A 10,000/s bucket refills 49 units in 4.9 ms: nothing is worth returning.
        k.housekeeping(n(5) + c.idle_return, &c, true, &m, &mut r);
        assert!(r.is_empty());
        assert_eq!((k.held(), k.totals().expired), (0, 49));
        // A slow bucket (1 per s): the rest goes back (the server deducts the refill).
        let slow = LeaseConfig {
            return_margin: Nanos::ZERO,
            lease: S * 10,
            ..LeaseConfig::new(Limit::token_bucket(1, Duration::from_secs(1)).unwrap().with_burst(100).unwrap())
        };
        let mut k = KeyState::with_totals();
        let Ruling::Claim(cl) = k.on_request(n(0), 1, &slow, &m) else { panic!() };
        let big = ClaimSpec { units: 50, partial: true, ..cl };
        let _ = k.on_claim_reply(n(4), &big, &reply(50, 100, 50, -1, 5), &slow, &m);
        assert!(matches!(k.on_request(n(5), 1, &slow, &m), Ruling::Admit { .. }));
        k.housekeeping(S * 2, &slow, true, &m, &mut r);
        assert_eq!(r, vec![ReturnSpec { units: 48, age: S * 2 }]);
    }
}
