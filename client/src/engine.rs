//! The whole client decision, sans IO: per-key reservations ([`crate::lease`]), the circuit
//! breaker ([`crate::breaker`]), the failure policy ([`crate::policy`]), shadow mode and the
//! metrics, over the keys of one shard. `now` is a [`Nanos`] passed in; nothing here reads a
//! clock, sleeps or does IO. The tokio driver ([`crate::Limiter`]), the simulator and the
//! property tests use it the same way, through one door (the contract of quinn-proto's
//! `poll_transmit` / `poll_timeout`). Every entry point:
//!
//! ```text
//! A request:
//!   check(now, key, cost)                    (check_hashed: the key's hash already computed)
//!   peek(now, key, cost)                     (decides without taking; not counted as a request)
//!     → Step::Done { outcome, refill }       answer outcome; send refill (a background claim) if any
//!     → Step::Send(claim)                    send claim.command(), by claim.deadline(); then
//!         on_reply(now, &claim, &decision)   → Some(next step) for its request, None for a refill
//!         on_error(now, &claim, CallError)   → likewise (Unavailable: no answer by the deadline)
//!     → Step::Wait(waiter)                   wait for the key's claim in flight (or waiter.until()), then
//!         resume(now, key, waiter)           → the next step
//!   A claim is a request's own (a remembered key's, or a one-off claim of a key not remembered:
//!   decided by its reply alone), a peek's DRYRUN, or a background refill: all reported alike.
//! After a request:
//!   refund(now, key, &outcome)               puts an admitted outcome's units back
//!   peek_local(now, key, cost)               what local knowledge alone decides (takes nothing)
//! Time and returns:
//!   poll_timeout()                           when handle_timeout next has work (ask after each call)
//!   handle_timeout(now)                      housekeeping of the keys due
//!   poll_transmit()                          the next RL.RETURN to send (housekeeping, evictions), then
//!     on_return(now, result)                 its answer
//!   drain(now)                               shutdown: every held unit to give back
//! ```
//!
//! Every [`Claim`] and [`Return`] is a finished request: it builds its own command and carries
//! its deadline, and a return its `AGE` (margin included), computed in one place. A claim that
//! is never reported is given up by the engine itself once stale (counted in
//! `claims_given_up`). [`Shared`] (one per limiter, over its shards) holds the configuration,
//! the breaker, the hasher and the counters; it decides nothing.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::HashTable;

use crate::breaker::{Breaker, BreakerConfig, Permit};
use crate::commands::{self, Options};
use crate::decision::Decision;
use crate::lease::{ClaimSpec, KeyState, LeaseConfig, LimitedBy, ReturnSpec, Ruling, Taken};
use crate::metrics::{add, add_shared, sub, Metrics, MetricsSnapshot};
use crate::policy::{FailurePolicy, LocalBucket};
use crate::sightings::{Sighting, Sightings};
use crate::slab::Slab;
use crate::spec::Limit;
use crate::wheel::Wheel;
use redis_ratelimit_core::Nanos;

/// The hasher of every shard of a limiter (foldhash, seeded per process): one hash per check
/// picks the shard and finds the key.
pub type KeyHasher = hashbrown::DefaultHashBuilder;

/// Everything that decides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineConfig {
    pub lease: LeaseConfig,
    pub breaker: BreakerConfig,
    /// Resolved ([`FailurePolicy::resolve`]): never `LocalShare` here.
    pub policy: FailurePolicy,
    /// Shadow mode: decide and count as if enforced, but always let the caller through.
    pub shadow: bool,
    /// The driver's per-call timeout: a request waits at most 1.5× this for a claim of its key
    /// that another request sent.
    pub call_timeout: Nanos,
    /// A key with nothing held, nothing in flight and no live denial is forgotten after this
    /// long without a request (default 2 L).
    pub forget_after: Nanos,
    /// At most this many keys remembered per engine (shard); 0: no cap. Beyond it, a new key
    /// evicts an old one (approximate LRU: the least recently used of a small sample), whose
    /// units are given back.
    pub max_keys: usize,
    /// The timer wheel's resolution: housekeeping runs at most this late.
    pub granularity: Nanos,
    /// Keep per-key [`crate::lease::Totals`] (tests, the simulator): 48 bytes more per key.
    pub key_totals: bool,
    /// Entries of the table of recent first requests (rounded up to a power of two, 4 bytes
    /// each; 0: none). With it, the request of a key not remembered is a one-off exact claim
    /// ([`Claim::one_off`]) decided by its reply alone, so that keys seen once (most per-IP
    /// keys) cost no slot, no timer and no forgetting, unless its entry holds this key's own
    /// first request younger than L (a 12-bit fingerprint tells): then the key is remembered.
    /// A younger first request of another key sharing the entry keeps it for at most L, so a
    /// key that keeps coming back is remembered within L plus two requests.
    pub sightings: usize,
}

impl EngineConfig {
    /// The defaults for `limit` (those of `LimiterConfig::new`).
    pub fn new(limit: Limit) -> EngineConfig {
        EngineConfig::from_lease(LeaseConfig::new(limit))
    }

    /// Defaults around a lease configuration: breaker 5 failures / 1 s, fail closed, 100 ms
    /// call timeout, forget after 2 L, no key cap, wheel resolution L/32 within [1, 50] ms,
    /// every key remembered from its first request (no sightings table).
    pub fn from_lease(lease: LeaseConfig) -> EngineConfig {
        EngineConfig {
            lease,
            breaker: BreakerConfig::default(),
            policy: FailurePolicy::FailClosed,
            shadow: false,
            call_timeout: Nanos::from_millis(100),
            forget_after: (lease.lease * 2).max(lease.idle_return),
            max_keys: 0,
            granularity: (lease.lease / 32).clamp(Nanos::from_millis(1), Nanos::from_millis(50)),
            key_totals: false,
            sightings: 0,
        }
    }
}

