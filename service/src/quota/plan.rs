//! The pure core of the quota service: how many units a lease claims, when the next lease is
//! due, what a report settles, and the local failure share, as functions of (a ledger, the
//! parameters, a report, now) in [`Nanos`] of the server's monotonic clock (from the quota
//! service's start). No IO, no clock reads: the stream handler ([`super::stream`]) reads the
//! clock and does the IO.
//!
//! A lease (docs/quota-service.md, "Assignments are leases"): `g` units claimed from the
//! module (`COST b PARTIAL`, granted `g ≤ b`), then pushed to one Envoy as
//! `[DENY_ALL, token_bucket {max_tokens: g, 1 token a day}]` with a TTL of the lease's life.
//! Envoy then holds exactly `g` tokens until the next lease replaces them or the TTL ends, so
//! every unit it admits was granted before the push and is admitted within the life (plus the
//! push's delivery): the lease bound `c + r·(W + L + d)`.

use std::collections::VecDeque;

use redis_ratelimit_client::Nanos;

/// One second.
pub const SECOND: Nanos = Nanos::from_secs(1);
/// The refill of a lease's token bucket: one token per day, so that a lease (at most
/// [`MAX_LEASE`]) never refills a whole token: Envoy admits the lease's units and no more.
pub const LEASE_FILL_INTERVAL_S: i64 = 86_400;
/// The longest lease (a slow limit's), in nanoseconds.
pub const MAX_LEASE: Nanos = Nanos::from_secs(60);
/// The shortest time between two leases of one bucket (a small burst at a high rate).
pub const MIN_REFRESH: Nanos = Nanos::from_millis(50);
/// Leases remembered per ledger for settling (pushed since the last report): three times a
/// 5 s report period at the default refresh (500 ms), 1 KiB per bucket at most; past it the
/// oldest are forgotten (their units stay counted: conservative).
pub const MAX_UNSETTLED: usize = 32;
/// The shortest window whose leases are settled at every report ([`Window`]): a report comes
/// every 5 s and its units are at least `margin` old, so units of a shorter window are past
/// their window when a report could return them (RL.RETURN credits a window only for units
/// claimed in it).
pub const MIN_SETTLED_WINDOW: Nanos = Nanos::from_secs(10);
/// Claims granted in full after which a binding limit's cap on a lease (the even split,
/// doubled at each) is lifted ([`Ledger::bound`]): by then it is far above any lease.
const MAX_DOUBLINGS: u32 = 16;
/// The shortest window of a bucket's holder counter ([`holder_window`]).
pub const HOLDER_WINDOW: Nanos = Nanos::from_secs(2);
/// Two leases whose windows end this close together (server clock) are in the same window
/// (each end is the push time plus the claim's `reset_after`); more apart, a new window.
const SAME_WINDOW: Nanos = SECOND;

/// Lease parameters (the QUOTA_* settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// `L`: the life of a lease on a limit of at least one unit per `L` (whole seconds, ≥ 1 s):
    /// its `assignment_time_to_live`.
    pub lease: Nanos,
    /// How often a lease of life `L` is replaced by a new one (< `lease`).
    pub refresh: Nanos,
    /// Time allowed for a push to reach Envoy and for a report to be built and arrive: a
    /// lease is only given back once it ended this long before a report.
    pub margin: Nanos,
    /// A Redis call's deadline (`REDIS_TIMEOUT`): a give-back's `AGE` adds it for the return's
    /// own transit (`commands::return_age`).
    pub timeout: Nanos,
}

impl Params {
    /// Checks the parameters: `lease` whole seconds from 1 s to [`MAX_LEASE`], `refresh` at
    /// least 1 ms and below `lease`.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease < SECOND || self.lease > MAX_LEASE || !self.lease.as_u64().is_multiple_of(SECOND.as_u64()) {
            return Err(format!(
                "QUOTA_LEASE must be whole seconds from 1s to 60s (Envoy 1.40 counts whole seconds): {:?}",
                self.lease
            ));
        }
        if self.refresh < Nanos::from_millis(1) || self.refresh >= self.lease {
            return Err(format!(
                "QUOTA_REFRESH must be at least 1ms and shorter than QUOTA_LEASE ({:?}): {:?}",
                self.lease, self.refresh
            ));
        }
        Ok(())
    }
}

/// A limit as leases see it: `units` per `period`, at most `capacity` at once (a bucket's
/// burst, a window's limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub units: u64,
    pub period: Nanos,
    pub capacity: u64,
}

fn div_ceil_u128(a: u128, b: u128) -> u128 {
    if b == 0 {
        return u128::MAX;
    }
    a.div_ceil(b)
}

fn to_u64(x: u128) -> u64 {
    x.min(u64::MAX as u128) as u64
}

/// A span's nanoseconds, widened for exact products.
fn ns(t: Nanos) -> u128 {
    t.as_u64() as u128
}

/// A lease's life: `L`, or for a limit slower than one unit per `L` the time one unit takes to
/// refill, rounded up to whole seconds, at most [`MAX_LEASE`]. So a lease holds at most one
/// unit more than `r × L` (a slow limit is not claimed faster than it refills), and the bound
/// per bucket is `c + r·(W + life + d)`.
pub fn lease_life(p: &Params, rate: &Rate) -> Nanos {
    let one_unit = div_ceil_u128(ns(rate.period), rate.units.max(1) as u128);
    let whole = to_u64(div_ceil_u128(one_unit, ns(SECOND))) * SECOND;
    whole.clamp(p.lease, MAX_LEASE.max(p.lease))
}

/// How long after its push a lease is replaced: `refresh` before a long (slow limit's) lease
/// ends; for a lease of life `L`, `refresh`, or sooner when the limit refills its capacity
/// sooner (`capacity ÷ rate`, at least [`MIN_REFRESH`]): a lease can never hold more than the
/// capacity (Redis grants at most its balance), so a bucket whose burst is below
/// `rate × refresh` would otherwise be held to `capacity ÷ refresh`.
pub fn replace_after(p: &Params, rate: &Rate) -> Nanos {
    let life = lease_life(p, rate);
    if life > p.lease {
        return life - p.refresh;
    }
    let fill = to_u64(div_ceil_u128(rate.capacity as u128 * ns(rate.period), rate.units.max(1) as u128));
    p.refresh.min(Nanos::new(fill.min(i64::MAX as u64) as i64).max(MIN_REFRESH))
}

