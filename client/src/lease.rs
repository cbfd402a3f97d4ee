//! Reservations (leases) for one key, sans IO: no clock reads, no tokio; `now` is virtual time
//! in nanoseconds passed in by the caller (the tokio driver, or the simulator).
//!
//! A process holds, per key, units claimed from Redis (`COST n [PARTIAL]`), each batch a
//! [`Lease`] with an expiry. A request is served from held units when there are enough
//! ([`Verdict::Admit`], no Redis call); otherwise it starts a claim ([`Verdict::Claim`]) or, when
//! a claim of this key is already in flight, waits for it ([`Verdict::Wait`]): exactly one claim
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

use crate::batch::{claim_size, BatchInput, ClaimSize, Demand};
use crate::decision::Decision;
use crate::metrics::{add, Metrics};
use crate::spec::{Algorithm, Limit};

const MS: u64 = 1_000_000;

/// `span` scaled by a factor in [1/2, 3/2) drawn from `seed` (splitmix64).
fn jitter(span: u64, seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let frac = (z >> 11) as f64 / (1u64 << 53) as f64;
    (span as f64 * (0.5 + frac)) as u64
}

/// How a key's reservations behave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseConfig {
    pub limit: Limit,
    /// `L`: the longest a lease lives, from its claim's send time, in ns.
    pub lease_ns: u64,
    /// Batch to cover the demand of this long (ns): batch ≈ demand rate × horizon.
    pub horizon_ns: u64,
    /// The largest claim.
    pub max_batch: u64,
    /// Instances expected to share a key: a key that ran dry is claimed again no sooner than
    /// this instance's fair share of the refill makes worthwhile (see [`LeaseConfig::dry_hold_ns`]).
    pub instances: u64,
    /// Time constant of the demand estimate (ns).
    pub demand_tau_ns: u64,
    /// A key with no request for this long gives its held units back (ns).
    pub idle_return_ns: u64,
    /// A claim with no reply or error after this long is taken as lost (ns); the driver's
    /// call timeout is shorter, so this only catches a driver that lost track of a call.
    pub stale_claim_ns: u64,
    /// Batch and serve locally. False: every request is an exact claim (a per-request check,
    /// still with the over-limit cache and the breaker). Always off for RL.LEAKY, whose every
    /// admitted request needs its own `delay`, and for RL.SLIDINGLOG, which needs each
    /// request's instant (and refuses RL.RETURN).
    pub batching: bool,
    /// Added to the measured age of units given back (ns): the return's own transit, at most the
    /// call timeout (`AGE` must never be less than the true age).
    pub return_margin_ns: u64,
}

impl LeaseConfig {
    /// Defaults for a limit: L = 1 s (never more than the period), horizon 100 ms (at most
    /// L/2), batches of at most 1000, one instance, τ = 1 s, idle return after L/2, claims lost
    /// after 10 s.
    pub fn new(limit: Limit) -> LeaseConfig {
        let period = limit.period.as_nanos().min(u64::MAX as u128) as u64;
        let lease_ns = 1_000_000_000u64.min(period.max(1));
        LeaseConfig {
            limit,
            lease_ns,
            horizon_ns: (100 * MS).min(lease_ns / 2),
            max_batch: 1000,
            instances: 1,
            demand_tau_ns: 1_000_000_000,
            idle_return_ns: lease_ns / 2,
            stale_claim_ns: 10_000_000_000,
            batching: !matches!(limit.algorithm, Algorithm::Leaky | Algorithm::SlidingLog),
            return_margin_ns: 100 * MS,
        }
    }

    fn batching(&self) -> bool {
        self.batching && !matches!(self.limit.algorithm, Algorithm::Leaky | Algorithm::SlidingLog)
    }

    /// The limit's mean spacing of units, `period ÷ limit` (ns, at least 1).
    pub fn interval_ns(&self) -> u64 {
        let period = self.limit.period.as_nanos().min(u64::MAX as u128) as u64;
        (period / self.limit.limit.max(1)).max(1)
    }

