//! `ShouldRateLimit`: a request's descriptors matched against the configuration (as
//! envoyproxy/ratelimit matches them), decided together by the backend, counted, and answered
//! with one status per descriptor, the overall code and the response headers; the failure
//! policy of the domain when Redis cannot answer.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis_ratelimit_client::policy::LocalBucket;
use redis_ratelimit_client::spec::{Algorithm, Limit};
use redis_ratelimit_client::Nanos;

use crate::backend::{Backend, BackendError, CheckResult, DescriptorCheck, RequestResult};
use crate::config::{unit_period, Config, FailureMode, Matched, Rule};
use crate::decision::{settle, Action, Answer, Plan};
use crate::headers::{self, HeaderMode, LimitStatus};
use crate::leases::{LeaseConn, Leases};
use crate::metrics::{Metrics, RuleStats, StatKey};
use crate::pb::{self, Code, DescriptorStatus, RateLimitRequest, RateLimitResponse, Unit};
use redis_ratelimit_client::{check_all, Limiter};

/// The largest hits a descriptor may add: the module's largest COST (10^15).
pub const MAX_HITS_ADDEND: u64 = redis_ratelimit_core::MAX_COUNT;
/// At most this many descriptors per request, entries per descriptor, bytes per key or value.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 32;
pub const MAX_ENTRY_BYTES: usize = 4096;

/// What the service needs from its settings.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// `NEAR_LIMIT_RATIO` (0.8).
    pub near_limit_ratio: f64,
    /// `SHADOW_MODE`: every refusal answered OK (and counted).
    pub global_shadow_mode: bool,
    pub headers: HeaderMode,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Redis Cluster: give every key of a domain one hash tag (one slot per domain).
    pub hash_tag_domain: bool,
    /// The failure mode of domains that set none.
    pub failure_mode: FailureMode,
    /// Service instances sharing the limits (the local fallback admits limit ÷ instances).
    pub instances: u64,
    /// `DEADLINE_MARGIN`: a gRPC call is answered this long before its `grpc-timeout` ends.
    pub deadline_margin: Duration,
}

/// `DEADLINE_MARGIN`'s default (settings.rs has the flag's; docs/service.md, Failures, the
/// measurement).
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(10);

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            near_limit_ratio: 0.8,
            global_shadow_mode: false,
            headers: HeaderMode::Draft,
            key_prefix: "rls:".into(),
            hash_tag_domain: false,
            failure_mode: FailureMode::Error,
            instances: 1,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
        }
    }
}

/// Why a call is answered with an error instead of a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// INVALID_ARGUMENT: a bad request; no limit was touched.
    Invalid(String),
    /// UNAVAILABLE: Redis could not answer and the domain's failure mode is `error` (Envoy's
    /// `failure_mode_deny` decides).
    Unavailable(String),
    /// INTERNAL / service error (no configuration loaded).
    Internal(String),
}

/// One descriptor's decision in a request: what it matched, its hits, and how it is decided
/// (its result: the verdict of its check, or its kind's fixed answer).
enum Item {
    /// No rule: OK, nothing counted.
    NoRule,
    /// `unlimited`: OK, without Redis.
    Unlimited,
    Limited {
        m: Matched,
        cost: u64,
        how: How,
    },
}

/// How a limited descriptor is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// Never admissible (a limit of 0, or more hits than its capacity): refused without asking
    /// anyone.
    RefusedLocally,
    /// By the request's check `i` (its key's; two descriptors of one key share it): per request,
    /// or from a lease when the check leases.
    Checked(usize),
}

/// Local token buckets for the `local` failure mode, sharded, bounded.
struct LocalFallback {
    shards: Vec<Mutex<HashMap<String, LocalBucket>>>,
    cap_per_shard: usize,
}

impl LocalFallback {
    fn new() -> LocalFallback {
        LocalFallback { shards: (0..32).map(|_| Mutex::new(HashMap::new())).collect(), cap_per_shard: 4096 }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, LocalBucket>> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        &self.shards[(h.finish() as usize) % self.shards.len()]
    }
}