/// One lease pushed to an Envoy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// When the claim was sent (its units are at most this old).
    pub claimed: Nanos,
    /// When the push was sent.
    pub pushed: Nanos,
    pub units: u64,
    /// Its TTL (the life).
    pub life: Nanos,
}

/// What a report settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Settled {
    /// No request since the previous report: abandon the bucket.
    pub idle: bool,
    /// Units never served, to give back (`RL.RETURN key n AGE age`), and their age bound.
    pub give_back: u64,
    pub age: Nanos,
    /// Units of the current window's ended leases beyond what Envoy reported admitted since
    /// that window's first lease ([`Window`]), given back in a call of their own (their age
    /// stays within the window), and their age bound.
    pub window_give_back: u64,
    pub window_age: Nanos,
}

/// The leases of one window of a window limit (fixed, sliding) of at least
/// [`MIN_SETTLED_WINDOW`], settled at every report. Every unit Envoy used from a lease that has
/// ended (replaced, or past its TTL, `margin` before a report) was admitted before that report
/// was built, so it is counted in the `allowed` of the reports received since the window's
/// first push; the units of the ended leases beyond that count were never used:
/// `ended − admitted − returned` can be given back (a lower bound: admissions from other leases
/// are counted too). All were claimed in this window, so RL.RETURN credits them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// The window's end (server clock, from the first claim's `reset_after`).
    pub end: Nanos,
    /// When the window's first settled claim was sent (every unit settled is at most this old).
    pub first_claim: Option<Nanos>,
    /// Leases not yet known to have ended, oldest first.
    pub open: VecDeque<Lease>,
    /// Units of the leases that ended.
    pub ended: u64,
    /// An upper bound of the units Envoy admitted from these leases: the requests reported
    /// admitted since the window's first push, at most the units the leases held.
    pub admitted: u64,
    /// Units given back from this window (by this rule or the idle one).
    pub returned: u64,
}

/// One Envoy's leases of one bucket: the demand its reports show, the leases not yet settled.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Requests (allowed + denied) in the last report period and the period's length (server
    /// clock); `None` before the first periodic report.
    pub demand: Option<(u64, Nanos)>,
    /// The last report had denied requests: the leases were too small.
    pub starved: bool,
    /// A lease since the last report was granted less than it asked, or none could be claimed:
    /// the limit (or Redis) refused, not the lease's size, so refusals do not double the next.
    pub short: bool,
    /// Arrival of the last report.
    pub last_report: Option<Nanos>,
    /// The lease Envoy holds now.
    pub current: Option<Lease>,
    /// Leases pushed since the last report (current included), oldest first.
    pub unsettled: VecDeque<Lease>,
    /// When the next lease is due.
    pub next: Nanos,
    /// What the limit still had after this bucket's last claim (the answer's `remaining`):
    /// room nobody was using, of which the next lease may take a share ([`Ledger::want`]).
    /// 0 before a claim and after a failed one.
    pub room: u64,
    /// The limit binds: a claim was granted less than it asked, and the next lease asks at
    /// most the even split times 2 to this power ([`Ledger::want`]): 0 after a short grant,
    /// one more after each claim granted in full, `None` once past [`MAX_DOUBLINGS`] (or
    /// before any short grant).
    pub bound: Option<u32>,
    /// The current window's leases (a window limit of at least [`MIN_SETTLED_WINDOW`]).
    pub window: Option<Window>,
    /// The end of the holder-time this ledger has charged to the bucket's holder counter
    /// ([`Ledger::hold`]).
    pub held_until: Option<Nanos>,
    /// The bucket's holders in the whole fleet as last counted ([`fleet_holders`]), and when.
    pub holders: Option<(u64, Nanos)>,
    /// Totals, for the metrics and the tests.
    pub granted: u64,
    pub given_back: u64,
    pub admitted: u64,
    pub denied: u64,
}

impl Ledger {
    /// Units to claim for the next lease: the demand over the time until the lease after it
    /// and a quarter more (at least one), doubled after a report with refusals; before any periodic
    /// report, an even split of the limit's rate over that time among `sharers` Envoys (plus
    /// one). While the limit has room (its answer to the last claim left at least twice the
    /// even split per sharer), at least that even split: a load that surges above the last
    /// report's demand is not refused at the edge while the limit is far from binding, and
    /// once claims take the room the share shrinks back to the demand. While the limit binds
    /// (a claim got less than it asked), at most the even split among the bucket's holders
    /// (`sharers`: in the whole fleet, [`Ledger::sharers`]), doubled after each claim granted
    /// in full: Envoys sharing a binding limit claim alike, where the largest demand would
    /// otherwise take every refill from the Envoys whose claims come after it, and a holder
    /// whose capped claim was granted in full takes the room others leave step by step, not
    /// its whole demand at once (which, on a limit that binds, took the refill from the next
    /// claims). At most the capacity and `u32::MAX` (a token bucket's `max_tokens`).
    pub fn want(&self, p: &Params, rate: &Rate, sharers: u64) -> u64 {
        let span = ns(replace_after(p, rate));
        let sharers = sharers.max(1) as u128;
        let even = div_ceil_u128(rate.units as u128 * span, ns(rate.period).max(1) * sharers);
        let room = (self.room as u128 / (2 * sharers)).min(even);
        let shares = match self.demand {
            Some((n, per)) if per > Nanos::ZERO => {
                // Every unit above the demand is lost at the next lease until a report settles
                // it (a window's limit ran out early): a quarter more than the demand, no more.
                let d = div_ceil_u128(5 * n as u128 * span, 4 * ns(per));
                d.max(room.saturating_add(1))
            }
            Some(_) => room.saturating_add(1),
            None => even.saturating_add(1),
        };
        let mut b = to_u64(shares).max(1);
        if self.starved {
            b = b.saturating_mul(2);
        }
        if let Some(k) = self.bound {
            b = b.min(to_u64(even).saturating_add(1).saturating_mul(1 << k));
        }
        b.min(rate.capacity.max(1)).min(u32::MAX as u64)
    }