    /// How long a key that ran dry (a claim granted less than it asked) waits, on average,
    /// before claiming again: the refill horizon, and with N instances at least the time for
    /// this instance's fair share of `k` units to refill (`¾ × k × N × interval`, `k` = the
    /// units its demand can use within a lease, between 1 and 3), never more than the period. The
    /// fixed window does not pace: the server names the window's end.
    pub fn dry_hold_ns(&self, lease_demand: f64) -> u64 {
        if self.limit.algorithm == Algorithm::Fixed {
            return 0;
        }
        let period = self.limit.period.as_nanos().min(u64::MAX as u128) as u64;
        let k = if lease_demand.is_finite() { lease_demand.clamp(1.0, 3.0) } else { 1.0 };
        // ¾: the instances together ask a third more than the refill, so that it is taken.
        let share = if self.instances > 1 {
            (self.interval_ns() as f64 * self.instances as f64 * k * 0.75).min(u64::MAX as f64 / 2.0) as u64
        } else {
            0
        };
        self.horizon_ns.max(share).min(period)
    }

    /// How long the units of this reply may be served, from the claim's send time.
    pub fn lease_span(&self, d: &Decision) -> u64 {
        let reset = d.reset_after.as_nanos().min(u64::MAX as u128) as u64;
        let window = self.limit.period.as_nanos().min(u64::MAX as u128) as u64;
        let window_end = match self.limit.algorithm {
            Algorithm::Fixed => Some(reset),
            Algorithm::Sliding if reset > window => Some(reset - window),
            Algorithm::Sliding => Some(reset),
            _ => None,
        };
        match window_end {
            Some(end) => end.saturating_sub(MS).min(self.lease_ns),
            None => self.lease_ns,
        }
    }
}

/// Units held from one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub units: u64,
    /// Served only while `now < expires_at`.
    pub expires_at: u64,
    /// When the claim was sent (RL.RETURN's AGE is measured from it).
    pub claim_sent_at: u64,
}

/// A claim to send: `<command> key limit period [BURST b] COST units [PARTIAL]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Identifies the claim in [`KeyState::on_claim_reply`] / [`KeyState::on_claim_error`].
    pub id: u64,
    pub units: u64,
    pub partial: bool,
    pub sent_at: u64,
    /// Sent ahead of need (nobody waits for it).
    pub background: bool,
}

/// Units to give back: `RL.RETURN key units AGE <now − claim_sent_at>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnRequest {
    pub units: u64,
    pub claim_sent_at: u64,
}

/// Why a request was refused without a Redis call, or by Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitedBy {
    /// The over-limit cache: a recent denial named an instant not yet reached.
    Cache,
    /// The cost is above the limit's capacity: it never passes.
    Never,
    /// Redis denied the claim made for this request.
    Redis,
}

/// What to do with a request (or, from [`KeyState::on_claim_reply`], with its initiator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted. `from_claim`: served by the claim it made (a round trip); else from held
    /// units. `refill`: send this background claim now (units are running low). `delay_ns`:
    /// RL.LEAKY's delay for a Redis admit.
    Admit { from_claim: bool, refill: Option<ClaimRequest>, delay_ns: Option<u64> },
    /// Refused; `retry_after_ns` is when it can pass (never early), `None` when it never can.
    /// `refill`: send this background claim now (a held key nearing the end of its hold).
    Limited { retry_after_ns: Option<u64>, by: LimitedBy, refill: Option<ClaimRequest> },
    /// A claim of this key is in flight: wait for its reply (or error), then call
    /// [`KeyState::resume`] with this id.
    Wait { claim: u64 },
    /// Send this claim and report its reply or error; the request is decided by it.
    Claim(ClaimRequest),
    /// The claim this request waited for failed (or the one it made): apply the failure policy.
    Failed,
    /// Decide again with [`KeyState::resume`] (a partial claim granted less than needed).
    Retry,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    claim: ClaimRequest,
    /// The initiator's cost (0 for a background claim).
    cost: u64,
}

