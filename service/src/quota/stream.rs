//! `StreamRateLimitQuotas`: one task per Envoy stream. It reads usage reports, resolves each
//! new bucket ([`resolve`]), leases limited buckets ([`plan`] says how much and when, the
//! [`QuotaStore`] claims it, [`actions`] builds the push), re-leases them on its own clock
//! (reports come only every 5 s), settles and abandons idle buckets, and answers Redis failures
//! with the domain's failure mode. The task owns its stream's buckets: no lock on the request
//! path; the replica-wide parts are the bucket cap ([`Slots`]) and the count of streams holding
//! each key ([`Sharers`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use redis_ratelimit_client::commands::return_age;
use redis_ratelimit_client::{Decision, Nanos};
use redis_ratelimit_core::MAX_COUNT;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

use super::actions;
use super::buckets::{bucket_key, holders_key, is_window, resolve, BucketKey, Leased, Slot, Slots, Target};
use super::metrics::{add, QuotaMetrics};
use super::plan::{failure_sharers, holder_window, lease_life, local_share, Ledger};
use super::settings::{QuotaSettings, UnknownBuckets};
use super::store::QuotaStore;
use crate::backend::BackendError;
use crate::config::{Config, FailureMode};
use crate::metrics::RuleStats;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use crate::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::service::Service;

/// Claims (and give-backs) of one stream in flight at once.
const CONCURRENT_CALLS: usize = 64;
/// Actions per response (a lease's two actions are never split).
const ACTIONS_PER_RESPONSE: usize = 1024;
/// Responses queued per stream before its task waits for Envoy to read.
const QUEUED_RESPONSES: usize = 8;

/// How many streams of this replica hold a bucket, by Redis key (the even split until the
/// fleet's holders are counted, at least that count; the `local` failure share).
#[derive(Default)]
pub struct Sharers(Mutex<HashMap<String, u64>>);

/// One stream's hold on a key in [`Sharers`], released when dropped.
struct Sharer {
    of: Arc<Sharers>,
    key: String,
}

impl Sharers {
    fn join(self: &Arc<Sharers>, key: &str) -> Sharer {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_default() += 1;
        Sharer { of: self.clone(), key: key.to_string() }
    }

    fn count(&self, key: &str) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied().unwrap_or(0).max(1)
    }
}

impl Drop for Sharer {
    fn drop(&mut self) {
        let mut m = self.of.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// The quota service of one replica.
pub struct QuotaService {
    service: Arc<Service>,
    store: Arc<dyn QuotaStore>,
    pub settings: QuotaSettings,
    slots: Arc<Slots>,
    sharers: Arc<Sharers>,
    pub metrics: Arc<QuotaMetrics>,
    epoch: Instant,
    stop: watch::Receiver<bool>,
}

impl QuotaService {
    /// `stop` turning true ends every stream (UNAVAILABLE): Envoy keeps its leases until
    /// their TTL and reconnects at its next report tick, to this replica or another.
    pub fn new(
        service: Arc<Service>,
        store: Arc<dyn QuotaStore>,
        settings: QuotaSettings,
        stop: watch::Receiver<bool>,
    ) -> Arc<QuotaService> {
        Arc::new(QuotaService {
            service,
            store,
            slots: Slots::new(settings.max_buckets),
            settings,
            sharers: Arc::default(),
            metrics: Arc::default(),
            epoch: Instant::now(),
            stop,
        })
    }

    /// The gRPC service, with the largest report accepted.
    pub fn server(self: &Arc<Self>) -> RateLimitQuotaServiceServer<QuotaServer> {
        RateLimitQuotaServiceServer::new(QuotaServer(self.clone()))
            .max_decoding_message_size(self.settings.max_report_bytes)
    }

    /// `/metrics` text.
    pub fn render_metrics(&self) -> String {
        self.metrics.render(self.slots.used() as u64)
    }

    fn now(&self) -> Nanos {
        Nanos::from(self.epoch.elapsed())
    }

    fn instant(&self, t: Nanos) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.epoch + Duration::from(t))
    }
}

/// The tonic service.
pub struct QuotaServer(Arc<QuotaService>);

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

/// A channel's receiver as a stream.
pub fn receiver_stream<T: Send + 'static>(mut rx: mpsc::Receiver<T>) -> Pin<Box<dyn Stream<Item = T> + Send>> {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaServer {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let (tx, rx) = mpsc::channel(QUEUED_RESPONSES);
        tokio::spawn(run(self.0.clone(), request.into_inner(), tx));
        Ok(Response::new(receiver_stream(rx)))
    }
}