    /// Records a lease pushed at `pushed` (its claim sent at `claimed`), and schedules the next
    /// one: after [`replace_after`], or at `window_end` (a window's end, from the claim's
    /// `reset_after`) when sooner, so that a window's units are dropped when it ends.
    pub fn pushed(
        &mut self,
        p: &Params,
        rate: &Rate,
        claimed: Nanos,
        pushed: Nanos,
        units: u64,
        window_end: Option<Nanos>,
    ) {
        let life = lease_life(p, rate);
        let lease = Lease { claimed, pushed, units, life };
        self.current = Some(lease);
        if self.unsettled.len() >= MAX_UNSETTLED {
            self.unsettled.pop_front();
        }
        self.unsettled.push_back(lease);
        self.granted = self.granted.saturating_add(units);
        if let Some(end) = window_end.filter(|_| rate.period >= MIN_SETTLED_WINDOW) {
            if self.window.as_ref().is_none_or(|w| (w.end - end).max(end - w.end) >= SAME_WINDOW) {
                self.window = Some(Window { end, ..Window::default() });
            }
            let w = self.window.as_mut().expect("set above");
            // RL.RETURN credits a window only units whose claim, dated `AGE` ago, falls in it;
            // the AGE of a give-back is its oldest claim's age plus the return's own transit
            // (the timeout). So a claim sent less than the timeout after the window surely
            // began (`end − period` is at or after its start) would date every unit settled
            // with it to the window before, where RL.RETURN credits nothing: the first lease of
            // a window, claimed at its edge, made all its returns credit 0. Such a claim is not
            // settled here (its units stay counted); every later one's AGE stays in the window.
            if claimed >= end - rate.period + p.timeout {
                if w.open.len() >= MAX_UNSETTLED {
                    // Never settled: its units stay counted (conservative).
                    w.open.pop_front();
                }
                w.first_claim.get_or_insert(claimed);
                w.open.push_back(lease);
            }
        }
        let mut next = pushed + replace_after(p, rate);
        if let Some(end) = window_end {
            next = next.min(end.max(pushed + Nanos::from_millis(1)));
        }
        self.next = next;
    }

    /// What the limit answered the claim of the lease just [`Ledger::pushed`] (`want` units):
    /// `granted` of them, `remaining` left. Granted less than half: another holder's claims
    /// take the refill just before this one's (leases of one span fall into step, and the
    /// same holder would come second every time, on any replica), so the next lease is due
    /// after half a span, out of step.
    pub fn answered(&mut self, p: &Params, rate: &Rate, want: u64, granted: u64, remaining: u64) {
        self.short |= granted < want;
        self.bound = if granted < want { Some(0) } else { self.bound.map(|k| k + 1).filter(|k| *k <= MAX_DOUBLINGS) };
        self.room = remaining;
        if granted < want / 2 {
            if let Some(l) = self.current {
                self.next = self.next.min(l.pushed + replace_after(p, rate) / 2);
            }
        }
    }

    /// The holder-time to charge to the bucket's holder counter with a claim sent at `now`:
    /// from the end of what this ledger charged before to the end of this lease's span. So
    /// the charges sum to the time the ledger held the bucket plus at most one span ahead: a
    /// lease replaced early (a window's end, a short grant) charges only what it adds, a claim
    /// sent late (its stream's task delayed) also the delay; after a gap longer than a span
    /// (failed claims) the charge starts again at `now`.
    pub fn hold(&mut self, p: &Params, rate: &Rate, now: Nanos) -> Nanos {
        let span = replace_after(p, rate);
        let until = now + span;
        let from = match self.held_until {
            Some(t) if now - t <= span => t.min(until),
            _ => now,
        };
        self.held_until = Some(until);
        until - from
    }

    /// The holder counter answered at `now`: `held` ms of holder-time in its window.
    pub fn counted(&mut self, p: &Params, rate: &Rate, held: u64, now: Nanos) {
        self.holders = Some((fleet_holders(held, holder_window(p, rate), replace_after(p, rate)), now));
    }

    /// The Envoys sharing the bucket, for [`Ledger::want`]: the fleet's holders when counted
    /// within the last holder window (at least the `local` ones, this replica's streams), else
    /// the local ones (never counted, or the counter has failed since).
    pub fn sharers(&self, p: &Params, rate: &Rate, local: u64, now: Nanos) -> u64 {
        let fleet = match self.holders {
            Some((n, at)) if now - at <= holder_window(p, rate) => n,
            _ => 0,
        };
        fleet.max(local).max(1)
    }

    /// A push that holds no units (a failure mode's action, a refusal): the next lease is due
    /// after `refresh`.
    pub fn pushed_nothing(&mut self, p: &Params, now: Nanos) {
        self.current = None;
        self.short = true;
        self.room = 0;
        self.bound = None;
        self.next = now + p.refresh;
    }