#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Refused locally until then: the instant the server named for the denied request, or the
    /// end of the pacing interval of a key that ran dry, whichever is later.
    until: u64,
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

/// The reservation state of one key.
#[derive(Clone, Debug, Default)]
pub struct KeyState {
    /// Unexpired leases with units, by expiry.
    leases: Vec<Lease>,
    in_flight: Option<InFlight>,
    next_claim: u64,
    /// The last claim that failed (waiters on it fall back).
    failed: Option<u64>,
    hold: Option<Hold>,
    /// The pacing interval while the key runs dry (0 otherwise): claims then ask for the demand
    /// of this long.
    pace_ns: u64,
    demand: Demand,
    /// From the last reply: capacity, remaining, and the absolute instant of a fresh state.
    capacity: Option<u64>,
    remaining: Option<u64>,
    reset_at: Option<u64>,
    last_request: u64,
    /// Smoothed round trip of claims (ns).
    rtt_ns: u64,
    /// Requests minus Redis calls: a background claim or a return needs one.
    call_credit: u64,
    totals: Totals,
}

impl KeyState {
    pub fn new() -> KeyState {
        KeyState::default()
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Units held (unexpired as of the last call that expired leases).
    pub fn held(&self) -> u64 {
        self.leases.iter().map(|l| l.units).sum()
    }

    /// Units servable at `now` (unexpired).
    pub fn held_at(&self, now: u64) -> u64 {
        self.leases.iter().filter(|l| now < l.expires_at).map(|l| l.units).sum()
    }

    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The claim in flight, if any.
    pub fn in_flight(&self) -> Option<ClaimRequest> {
        self.in_flight.map(|f| f.claim)
    }

    /// The limit's capacity, once a reply reported it.
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// The units still admissible overall, as best known: the server's last `remaining` plus
    /// what is held here.
    pub fn remaining_estimate(&self, now: u64) -> Option<u64> {
        let r = self.remaining?.saturating_add(self.held_at(now));
        Some(self.capacity.map_or(r, |c| r.min(c)))
    }

    /// Time until the limiter is fresh again, as of the last reply.
    pub fn reset_after(&self, now: u64) -> Option<u64> {
        self.reset_at.map(|t| t.saturating_sub(now))
    }

    /// Nothing held, nothing in flight, no live denial, idle for `idle_ns`: safe to forget.
    pub fn is_forgettable(&self, now: u64, idle_ns: u64) -> bool {
        self.leases.is_empty()
            && self.in_flight.is_none()
            && self.hold.is_none_or(|d| d.until <= now)
            && now.saturating_sub(self.last_request) >= idle_ns
    }

    /// Drops expired leases (counted as expired).
    pub fn expire(&mut self, now: u64, m: &Metrics) {
        let mut expired = 0;
        self.leases.retain(|l| {
            let live = now < l.expires_at;
            if !live {
                expired += l.units;
            }
            live
        });
        self.totals.expired += expired;
        add(&m.units_expired, expired);
    }

    fn take(&mut self, mut units: u64) {
        self.totals.served += units;
        for l in self.leases.iter_mut() {
            let t = l.units.min(units);
            l.units -= t;
            units -= t;
        }
        self.leases.retain(|l| l.units > 0);
        debug_assert_eq!(units, 0, "took more units than held");
    }

    fn new_claim(&mut self, now: u64, size: ClaimSize, cost: u64, background: bool, m: &Metrics) -> ClaimRequest {
        self.next_claim += 1;
        let claim =
            ClaimRequest { id: self.next_claim, units: size.units, partial: size.partial, sent_at: now, background };
        self.in_flight = Some(InFlight { claim, cost });
        self.call_credit = self.call_credit.saturating_sub(1);
        self.totals.calls += 1;
        add(&m.claims, 1);
        add(&m.redis_calls, 1);
        if background {
            add(&m.background_claims, 1);
        }
        claim
    }

    /// The claim was not sent after all (the breaker refused it): as if never made.
    pub fn cancel_claim(&mut self, id: u64, m: &Metrics) {
        if let Some(f) = self.in_flight.filter(|f| f.claim.id == id) {
            self.in_flight = None;
            self.call_credit += 1;
            self.totals.calls -= 1;
            m.claims.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            m.redis_calls.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            if f.claim.background {
                m.background_claims.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    fn hold_active(&self, now: u64) -> bool {
        self.hold.is_some_and(|d| now < d.until)
    }

    /// The span a claim covers: the horizon, or the pacing interval of a dry key.
    fn span(&self, cfg: &LeaseConfig) -> u64 {
        cfg.horizon_ns.max(self.pace_ns)
    }

    /// The size of a claim for `need` more units (0: a background refill).
    fn size(&self, now: u64, need: u64, cfg: &LeaseConfig) -> ClaimSize {
        if !cfg.batching() {
            return ClaimSize { units: need, partial: false };
        }
        let span = self.span(cfg);
        // What the server can grant over the span: its last remaining plus its refill (the
        // fixed window refills only at its end).
        let refill = if cfg.limit.algorithm == Algorithm::Fixed { 0 } else { span / cfg.interval_ns() };
        // Never more than the demand can use before the lease expires.
        let usable = self.demand.expected(now, cfg.demand_tau_ns, cfg.lease_ns).max(1);
        claim_size(BatchInput {
            expected: self.demand.expected(now, cfg.demand_tau_ns, span),
            need,
            max_batch: cfg.max_batch.min(self.capacity.unwrap_or(cfg.limit.capacity())).min(usable),
            available: self.remaining.map(|r| r.saturating_add(refill)),
        })
    }

    /// The refill lead: claim this long before the units are expected to run out (4 round
    /// trips, at least a quarter of the horizon).
    fn lead(&self, cfg: &LeaseConfig) -> u64 {
        (cfg.horizon_ns / 4).max(self.rtt_ns.saturating_mul(4))
    }

    /// A background claim of at least 2 units, with a call credit and none in flight.
    fn background(&mut self, now: u64, cfg: &LeaseConfig, m: &Metrics) -> Option<ClaimRequest> {
        if !cfg.batching() || self.in_flight.is_some() || self.call_credit == 0 {
            return None;
        }
        let size = self.size(now, 0, cfg);
        (size.partial && size.units >= 2).then(|| self.new_claim(now, size, 0, true, m))
    }

    /// A background claim when units run low: held below the demand of the refill lead time,
    /// sized for the span, only for a demand of at least 2 units per span, with a call credit,
    /// never while a claim is in flight or the key is held.
    fn refill(&mut self, now: u64, cfg: &LeaseConfig, m: &Metrics) -> Option<ClaimRequest> {
        if self.hold_active(now) || self.held() >= self.demand.expected(now, cfg.demand_tau_ns, self.lead(cfg)) {
            return None;
        }
        self.background(now, cfg, m)
    }

    /// A new request for `cost` units at `now`.
    pub fn on_request(&mut self, now: u64, cost: u64, cfg: &LeaseConfig, m: &Metrics) -> Verdict {
        self.totals.requests += 1;
        self.call_credit += 1;
        self.last_request = self.last_request.max(now);
        self.demand.observe(now, cost, cfg.demand_tau_ns);
        self.decide(now, cost, cfg, m)
    }

    /// The same request again, after waiting for claim `waited` (woken by its reply or error,
    /// or after a timeout), or after [`Verdict::Retry`] (pass `None`).
    pub fn resume(&mut self, now: u64, cost: u64, waited: Option<u64>, cfg: &LeaseConfig, m: &Metrics) -> Verdict {
        if waited.is_some() && self.failed == waited {
            self.expire(now, m);
            if self.held() >= cost && cost > 0 {
                self.take(cost);
                add(&m.local_admits, 1);
                add(&m.units_served, cost);
                return Verdict::Admit { from_claim: false, refill: None, delay_ns: None };
            }
            return Verdict::Failed;
        }
        self.decide(now, cost, cfg, m)
    }

    fn decide(&mut self, now: u64, cost: u64, cfg: &LeaseConfig, m: &Metrics) -> Verdict {
        self.expire(now, m);
        if cost == 0 {
            return Verdict::Admit { from_claim: false, refill: None, delay_ns: None };
        }
        if cost > self.capacity.unwrap_or(cfg.limit.capacity()) {
            add(&m.never_denials, 1);
            return Verdict::Limited { retry_after_ns: None, by: LimitedBy::Never, refill: None };
        }
        let held = self.held();
        if held >= cost {
            self.take(cost);
            add(&m.local_admits, 1);
            add(&m.units_served, cost);
            let refill = self.refill(now, cfg, m);
            return Verdict::Admit { from_claim: false, refill, delay_ns: None };
        }
        if let Some(f) = self.in_flight {
            if now.saturating_sub(f.claim.sent_at) <= cfg.stale_claim_ns {
                return Verdict::Wait { claim: f.claim.id };
            }
            // Lost: its reply (if it ever comes) still adds its units.
            self.in_flight = None;
            self.failed = Some(f.claim.id);
        }
        let need = cost - held;
        if let Some(d) = self.hold.filter(|d| now < d.until && need >= d.need) {
            add(&m.over_limit_cache_hits, 1);
            // Claim ahead of the hold's end, so that units are back when it ends.
            let refill =
                if now.saturating_add(self.lead(cfg)) >= d.until { self.background(now, cfg, m) } else { None };
            return Verdict::Limited { retry_after_ns: Some(d.until - now), by: LimitedBy::Cache, refill };
        }
        let size = self.size(now, need, cfg);
        Verdict::Claim(self.new_claim(now, size, cost, false, m))
    }

    /// The reply to claim `claim` arrived at `now`. Returns the verdict for the request that made
    /// it (`None` for a background claim, or a reply to a claim given up as lost).
    pub fn on_claim_reply(
        &mut self,
        now: u64,
        claim: &ClaimRequest,
        d: &Decision,
        cfg: &LeaseConfig,
        m: &Metrics,
    ) -> Option<Verdict> {
        let initiator = match self.in_flight {
            Some(f) if f.claim.id == claim.id => {
                self.in_flight = None;
                (!f.claim.background).then_some(f.cost)
            }
            _ => {
                // A reply to a claim already given up (failed, timed out, lost): its units were
                // counted by the server, nobody serves them.
                let lost = d.allowed.min(claim.units);
                self.totals.claimed += lost;
                self.totals.expired += lost;
                add(&m.units_claimed, lost);
                add(&m.units_expired, lost);
                return None;
            }
        };
        let rtt = now.saturating_sub(claim.sent_at);
        self.rtt_ns = if self.rtt_ns == 0 { rtt } else { (self.rtt_ns * 7 + rtt) / 8 };
        self.capacity = Some(d.limit);
        self.remaining = Some(d.remaining);
        self.reset_at = Some(now.saturating_add(d.reset_after.as_nanos().min(u64::MAX as u128) as u64));
        // Never more than asked, whatever the reply says.
        let granted = d.allowed.min(claim.units);
        self.totals.claimed += granted;
        add(&m.units_claimed, granted);
        if granted > 0 {
            let lease = Lease {
                units: granted,
                expires_at: claim.sent_at.saturating_add(cfg.lease_span(d)),
                claim_sent_at: claim.sent_at,
            };
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
            self.hold = None;
            self.pace_ns = 0;
        } else if granted > 0 || d.retry_after.is_some() {
            // Hold until the server-named instant (its durations run from when it decided,
            // before `now`: never early), and while paced until this instance's next claim is
            // worth making; the next claims ask for the demand of the pacing interval.
            let retry = d.retry_after.map_or(0, |r| r.as_nanos().min(u64::MAX as u128) as u64);
            let pace = if cfg.batching() {
                let lease_demand = self.demand.rate_at(now, cfg.demand_tau_ns) * cfg.lease_ns as f64;
                cfg.dry_hold_ns(lease_demand)
            } else {
                0
            };
            self.pace_ns = pace;
            // Spread over [pace/2, 3·pace/2): instances that ran dry together must not all
            // come back together (the instant of the reply, in ns, differs between them).
            let pace = jitter(pace, now ^ claim.id.rotate_left(32));
            let need = if claim.partial || pace > 0 { 1 } else { claim.units };
            let until = now.saturating_add(retry.max(pace));
            if until > now {
                self.hold = Some(Hold { until, need });
            }
        }
        self.expire(now, m);
        let cost = initiator?;
        if self.held() >= cost {
            self.take(cost);
            add(&m.redis_admits, 1);
            add(&m.units_served, cost);
            let delay_ns = d.delay.map(|x| x.as_nanos().min(u64::MAX as u128) as u64);
            Some(Verdict::Admit { from_claim: true, refill: None, delay_ns })
        } else if granted == 0 {
            add(&m.redis_denials, 1);
            // The hold's end: the server-named instant, or later while paced.
            let retry_after_ns = d.retry_after.map(|r| {
                self.hold.filter(|h| h.until > now).map_or(r.as_nanos().min(u64::MAX as u128) as u64, |h| h.until - now)
            });
            let by = if retry_after_ns.is_none() { LimitedBy::Never } else { LimitedBy::Redis };
            Some(Verdict::Limited { retry_after_ns, by, refill: None })
        } else {
            Some(Verdict::Retry)
        }
    }

    /// Claim `claim` failed (error, timeout, or dropped). Returns [`Verdict::Failed`] for the
    /// request that made it (`None` for a background claim). Requests waiting on it get
    /// [`Verdict::Failed`] from [`KeyState::resume`] (unless held units now cover them).
    pub fn on_claim_error(&mut self, claim: &ClaimRequest) -> Option<Verdict> {
        match self.in_flight {
            Some(f) if f.claim.id == claim.id => {
                self.in_flight = None;
                self.failed = Some(claim.id);
                (!f.claim.background).then_some(Verdict::Failed)
            }
            _ => None,
        }
    }

    /// Housekeeping at `now`: drops expired leases; when the key has been idle for
    /// `idle_return_ns`, gives its held units back (one return per lease, each with a call
    /// credit; algorithms without RL.RETURN keep them until they expire). `may_call`: false
    /// while Redis is unavailable (units are then kept until they expire).
    pub fn tick(&mut self, now: u64, cfg: &LeaseConfig, may_call: bool, m: &Metrics) -> Vec<ReturnRequest> {
        self.expire(now, m);
        let idle = now.saturating_sub(self.last_request) >= cfg.idle_return_ns;
        if !idle || !may_call || !cfg.limit.algorithm.supports_return() || self.leases.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        while self.call_credit > 0 && !self.leases.is_empty() {
            let l = self.leases.remove(0);
            if let Some(r) = self.give_back(now, l, cfg, m) {
                self.call_credit -= 1;
                out.push(r);
            }
        }
        out
    }

    /// Gives a lease back: all its units, with `AGE` = the time since the claim's send plus the
    /// return margin. The server ages a bucket return itself (it credits `units − rate × AGE`:
    /// the refill a full bucket lost while the units were out is not handed out again, which
    /// keeps the bound, docs/local-reservations.md rule 4); when that leaves nothing, no call is
    /// made and the units are dropped (counted as expired). `None` then.
    fn give_back(&mut self, now: u64, l: Lease, cfg: &LeaseConfig, m: &Metrics) -> Option<ReturnRequest> {
        if cfg.limit.algorithm.is_bucket() {
            let age = now.saturating_sub(l.claim_sent_at).saturating_add(cfg.return_margin_ns);
            let refilled = (age as u128 * cfg.limit.limit as u128).div_ceil(cfg.limit.period.as_nanos().max(1));
            if refilled >= l.units as u128 {
                self.totals.expired += l.units;
                add(&m.units_expired, l.units);
                return None;
            }
        }
        self.totals.returned += l.units;
        self.totals.calls += 1;
        add(&m.units_returned, l.units);
        add(&m.returns, 1);
        add(&m.redis_calls, 1);
        Some(ReturnRequest { units: l.units, claim_sent_at: l.claim_sent_at })
    }

    /// Shutdown: every unexpired unit is given back (one return per lease, whatever the call
    /// credit); for an algorithm without RL.RETURN they are dropped (counted as expired).
    pub fn drain(&mut self, now: u64, cfg: &LeaseConfig, m: &Metrics) -> Vec<ReturnRequest> {
        self.expire(now, m);
        let leases = std::mem::take(&mut self.leases);
        if !cfg.limit.algorithm.supports_return() {
            let n: u64 = leases.iter().map(|l| l.units).sum();
            self.totals.expired += n;
            add(&m.units_expired, n);
            return Vec::new();
        }
        leases.into_iter().filter_map(|l| self.give_back(now, l, cfg, m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: u64 = 1_000_000_000;

    fn reply(allowed: u64, limit: u64, remaining: u64, retry_ms: i64, reset_ms: i64) -> Decision {
        Decision::from_fields(allowed as i64, limit as i64, remaining as i64, retry_ms, reset_ms, None)
    }

    fn cfg() -> LeaseConfig {
        LeaseConfig::new(Limit::token_bucket(10_000, Duration::from_secs(1)))
    }

    #[test]
    fn cold_key_claims_exactly_the_request() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::new();
        let Verdict::Claim(cl) = k.on_request(0, 1, &c, &m) else { panic!() };
        assert_eq!((cl.units, cl.partial), (1, false));
        assert_eq!(k.on_request(1, 1, &c, &m), Verdict::Wait { claim: cl.id });
        let v = k.on_claim_reply(10, &cl, &reply(1, 10_000, 9_999, -1, 1), &c, &m);
        assert!(matches!(v, Some(Verdict::Admit { from_claim: true, .. })));
        assert_eq!(k.held(), 0);
    }

    #[test]
    fn hot_key_batches_serves_locally_and_refills_in_background() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::new();
        let mut t = 0;
        let mut calls = 0;
        for _ in 0..5000 {
            t += S / 5000; // 5000/s
            match k.on_request(t, 1, &c, &m) {
                Verdict::Claim(cl) | Verdict::Admit { refill: Some(cl), .. } => {
                    calls += 1;
                    let _ = k.on_claim_reply(t, &cl, &reply(cl.units, 10_000, 5_000, -1, 100), &c, &m);
                }
                Verdict::Admit { .. } => {}
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
        let mut k = KeyState::new();
        let Verdict::Claim(cl) = k.on_request(0, 1, &c, &m) else { panic!() };
        let v = k.on_claim_reply(0, &cl, &reply(0, 10, 0, 250, 1000), &c, &m);
        assert_eq!(v, Some(Verdict::Limited { retry_after_ns: Some(250_000_000), by: LimitedBy::Redis, refill: None }));
        assert_eq!(
            k.on_request(S / 10, 1, &c, &m),
            Verdict::Limited { retry_after_ns: Some(150_000_000), by: LimitedBy::Cache, refill: None }
        );
        assert!(matches!(k.on_request(S / 4, 1, &c, &m), Verdict::Claim(_)));
        assert_eq!(
            k.on_request(S / 4, 11, &c, &m),
            Verdict::Limited { retry_after_ns: None, by: LimitedBy::Never, refill: None }
        );
    }

    #[test]
    fn a_dry_key_is_paced_and_asks_for_the_demand_of_the_interval() {
        let m = Metrics::default();
        let c = LeaseConfig { instances: 40, ..cfg() };
        let mut k = KeyState::new();
        let mut t = 0;
        // 5000/s for a second: a hot key.
        for _ in 0..5000 {
            t += S / 5000;
            match k.on_request(t, 1, &c, &m) {
                Verdict::Claim(cl) | Verdict::Admit { refill: Some(cl), .. } => {
                    let _ = k.on_claim_reply(t, &cl, &reply(cl.units, 10_000, 5_000, -1, 100), &c, &m);
                }
                _ => {}
            }
        }
        // The server runs dry: a batch comes back short.
        k.take(k.held());
        let Verdict::Claim(cl) = k.on_request(t, 1, &c, &m) else { panic!() };
        assert!(cl.partial && cl.units > 100, "{cl:?}");
        let _ = k.on_claim_reply(t, &cl, &reply(10, 10_000, 0, -1, 100), &c, &m);
        k.take(k.held());
        // Held for about the horizon (jittered ±50%), refused locally meanwhile.
        let Verdict::Limited { retry_after_ns: Some(r), by: LimitedBy::Cache, .. } = k.on_request(t + 1, 1, &c, &m)
        else {
            panic!()
        };
        assert!((c.horizon_ns / 2..c.horizon_ns * 3 / 2).contains(&(r + 1)), "{r}");
    }

    #[test]
    fn window_leases_end_before_the_window() {
        let c = LeaseConfig::new(Limit::fixed(100, Duration::from_secs(60)));
        assert_eq!(c.lease_span(&reply(5, 100, 95, -1, 300)), 299 * 1_000_000);
        assert_eq!(c.lease_span(&reply(5, 100, 95, -1, 30_000)), S);
        let s = LeaseConfig::new(Limit::sliding(100, Duration::from_secs(60)));
        assert_eq!(s.lease_span(&reply(5, 100, 95, -1, 60_400)), 399 * 1_000_000);
    }

    #[test]
    fn failed_claim_fails_its_waiters_and_idle_units_go_back() {
        let (c, m) = (cfg(), Metrics::default());
        let mut k = KeyState::new();
        let Verdict::Claim(cl) = k.on_request(0, 1, &c, &m) else { panic!() };
        let Verdict::Wait { claim } = k.on_request(1, 1, &c, &m) else { panic!() };
        assert_eq!(k.on_claim_error(&cl), Some(Verdict::Failed));
        assert_eq!(k.resume(2, 1, Some(claim), &c, &m), Verdict::Failed);
        // A batch, then silence: the rest goes back after idle_return.
        let Verdict::Claim(cl) = k.on_request(3, 1, &c, &m) else { panic!() };
        let big = ClaimRequest { units: 50, partial: true, ..cl };
        let _ = k.on_claim_reply(4, &big, &reply(50, 10_000, 9_000, -1, 5), &c, &m);
        assert_eq!(k.held(), 49);
        assert!(k.tick(5, &c, true, &m).is_empty());
        // A 10,000/s bucket refills 49 units in 4.9 ms: nothing is worth returning.
        let r = k.tick(5 + c.idle_return_ns, &c, true, &m);
        assert!(r.is_empty());
        assert_eq!((k.held(), k.totals().expired), (0, 49));
        // A slow bucket (1 per s): the rest goes back (the server deducts the refill).
        let slow = LeaseConfig {
            return_margin_ns: 0,
            lease_ns: 10 * S,
            ..LeaseConfig::new(Limit::token_bucket(1, Duration::from_secs(1)).with_burst(100))
        };
        let mut k = KeyState::new();
        let Verdict::Claim(cl) = k.on_request(0, 1, &slow, &m) else { panic!() };
        let big = ClaimRequest { units: 50, partial: true, ..cl };
        let _ = k.on_claim_reply(4, &big, &reply(50, 100, 50, -1, 5), &slow, &m);
        assert!(matches!(k.on_request(5, 1, &slow, &m), Verdict::Admit { .. }));
        let r = k.tick(2 * S, &slow, true, &m);
        assert_eq!(r, vec![ReturnRequest { units: 48, claim_sent_at: 0 }]);
    }
}