/// One tracked bucket of a stream.
struct Bucket {
    /// As Envoy sent it (echoed in every action).
    id: BucketId,
    /// The configuration it was resolved with (held: compared by pointer, never reused).
    config: Option<Arc<Config>>,
    target: Target,
    ledger: Ledger,
    /// When its static action was last pushed.
    static_at: Option<Nanos>,
    seq: u64,
    _slot: Slot,
    _sharer: Option<Sharer>,
}

/// A bucket's actions (kept together in one response).
type Group = Vec<BucketAction>;

struct StreamState {
    q: Arc<QuotaService>,
    domain: Option<String>,
    buckets: HashMap<BucketKey, Bucket>,
    /// Leases due, by time (stale entries skipped: a bucket's `ledger.next` says).
    due: BinaryHeap<Reverse<(Nanos, u64)>>,
    by_seq: HashMap<u64, BucketKey>,
    next_seq: u64,
    /// Said once per stream: a failing Redis, a refused bucket.
    warned_redis: bool,
    warned_full: bool,
    warned_holders: bool,
}

/// Counts one open stream while it lives.
struct Open(Arc<QuotaMetrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn run(
    q: Arc<QuotaService>,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    add(&q.metrics.streams, 1);
    add(&q.metrics.streams_total, 1);
    let _open = Open(q.metrics.clone());
    let mut stop = q.stop.clone();
    let mut s = StreamState {
        q: q.clone(),
        domain: None,
        buckets: HashMap::new(),
        due: BinaryHeap::new(),
        by_seq: HashMap::new(),
        next_seq: 0,
        warned_redis: false,
        warned_full: false,
        warned_holders: false,
    };
    let end = loop {
        let next = s.due.peek().map(|Reverse((t, _))| *t);
        let wake = async {
            match next {
                Some(t) => tokio::time::sleep_until(q.instant(t)).await,
                None => std::future::pending().await,
            }
        };
        let groups = tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(r)) => s.report(r).await,
                Ok(None) => break None,
                Err(e) => {
                    tracing::warn!(
                        "quota stream of domain '{}' ended: {e} (a report over QUOTA_MAX_REPORT_BYTES = {} ends it)",
                        s.domain.as_deref().unwrap_or(""),
                        q.settings.max_report_bytes
                    );
                    // A report too large (tonic: OUT_OF_RANGE) is refused as RESOURCE_EXHAUSTED;
                    // any other error is passed on (the client may be gone: then unheard).
                    let status = match e.code() {
                        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => {
                            Status::resource_exhausted(format!("usage report refused: {}", e.message()))
                        }
                        _ => e,
                    };
                    break Some(status);
                }
            },
            _ = wake => s.refresh_due().await,
            _ = async { let _ = stop.wait_for(|v| *v).await; } => break Some(Status::unavailable("the rate limit service is shutting down")),
        };
        if !send(&tx, groups).await {
            break None;
        }
    };
    if let Some(status) = end {
        let _ = tx.send(Err(status)).await;
    }
}

/// Sends the groups in responses of at most [`ACTIONS_PER_RESPONSE`] actions; false when the
/// stream is gone.
async fn send(tx: &mpsc::Sender<Result<RateLimitQuotaResponse, Status>>, groups: Vec<Group>) -> bool {
    let mut batch: Vec<BucketAction> = Vec::new();
    for g in groups {
        if !batch.is_empty()
            && batch.len() + g.len() > ACTIONS_PER_RESPONSE
            && tx.send(Ok(RateLimitQuotaResponse { bucket_action: std::mem::take(&mut batch) })).await.is_err()
        {
            return false;
        }
        batch.extend(g);
    }
    batch.is_empty() || tx.send(Ok(RateLimitQuotaResponse { bucket_action: batch })).await.is_ok()
}