    /// A usage report arrived at `now` with `allowed` and `denied` requests since the
    /// previous one. Learns the demand; when nothing was requested (idle), the leases pushed
    /// since the previous report that ended at least `margin` before this one were never used
    /// (no request in the whole period) and are given back, aged from the oldest one's claim.
    /// A lease that may still be in use, or whose period had requests, is never given back.
    pub fn report(&mut self, p: &Params, now: Nanos, allowed: u64, denied: u64) -> Settled {
        let requests = allowed.saturating_add(denied);
        self.admitted = self.admitted.saturating_add(allowed);
        self.denied = self.denied.saturating_add(denied);
        // Refusals in a period under leases: they were too small. A bucket's first report
        // (no period yet) counts requests refused before any lease (`no_assignment_behavior`),
        // which say nothing of a lease's size: doubling on them made the first leases claim
        // twice the even split (a whole window's limit in one lease, the next one of the
        // window granted nothing).
        // Nor do refusals while the limit itself granted less than asked: a bigger claim gets
        // no more, and once the limit refills (a new window) it would take twice the demand.
        self.starved = denied > 0 && self.last_report.is_some() && !self.short;
        self.short = false;
        let mut out = Settled::default();
        if let Some(prev) = self.last_report {
            self.demand = Some((requests, now - prev));
            out.idle = requests == 0;
        }
        if out.idle {
            let cutoff = now - p.margin;
            let leases: Vec<Lease> = self.unsettled.iter().copied().collect();
            let mut oldest: Option<Nanos> = None;
            let mut kept = VecDeque::new();
            for (i, l) in leases.iter().enumerate() {
                // Ended: replaced by a later push, or its TTL over, `margin` before the report.
                let replaced = leases.get(i + 1).is_some_and(|n| n.pushed <= cutoff);
                let expired = l.pushed + l.life <= cutoff;
                if replaced || expired {
                    out.give_back = out.give_back.saturating_add(l.units);
                    oldest = Some(oldest.map_or(l.claimed, |o| o.min(l.claimed)));
                } else {
                    kept.push_back(*l);
                }
            }
            out.age = oldest.map_or(Nanos::ZERO, |o| now - o);
            self.given_back = self.given_back.saturating_add(out.give_back);
            self.unsettled = kept;
        }
        if let Some(w) = self.window.as_mut() {
            // What the idle rule gave back may be this window's: counted as returned here too.
            w.returned = w.returned.saturating_add(out.give_back);
            // At most what the window's leases held: the report that spans the window's edge
            // also counts requests the window before admitted from its own leases (taken
            // whole, they held back a report's worth of units, often every return of the
            // window).
            let held = w.open.iter().fold(w.ended, |n, l| n.saturating_add(l.units));
            w.admitted = w.admitted.saturating_add(allowed).min(held);
            let cutoff = now - p.margin;
            while let Some(l) = w.open.front() {
                let replaced = w.open.get(1).is_some_and(|n| n.pushed <= cutoff);
                if !(replaced || l.pushed + l.life <= cutoff) {
                    break;
                }
                w.ended = w.ended.saturating_add(l.units);
                w.open.pop_front();
            }
            let unused = w.ended.saturating_sub(w.admitted).saturating_sub(w.returned);
            if unused > 0 {
                w.returned = w.returned.saturating_add(unused);
                out.window_give_back = unused;
                out.window_age = now - w.first_claim.unwrap_or(Nanos::ZERO);
                self.given_back = self.given_back.saturating_add(unused);
            }
        }
        // Only leases pushed after this report can be settled by the next one.
        self.unsettled.retain(|l| l.pushed > now);
        self.last_report = Some(now);
        out
    }
}

/// The window of a bucket's holder counter: at least [`HOLDER_WINDOW`] and four spans (so
/// that every window holds several charges of each holder), in whole milliseconds.
pub fn holder_window(p: &Params, rate: &Rate) -> Nanos {
    Nanos::from_millis(HOLDER_WINDOW.max(replace_after(p, rate) * 4).as_millis_ceil())
}

/// A bucket's holders in the whole fleet from its holder counter: `held` ms of holder-time
/// counted in the last `window` (sliding). Each holder charges the time it holds the bucket
/// plus up to one `span` ahead ([`Ledger::hold`]), so a window holds `window` to `window +
/// span` of each: the count is `held ÷ (window + span/2)`, rounded to the nearest (exact for
/// up to `window ÷ span` holders, within one beyond, once each has held for two windows), at
/// least 1.
pub fn fleet_holders(held: u64, window: Nanos, span: Nanos) -> u64 {
    let per_holder = (ns(window) + ns(span) / 2).max(1);
    let held = held as u128 * ns(Nanos::from_millis(1));
    to_u64((2 * held + per_holder) / (2 * per_holder)).max(1)
}

/// The Envoys the `local` failure share divides among: the bucket's holders in the fleet as
/// last counted (`holders`, at least the `local` ones: this replica's streams), or with no
/// count the local ones times the replicas (`instances`: each assumed to hold as many).
pub fn failure_sharers(holders: Option<u64>, local: u64, instances: u64) -> u64 {
    match holders {
        Some(n) => n.max(local),
        None => local.saturating_mul(instances),
    }
    .max(1)
}

/// A token bucket as Envoy takes it: `max_tokens`, `tokens_per_fill` per `fill_interval_s`
/// whole seconds (Envoy 1.40 truncates the interval to whole seconds: under 1 s it never
/// refuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketShare {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval_s: i64,
}