pub struct Service {
    config: RwLock<Option<Arc<Config>>>,
    backend: Arc<Backend>,
    pub metrics: Arc<Metrics>,
    settings: ServiceSettings,
    local: LocalFallback,
    epoch: Instant,
    leases: Option<Arc<Leases>>,
}

/// A Redis key component, escaped so that keys are unambiguous and carry no accidental hash
/// tag: `%`, `|`, `=`, `{`, `}` are percent-encoded.
fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            '=' => out.push_str("%3D"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            _ => out.push(c),
        }
    }
}

/// The Redis key of a descriptor: `<prefix><algorithm>:<domain>|k=v|k=v` (with
/// `share_threshold`, the wildcard pattern instead of the value), or on Redis Cluster with
/// domain hash tags `<prefix>{<domain>}<algorithm>|k=v…`.
pub fn redis_key(
    prefix: &str,
    tag_domain: bool,
    algorithm: Algorithm,
    domain: &str,
    entries: &[(&str, &str)],
    share: &[Option<String>],
) -> String {
    let mut k = String::with_capacity(
        prefix.len() + domain.len() + 16 + entries.iter().map(|(a, b)| a.len() + b.len() + 2).sum::<usize>(),
    );
    k.push_str(prefix);
    if tag_domain {
        k.push('{');
        escape(&mut k, domain);
        k.push('}');
        k.push_str(algorithm.config_name());
    } else {
        k.push_str(algorithm.config_name());
        k.push(':');
        escape(&mut k, domain);
    }
    for (i, (key, value)) in entries.iter().enumerate() {
        k.push('|');
        escape(&mut k, key);
        k.push('=');
        match share.get(i).and_then(|p| p.as_deref()) {
            Some(p) => escape(&mut k, p),
            None => escape(&mut k, value),
        }
    }
    k
}

/// The checks a request is invalid for, before anything is touched.
pub fn validate(req: &RateLimitRequest) -> Result<(), String> {
    if req.domain.is_empty() {
        return Err("rate limit domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return Err("rate limit descriptor list must not be empty".into());
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(format!("{} descriptors: at most {MAX_DESCRIPTORS} per request", req.descriptors.len()));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(format!("descriptor {i} has no entries"));
        }
        if d.entries.len() > MAX_ENTRIES {
            return Err(format!("descriptor {i} has {} entries: at most {MAX_ENTRIES}", d.entries.len()));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return Err(format!("descriptor {i} entry {j} has an empty key"));
            }
            if e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES {
                return Err(format!("descriptor {i} entry {j}: keys and values are at most {MAX_ENTRY_BYTES} bytes"));
            }
        }
        if let Some(h) = d.hits_addend {
            if h > MAX_HITS_ADDEND {
                return Err(format!("descriptor {i} hits_addend {h} is above {MAX_HITS_ADDEND}"));
            }
        }
        if let Some(l) = &d.limit {
            if pb::RateLimitUnit::try_from(l.unit).unwrap_or(pb::RateLimitUnit::Unknown) == pb::RateLimitUnit::Unknown {
                return Err(format!("descriptor {i} limit override has no valid unit"));
            }
        }
    }
    Ok(())
}

/// The hits each descriptor adds (envoyproxy/ratelimit's `GetHitsAddends`): the descriptor's
/// own when set (0 allowed: a peek), else the request's, 0 meaning 1.
fn hits(req: &RateLimitRequest, i: usize) -> u64 {
    match req.descriptors[i].hits_addend {
        Some(h) => h,
        None => u64::from(req.hits_addend.max(1)),
    }
}

fn override_unit(u: i32) -> Unit {
    match pb::RateLimitUnit::try_from(u).unwrap_or(pb::RateLimitUnit::Unknown) {
        pb::RateLimitUnit::Second => Unit::Second,
        pb::RateLimitUnit::Minute => Unit::Minute,
        pb::RateLimitUnit::Hour => Unit::Hour,
        pb::RateLimitUnit::Day => Unit::Day,
        pb::RateLimitUnit::Month => Unit::Month,
        pb::RateLimitUnit::Year => Unit::Year,
        pb::RateLimitUnit::Unknown => Unit::Unknown,
    }
}