/// Where a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Units held locally (no Redis call), or a local certainty (cost above capacity).
    Local,
    /// A claim sent for this request (one round trip).
    Redis,
    /// The over-limit cache (no Redis call).
    Cache,
    /// Redis unavailable: the local fallback limit decided.
    Fallback,
    /// Redis unavailable: fail-open admitted.
    FailOpen,
    /// Redis unavailable: fail-closed refused.
    FailClosed,
}

/// The answer to one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Let the request through (always true in shadow mode).
    pub allowed: bool,
    /// The decision as enforced (differs from `allowed` only in shadow mode).
    pub enforced: bool,
    pub source: Source,
    /// When refused: when to retry (never early); `None` when it never passes or is unknown.
    pub retry_after: Option<Nanos>,
    /// RL.LEAKY: how long an admitted request waits (Redis admits only).
    pub delay: Option<Nanos>,
    /// For headers, as best known: the capacity, units still admissible overall (server's last
    /// `remaining` plus units held here; 0 when refused by the over-limit cache or pacing hold),
    /// time until fresh.
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub reset_after: Option<Nanos>,
    /// What the admission took, for [`Engine::refund`].
    pub(crate) taken: Option<Taken>,
}

impl Outcome {
    fn plain(allowed: bool, source: Source, retry_after: Option<Nanos>) -> Outcome {
        Outcome {
            allowed,
            enforced: allowed,
            source,
            retry_after,
            delay: None,
            limit: None,
            remaining: None,
            reset_after: None,
            taken: None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after.map(Duration::from)
    }
    pub fn delay(&self) -> Option<Duration> {
        self.delay.map(Duration::from)
    }
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_after.map(Duration::from)
    }
    /// Decided by the failure policy because Redis could not answer (a Layer answers 503 on a
    /// refusal of this kind rather than 429).
    pub fn unavailable(&self) -> bool {
        matches!(self.source, Source::Fallback | Source::FailOpen | Source::FailClosed)
    }
    // headers(): crate::headers.
}

/// A claim to send: `<algorithm command> key limit period [BURST b] COST units [PARTIAL]` (or,
/// for a peek, `COST units DRYRUN`). Report its reply with [`Engine::on_reply`] or its failure
/// with [`Engine::on_error`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a claim must be sent and its reply or error reported to the engine"]
pub struct Claim<K> {
    key: K,
    spec: ClaimSpec,
    limit: Limit,
    dry_run: bool,
    one_off: bool,
    /// Its send plus the call timeout.
    deadline: Nanos,
}

impl<K> Claim<K> {
    pub fn key(&self) -> &K {
        &self.key
    }
    pub fn units(&self) -> u64 {
        self.spec.units
    }
    pub fn partial(&self) -> bool {
        self.spec.partial
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }
    /// The request of a key not remembered (see [`EngineConfig::sightings`]): an exact claim,
    /// decided by its reply alone.
    pub fn one_off(&self) -> bool {
        self.one_off
    }
    /// The units the request that made it needs (0 for a background claim). Read only: the
    /// engine takes it from the claim, never from the caller.
    pub fn cost(&self) -> u64 {
        self.spec.cost
    }
    /// Sent ahead of need (a background refill: nobody waits for it).
    pub fn background(&self) -> bool {
        self.spec.background
    }
    /// The engine's instant the claim was made (its leases are timed from it).
    pub fn sent_at(&self) -> Nanos {
        self.spec.sent_at
    }
    /// Identifies the claim among this key's.
    pub fn id(&self) -> u64 {
        self.spec.id
    }
    pub fn limit(&self) -> &Limit {
        &self.limit
    }
}

impl<K> Claim<K> {
    /// Give it up as timed out (report [`CallError::Unavailable`]) at this instant: its send
    /// plus the call timeout.
    pub fn deadline(&self) -> Nanos {
        self.deadline
    }
}

impl<K: AsRef<str>> Claim<K> {
    /// The command to send.
    pub fn command(&self) -> redis::Cmd {
        let opts = if self.dry_run {
            Options::cost(self.spec.units).dry_run()
        } else {
            Options { cost: Some(self.spec.units), partial: self.spec.partial, dry_run: false }
        };
        commands::limit_cmd(self.key.as_ref(), &self.limit, opts)
    }
}

/// Units to give back: `RL.RETURN key units AGE ms`. Report the answer with
/// [`Engine::on_return`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a return must be sent (or its units are only lost: the safe direction)"]
pub struct Return<K> {
    key: K,
    spec: ReturnSpec,
    /// Its AGE counts the margin from here: past this instant it may understate the true age.
    deadline: Nanos,
}

impl<K> Return<K> {
    pub fn key(&self) -> &K {
        &self.key
    }
    pub fn units(&self) -> u64 {
        self.spec.units
    }
    /// The `AGE`: the time since the claim was sent plus the return margin (the call timeout),
    /// so never below the true age when the return arrives within its timeout.
    pub fn age(&self) -> Nanos {
        self.spec.age
    }
    /// Send it so that it arrives by this instant, or not at all: its `AGE` covers the time
    /// until then (the margin). A driver's call timeout runs to here.
    pub fn deadline(&self) -> Nanos {
        self.deadline
    }
}

impl<K: AsRef<str>> Return<K> {
    /// `RL.RETURN key units AGE ms` (AGE rounded up to the ms).
    pub fn command(&self) -> redis::Cmd {
        commands::give_back_cmd(self.key.as_ref(), self.spec.units, Some(self.spec.age))
    }
}

/// A request waiting for a claim of its key (sent by another request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a waiter must be resumed"]
pub struct Waiter {
    claim: u64,
    cost: u64,
    until: Nanos,
}