fn same_config(a: &Option<Arc<Config>>, b: &Option<Arc<Config>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

fn count_stats(stats: &RuleStats, allowed: u64, denied: u64) {
    add(&stats.total_hits, allowed.saturating_add(denied));
    add(&stats.within_limit, allowed);
    add(&stats.over_limit, denied);
}

impl StreamState {
    fn settings(&self) -> &QuotaSettings {
        &self.q.settings
    }

    fn schedule(&mut self, key: &BucketKey) {
        if let Some(b) = self.buckets.get(key) {
            self.due.push(Reverse((b.ledger.next, b.seq)));
        }
    }

    fn remove(&mut self, key: &BucketKey) -> Option<Bucket> {
        let b = self.buckets.remove(key)?;
        self.by_seq.remove(&b.seq);
        Some(b)
    }

    /// The action of a bucket that needs no lease, if it has one.
    fn static_action(&self, target: &Target, id: &BucketId) -> Option<BucketAction> {
        let ttl = self.settings().static_ttl;
        match target {
            Target::Unknown | Target::Invalid(_) => Some(match self.settings().unknown {
                UnknownBuckets::Allow => actions::allow_all(id, ttl),
                UnknownBuckets::Deny => actions::deny_all(id, ttl),
            }),
            Target::Unlimited(_) | Target::Shadow(_) => Some(actions::allow_all(id, ttl)),
            Target::Refused(_) => Some(actions::deny_all(id, ttl)),
            Target::Leased(_) => None,
        }
    }

    /// What a bucket gets when Redis cannot serve it (a failed claim, or no room to track
    /// it): its domain's failure mode, for `ttl`; `holders`: the bucket's holders in the fleet
    /// as last counted, if ever.
    fn failure_action(&self, l: &Leased, id: &BucketId, ttl: Nanos, holders: Option<u64>) -> Option<BucketAction> {
        let m = &self.q.metrics;
        match l.mode {
            FailureMode::Closed => {
                add(&m.deny_assignments, 1);
                Some(actions::deny_all(id, ttl))
            }
            FailureMode::Open => {
                add(&m.allow_assignments, 1);
                Some(actions::allow_all(id, ttl))
            }
            FailureMode::Local => {
                add(&m.local_assignments, 1);
                let sharers = failure_sharers(holders, self.q.sharers.count(&l.key), self.settings().instances);
                Some(actions::token_bucket(id, local_share(&l.rate, sharers), ttl))
            }
            // Envoy decides: the lease runs out, its expired/no-assignment behaviour applies.
            FailureMode::Error => None,
        }
    }

    /// Handles a report; returns the actions to push.
    async fn report(&mut self, r: RateLimitQuotaUsageReports) -> Vec<Group> {
        let q = self.q.clone();
        let now = q.now();
        add(&q.metrics.reports, 1);
        add(&q.metrics.usages, r.bucket_quota_usages.len() as u64);
        if self.domain.is_none() {
            self.domain = Some(r.domain.clone());
        } else if self.domain.as_deref() != Some(r.domain.as_str()) && !r.domain.is_empty() {
            tracing::warn!(
                "quota stream: a report for domain '{}' on a stream of domain '{}' (kept: a stream has one domain)",
                r.domain,
                self.domain.as_deref().unwrap_or("")
            );
        }
        let domain = self.domain.clone().unwrap_or_default();
        let config = q.service.config();
        let params = self.settings().params;
        let mut groups: Vec<Group> = Vec::new();
        let mut to_lease: Vec<BucketKey> = Vec::new();
        let mut after: Vec<AfterReport> = Vec::new();
        for u in r.bucket_quota_usages {
            let Some(id) = u.bucket_id else {
                add(&q.metrics.invalid_buckets, 1);
                continue;
            };
            let (allowed, denied) = (u.num_requests_allowed, u.num_requests_denied);
            add(&q.metrics.admitted, allowed);
            add(&q.metrics.denied, denied);
            let key = bucket_key(&id.bucket);
            if !self.buckets.contains_key(&key) {
                if let Some(g) = self.new_bucket(&domain, &config, key.clone(), id, allowed, denied, now, &mut to_lease)
                {
                    groups.push(g);
                }
                continue;
            }
            // A reloaded configuration: resolve again.
            if !same_config(&self.buckets[&key].config, &config) {
                self.retarget(&domain, &config, &key, now, &mut groups, &mut to_lease);
            }
            let b = self.buckets.get_mut(&key).expect("present");
            let idle;
            match &b.target {
                Target::Leased(l) => {
                    count_stats(&l.stats, allowed, denied);
                    let s = b.ledger.report(&params, now, allowed, denied);
                    idle = s.idle;
                    if l.limit.algorithm().returnable() {
                        // Each return aged from the send of the oldest claim it covers; the
                        // window's apart, so that its age stays within its window.
                        for (units, age) in [(s.give_back, s.age), (s.window_give_back, s.window_age)] {
                            if units > 0 {
                                let claimed = now - age;
                                after.push(AfterReport::GiveBack { key: l.key.clone(), units, claimed });
                            }
                        }
                    }
                }
                Target::Shadow(l) => {
                    add(&l.stats.total_hits, allowed.saturating_add(denied));
                    idle = b.ledger.report(&params, now, allowed, denied).idle;
                    if allowed > 0 {
                        after.push(AfterReport::Charge { leased: l.clone(), units: allowed.min(MAX_COUNT) });
                    }
                }
                Target::Unlimited(st) | Target::Refused(st) => {
                    count_stats(st, allowed, denied);
                    idle = b.ledger.report(&params, now, allowed, denied).idle;
                }
                Target::Unknown | Target::Invalid(_) => idle = b.ledger.report(&params, now, allowed, denied).idle,
            }
            if idle {
                let b = self.remove(&key).expect("present");
                add(&q.metrics.abandons, 1);
                groups.push(vec![actions::abandon(&b.id)]);
                continue;
            }
            // Static actions are pushed again once half their TTL is gone.
            let b = &self.buckets[&key];
            let stale = b.static_at.is_none_or(|t| now - t >= self.settings().static_ttl / 2);
            if stale {
                if let Some(a) = self.static_action(&b.target, &b.id) {
                    add(&q.metrics.static_assignments, 1);
                    groups.push(vec![a]);
                    self.buckets.get_mut(&key).expect("present").static_at = Some(now);
                }
            }
        }
        groups.extend(self.lease(to_lease).await);
        if !after.is_empty() {
            // Give-backs and shadow charges need no answer to Envoy: off the stream's path.
            tokio::spawn(settle(q.clone(), after));
        }
        groups
    }

    /// A bucket seen for the first time on this stream.
    #[allow(clippy::too_many_arguments)]
    fn new_bucket(
        &mut self,
        domain: &str,
        config: &Option<Arc<Config>>,
        key: BucketKey,
        id: BucketId,
        allowed: u64,
        denied: u64,
        now: Nanos,
        to_lease: &mut Vec<BucketKey>,
    ) -> Option<Group> {
        let q = self.q.clone();
        let (target, ambiguous) = resolve(config.as_deref(), domain, &key, &self.settings().keys, &q.service.metrics);
        if ambiguous {
            add(&q.metrics.ambiguous_buckets, 1);
            tracing::warn!(
                "quota bucket {key:?} of domain '{domain}' matches rules in two orders of its entries; the first by key order is used"
            );
        }
        match &target {
            Target::Unknown => add(&q.metrics.unknown_buckets, 1),
            Target::Invalid(why) => {
                add(&q.metrics.invalid_buckets, 1);
                tracing::warn!("quota bucket of domain '{domain}' refused: {why}");
            }
            _ => {}
        }
        if allowed == 0 && denied == 0 {
            // Known to Envoy but idle (a stream's first report after a reconnect): not leased;
            // abandoned, its next request starts it again.
            add(&q.metrics.abandons, 1);
            return Some(vec![actions::abandon(&id)]);
        }
        let Some(slot) = q.slots.take() else {
            add(&q.metrics.buckets_refused, 1);
            if !self.warned_full {
                self.warned_full = true;
                tracing::warn!(
                    "quota: QUOTA_MAX_BUCKETS ({}) buckets tracked; new buckets get their failure mode's action (domain '{domain}')",
                    self.settings().max_buckets
                );
            }
            return match &target {
                Target::Leased(l) => self.failure_action(l, &id, self.settings().static_ttl, None).map(|a| vec![a]),
                t => self.static_action(t, &id).map(|a| vec![a]),
            };
        };
        let sharer = match &target {
            Target::Leased(l) => Some(q.sharers.join(&l.key)),
            _ => None,
        };
        let mut ledger = Ledger::default();
        let params = self.settings().params;
        ledger.report(&params, now, allowed, denied);
        match &target {
            Target::Leased(l) => count_stats(&l.stats, allowed, denied),
            Target::Unlimited(st) | Target::Refused(st) => count_stats(st, allowed, denied),
            _ => {}
        }
        let group = match &target {
            Target::Leased(_) => {
                to_lease.push(key.clone());
                None
            }
            t => {
                add(&q.metrics.static_assignments, 1);
                self.static_action(t, &id).map(|a| vec![a])
            }
        };
        if let Target::Shadow(l) = &target {
            if allowed > 0 {
                tokio::spawn(settle(
                    q.clone(),
                    vec![AfterReport::Charge { leased: l.clone(), units: allowed.min(MAX_COUNT) }],
                ));
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let static_at = group.as_ref().map(|_| now);
        self.by_seq.insert(seq, key.clone());
        self.buckets.insert(
            key,
            Bucket { id, config: config.clone(), target, ledger, static_at, seq, _slot: slot, _sharer: sharer },
        );
        group
    }

    /// A bucket whose configuration changed: resolved again; a new target starts over (a new
    /// lease at once, or its static action).
    fn retarget(
        &mut self,
        domain: &str,
        config: &Option<Arc<Config>>,
        key: &BucketKey,
        now: Nanos,
        groups: &mut Vec<Group>,
        to_lease: &mut Vec<BucketKey>,
    ) {
        let q = self.q.clone();
        let (target, _) = resolve(config.as_deref(), domain, key, &self.settings().keys, &q.service.metrics);
        let b = self.buckets.get_mut(key).expect("present");
        b.config = config.clone();
        let same = match (&b.target, &target) {
            (Target::Leased(a), Target::Leased(b)) | (Target::Shadow(a), Target::Shadow(b)) => {
                a.key == b.key && a.limit == b.limit && a.mode == b.mode
            }
            (Target::Unknown, Target::Unknown) | (Target::Unlimited(_), Target::Unlimited(_)) => true,
            (Target::Refused(_), Target::Refused(_)) => true,
            _ => false,
        };
        if same {
            b.target = target;
            return;
        }
        b._sharer = match &target {
            Target::Leased(l) => Some(q.sharers.join(&l.key)),
            _ => None,
        };
        b.target = target;
        b.static_at = None;
        let demand = (b.ledger.demand, b.ledger.last_report);
        b.ledger = Ledger { demand: demand.0, last_report: demand.1, ..Ledger::default() };
        if matches!(b.target, Target::Leased(_)) {
            to_lease.push(key.clone());
        } else if let Some(a) = self.static_action(&self.buckets[key].target, &self.buckets[key].id) {
            add(&q.metrics.static_assignments, 1);
            groups.push(vec![a]);
            self.buckets.get_mut(key).expect("present").static_at = Some(now);
        }
    }

    /// The leases due now.
    async fn refresh_due(&mut self) -> Vec<Group> {
        let now = self.q.now();
        let mut keys = Vec::new();
        while let Some(&Reverse((t, seq))) = self.due.peek() {
            if t > now {
                break;
            }
            self.due.pop();
            if let Some(k) = self.by_seq.get(&seq) {
                if self.buckets.get(k).is_some_and(|b| b.ledger.next == t && matches!(b.target, Target::Leased(_))) {
                    keys.push(k.clone());
                }
            }
        }
        self.lease(keys).await
    }

    /// Claims and pushes a new lease for each bucket (claims concurrently).
    async fn lease(&mut self, keys: Vec<BucketKey>) -> Vec<Group> {
        if keys.is_empty() {
            return Vec::new();
        }
        let q = self.q.clone();
        let params = self.settings().params;
        let deadline = self.settings().timeout();
        let now = q.now();
        let jobs: Vec<Job> = keys
            .into_iter()
            .filter_map(|k| {
                let b = self.buckets.get_mut(&k)?;
                let Target::Leased(l) = &b.target else { return None };
                let sharers = b.ledger.sharers(&params, &l.rate, q.sharers.count(&l.key), now);
                let want = b.ledger.want(&params, &l.rate, sharers);
                let held = b.ledger.hold(&params, &l.rate, now);
                let l = l.clone();
                Some((k, l, want, held))
            })
            .collect();
        let store = q.store.clone();
        let results: Vec<Claimed> = futures::stream::iter(jobs)
            .map(|(k, l, want, held)| {
                let (store, q) = (store.clone(), q.clone());
                async move {
                    let sent = q.now();
                    // The holder count goes with the claim, within its deadline; its failure
                    // fails nothing (the last count, then the local one, sizes the leases).
                    let holders = holders_key(&l.key);
                    let window = holder_window(&params, &l.rate);
                    let (r, h) = futures::join!(
                        store.claim(&l.key, &l.limit, want, deadline),
                        store.count_holders(&holders, held, window, deadline)
                    );
                    (k, l, want, sent, r, h)
                }
            })
            .buffer_unordered(CONCURRENT_CALLS)
            .collect()
            .await;
        let pushed = q.now();
        let mut groups = Vec::with_capacity(results.len());
        let mut failed: Option<BackendError> = None;
        for (k, l, want, sent, r, h) in results {
            let Some(b) = self.buckets.get_mut(&k) else { continue };
            let life = lease_life(&params, &l.rate);
            match h {
                Ok(held) => b.ledger.counted(&params, &l.rate, held, pushed),
                Err(e) => {
                    add(&q.metrics.holder_counts_failed, 1);
                    // Said when it fails alone (a Redis user not granted RL.SLIDING); a Redis
                    // that answers nothing is said below.
                    if r.is_ok() && !self.warned_holders {
                        self.warned_holders = true;
                        tracing::warn!(
                            "quota: counting the holders of {} in Redis failed ({e}); leases split by this replica's streams until it works",
                            l.key
                        );
                    }
                }
            }
            match r {
                Ok(d) => {
                    let granted = d.allowed.min(want);
                    add(&q.metrics.units_claimed, want);
                    add(&q.metrics.units_granted, granted);
                    let window_end = is_window(l.limit.algorithm()).then(|| pushed + Nanos::from(d.reset_after));
                    b.ledger.pushed(&params, &l.rate, sent, pushed, granted, window_end);
                    b.ledger.answered(&params, &l.rate, want, granted, d.remaining);
                    let m = if granted > 0 { &q.metrics.lease_assignments } else { &q.metrics.deny_assignments };
                    add(m, 1);
                    groups.push(actions::lease(&b.id, granted, life));
                }
                Err(e) => {
                    add(&q.metrics.claims_failed, 1);
                    b.ledger.pushed_nothing(&params, pushed);
                    let id = b.id.clone();
                    let holders = b.ledger.holders.map(|(n, _)| n);
                    if let Some(a) = self.failure_action(&l, &id, life, holders) {
                        groups.push(vec![a]);
                    }
                    failed = Some(e);
                }
            }
            self.schedule(&k);
        }
        match failed {
            Some(e) if !self.warned_redis => {
                self.warned_redis = true;
                tracing::warn!(
                    "quota leases of domain '{}': Redis did not answer ({e}); the domain's failure mode decides until it does",
                    self.domain.as_deref().unwrap_or("")
                );
            }
            None if self.warned_redis => {
                self.warned_redis = false;
                tracing::info!(
                    "quota leases of domain '{}': Redis answers again",
                    self.domain.as_deref().unwrap_or("")
                );
            }
            _ => {}
        }
        groups
    }
}

/// A claim to send: the bucket, its limit, the units to ask, the holder-time to charge.
type Job = (BucketKey, Leased, u64, Nanos);
/// A claim's outcome: the bucket, its limit, the units asked, when it was sent, the answer,
/// and the holder counter's (ms of holder-time in its window).
type Claimed = (BucketKey, Leased, u64, Nanos, Result<Decision, BackendError>, Result<u64, BackendError>);

/// Redis work a report leads to that Envoy does not wait for.
enum AfterReport {
    /// Units of ended, unused leases given back; `claimed`: when the oldest of their claims
    /// was sent.
    GiveBack { key: String, units: u64, claimed: Nanos },
    /// A shadow-mode bucket's admitted requests, charged to its limit afterwards; what the
    /// limit refuses is counted as shadow-mode breaches.
    Charge { leased: Leased, units: u64 },
}

async fn settle(q: Arc<QuotaService>, work: Vec<AfterReport>) {
    let deadline = q.settings.timeout();
    futures::stream::iter(work)
        .for_each_concurrent(CONCURRENT_CALLS, |w| {
            let q = q.clone();
            async move {
                match w {
                    AfterReport::GiveBack { key, units, claimed } => {
                        // AGE by the one rule: since the claim was sent, plus this return's
                        // transit (at most the deadline: `Params::timeout`, which the ledger's
                        // window settling counts on).
                        let age = return_age(claimed, q.now(), q.settings.params.timeout);
                        match q.store.give_back(&key, units, age, deadline).await {
                            Ok(credited) => add(&q.metrics.units_returned, credited),
                            Err(e) => tracing::debug!("quota: RL.RETURN {key} {units} failed: {e}"),
                        }
                    }
                    AfterReport::Charge { leased, units } => {
                        match q.store.claim(&leased.key, &leased.limit, units, deadline).await {
                            Ok(d) => {
                                let over = units.saturating_sub(d.allowed);
                                add(&leased.stats.within_limit, units - over);
                                add(&leased.stats.over_limit, over);
                                add(&leased.stats.shadow_mode, over);
                            }
                            Err(e) => tracing::debug!("quota: shadow-mode charge of {} failed: {e}", leased.key),
                        }
                    }
                }
            }
        })
        .await;
}