/// `duration_until_reset` in whole seconds, rounded up (issue 31.12): Envoy renders
/// `x-ratelimit-reset` from the `seconds` alone, dropping `nanos`, and envoyproxy/ratelimit
/// sends whole seconds; never early.
fn duration(d: Duration) -> prost_types::Duration {
    let seconds = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    prost_types::Duration { seconds: seconds.min(i64::MAX as u64) as i64, nanos: 0 }
}

/// An override's key carries its limit (`|=<requests_per_unit>/<unit>`; no entry makes `|=`,
/// an entry's key being non-empty with `=` escaped): an override and a configured rule on the
/// same entries, or two overrides of different limits, count apart, each against its own
/// limit. (envoyproxy/ratelimit shares one counter between them, each comparing it with its
/// own limit; here a key's state is its limit's, so they cannot share.)
fn override_key(key: &mut String, o: &pb::RateLimitOverride) {
    use std::fmt::Write;
    let unit = pb::RateLimitUnit::try_from(o.unit).unwrap_or(pb::RateLimitUnit::Unknown);
    let _ = write!(key, "|={}/{}", o.requests_per_unit, unit.as_str_name().to_ascii_lowercase());
}

impl Service {
    pub fn new(backend: Arc<Backend>, metrics: Arc<Metrics>, settings: ServiceSettings) -> Service {
        Service {
            config: RwLock::new(None),
            backend,
            metrics,
            settings,
            local: LocalFallback::new(),
            leases: None,
            epoch: Instant::now(),
        }
    }

    /// Serves leasable rules from leases (see [`crate::leases`]).
    pub fn with_leases(mut self, leases: Arc<Leases>) -> Service {
        self.leases = Some(leases);
        self
    }

    pub fn leases(&self) -> Option<&Arc<Leases>> {
        self.leases.as_ref()
    }