impl Waiter {
    /// A waiter on `claim` already past its wait: resuming it decides the request as if the
    /// claim had failed (unless it is still pending and a new wait is due).
    pub fn gave_up<K>(claim: &Claim<K>) -> Waiter {
        Waiter { claim: claim.spec.id, cost: claim.spec.cost, until: Nanos::ZERO }
    }

    /// Resume no later than this, even if the claim has not finished: the failure policy
    /// decides then.
    pub fn until(&self) -> Nanos {
        self.until
    }
    pub fn claim(&self) -> u64 {
        self.claim
    }
}

/// How a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// Redis did not answer: IO error, timeout, connection refused (counts for the breaker).
    Unavailable,
    /// Redis answered with an error (a wrong type, the module missing, an ACL refusal): an
    /// answer, so the breaker stays closed, but the request falls to the failure policy.
    Refused,
}

/// What the caller of [`Engine`] does next for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a step must be carried out: a dropped Send leaves its key waiting until the claim is given up"]
pub enum Step<K> {
    /// Decided. Send `refill` (a background claim) if present; report it like any claim.
    Done { outcome: Outcome, refill: Option<Claim<K>> },
    /// Send this claim; the request waits for it.
    Send(Claim<K>),
    /// Wait for the claim of this key in flight (or until `waiter.until()`), then
    /// [`Engine::resume`].
    Wait(Waiter),
}

/// State shared by all shards of one limiter: config, breaker, hasher, and the metrics of
/// every shard (each engine counts in its own [`Metrics`], written only under its `&mut`, so a
/// check updates no cache line another shard's thread writes; [`Shared::snapshot`] sums them).
#[derive(Debug)]
pub struct Shared {
    pub config: EngineConfig,
    pub breaker: Breaker,
    pub hasher: KeyHasher,
    /// What no shard counts: the answers of returns sent by a driver without its shard.
    unsharded: Metrics,
    /// The metrics of every engine made with this state.
    engines: Mutex<Vec<Arc<Metrics>>>,
}

impl Shared {
    pub fn new(config: EngineConfig) -> Arc<Shared> {
        Arc::new(Shared {
            config,
            breaker: Breaker::new(config.breaker),
            hasher: KeyHasher::default(),
            unsharded: Metrics::default(),
            engines: Mutex::new(Vec::new()),
        })
    }

    /// A new engine's own metrics, counted in [`Shared::snapshot`].
    fn register(&self) -> Arc<Metrics> {
        let m = Arc::new(Metrics::default());
        self.engines.lock().unwrap_or_else(|e| e.into_inner()).push(m.clone());
        m
    }

    /// The hash every shard uses for `key`.
    pub fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// A return's answer (see [`Engine::on_return`]): needs no shard.
    pub fn on_return(&self, now: Nanos, result: Result<u64, CallError>) {
        let m = &self.unsharded;
        match result {
            Ok(credited) => {
                self.breaker.on_success();
                add_shared(&m.units_credited, credited);
            }
            Err(CallError::Refused) => self.breaker.on_success(),
            Err(CallError::Unavailable) => {
                add_shared(&m.redis_errors, 1);
                if self.breaker.on_failure(now) {
                    add_shared(&m.breaker_opens, 1);
                }
            }
        }
    }

    /// The metrics of every engine made with this state, with the breaker's state.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let mut s = MetricsSnapshot::default();
        self.unsharded.accumulate(&mut s);
        for m in self.engines.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            m.accumulate(&mut s);
        }
        s.derive();
        s.breaker_state = self.breaker.state() as u64;
        s
    }
}

#[derive(Debug)]
struct Slot<K> {
    key: K,
    /// Tells this occupant of the slot index from earlier ones (wheel entries carry it).
    gen: u32,
    /// When the live wheel entry of this key fires (`ZERO`: none).
    armed: Nanos,
    state: KeyState,
    fallback: LocalBucket,
}

/// Keys and their reservations; one per shard in the driver, one per instance in the simulator.
/// Keys live in a dense slab (in fixed-size chunks: memory follows the keys) indexed by a hash
/// table of slab positions (one hash per lookup, borrowed keys: no allocation for a key already
/// held); their deadlines in a timer wheel.
#[derive(Debug)]
pub struct Engine<K> {
    shared: Arc<Shared>,
    /// This engine's counters (registered with `shared`).
    metrics: Arc<Metrics>,
    slots: Slab<Slot<K>>,
    index: HashTable<u32>,
    wheel: Wheel,
    next_gen: u32,
    transmit: VecDeque<Return<K>>,
    due: Vec<(u32, u32)>,
    returns: Vec<ReturnSpec>,
    /// For the eviction sample (xorshift).
    rng: u64,
    /// Recent first requests ([`EngineConfig::sightings`]).
    sightings: Sightings,
}

impl<K: Hash + Eq + Clone> Engine<K> {
    pub fn new(config: EngineConfig) -> Engine<K> {
        Engine::with_shared(Shared::new(config))
    }

    pub fn with_shared(shared: Arc<Shared>) -> Engine<K> {
        let wheel = Wheel::new(shared.config.granularity, 256);
        Engine {
            metrics: shared.register(),
            shared,
            slots: Slab::default(),
            index: HashTable::new(),
            wheel,
            next_gen: 0,
            transmit: VecDeque::new(),
            due: Vec::new(),
            returns: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
            sightings: Sightings::default(),
        }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// The metrics of every engine sharing this one's [`Shared`] (one engine: its own).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.snapshot()
    }