/// The `local` failure mode's share for one Envoy: the limit's rate and capacity ÷ `sharers`,
/// the rate rounded down to what `tokens_per_fill / whole seconds` can say (never above the
/// share), the capacity at least 1.
pub fn local_share(rate: &Rate, sharers: u64) -> TokenBucketShare {
    let n = sharers.max(1) as u128;
    let max_tokens = (rate.capacity as u128 / n).clamp(1, u32::MAX as u128) as u32;
    // Units per second of the share: units × 1 s / (period × sharers).
    let den = ns(rate.period).max(1) * n;
    let per_second = rate.units as u128 * ns(SECOND) / den;
    if per_second >= 1 {
        TokenBucketShare { max_tokens, tokens_per_fill: per_second.min(u32::MAX as u128) as u32, fill_interval_s: 1 }
    } else {
        // One token per whole number of seconds, rounded up (slower, never faster).
        let secs = div_ceil_u128(den, rate.units.max(1) as u128 * ns(SECOND));
        TokenBucketShare { max_tokens, tokens_per_fill: 1, fill_interval_s: secs.clamp(1, i64::MAX as u128) as i64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = Nanos::from_millis(1);
    const ZERO: Nanos = Nanos::ZERO;

    /// `n` nanoseconds.
    fn ns(n: u64) -> Nanos {
        Nanos::new(n as i64)
    }

    fn params() -> Params {
        Params { lease: SECOND, refresh: 500 * MS, margin: SECOND, timeout: 100 * MS }
    }

    fn per_second(units: u64, capacity: u64) -> Rate {
        Rate { units, period: SECOND, capacity }
    }

    #[test]
    fn parameters_are_checked() {
        assert!(params().validate().is_ok());
        for (lease, refresh) in
            [(1500 * MS, 500 * MS), (ZERO, ns(1)), (61 * SECOND, MS), (SECOND, SECOND), (SECOND, ZERO)]
        {
            assert!(
                Params { lease, refresh, margin: SECOND, timeout: 100 * MS }.validate().is_err(),
                "{lease:?} {refresh:?}"
            );
        }
    }

    #[test]
    fn a_lease_lives_l_or_one_units_refill() {
        let p = params();
        assert_eq!(lease_life(&p, &per_second(1000, 100)), SECOND);
        assert_eq!(lease_life(&p, &per_second(1, 1)), SECOND);
        // 10 per minute: one unit per 6 s.
        assert_eq!(lease_life(&p, &Rate { units: 10, period: 60 * SECOND, capacity: 10 }), 6 * SECOND);
        // 2 per 3 s: 1.5 s, rounded up to 2 s.
        assert_eq!(lease_life(&p, &Rate { units: 2, period: 3 * SECOND, capacity: 2 }), 2 * SECOND);
        // A day: capped.
        assert_eq!(lease_life(&p, &Rate { units: 1, period: 86_400 * SECOND, capacity: 1 }), MAX_LEASE);
        assert_eq!(replace_after(&p, &per_second(1000, 1000)), 500 * MS);
        assert_eq!(replace_after(&p, &Rate { units: 10, period: 60 * SECOND, capacity: 10 }), 5500 * MS);
        // A burst refilled in 250 ms: replaced every 250 ms; in 1 ms: every 50 ms.
        assert_eq!(replace_after(&p, &per_second(200, 50)), 250 * MS);
        assert_eq!(replace_after(&p, &per_second(10_000, 10)), MIN_REFRESH);
    }

    #[test]
    fn a_new_bucket_gets_an_even_split_of_the_rate() {
        let p = params();
        let l = Ledger::default();
        // 1000/s over 500 ms among 4 Envoys: 125, plus one.
        assert_eq!(l.want(&p, &per_second(1000, 1000), 4), 126);
        // Never above the capacity, never zero.
        assert_eq!(l.want(&p, &per_second(1000, 50), 1), 50);
        assert_eq!(l.want(&p, &Rate { units: 10, period: 60 * SECOND, capacity: 10 }, 3), 2);
    }

    #[test]
    fn a_limit_with_room_leases_its_even_split_whatever_the_last_demand() {
        let p = params();
        let rate = per_second(10_000, 10_000);
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        // 10 requests in 5 s: a lease of 1, a quarter more (rounded up), while the limit's
        // room is unknown.
        l.report(&p, 5 * SECOND, 10, 0);
        assert_eq!(l.want(&p, &rate, 2), 2);
        // The last claim left 10,000 units: at least the even split of 500 ms between two
        // Envoys (2,500, half the room per sharer), plus one.
        l.room = 10_000;
        assert_eq!(l.want(&p, &rate, 2), 2_501);
        l.room = 1_000_000;
        assert_eq!(l.want(&p, &rate, 2), 2_501);
        // Little room left: half of it per sharer, never more.
        l.room = 1_000;
        assert_eq!(l.want(&p, &rate, 2), 251);
        // None: the demand again; a demand above the room keeps its own size.
        l.room = 0;
        assert_eq!(l.want(&p, &rate, 2), 2);
        l.report(&p, 10 * SECOND, 40_000, 0);
        l.room = 9_000;
        assert_eq!(l.want(&p, &rate, 2), 5_000);
        // A failed claim leaves no room.
        l.pushed_nothing(&p, 10 * SECOND);
        assert_eq!(l.room, 0);
    }

    #[test]
    fn a_binding_limit_is_claimed_in_even_splits() {
        let p = params();
        let rate = per_second(300, 100);
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        // Flat out: 20,000 requests in 5 s; a lease asks the whole burst.
        l.report(&p, 5 * SECOND, 20_000, 0);
        assert_eq!(l.want(&p, &rate, 2), 100);
        // The limit granted 40 of 100: the next lease asks at most the even split of the
        // rate between two Envoys over a lease's 333.3 ms (51, rounded up), plus one.
        l.pushed(&p, &rate, 6 * SECOND, 6 * SECOND, 40, None);
        l.answered(&p, &rate, 100, 40, 0);
        assert!(l.short);
        assert_eq!(l.bound, Some(0));
        assert_eq!(l.want(&p, &rate, 2), 52);
        // Less than half of what it asked: the next lease after half a span (333 ms), out of
        // step with the claims that come just before it.
        assert_eq!(l.next, 6 * SECOND + replace_after(&p, &rate) / 2);
        // Granted in full: twice the even split (104), at most the demand (the burst, 100), a
        // lease a span later.
        l.pushed(&p, &rate, 7 * SECOND, 7 * SECOND, 52, None);
        l.answered(&p, &rate, 52, 52, 0);
        assert_eq!(l.bound, Some(1));
        assert_eq!(l.want(&p, &rate, 2), 100);
        assert_eq!(l.want(&p, &rate, 3), 70);
        assert_eq!(l.next, 7 * SECOND + replace_after(&p, &rate));
        // Granted in full again and again: the cap is lifted.
        for _ in 0..MAX_DOUBLINGS {
            l.answered(&p, &rate, 1, 1, 0);
        }
        assert_eq!(l.bound, None);
        assert_eq!(l.want(&p, &rate, 3), 100);
        // Short again: the even split.
        l.answered(&p, &rate, 100, 10, 0);
        assert_eq!(l.want(&p, &rate, 3), 35);
    }

    #[test]
    fn a_holder_charges_the_time_it_holds_plus_one_span_ahead() {
        let p = params();
        let rate = per_second(300, 100);
        let span = replace_after(&p, &rate);
        assert_eq!(holder_window(&p, &rate), 2 * SECOND);
        // A slow limit's span (5.5 s): four of them, in whole ms.
        assert_eq!(holder_window(&p, &Rate { units: 10, period: 60 * SECOND, capacity: 10 }), 22 * SECOND);
        let mut l = Ledger::default();
        // The first claim: one span ahead; the next, a span later: one more.
        assert_eq!(l.hold(&p, &rate, SECOND), span);
        assert_eq!(l.hold(&p, &rate, SECOND + span), span);
        // Replaced after half a span: only the half it adds.
        assert_eq!(l.hold(&p, &rate, SECOND + span + span / 2), span / 2);
        // 20 ms late: the delay too.
        let end = SECOND + 2 * span + span / 2;
        assert_eq!(l.hold(&p, &rate, end + 20 * MS), span + 20 * MS);
        // After a gap longer than a span (failed claims): the gap is not charged.
        assert_eq!(l.hold(&p, &rate, 10 * SECOND), span);
        assert_eq!(l.held_until, Some(10 * SECOND + span));
    }

    #[test]
    fn the_fleet_holders_are_the_holder_time_per_window() {
        let span = 333 * MS;
        // Each holder counts `window` to `window + span`.
        for (held, n) in [(0, 1), (2_000, 1), (2_333, 1), (4_000, 2), (6_000, 3), (7_000, 3), (9_332, 4)] {
            assert_eq!(fleet_holders(held, 2 * SECOND, span), n, "{held} ms");
        }
        assert!(fleet_holders(u64::MAX, 2 * SECOND, span) > u64::MAX / 2_200);
        let p = params();
        let rate = per_second(300, 100);
        let mut l = Ledger::default();
        // Never counted: this replica's streams.
        assert_eq!(l.sharers(&p, &rate, 2, SECOND), 2);
        l.counted(&p, &rate, 6_500, SECOND);
        assert_eq!(l.holders, Some((3, SECOND)));
        assert_eq!(l.sharers(&p, &rate, 2, 3 * SECOND), 3);
        // Never fewer than this replica's own.
        assert_eq!(l.sharers(&p, &rate, 5, 3 * SECOND), 5);
        // A count older than the holder window (the counter failing since): the local count.
        assert_eq!(l.sharers(&p, &rate, 2, 3 * SECOND + MS), 2);
        assert_eq!(l.sharers(&p, &rate, 0, 3 * SECOND + MS), 1);
    }

    /// Holders charging the module's own sliding window (`redis_ratelimit_core::sliding`, what
    /// RL.SLIDING runs) are counted exactly at every claim once a window and a span have
    /// passed, through claims out of step (half a span early), a holder joining and one leaving
    /// (each early in one of the module's windows: one joining late in a window counts for ¾ at
    /// least until the next window ends, docs/quota-service.md).
    #[test]
    fn holders_counted_through_the_modules_sliding_window() {
        use redis_ratelimit_core::{sliding, Request, Window, MAX_COUNT};
        let p = params();
        let rate = per_second(300, 100);
        let span = replace_after(&p, &rate);
        let win = Window { limit: MAX_COUNT, window: holder_window(&p, &rate) };
        let mut state: Option<sliding::State> = None;
        let t0 = 1_000 * SECOND + 123 * MS;
        // (joins, leaves, phase): four holders, the fourth joins at 6 s, the first leaves at 8 s.
        let holders = [
            (ZERO, 8 * SECOND, ZERO),
            (ZERO, 20 * SECOND, 97 * MS),
            (ZERO, 20 * SECOND, 211 * MS),
            (6 * SECOND, 20 * SECOND, 50 * MS),
        ];
        let mut ledgers = vec![Ledger::default(); holders.len()];
        let mut next: Vec<Nanos> = holders.iter().map(|h| t0 + h.0 + h.2).collect();
        let mut claims = vec![0u64; holders.len()];
        let mut checked = 0;
        loop {
            let (i, &t) = next.iter().enumerate().min_by_key(|(_, t)| **t).unwrap();
            if t >= t0 + 16 * SECOND {
                break;
            }
            let held = ledgers[i].hold(&p, &rate, t);
            let (d, s) = sliding::check(state.as_ref(), &win, t, Request::new(held.as_millis_ceil()));
            state = s.or(state);
            ledgers[i].counted(&p, &rate, d.limit - d.remaining, t);
            let (n, _) = ledgers[i].holders.unwrap();
            let at = t - t0;
            let live = holders.iter().filter(|h| h.0 <= at && at < h.1).count() as u64;
            // Settled: a window and a span past every join and leave.
            let settled = |e: Nanos| at < e || at >= e + win.window + span;
            if at >= win.window + span {
                if holders.iter().all(|h| settled(h.0) && settled(h.1)) {
                    assert_eq!(n, live, "at {at:?}");
                    checked += 1;
                } else {
                    // Joining or leaving: within one.
                    assert!(n + 1 >= live && n <= live + 1, "{n} holders counted at {at:?}, {live} live");
                }
            }
            // Every third lease of the second holder is replaced after half a span.
            claims[i] += 1;
            let early = i == 1 && claims[i].is_multiple_of(3);
            next[i] = if at + span >= holders[i].1 { Nanos::MAX } else { t + if early { span / 2 } else { span } };
        }
        assert!(checked > 40, "{checked} claims checked");
    }

    #[test]
    fn leases_follow_the_reported_demand() {
        let p = params();
        let rate = per_second(10_000, 10_000);
        let mut l = Ledger::default();
        // The first report (the bucket's creation) carries no period.
        assert_eq!(l.report(&p, ZERO, 1, 0), Settled::default());
        assert_eq!(l.demand, None);
        // 1000 requests in 5 s: 200/s; over 500 ms 100, a quarter more.
        let s = l.report(&p, 5 * SECOND, 1000, 0);
        assert!(!s.idle);
        assert_eq!(l.want(&p, &rate, 3), 125);
        // Refusals: doubled.
        l.report(&p, 10 * SECOND, 900, 100);
        assert_eq!(l.want(&p, &rate, 3), 250);
        // Capped by the capacity and by u32::MAX.
        l.report(&p, 15 * SECOND, u64::MAX / 2, 0);
        assert_eq!(l.want(&p, &rate, 3), 10_000);
        let huge = Rate { units: u64::MAX, period: ns(1), capacity: u64::MAX };
        assert_eq!(l.want(&p, &huge, 1), u32::MAX as u64);
        // An idle period: one unit.
        l.report(&p, 20 * SECOND, 0, 0);
        assert_eq!(l.want(&p, &rate, 3), 1);
    }

    #[test]
    fn refusals_before_any_lease_do_not_double_the_first_leases() {
        let p = params();
        let rate = per_second(1000, 1000);
        let mut l = Ledger::default();
        // The bucket's first report: its first request refused by no_assignment_behavior.
        l.report(&p, ZERO, 0, 1);
        assert!(!l.starved);
        assert_eq!(l.want(&p, &rate, 1), 501);
        // Refusals in a period under leases: doubled.
        l.report(&p, 5 * SECOND, 0, 1);
        assert!(l.starved);
    }

    #[test]
    fn a_long_window_settles_its_ended_leases_at_every_report() {
        let p = params();
        let rate = Rate { units: 200, period: 20 * SECOND, capacity: 200 };
        let end = 20 * SECOND;
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        // 14 units every 500 ms from 1 s to 5.5 s (10 leases, 140 units) in one window.
        for k in 0..10 {
            let t = SECOND + k * 500 * MS;
            l.pushed(&p, &rate, t - MS, t, 14, Some(end + (k % 2) * MS));
        }
        // A report at 6 s with 45 admitted: the leases replaced by 5 s (pushed 1 … 4.5 s, 8 of
        // them, 112 units) hold at least 112 − 45 unused.
        let s = l.report(&p, 6 * SECOND, 45, 0);
        assert_eq!((s.give_back, s.window_give_back, s.window_age), (0, 67, 5 * SECOND + MS));
        // The next report: 2 more leases ended (28), 45 more admitted: nothing more.
        let s = l.report(&p, 11 * SECOND, 45, 0);
        assert_eq!(s.window_give_back, 0);
        assert_eq!(l.given_back, 67);
        // A new window starts over; a short window is never settled this way.
        l.pushed(&p, &rate, 21 * SECOND, 21 * SECOND, 5, Some(40 * SECOND));
        assert_eq!(l.window.as_ref().map(|w| (w.ended, w.admitted, w.open.len())), Some((0, 0, 1)));
        // A claim sent before its window surely began is not settled.
        l.pushed(&p, &rate, 39_999 * MS, 40_001 * MS, 5, Some(60_001 * MS));
        assert_eq!(l.window.as_ref().map(|w| (w.open.len(), w.first_claim)), Some((0, None)));
        // The first lease of a window, claimed at its edge (less than the timeout after it
        // began), is not settled: a give-back aged from its claim, plus the return's transit,
        // would date the units to the window before, where RL.RETURN credits nothing (in a
        // real run every give-back of the window credited 0). The next one is.
        let mut edge = Ledger::default();
        edge.pushed(&p, &rate, 20_010 * MS, 20_011 * MS, 8, Some(40_006 * MS));
        edge.pushed(&p, &rate, 20_500 * MS, 20_501 * MS, 8, Some(40_001 * MS));
        assert_eq!(edge.window.as_ref().and_then(|w| w.first_claim), Some(20_500 * MS));
        let s = edge.report(&p, 26 * SECOND, 3, 0);
        assert_eq!(s.window_give_back, 5);
        assert!(26 * SECOND - s.window_age - p.timeout >= 20 * SECOND, "{s:?}: dated before the window");
        // A report spanning the window's edge: of its 45 admitted, at most the 24 units the
        // window's leases held were theirs (two ended, one in use); the rest came from the
        // window before.
        let mut span = Ledger::default();
        span.pushed(&p, &rate, 19 * SECOND, 19 * SECOND, 20, Some(20 * SECOND));
        span.pushed(&p, &rate, 20_500 * MS, 20_500 * MS, 8, Some(40 * SECOND));
        span.pushed(&p, &rate, 21 * SECOND, 21 * SECOND, 8, Some(40 * SECOND));
        span.pushed(&p, &rate, 21_500 * MS, 21_500 * MS, 8, Some(40 * SECOND));
        span.report(&p, 23 * SECOND, 45, 0);
        assert_eq!(span.window.as_ref().map(|w| (w.ended, w.admitted)), Some((16, 24)));
        // The next report: 12 of the window's leases ended, 24 + 60 admitted at most.
        for k in 0..10 {
            let t = 22 * SECOND + k * 500 * MS;
            span.pushed(&p, &rate, t, t, 8, Some(40 * SECOND));
        }
        let s = span.report(&p, 28 * SECOND, 60, 0);
        assert_eq!(s.window_give_back, 8 * 12 - 24 - 60);
        let mut short = Ledger::default();
        short.pushed(&p, &per_second(100, 100), ZERO, ZERO, 5, Some(SECOND));
        assert!(short.window.is_none());
    }

    #[test]
    fn refusals_while_the_limit_granted_less_do_not_double_the_next_lease() {
        let p = params();
        let rate = per_second(1000, 1000);
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        l.short = true;
        l.report(&p, 5 * SECOND, 100, 50);
        assert!(!l.starved);
        l.report(&p, 10 * SECOND, 100, 50);
        assert!(l.starved);
        assert_eq!(l.want(&p, &rate, 1), 2 * 19);
    }

    #[test]
    fn the_next_lease_is_due_after_refresh_or_at_the_window_end() {
        let p = params();
        let rate = per_second(100, 100);
        let mut l = Ledger::default();
        l.pushed(&p, &rate, ns(10), ns(20), 50, None);
        assert_eq!((l.next, l.granted), (ns(20) + 500 * MS, 50));
        assert_eq!(l.current, Some(Lease { claimed: ns(10), pushed: ns(20), units: 50, life: SECOND }));
        l.pushed(&p, &rate, SECOND, SECOND + ns(5), 50, Some(SECOND + 200 * MS));
        assert_eq!(l.next, SECOND + 200 * MS);
        // A window ending now: at least 1 ms later, never at once again.
        l.pushed(&p, &rate, 2 * SECOND, 2 * SECOND, 50, Some(ZERO));
        assert_eq!(l.next, 2 * SECOND + MS);
        // A slow limit's lease is replaced shortly before it ends.
        let slow = Rate { units: 10, period: 60 * SECOND, capacity: 10 };
        l.pushed(&p, &slow, 3 * SECOND, 3 * SECOND, 1, None);
        assert_eq!(l.next, 3 * SECOND + 5500 * MS);
        l.pushed_nothing(&p, 10 * SECOND);
        assert_eq!((l.next, l.current), (10 * SECOND + 500 * MS, None));
    }

    #[test]
    fn an_idle_report_gives_back_only_leases_that_ended_unused() {
        let p = params();
        let rate = per_second(100, 100);
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        // A busy period: nothing is given back, whatever was pushed.
        for k in 0..10 {
            l.pushed(&p, &rate, k * 500 * MS, k * 500 * MS + MS, 10, None);
        }
        assert_eq!(
            l.report(&p, 5 * SECOND, 40, 0),
            Settled { idle: false, give_back: 0, age: ZERO, ..Settled::default() }
        );
        assert!(l.unsettled.is_empty());
        // The next period is idle: leases pushed after the report, replaced (or expired) at
        // least `margin` before the idle report, come back; the last two may still be in use.
        for k in 0..10 {
            let t = 5 * SECOND + 100 * MS + k * 500 * MS;
            l.pushed(&p, &rate, t - MS, t, 10, None);
        }
        let s = l.report(&p, 10 * SECOND + 100 * MS, 0, 0);
        // Pushed at 5.1 … 9.6 s; cutoff 9.1 s: replaced by 9.1 s: the leases of 5.1 … 8.6 s (8).
        assert!(s.idle);
        assert_eq!(s.give_back, 80);
        assert_eq!(s.age, 10 * SECOND + 100 * MS - (5 * SECOND + 99 * MS));
        assert_eq!((l.granted, l.given_back, l.admitted), (200, 80, 41));
        assert!(l.unsettled.is_empty());
        // An idle report with nothing pushed gives back nothing, never a negative.
        assert_eq!(
            l.report(&p, 15 * SECOND, 0, 0),
            Settled { idle: true, give_back: 0, age: ZERO, ..Settled::default() }
        );
    }

    #[test]
    fn an_expired_lease_is_given_back_at_an_idle_report() {
        let p = params();
        let rate = per_second(100, 100);
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        // One lease, never replaced (the bucket went quiet, pushes stopped), its TTL long over.
        l.pushed(&p, &rate, SECOND, SECOND + MS, 7, None);
        let s = l.report(&p, 5 * SECOND, 0, 0);
        assert_eq!((s.idle, s.give_back, s.age), (true, 7, 4 * SECOND));
        // Within `margin` of its end: kept.
        let mut l = Ledger::default();
        l.report(&p, ZERO, 1, 0);
        l.pushed(&p, &rate, 3 * SECOND + 500 * MS, 3 * SECOND + 500 * MS, 7, None);
        assert_eq!(l.report(&p, 5 * SECOND, 0, 0).give_back, 0);
    }

    #[test]
    fn unsettled_leases_are_bounded() {
        let p = params();
        let rate = per_second(100, 100);
        let mut l = Ledger::default();
        for k in 0..(MAX_UNSETTLED as u64 * 3) {
            l.pushed(&p, &rate, ns(k), ns(k), 1, None);
        }
        assert_eq!(l.unsettled.len(), MAX_UNSETTLED);
        assert_eq!(l.granted, MAX_UNSETTLED as u64 * 3);
    }

    #[test]
    fn the_local_failure_share_divides_among_the_last_counted_holders() {
        // Never counted: this replica's streams times the replicas.
        assert_eq!(failure_sharers(None, 2, 3), 6);
        // Counted: the fleet's holders, at least this replica's.
        assert_eq!(failure_sharers(Some(3), 2, 3), 3);
        assert_eq!(failure_sharers(Some(1), 2, 3), 2);
        assert_eq!(failure_sharers(None, 0, 0), 1);
    }

    #[test]
    fn the_local_share_never_exceeds_the_limit_split() {
        // 1000/s, burst 100, 4 Envoys: 250/s, 25.
        assert_eq!(
            local_share(&per_second(1000, 100), 4),
            TokenBucketShare { max_tokens: 25, tokens_per_fill: 250, fill_interval_s: 1 }
        );
        // 10 per minute over 3: one per 18 s.
        assert_eq!(
            local_share(&Rate { units: 10, period: 60 * SECOND, capacity: 10 }, 3),
            TokenBucketShare { max_tokens: 3, tokens_per_fill: 1, fill_interval_s: 18 }
        );
        // 7 per second over 2: 3 per second (3.5 rounded down), at least one token of capacity.
        assert_eq!(
            local_share(&per_second(7, 1), 2),
            TokenBucketShare { max_tokens: 1, tokens_per_fill: 3, fill_interval_s: 1 }
        );
        // 1 per 1.5 s: one per 2 s (rounded up: slower).
        assert_eq!(local_share(&Rate { units: 1, period: 1500 * MS, capacity: 1 }, 1).fill_interval_s, 2);
        // Zero sharers count as one; extreme values do not overflow.
        assert_eq!(local_share(&per_second(5, 5), 0).tokens_per_fill, 5);
        let huge = local_share(&Rate { units: u64::MAX, period: ns(1), capacity: u64::MAX }, 1);
        assert_eq!((huge.max_tokens, huge.tokens_per_fill), (u32::MAX, u32::MAX));
    }
}