    pub fn settings(&self) -> &ServiceSettings {
        &self.settings
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// Installs a new configuration (requests in flight keep the one they started with).
    pub fn set_config(&self, c: Arc<Config>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    pub fn config(&self) -> Option<Arc<Config>> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn override_rule(&self, domain: &str, d: &pb::RateLimitDescriptor) -> Option<Matched> {
        let l = d.limit.as_ref()?;
        let unit = override_unit(l.unit);
        let period = unit_period(unit)?;
        let comps: Vec<String> = d
            .entries
            .iter()
            .map(|e| if e.value.is_empty() { e.key.clone() } else { format!("{}_{}", e.key, e.value) })
            .collect();
        let key = StatKey::new(domain.to_string(), comps);
        let stats = self
            .metrics
            .try_rule_stats(&key, true)
            .unwrap_or_else(|| self.metrics.rule_stats(&StatKey::new(domain.to_string(), vec!["_override".into()])));
        let rule = Arc::new(Rule {
            stat_key: key,
            name: String::new(),
            replaces: Vec::new(),
            unlimited: false,
            shadow_mode: false,
            detailed_metric: false,
            requests_per_unit: l.requests_per_unit,
            unit,
            period,
            algorithm: Algorithm::Fixed,
            // (A unit's period, and a u32 count: a valid limit unless 0.)
            limit: Limit::fixed(u64::from(l.requests_per_unit), period).ok(),
            lease: None,
            stats: stats.clone(),
        });
        Some(Matched { rule, stats, share_patterns: Vec::new() })
    }

    /// Decides one request, answering before `deadline` (the caller's, less the margin; see
    /// [`Service::deadline`]): Redis not done by then is Redis unable to answer, decided by the
    /// domain's failure mode. Without one, each Redis call has `REDIS_TIMEOUT`.
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<RateLimitResponse, RequestError> {
        let started = Instant::now();
        self.metrics.total_requests.fetch_add(1, Relaxed);
        let r = self.decide(req, deadline).await;
        match &r {
            Err(RequestError::Invalid(_)) => self.metrics.invalid_argument.fetch_add(1, Relaxed),
            Err(RequestError::Unavailable(_)) => self.metrics.redis_error.fetch_add(1, Relaxed),
            Err(RequestError::Internal(_)) => self.metrics.service_error.fetch_add(1, Relaxed),
            Ok(_) => 0,
        };
        self.metrics.response_time.observe(started.elapsed());
        r
    }

    /// The deadline of a call received now whose caller gives up after `timeout` (gRPC's
    /// `grpc-timeout`, which Envoy sets to its filter's `timeout`): `DEADLINE_MARGIN` earlier,
    /// for the answer's way back.
    pub fn deadline(&self, timeout: Duration) -> tokio::time::Instant {
        tokio::time::Instant::now() + timeout.saturating_sub(self.settings.deadline_margin)
    }

    async fn decide(
        &self,
        req: &RateLimitRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<RateLimitResponse, RequestError> {
        validate(req).map_err(RequestError::Invalid)?;
        let config =
            self.config().ok_or_else(|| RequestError::Internal("no rate limit configuration loaded".into()))?;
        let domain = req.domain.as_str();
        let known_domain = config.domains.contains_key(domain);
        let entries: Vec<Vec<(&str, &str)>> = req
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect())
            .collect();

        // Match, then drop the limits another matched limit replaces.
        let mut matched: Vec<Option<Matched>> = req
            .descriptors
            .iter()
            .zip(&entries)
            .map(|(d, e)| {
                if !known_domain {
                    None
                } else if d.limit.is_some() {
                    self.override_rule(domain, d)
                } else {
                    config.get_limit(domain, e, &self.metrics)
                }
            })
            .collect();
        let replacing: HashSet<&str> =
            matched.iter().flatten().flat_map(|m| m.rule.replaces.iter().map(String::as_str)).collect();
        if !replacing.is_empty() {
            let replacing: HashSet<String> = replacing.into_iter().map(str::to_string).collect();
            for m in matched.iter_mut() {
                if m.as_ref().is_some_and(|m| !m.rule.name.is_empty() && replacing.contains(&m.rule.name)) {
                    *m = None;
                }
            }
        }

        let mode = config.domains.get(domain).and_then(|d| d.failure_mode).unwrap_or(self.settings.failure_mode);
        let mut items = Vec::with_capacity(matched.len());
        let mut checks: Vec<DescriptorCheck> = Vec::new();
        for (i, m) in matched.into_iter().enumerate() {
            let Some(m) = m else {
                items.push(Item::NoRule);
                continue;
            };
            let cost = hits(req, i);
            m.stats.total_hits.fetch_add(cost, Relaxed);
            if m.rule.unlimited {
                m.stats.within_limit.fetch_add(cost, Relaxed);
                items.push(Item::Unlimited);
                continue;
            }
            // A limit of 0 (a blocklist entry) has no limit: never admissible.
            let how = match m.rule.limit {
                None => How::RefusedLocally,
                Some(limit) => {
                    let mut key = redis_key(
                        &self.settings.key_prefix,
                        self.settings.hash_tag_domain && self.backend.cluster,
                        m.rule.algorithm,
                        domain,
                        &entries[i],
                        &m.share_patterns,
                    );
                    if let Some(o) = &req.descriptors[i].limit {
                        override_key(&mut key, o);
                    }
                    // The same key twice (the same descriptor twice in one request): one check,
                    // the hits summed, as envoyproxy/ratelimit counts both. A key names its rule
                    // (an override's key its limit), so both carry the same limit.
                    match checks.iter().position(|c| c.key == key) {
                        Some(j) => {
                            checks[j].cost = checks[j].cost.saturating_add(cost);
                            How::Checked(j)
                        }
                        None => {
                            // (Whether it leases is settled below, once the request's checks are.)
                            let lease = self
                                .leases
                                .as_ref()
                                .filter(|l| {
                                    m.rule.algorithm.leasable() && m.rule.lease.unwrap_or(l.settings.default_on)
                                })
                                .map(|_| m.rule.stat_key.full());
                            checks.push(DescriptorCheck { key, limit, cost, soft: m.rule.shadow_mode, lease });
                            How::Checked(checks.len() - 1)
                        }
                    }
                }
            };
            items.push(Item::Limited { m, cost, how });
        }
        // More hits than the capacity (summed over a key) are never admissible either: refused
        // here, without asking Redis.
        let mut index = Vec::with_capacity(checks.len());
        let mut kept = Vec::with_capacity(checks.len());
        for c in checks {
            index.push((c.cost <= c.limit.capacity()).then_some(kept.len()));
            if c.cost <= c.limit.capacity() {
                kept.push(c);
            }
        }
        let mut checks = kept;
        for item in &mut items {
            if let Item::Limited { how, .. } = item {
                if let How::Checked(j) = *how {
                    *how = index[j].map_or(How::RefusedLocally, How::Checked);
                }
            }
        }
        let refused_locally = refused_locally(&items);
        // Which checks lease: a leased rule's value once hot (crate::leases::Heat), and only in a
        // request not refused already (issue 31.1: it touches no lease; its checks are one dry
        // run). Cold values are decided per request with the request's other checks.
        for c in &mut checks {
            if refused_locally || c.cost == 0 || !self.leases.as_ref().is_some_and(|l| l.heat.observe(&c.key)) {
                c.lease = None;
            }
        }
        let leased_cost = checks.iter().find(|c| c.lease.is_some()).map(|c| c.cost);
        let outcome = match (&self.leases, leased_cost) {
            // check_all takes one cost for all its limits: mixed costs are decided per request.
            (Some(leases), Some(cost)) if checks.iter().all(|c| c.lease.is_none() || c.cost == cost) => {
                self.decide_leased(leases, &checks, mode, deadline).await
            }
            _ => self.backend.decide(&checks, refused_locally, deadline).await,
        };
        match outcome {
            Ok(o) => Ok(self.respond(&items, &RequestResult { admitted: o.admitted && !refused_locally, ..o })),
            Err(e) => self.on_failure(mode, domain, &items, &checks, e),
        }
    }

    /// The leased checks served from leases (`check_all` over their limiters: the hot values of
    /// leased rules), the others per request (one backend decision: one command on one slot);
    /// all or nothing by [`settle`]: when the per-request part refuses, the leased units go back
    /// to their local pools (`refund`), and a leased refusal makes the rest a dry run.
    async fn decide_leased(
        &self,
        leases: &Leases,
        checks: &[DescriptorCheck],
        mode: FailureMode,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<RequestResult, BackendError> {
        let (leased, rest): (Vec<usize>, Vec<usize>) = (0..checks.len()).partition(|&i| checks[i].lease.is_some());
        let cost = checks[leased[0]].cost;
        let limiters: Vec<_> = leased
            .iter()
            .map(|&i| leases.limiter(checks[i].lease.as_deref().unwrap_or(""), checks[i].limit, checks[i].soft, mode))
            .collect();
        let pairs: Vec<(&Limiter<LeaseConn>, &str)> =
            leased.iter().zip(&limiters).map(|(&i, l)| (l.as_ref(), checks[i].key.as_str())).collect();
        // The limiters' calls have the lease timeout; the request's deadline bounds the wait
        // (a claim cut short lands in the local pool or expires with its lease).
        let all = match deadline {
            None => check_all(&pairs, cost).await,
            Some(d) => tokio::time::timeout_at(d, check_all(&pairs, cost))
                .await
                .map_err(|_| BackendError::Unavailable("no answer before the caller's deadline".into()))?,
        };
        // Each leased limit's own answer: check_all took the units of the enforced ones that
        // admitted, unless it refused (then it gave them back itself).
        let leased_answers: Vec<Answer> = leased
            .iter()
            .zip(&all.outcomes)
            .map(|(&i, o)| {
                let soft = checks[i].soft;
                match o {
                    // A shadow limit always allows; `enforced` says what it would have done.
                    Some(o) => Answer {
                        admits: if soft { o.enforced } else { o.allowed },
                        enforced: !soft,
                        taken: all.allowed && o.enforced && o.allowed,
                    },
                    // Not consulted: another limit refused first from its local cache.
                    None => Answer { admits: false, enforced: !soft, taken: false },
                }
            })
            .collect();
        let refund = |plan: &Plan| {
            for (((l, k), o), action) in pairs.iter().zip(&all.outcomes).zip(&plan.actions) {
                if let (Some(o), Action::GiveBack) = (o, action) {
                    l.refund(k, o);
                }
            }
        };
        if mode == FailureMode::Error && all.outcomes.iter().flatten().any(|o| o.unavailable()) {
            refund(&settle(&leased_answers, true));
            return Err(BackendError::Unavailable("redis unavailable (leases)".into()));
        }
        let rest_checks: Vec<DescriptorCheck> = rest.iter().map(|&i| checks[i].clone()).collect();
        // A leased refusal makes the rest a dry run.
        let rest_outcome = match self.backend.decide(&rest_checks, !all.allowed, deadline).await {
            Ok(o) => o,
            Err(e) => {
                refund(&settle(&leased_answers, true));
                return Err(e);
            }
        };
        let rest_answers = rest.iter().zip(&rest_outcome.verdicts).map(|(&i, v)| Answer {
            admits: v.admitted,
            enforced: !checks[i].soft,
            taken: v.consumed,
        });
        let plan = settle(&leased_answers.iter().copied().chain(rest_answers).collect::<Vec<_>>(), false);
        // (The rest is all or nothing in itself: only leased units are ever given back here.)
        refund(&plan);
        let mut verdicts: Vec<Option<CheckResult>> = vec![None; checks.len()];
        for (&i, v) in rest.iter().zip(rest_outcome.verdicts) {
            verdicts[i] = Some(v);
        }
        for ((&i, o), a) in leased.iter().zip(&all.outcomes).zip(&leased_answers) {
            let c = &checks[i];
            verdicts[i] = Some(match o {
                Some(o) => CheckResult {
                    decision: redis_ratelimit_client::Decision {
                        allowed: if o.allowed { c.cost } else { 0 },
                        limit: o.limit.unwrap_or(c.limit.capacity()),
                        remaining: o.remaining.unwrap_or(0),
                        retry_after: o.retry_after(),
                        reset_after: o.reset_after().unwrap_or_default(),
                        delay: None,
                    },
                    admitted: a.admits,
                    consumed: plan.admitted && o.allowed,
                },
                None => fallback_verdict(c, true, Nanos::ZERO),
            });
        }
        Ok(RequestResult {
            admitted: plan.admitted,
            verdicts: verdicts.into_iter().map(|v| v.expect("every check has a verdict")).collect(),
        })
    }

    fn respond(&self, items: &[Item], outcome: &RequestResult) -> RateLimitResponse {
        let mut statuses = Vec::with_capacity(items.len());
        let mut header_limits = Vec::new();
        for item in items {
            match item {
                Item::NoRule => statuses.push(DescriptorStatus { code: Code::Ok as i32, ..Default::default() }),
                Item::Unlimited => statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                }),
                Item::Limited { m, cost, how } => {
                    let rule = &m.rule;
                    let (admitted, remaining, reset, retry) = match how {
                        How::Checked(c) => {
                            let v: &CheckResult = &outcome.verdicts[*c];
                            (v.admitted, v.decision.remaining, v.decision.reset_after, v.decision.retry_after)
                        }
                        // Refused without asking Redis: nothing remains for this request.
                        How::RefusedLocally => (false, 0, Duration::ZERO, None),
                    };
                    self.count(&m.stats, rule, *cost, admitted, remaining);
                    let shadowed = !admitted && rule.shadow_mode;
                    if shadowed {
                        m.stats.shadow_mode.fetch_add(*cost, Relaxed);
                    }
                    let refused = !admitted && !shadowed;
                    statuses.push(DescriptorStatus {
                        code: if refused { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(pb::RateLimit {
                            name: rule.name.clone(),
                            requests_per_unit: rule.requests_per_unit,
                            unit: rule.unit as i32,
                        }),
                        limit_remaining: remaining.min(u32::MAX as u64) as u32,
                        duration_until_reset: Some(duration(reset)),
                        quota: None,
                    });
                    header_limits.push(LimitStatus {
                        policy: if rule.name.is_empty() { rule.stat_key.full() } else { rule.name.clone() },
                        limit: rule.capacity(),
                        remaining,
                        reset,
                        window: rule.policy_window(),
                        refused,
                        retry_after: if refused { retry } else { None },
                    });
                }
            }
        }
        let mut code = if outcome.admitted { Code::Ok } else { Code::OverLimit };
        if code == Code::OverLimit && self.settings.global_shadow_mode {
            code = Code::Ok;
            self.metrics.global_shadow_mode.fetch_add(1, Relaxed);
        }
        let response_headers_to_add = headers::render(&header_limits, &self.settings.headers)
            .into_iter()
            .map(|(key, value)| pb::HeaderValue { key, value, raw_value: Vec::new() })
            .collect();
        RateLimitResponse { overall_code: code as i32, statuses, response_headers_to_add, ..Default::default() }
    }

    /// envoyproxy/ratelimit's within / near / over counts (in hits). A refused descriptor's
    /// hits are all over the limit (none was admitted).
    fn count(&self, s: &RuleStats, rule: &Rule, cost: u64, admitted: bool, remaining: u64) {
        if !admitted {
            s.over_limit.fetch_add(cost, Relaxed);
            return;
        }
        s.within_limit.fetch_add(cost, Relaxed);
        let cap = rule.capacity();
        let near = (cap as f64 * self.settings.near_limit_ratio).floor() as u64;
        let after = cap.saturating_sub(remaining);
        if after > near {
            let before = after.saturating_sub(cost);
            s.near_limit.fetch_add(if before >= near { cost } else { after - near }, Relaxed);
        }
    }

    /// Redis could not answer: the domain's failure mode decides.
    fn on_failure(
        &self,
        mode: FailureMode,
        domain: &str,
        items: &[Item],
        checks: &[DescriptorCheck],
        e: BackendError,
    ) -> Result<RateLimitResponse, RequestError> {
        // (An invalid request was logged at ERROR and counted where Redis refused it:
        // Backend::invalid.)
        tracing::debug!("redis failed ({e}); domain '{domain}' fails {mode:?}");
        let decided: Vec<CheckResult> = match mode {
            FailureMode::Error => {
                self.metrics.failure_error.fetch_add(1, Relaxed);
                return Err(RequestError::Unavailable(e.to_string()));
            }
            FailureMode::Open | FailureMode::Closed => {
                let admit = mode == FailureMode::Open;
                let m = if admit { &self.metrics.failure_open } else { &self.metrics.failure_closed };
                m.fetch_add(1, Relaxed);
                checks.iter().map(|c| fallback_verdict(c, admit, Nanos::ZERO)).collect()
            }
            FailureMode::Local => self.local_decide(checks, refused_locally(items)),
        };
        let answers: Vec<Answer> = decided
            .iter()
            .zip(checks)
            .map(|(v, c)| Answer { admits: v.admitted, enforced: !c.soft, taken: v.consumed })
            .collect();
        let admitted = settle(&answers, refused_locally(items)).admitted;
        Ok(self.respond(items, &RequestResult { admitted, verdicts: decided }))
    }

    /// The local fallback: a token bucket per key at the limit ÷ instances, all or nothing
    /// over the enforced checks (nothing taken from a request `refused` already).
    fn local_decide(&self, checks: &[DescriptorCheck], refused: bool) -> Vec<CheckResult> {
        let now = Nanos::from(self.epoch.elapsed());
        let n = self.settings.instances.max(1);
        let params = |c: &DescriptorCheck| {
            let limit = (c.limit.limit() / n).max(1);
            let burst = (c.limit.capacity() / n).max(1);
            (limit, c.limit.period_nanos(), burst)
        };
        // Try every check on a copy; commit the enforced ones only if all admit.
        let mut results = Vec::with_capacity(checks.len());
        for c in checks {
            let (limit, period, burst) = params(c);
            let mut b = self
                .local
                .shard(&c.key)
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&c.key)
                .copied()
                .unwrap_or_default();
            results.push(b.check(now, c.cost, limit, period, burst));
        }
        let answers: Vec<Answer> = results
            .iter()
            .zip(checks)
            .map(|(r, c)| Answer { admits: r.is_ok(), enforced: !c.soft, taken: false })
            .collect();
        let plan = settle(&answers, refused);
        let mut out = Vec::with_capacity(checks.len());
        for ((c, r), action) in checks.iter().zip(&results).zip(&plan.actions) {
            let admitted = r.is_ok();
            if *action == Action::Take {
                let (limit, period, burst) = params(c);
                let mut shard = self.local.shard(&c.key).lock().unwrap_or_else(|e| e.into_inner());
                if shard.len() >= self.local.cap_per_shard && !shard.contains_key(&c.key) {
                    shard.clear();
                }
                let b = shard.entry(c.key.clone()).or_default();
                let _ = b.check(now, c.cost, limit, period, burst);
            }
            let m = if admitted { &self.metrics.failure_local_admits } else { &self.metrics.failure_local_denials };
            m.fetch_add(1, Relaxed);
            let retry = match r {
                Err(Some(ns)) => *ns,
                _ => Nanos::ZERO,
            };
            out.push(fallback_verdict(c, admitted, retry));
        }
        out
    }
}

/// An enforced descriptor refused without asking anyone (no limit, or more hits than its
/// capacity).
fn refused_locally(items: &[Item]) -> bool {
    items.iter().any(|i| matches!(i, Item::Limited { how: How::RefusedLocally, m, .. } if !m.rule.shadow_mode))
}

/// A verdict made without Redis (nothing known of the shared state).
fn fallback_verdict(c: &DescriptorCheck, admitted: bool, retry: Nanos) -> CheckResult {
    CheckResult {
        decision: redis_ratelimit_client::Decision {
            allowed: if admitted { c.cost } else { 0 },
            limit: c.limit.capacity(),
            remaining: 0,
            retry_after: (!admitted && retry > Nanos::ZERO).then(|| retry.into()),
            reset_after: Duration::ZERO,
            delay: None,
        },
        admitted,
        consumed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unambiguous_and_tag_free() {
        let k = redis_key("rls:", false, Algorithm::Fixed, "d{x}", &[("a|b", "c=d"), ("k", "50%")], &[]);
        assert_eq!(k, "rls:fixed:d%7Bx%7D|a%7Cb=c%3Dd|k=50%25");
        let k = redis_key("", true, Algorithm::Gcra, "dom", &[("files", "files/a.pdf")], &[Some("files/*".into())]);
        assert_eq!(k, "{dom}gcra|files=files/*");
    }

    #[test]
    fn validation_names_the_problem() {
        let mut r = RateLimitRequest::default();
        assert!(validate(&r).unwrap_err().contains("domain"));
        r.domain = "d".into();
        assert!(validate(&r).unwrap_err().contains("descriptor list"));
        r.descriptors.push(pb::RateLimitDescriptor::default());
        assert_eq!(validate(&r).unwrap_err(), "descriptor 0 has no entries");
        r.descriptors[0].entries.push(pb::Entry { key: String::new(), value: "v".into() });
        assert_eq!(validate(&r).unwrap_err(), "descriptor 0 entry 0 has an empty key");
        r.descriptors[0].entries[0].key = "k".into();
        r.descriptors[0].hits_addend = Some(MAX_HITS_ADDEND + 1);
        assert!(validate(&r).unwrap_err().contains("hits_addend"));
        r.descriptors[0].hits_addend = Some(3);
        assert!(validate(&r).is_ok());
        assert_eq!(hits(&r, 0), 3);
        r.descriptors[0].hits_addend = None;
        assert_eq!(hits(&r, 0), 1);
        r.hits_addend = 7;
        assert_eq!(hits(&r, 0), 7);
    }
}