    /// The hash of `key` (pick a shard with it, then call [`Engine::check_hashed`]).
    pub fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.shared.hash(key)
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// A key's state (tests and the simulator).
    pub fn key<Q>(&self, key: &Q) -> Option<&KeyState>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hash(key), key).map(|i| &self.slots[i].state)
    }

    pub fn keys(&self) -> impl Iterator<Item = (&K, &KeyState)> {
        self.slots.iter().map(|s| (&s.key, &s.state))
    }

    #[inline]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slots = &self.slots;
        self.index.find(hash, |&i| slots[i as usize].key.borrow() == key).map(|&i| i as usize)
    }

    fn new_gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    #[inline]
    fn find_or_insert<Q>(&mut self, now: Nanos, hash: u64, key: &Q) -> usize
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Eq + ToOwned + ?Sized,
    {
        match self.find(hash, key) {
            Some(i) => i,
            None => self.insert(now, hash, key),
        }
    }

    /// A key not remembered yet (kept out of line: the local path finds its key).
    #[cold]
    #[inline(never)]
    fn insert<Q>(&mut self, now: Nanos, hash: u64, key: &Q) -> usize
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Eq + ToOwned + ?Sized,
    {
        if self.full() {
            self.evict(now);
        }
        let i = self.slots.len();
        let gen = self.new_gen();
        self.slots.push(Slot {
            key: K::from(key.to_owned()),
            gen,
            armed: Nanos::ZERO,
            state: if self.shared.config.key_totals { KeyState::with_totals() } else { KeyState::new() },
            fallback: LocalBucket::default(),
        });
        let (slots, hasher) = (&self.slots, &self.shared.hasher);
        self.index.insert_unique(hash, i as u32, |&j| hasher.hash_one(&slots[j as usize].key));
        add(&self.metrics.keys, 1);
        i
    }

    /// Makes sure the wheel wakes key `i` by its next deadline.
    #[inline]
    fn arm(&mut self, now: Nanos, i: usize) {
        let (cfg, slot) = (&self.shared.config, &mut self.slots[i]);
        let at = slot.state.next_deadline(now, &cfg.lease, cfg.forget_after);
        if slot.armed.is_zero() || at < slot.armed {
            // A new generation: the entry already in the wheel (a later one) is superseded.
            self.next_gen = self.next_gen.wrapping_add(1);
            slot.gen = self.next_gen;
            slot.armed = at.max(Nanos::new(1));
            self.wheel.insert(now, slot.armed, (i as u32, slot.gen));
        }
    }

    /// Forgets key `i` (the last key takes its slab position).
    fn remove(&mut self, now: Nanos, i: usize) {
        let hasher = &self.shared.hasher;
        let hash = hasher.hash_one(&self.slots[i].key);
        if let Ok(e) = self.index.find_entry(hash, |&j| j as usize == i) {
            e.remove();
        }
        let last = self.slots.len() - 1;
        if i != last {
            let h = hasher.hash_one(&self.slots[last].key);
            if let Some(j) = self.index.find_mut(h, |&j| j as usize == last) {
                *j = i as u32;
            }
        }
        self.slots.swap_remove(i);
        sub(&self.metrics.keys, 1);
        add(&self.metrics.keys_forgotten, 1);
        if i != last {
            // The moved key's wheel entries name its old position: arm it again here.
            let gen = self.new_gen();
            let slot = &mut self.slots[i];
            slot.gen = gen;
            if !slot.armed.is_zero() {
                self.wheel.insert(now, slot.armed, (i as u32, gen));
            }
        }
        // Forgotten keys give their memory back (the slab frees its chunks itself).
        let len = self.slots.len();
        if len == 0 || (self.index.capacity() > 64 && len < self.index.capacity() / 4) {
            let (slots, hasher) = (&self.slots, &self.shared.hasher);
            self.index.shrink_to(len * 2, |&j| hasher.hash_one(&slots[j as usize].key));
        }
    }

    /// At the `max_keys` cap: a new key must evict one to be remembered.
    fn full(&self) -> bool {
        let cap = self.shared.config.max_keys;
        cap > 0 && self.slots.len() >= cap
    }

    /// The `max_keys` cap: forgets the least recently used of a few sampled keys with no claim
    /// in flight, giving its units back (none when every key sampled has a claim in flight).
    fn evict(&mut self, now: Nanos) {
        let n = self.slots.len();
        let mut victim: Option<usize> = None;
        for _ in 0..5 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let i = (self.rng % n as u64) as usize;
            let s = &self.slots[i].state;
            if s.in_flight().is_none() && victim.is_none_or(|v| s.last_request() < self.slots[v].state.last_request()) {
                victim = Some(i);
            }
        }
        let Some(i) = victim else { return };
        let (cfg, m) = (&self.shared.config, &self.metrics);
        self.slots[i].state.drain(now, &cfg.lease, m, &mut self.returns);
        let key = &self.slots[i].key;
        let deadline = now + cfg.lease.return_margin;
        self.transmit.extend(self.returns.drain(..).map(|spec| Return { key: key.clone(), spec, deadline }));
        add(&m.keys_evicted, 1);
        self.remove(now, i);
    }

    /// A new request for `cost` units of `key`.
    pub fn check<Q>(&mut self, now: Nanos, key: &Q, cost: u64) -> Step<K>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.check_hashed(now, self.hash(key), key, cost)
    }

    /// [`Engine::check`] with the key's hash already computed ([`Engine::hash`]: a driver picks
    /// its shard with it).
    #[inline]
    pub fn check_hashed<Q>(&mut self, now: Nanos, hash: u64, key: &Q, cost: u64) -> Step<K>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Eq + ToOwned + ?Sized,
    {
        add(&self.metrics.requests, 1);
        let i = match self.find(hash, key) {
            Some(i) => i,
            None => match self.new_key(now, hash, key, cost) {
                Ok(i) => i,
                Err(claim) => return Step::Send(claim),
            },
        };
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        let v = self.slots[i].state.on_request(now, cost, lease, m);
        self.step(now, i, cost, v)
    }

    /// A request of a key not remembered: a one-off claim when the sightings table says so,
    /// else the key remembered, evicting one at the `max_keys` cap; when none can be evicted
    /// (the keys sampled all have a claim in flight: a flood of new keys) a one-off claim all
    /// the same, rather than a key remembered beyond the cap.
    #[cold]
    #[inline(never)]
    fn new_key<Q>(&mut self, now: Nanos, hash: u64, key: &Q, cost: u64) -> Result<usize, Claim<K>>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Eq + ToOwned + ?Sized,
    {
        let cfg = &self.shared.config;
        // Something to claim that can pass: else a fresh key state decides (nothing to claim,
        // a cost above the capacity).
        let claimable = cost > 0 && cost <= cfg.lease.limit.capacity();
        if claimable && cfg.sightings > 0 {
            if let Sighting::First { free } = self.sightings.look(now, hash, cfg.sightings, cfg.lease.lease) {
                // The breaker refusing the call: the key is remembered, its state decides.
                if self.shared.breaker.permit(now).allows_call() {
                    if free {
                        self.sightings.note(now, hash);
                    }
                    return Err(self.one_off(now, key, cost));
                }
            }
        }
        if self.full() {
            self.evict(now);
        }
        if self.full() && claimable && self.shared.breaker.permit(now).allows_call() {
            return Err(self.one_off(now, key, cost));
        }
        Ok(self.insert(now, hash, key))
    }

    /// A one-off claim of `cost` units of `key` (not remembered), counted as sent: an exact
    /// claim (`COST cost`, what a fresh key state would send), decided by its reply alone.
    fn one_off<Q>(&mut self, now: Nanos, key: &Q, cost: u64) -> Claim<K>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Eq + ToOwned + ?Sized,
    {
        let m = &self.metrics;
        add(&m.claims, 1);
        add(&m.redis_calls, 1);
        add(&m.one_off_claims, 1);
        add(&m.claims_in_flight, 1);
        let spec = ClaimSpec { id: 0, units: cost, partial: false, sent_at: now, background: false, cost };
        self.new_claim(K::from(key.to_owned()), spec, false, true)
    }

    /// Every claim is made here: its command's limit and its deadline are the engine's.
    fn new_claim(&self, key: K, spec: ClaimSpec, dry_run: bool, one_off: bool) -> Claim<K> {
        let cfg = &self.shared.config;
        let deadline = spec.sent_at + cfg.call_timeout;
        Claim { key, spec, limit: cfg.lease.limit, dry_run, one_off, deadline }
    }

    /// Decides a request for `cost` units of `key` without taking anything: from what is held
    /// or cached here, else by a `DRYRUN` claim ([`Step::Send`]); the failure policy (without
    /// consuming its local bucket) while Redis is unavailable. Not counted as a request.
    pub fn peek<Q>(&mut self, now: Nanos, key: &Q, cost: u64) -> Step<K>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let i = self.find_or_insert(now, self.hash(key), key);
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        let step = match self.slots[i].state.peek(now, cost, lease, m) {
            Some(Ruling::Admit { .. }) => {
                Step::Done { outcome: self.known(now, i, true, Source::Local, None, None), refill: None }
            }
            Some(Ruling::Limited { retry_after, by, .. }) => {
                let source = if by == LimitedBy::Cache { Source::Cache } else { Source::Local };
                Step::Done { outcome: self.known(now, i, false, source, retry_after, None), refill: None }
            }
            _ if cost == 0 => Step::Done { outcome: self.known(now, i, true, Source::Local, None, None), refill: None },
            _ => match self.shared.breaker.permit(now) {
                Permit::Reject { retry_in } => {
                    Step::Done { outcome: self.fallback(now, i, cost, retry_in, false), refill: None }
                }
                _ => {
                    let spec = ClaimSpec { id: 0, units: cost, partial: false, sent_at: now, background: false, cost };
                    Step::Send(self.new_claim(self.slots[i].key.clone(), spec, true, false))
                }
            },
        };
        self.arm(now, i);
        step
    }

    /// What `key` would get from what is known here alone, taking and counting nothing:
    /// `Some` when held units cover `cost` or the over-limit cache (or the capacity) refuses
    /// it, `None` when only Redis knows. A multi-limit check asks this first, so that a limit
    /// refusing from its cache costs the others nothing.
    pub fn peek_local<Q>(&mut self, now: Nanos, key: &Q, cost: u64) -> Option<Outcome>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let i = self.find(self.hash(key), key)?;
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        match self.slots[i].state.peek(now, cost, lease, m)? {
            Ruling::Admit { .. } => Some(self.known(now, i, true, Source::Local, None, None)),
            Ruling::Limited { retry_after, by, .. } => {
                let source = if by == LimitedBy::Cache { Source::Cache } else { Source::Local };
                Some(self.shadow_quiet(self.known(now, i, false, source, retry_after, None)))
            }
            _ => None,
        }
    }

    /// The request waited (woken by the claim's reply or error, or at `waiter.until()`).
    pub fn resume<Q>(&mut self, now: Nanos, key: &Q, waiter: Waiter) -> Step<K>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let i = self.find_or_insert(now, self.hash(key), key);
        if self.slots[i].state.claim_pending(waiter.claim) {
            if now < waiter.until {
                return Step::Wait(waiter);
            }
            // Redis could not decide this request in time: the failure policy does.
            let o = self.fallback(now, i, waiter.cost, self.shared.config.breaker.cool_down, true);
            self.arm(now, i);
            return Step::Done { outcome: self.shadow(o), refill: None };
        }
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        let v = self.slots[i].state.resume(now, waiter.cost, Some(waiter.claim), lease, m);
        self.step(now, i, waiter.cost, v)
    }

    /// The reply to `claim`. `Some(step)` for the request that sent it, `None` for a background
    /// claim.
    pub fn on_reply(&mut self, now: Nanos, claim: &Claim<K>, d: &Decision) -> Option<Step<K>> {
        self.shared.breaker.on_success();
        if claim.one_off {
            return Some(Step::Done { outcome: self.one_off_reply(claim, d), refill: None });
        }
        if claim.dry_run {
            return Some(Step::Done { outcome: self.peeked(now, claim, d), refill: None });
        }
        let i = self.find_or_insert(now, self.hash(&claim.key), &claim.key);
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        let state = &mut self.slots[i].state;
        let Some((v, cost)) = state.on_claim_reply(now, &claim.spec, d, lease, m) else {
            if claim.spec.background {
                self.arm(now, i);
                return None;
            }
            // The request's own claim, given up before its reply came: decided as if it had
            // failed (held units may still cover it).
            let v = state.resume(now, claim.spec.cost, Some(claim.spec.id), lease, m);
            return Some(self.step(now, i, claim.spec.cost, v));
        };
        let v = match v {
            Ruling::Retry => state.resume(now, cost, None, lease, m),
            v => v,
        };
        Some(self.step(now, i, cost, v))
    }

    /// `claim` failed. `Some(step)` for the request that sent it (`None` for a background
    /// claim).
    pub fn on_error(&mut self, now: Nanos, claim: &Claim<K>, error: CallError) -> Option<Step<K>> {
        let m = &self.metrics;
        match error {
            CallError::Unavailable => {
                add(&m.redis_errors, 1);
                if self.shared.breaker.on_failure(now) {
                    add(&m.breaker_opens, 1);
                }
            }
            CallError::Refused => {
                add(&m.redis_errors, 1);
                self.shared.breaker.on_success();
            }
        }
        if claim.dry_run {
            let i = self.find_or_insert(now, self.hash(&claim.key), &claim.key);
            let o = self.fallback(now, i, claim.spec.cost, self.shared.config.breaker.cool_down, false);
            return Some(Step::Done { outcome: self.shadow(o), refill: None });
        }
        if claim.one_off {
            // Its request falls to the failure policy, with the key remembered from now on
            // (the local fallback limit is per key).
            sub(&self.metrics.claims_in_flight, 1);
            let i = self.find_or_insert(now, self.hash(&claim.key), &claim.key);
            let o = self.fallback(now, i, claim.spec.cost, self.shared.config.breaker.cool_down, true);
            self.arm(now, i);
            return Some(Step::Done { outcome: self.shadow(o), refill: None });
        }
        let i = self.find_or_insert(now, self.hash(&claim.key), &claim.key);
        let m = &self.metrics;
        let state = &mut self.slots[i].state;
        state.expire(now, m);
        let step = match state.on_claim_error(&claim.spec, m) {
            Some((v, cost)) => Some(self.step(now, i, cost, v)),
            // The request's own claim, already given up: it failed all the same.
            None if !claim.spec.background => {
                let (lease, m) = (&self.shared.config.lease, &self.metrics);
                let v = self.slots[i].state.resume(now, claim.spec.cost, Some(claim.spec.id), lease, m);
                Some(self.step(now, i, claim.spec.cost, v))
            }
            None => None,
        };
        self.arm(now, i);
        step
    }

    /// The reply to a one-off claim decides its request alone. The key stays unremembered (a
    /// refusal is not cached: the key's next request within L, remembered, learns it again).
    fn one_off_reply(&mut self, claim: &Claim<K>, d: &Decision) -> Outcome {
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        sub(&m.claims_in_flight, 1);
        let (cost, sent_at) = (claim.spec.cost, claim.spec.sent_at);
        let granted = d.allowed.min(cost);
        add(&m.units_claimed, granted);
        let base = Outcome {
            limit: Some(d.limit),
            remaining: Some(d.remaining.min(d.limit)),
            reset_after: Some(d.reset_after.into()),
            ..Outcome::plain(false, Source::Redis, None)
        };
        let mut outcome = if granted >= cost {
            add(&m.redis_admits, 1);
            add(&m.units_served, cost);
            let expires_at = sent_at + lease.lease_span(d);
            Outcome {
                allowed: true,
                enforced: true,
                delay: d.delay.map(Nanos::from),
                taken: Some(Taken { units: cost, expires_at, claim_sent_at: sent_at, one_off: true }),
                ..base
            }
        } else {
            // An exact claim is granted all or nothing; anything else counts as lost.
            add(&m.units_expired, granted);
            add(&m.redis_denials, 1);
            let retry_after = d.retry_after.map(|r| Nanos::from(r).max(Nanos::new(1)));
            Outcome { retry_after, ..base }
        };
        self.shadow_in_place(&mut outcome);
        outcome
    }

    /// A return's answer: the units credited, or how it failed (a failed return leaves the
    /// units consumed at the server: the safe direction).
    pub fn on_return(&mut self, now: Nanos, result: Result<u64, CallError>) {
        self.shared.on_return(now, result)
    }

    /// Puts back the units an admitted `outcome` of `key` took (a multi-limit check refused by
    /// another limit, or a request not carried out), at no cost: they serve the next request.
    /// False when nothing went back (nothing taken, or the units would have expired since).
    pub fn refund<Q>(&mut self, now: Nanos, key: &Q, outcome: &Outcome) -> bool
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let hash = self.hash(key);
        let one_off = outcome.taken.filter(|t| t.one_off && outcome.enforced && now < t.expires_at);
        let i = match (self.find(hash, key), one_off) {
            // A one-off claim's units: its key (remembered now, if it is not yet) holds them,
            // its totals counting that claim.
            (found, Some(t)) => {
                let i = found.unwrap_or_else(|| self.insert(now, hash, key));
                self.slots[i].state.adopt_one_off(t.units);
                i
            }
            (Some(i), None) if !outcome.taken.is_some_and(|t| t.one_off) => i,
            (_, None) => {
                // Its key forgotten since, or a one-off claim's units past their lease: served
                // to this request and gone unused, refunded and expired (as `KeyState::refund`
                // counts units too late to serve again), none of a remembered key's.
                if let (Source::Local | Source::Redis, Some(t), true) =
                    (outcome.source, outcome.taken, outcome.enforced)
                {
                    add(&self.metrics.units_refunded, t.units);
                    add(&self.metrics.units_expired, t.units);
                }
                return false;
            }
        };
        let (cfg, m) = (&self.shared.config, &self.metrics);
        let done = match (outcome.source, outcome.taken) {
            (Source::Local | Source::Redis, Some(t)) if outcome.enforced => self.slots[i].state.refund(now, t, m),
            (Source::Fallback, Some(t)) if outcome.enforced => match cfg.policy {
                FailurePolicy::LocalFallback { limit, period, .. } => {
                    self.slots[i].fallback.refund(t.units, limit, period);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        self.arm(now, i);
        done
    }

    /// The step of a verdict on key `i`; the key is armed (its next deadline in the wheel)
    /// before the step is built, so that the step is written once, in place.
    #[inline]
    fn step(&mut self, now: Nanos, i: usize, cost: u64, v: Ruling) -> Step<K> {
        let (outcome, refill) = match v {
            Ruling::Admit { from_claim, refill, delay, taken, held } => {
                // The local path: the refill and the arming first, then the step written once
                // (an admission is never a shadow refusal).
                let refill = self.refill(now, i, refill);
                self.arm(now, i);
                let source = if from_claim { Source::Redis } else { Source::Local };
                let st = &self.slots[i].state;
                return Step::Done {
                    outcome: Outcome {
                        limit: st.capacity(),
                        remaining: st.remaining_with(held),
                        reset_after: st.reset_after(now),
                        delay,
                        taken,
                        ..Outcome::plain(true, source, None)
                    },
                    refill,
                };
            }
            Ruling::Limited { retry_after, by, refill } => {
                let source = match by {
                    LimitedBy::Cache => Source::Cache,
                    LimitedBy::Never => Source::Local,
                    LimitedBy::Redis => Source::Redis,
                };
                (self.known(now, i, false, source, retry_after, None), refill)
            }
            Ruling::Wait { claim } => {
                let until = now + self.shared.config.call_timeout * 3 / 2;
                self.arm(now, i);
                return Step::Wait(Waiter { claim, cost, until });
            }
            Ruling::Claim(c) => match self.shared.breaker.permit(now) {
                Permit::Reject { retry_in } => {
                    self.slots[i].state.cancel_claim(c.id, &self.metrics);
                    (self.fallback(now, i, cost, retry_in, true), None)
                }
                _ => {
                    self.arm(now, i);
                    return Step::Send(self.claim(i, c));
                }
            },
            Ruling::Failed => (self.fallback(now, i, cost, self.shared.config.breaker.cool_down, true), None),
            Ruling::Retry => {
                // on_reply resolves it; any other path treats it as a new decision.
                let (lease, m) = (&self.shared.config.lease, &self.metrics);
                let v = self.slots[i].state.resume(now, cost, None, lease, m);
                return self.step(now, i, cost, v);
            }
        };
        let refill = self.refill(now, i, refill);
        self.arm(now, i);
        let mut outcome = outcome;
        self.shadow_in_place(&mut outcome);
        Step::Done { outcome, refill }
    }

    /// A background refill only when Redis may be called (it may be the half-open probe).
    #[inline]
    fn refill(&mut self, now: Nanos, i: usize, refill: Option<ClaimSpec>) -> Option<Claim<K>> {
        match refill {
            Some(c) if !self.shared.breaker.permit(now).allows_call() => {
                self.slots[i].state.cancel_claim(c.id, &self.metrics);
                None
            }
            Some(c) => Some(self.claim(i, c)),
            None => None,
        }
    }

    fn claim(&self, i: usize, spec: ClaimSpec) -> Claim<K> {
        self.new_claim(self.slots[i].key.clone(), spec, false, false)
    }

    fn known(
        &self,
        now: Nanos,
        i: usize,
        allowed: bool,
        source: Source,
        retry_after: Option<Nanos>,
        delay: Option<Nanos>,
    ) -> Outcome {
        let st = &self.slots[i].state;
        // Refused by the over-limit cache or the pacing hold: nothing is admissible now,
        // whatever the server last reported (it may have units left for other instances).
        let remaining = if source == Source::Cache { st.capacity().map(|_| 0) } else { st.remaining_estimate(now) };
        Outcome {
            limit: st.capacity(),
            remaining,
            reset_after: st.reset_after(now),
            delay,
            ..Outcome::plain(allowed, source, retry_after)
        }
    }

    /// The outcome of a peek answered by a `DRYRUN` reply.
    fn peeked(&self, now: Nanos, claim: &Claim<K>, d: &Decision) -> Outcome {
        let allowed = d.allowed >= claim.spec.cost;
        let held = self.find(self.hash(&claim.key), &claim.key).map_or(0, |i| self.slots[i].state.held_at(now));
        let o = Outcome {
            limit: Some(d.limit),
            remaining: Some(d.remaining.saturating_add(held).min(d.limit)),
            reset_after: Some(d.reset_after.into()),
            delay: d.delay.map(Nanos::from),
            ..Outcome::plain(allowed, Source::Redis, if allowed { None } else { d.retry_after.map(Nanos::from) })
        };
        self.shadow_quiet(o)
    }

    /// Redis cannot decide this request: the failure policy does. `take`: false for a peek
    /// (nothing consumed, nothing counted).
    fn fallback(&mut self, now: Nanos, i: usize, cost: u64, retry_in: Nanos, take: bool) -> Outcome {
        let m = &self.metrics;
        let count = |c| {
            if take {
                add(c, 1)
            }
        };
        match self.shared.config.policy {
            FailurePolicy::FailOpen => {
                count(&m.fail_open_admits);
                Outcome::plain(true, Source::FailOpen, None)
            }
            FailurePolicy::LocalFallback { limit, period, burst } => {
                let bucket = &mut self.slots[i].fallback;
                let mut probe = *bucket;
                let verdict = if take {
                    bucket.check(now, cost, limit, period, burst)
                } else {
                    probe.check(now, cost, limit, period, burst)
                };
                match verdict {
                    Ok(()) => {
                        count(&m.fallback_admits);
                        let taken = Taken { units: cost, expires_at: Nanos::MAX, claim_sent_at: now, one_off: false };
                        Outcome { taken: take.then_some(taken), ..Outcome::plain(true, Source::Fallback, None) }
                    }
                    Err(retry) => {
                        count(&m.fallback_denials);
                        Outcome::plain(false, Source::Fallback, retry)
                    }
                }
            }
            // LocalShare is resolved by the configuration; as a last resort it fails closed.
            FailurePolicy::FailClosed | FailurePolicy::LocalShare => {
                count(&m.fail_closed_denials);
                Outcome::plain(false, Source::FailClosed, Some(retry_in.max(Nanos::new(1))))
            }
        }
    }

    fn shadow(&self, mut o: Outcome) -> Outcome {
        self.shadow_in_place(&mut o);
        o
    }

    /// Shadow mode: a refusal is counted and let through.
    fn shadow_in_place(&self, o: &mut Outcome) {
        if self.shared.config.shadow && !o.allowed {
            add(&self.metrics.shadow_would_blocks, 1);
            o.allowed = true;
        }
    }

    fn shadow_quiet(&self, mut o: Outcome) -> Outcome {
        if self.shared.config.shadow {
            o.allowed = true;
        }
        o
    }

    /// When [`Engine::handle_timeout`] next has work (`None`: no key needs attention; a new
    /// request may bring an earlier deadline, so ask again after each call).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.wheel.next_due()
    }

    /// Housekeeping of the keys whose deadline passed: lost claims given up, expired leases
    /// dropped, the units of idle keys queued for return ([`Engine::poll_transmit`]), keys with
    /// nothing left forgotten. Work is proportional to the keys due, not to the keys
    /// remembered.
    pub fn handle_timeout(&mut self, now: Nanos) {
        // A key moved in the slab by a forgetting is armed again at its (due) deadline: a
        // second pass handles it (a third never has anything, but is allowed).
        for _ in 0..3 {
            if !self.handle_due(now) {
                break;
            }
        }
        // The buffer of due keys is kept for the next call, not at a burst's size.
        self.due.shrink_to(if self.slots.is_empty() { 0 } else { 64 });
    }

    /// One pass of [`Engine::handle_timeout`]; false when nothing was due.
    fn handle_due(&mut self, now: Nanos) -> bool {
        let mut due = std::mem::take(&mut self.due);
        let slots = &self.slots;
        let at_of = |(i, gen): (u32, u32)| {
            slots.get(i as usize).filter(|s| s.gen == gen && !s.armed.is_zero()).map(|s| s.armed)
        };
        self.wheel.pop_due(now, at_of, &mut due);
        let any = !due.is_empty();
        let may_call = !self.shared.breaker.is_open();
        let (shared, metrics) = (Arc::clone(&self.shared), Arc::clone(&self.metrics));
        let (cfg, m) = (&shared.config, &*metrics);
        for (i, gen) in due.drain(..) {
            let i = i as usize;
            if self.slots.get(i).is_none_or(|s| s.gen != gen || s.armed.is_zero() || s.armed > now) {
                continue;
            }
            let slot = &mut self.slots[i];
            slot.armed = Nanos::ZERO;
            slot.state.housekeeping(now, &cfg.lease, may_call, m, &mut self.returns);
            let (key, deadline) = (&slot.key, now + cfg.lease.return_margin);
            self.transmit.extend(self.returns.drain(..).map(|spec| Return { key: key.clone(), spec, deadline }));
            if slot.state.is_forgettable(now, cfg.forget_after) {
                self.remove(now, i);
                continue;
            }
            self.arm(now, i);
            if !may_call && !self.slots[i].state.leases().is_empty() {
                // Idle units could not go back while Redis is unavailable: look again after a
                // cool-down (they expire meanwhile otherwise).
                let slot = &mut self.slots[i];
                let at = now + cfg.breaker.cool_down;
                if at < slot.armed {
                    self.next_gen = self.next_gen.wrapping_add(1);
                    slot.gen = self.next_gen;
                    slot.armed = at;
                    self.wheel.insert(now, at, (i as u32, slot.gen));
                }
            }
        }
        self.due = due;
        any
    }

    /// The next return to send (from housekeeping or an eviction).
    pub fn poll_transmit(&mut self) -> Option<Return<K>> {
        self.transmit.pop_front()
    }

    /// Shutdown: every held unit to give back (and any return still queued).
    pub fn drain(&mut self, now: Nanos) -> Vec<Return<K>> {
        let (lease, m) = (&self.shared.config.lease, &self.metrics);
        let mut out: Vec<Return<K>> = self.transmit.drain(..).collect();
        let deadline = now + lease.return_margin;
        for s in self.slots.iter_mut() {
            s.state.drain(now, lease, m, &mut self.returns);
            out.extend(self.returns.drain(..).map(|spec| Return { key: s.key.clone(), spec, deadline }));
        }
        out
    }
}

impl<K> Drop for Engine<K> {
    /// Its counters stay in the limiter's totals; its gauges go (its keys and claims with it).
    fn drop(&mut self) {
        self.metrics.keys.store(0, std::sync::atomic::Ordering::Relaxed);
        self.metrics.claims_in_flight.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory per remembered key (issue 19: ≤ 200 B with the driver's inline keys): the slot
    /// itself, and its share of the index and the wheel are measured by the benchmark.
    #[test]
    fn a_slot_stays_small() {
        let slot = std::mem::size_of::<Slot<compact_str::CompactString>>();
        eprintln!("slot {slot} B, key state {} B", std::mem::size_of::<KeyState>());
        assert!(slot <= 160, "{slot}");
    }
}
