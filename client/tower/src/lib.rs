//! A tower [`Layer`] that rate-limits HTTP and gRPC requests (axum, hyper, tonic) with
//! redis-ratelimit's [`Limiter`]: local reservations, one limit or several per request, tiers
//! chosen per request, `429` with `Retry-After` and the rate-limit headers, `503` when Redis is
//! unavailable under fail closed, and shadow mode.
//!
//! The crate's README (below) is compiled with it: its samples are doc tests.
#![doc = include_str!("../README.md")]

mod decide;
mod key;

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderValue, Request, Response, StatusCode};
use redis_ratelimit_client::headers::{render_into, HeaderFormat, LimitStatus, DEFAULT_FORMATS};
use redis_ratelimit_client::redis::aio::ConnectionLike;
use redis_ratelimit_client::{Limiter, Outcome, Source};
use tower_layer::Layer;
use tower_service::Service;

pub use decide::Check;
pub use key::{Forwarded, Key, Missing};
/// The client crate (limits, limiters, header formats).
pub use redis_ratelimit_client as client;

type SelectFn = Arc<dyn for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync>;
type CostFn = Arc<dyn Fn(&Parts) -> u64 + Send + Sync>;

/// One limit applied to a key of the request: a name (the policy name in the headers), a
/// [`Limiter`] (the limit, its reservations and failure policy) and a [`Key`].
#[derive(Clone)]
pub struct Rule {
    name: Cow<'static, str>,
    limiter: Arc<dyn Check>,
    key: Key,
    prefix: String,
}

impl Rule {
    /// A rule named `name`; its Redis keys are `rl:<name>:<key>` (see [`Rule::key_prefix`]).
    pub fn new<C>(name: impl Into<Cow<'static, str>>, limiter: Limiter<C>, key: Key) -> Rule
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Rule::with_check(name, Arc::new(limiter), key)
    }

    /// A rule over any [`Check`].
    pub fn with_check(name: impl Into<Cow<'static, str>>, limiter: Arc<dyn Check>, key: Key) -> Rule {
        let name = name.into();
        let prefix = format!("rl:{name}:");
        Rule { name, limiter, key, prefix }
    }

    /// The Redis key is `prefix` followed by the request's key (e.g. a hash tag, so that the
    /// keys of a tier share a Redis Cluster slot: `{acme}:ip:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Rule {
        self.prefix = prefix.into();
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The rules one request is checked against (all of them must admit it).
#[derive(Clone)]
struct Tier {
    name: Cow<'static, str>,
    rules: Vec<Rule>,
}

/// The counters of a layer (monotonic; shared by its clones and services).
#[derive(Debug, Default)]
struct Stats {
    requests: AtomicU64,
    admitted: AtomicU64,
    refused: AtomicU64,
    unavailable: AtomicU64,
    missing_key: AtomicU64,
    unlimited: AtomicU64,
    shadow_passed: AtomicU64,
}

/// A snapshot of a layer's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Requests seen.
    pub requests: u64,
    /// Passed to the service after every rule admitted them.
    pub admitted: u64,
    /// Answered with the refusal status (429).
    pub refused: u64,
    /// Answered with the unavailable status (503): Redis could not decide under fail closed.
    pub unavailable: u64,
    /// Answered with a rule's [`Missing::Refuse`] status.
    pub missing_key: u64,
    /// No tier selected ([`Builder::select`] answered `None`): passed unlimited.
    pub unlimited: u64,
    /// Shadow mode: would have been refused or unavailable, passed.
    pub shadow_passed: u64,
}

struct Config {
    tiers: Vec<Tier>,
    select: Option<SelectFn>,
    cost: Option<CostFn>,
    formats: Vec<HeaderFormat>,
    shadow: bool,
    refused_status: StatusCode,
    unavailable_status: StatusCode,
    stats: Stats,
}

/// The layer: `.layer(RateLimitLayer::new(limiter, Key::peer_ip()))`. Cheap to clone.
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

/// A configuration error of [`Builder::build`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Builds a [`RateLimitLayer`] with several rules, tiers, and the responses' settings.
#[derive(Clone)]
pub struct Builder {
    tiers: Vec<Tier>,
    select: Option<SelectFn>,
    cost: Option<CostFn>,
    formats: Vec<HeaderFormat>,
    shadow: bool,
    refused_status: StatusCode,
    unavailable_status: StatusCode,
}

impl RateLimitLayer {
    /// One limit (the rule is named `default`) on `key`.
    pub fn new<C>(limiter: Limiter<C>, key: Key) -> RateLimitLayer
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RateLimitLayer::builder().rule(Rule::new("default", limiter, key)).build().expect("one rule is a valid layer")
    }

    pub fn builder() -> Builder {
        Builder {
            tiers: Vec::new(),
            select: None,
            cost: None,
            formats: DEFAULT_FORMATS.to_vec(),
            shadow: false,
            refused_status: StatusCode::TOO_MANY_REQUESTS,
            unavailable_status: StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The layer's counters.
    pub fn stats(&self) -> LayerStats {
        let s = &self.config.stats;
        LayerStats {
            requests: s.requests.load(Relaxed),
            admitted: s.admitted.load(Relaxed),
            refused: s.refused.load(Relaxed),
            unavailable: s.unavailable.load(Relaxed),
            missing_key: s.missing_key.load(Relaxed),
            unlimited: s.unlimited.load(Relaxed),
            shadow_passed: s.shadow_passed.load(Relaxed),
        }
    }
}

impl Builder {
    /// Adds a rule to the default tier (the first tier, named `default`): every request is
    /// checked against all its rules.
    pub fn rule(mut self, rule: Rule) -> Builder {
        match self.tiers.iter_mut().find(|t| t.name == "default") {
            Some(t) => t.rules.push(rule),
            None => self.tiers.insert(0, Tier { name: "default".into(), rules: vec![rule] }),
        }
        self
    }

    /// Adds a tier: a named set of rules, chosen per request by [`Builder::select`].
    pub fn tier(mut self, name: impl Into<Cow<'static, str>>, rules: impl IntoIterator<Item = Rule>) -> Builder {
        self.tiers.push(Tier { name: name.into(), rules: rules.into_iter().collect() });
        self
    }

    /// Chooses each request's tier by name (e.g. from an `x-plan` header or an extension
    /// that an authentication layer set). `None`: the request is not limited. A name that is
    /// no tier's gets the first tier. Without it every request gets the first tier.
    pub fn select<F>(mut self, f: F) -> Builder
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.select = Some(Arc::new(f));
        self
    }

    /// The units a request costs (default 1), e.g. from its `content-length`.
    pub fn cost<F>(mut self, f: F) -> Builder
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(f));
        self
    }

    /// The header formats of every limited response, admitted and refused (default:
    /// [`DEFAULT_FORMATS`], the current draft's `ratelimit-policy` / `ratelimit` and the
    /// three-field `ratelimit-limit` / `-remaining` / `-reset`). `retry-after` is sent on
    /// refusals whatever the formats; `&[]` sends nothing else.
    pub fn formats(mut self, formats: &[HeaderFormat]) -> Builder {
        self.formats = formats.to_vec();
        self
    }

    /// Shadow mode: every request is decided and counted ([`LayerStats::shadow_passed`]) but
    /// none is refused; responses carry the headers without `retry-after`. (Each
    /// `LimiterConfig::shadow` does the same for one limit.)
    pub fn shadow(mut self, on: bool) -> Builder {
        self.shadow = on;
        self
    }

    /// The status of a refusal (default 429). gRPC requests get `grpc-status` 8
    /// (RESOURCE_EXHAUSTED) instead.
    pub fn refused_status(mut self, s: StatusCode) -> Builder {
        self.refused_status = s;
        self
    }

    /// The status when Redis cannot decide under fail closed (default 503). gRPC requests get
    /// `grpc-status` 14 (UNAVAILABLE) instead.
    pub fn unavailable_status(mut self, s: StatusCode) -> Builder {
        self.unavailable_status = s;
        self
    }

    /// Checks the configuration: at least one tier, each with at least one rule, unique tier
    /// names, unique rule names within a tier (they name the policies in the headers).
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if self.tiers.is_empty() {
            return Err(ConfigError("a rate-limit layer needs at least one rule".into()));
        }
        for (i, t) in self.tiers.iter().enumerate() {
            if t.rules.is_empty() {
                return Err(ConfigError(format!("tier {:?} has no rules", t.name)));
            }
            if self.tiers[..i].iter().any(|o| o.name == t.name) {
                return Err(ConfigError(format!("two tiers are named {:?}", t.name)));
            }
            for (j, r) in t.rules.iter().enumerate() {
                if t.rules[..j].iter().any(|o| o.name == r.name) {
                    return Err(ConfigError(format!("tier {:?} has two rules named {:?}", t.name, r.name)));
                }
            }
        }
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                tiers: self.tiers,
                select: self.select,
                cost: self.cost,
                formats: self.formats,
                shadow: self.shadow,
                refused_status: self.refused_status,
                unavailable_status: self.unavailable_status,
                stats: Stats::default(),
            }),
        })
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService { inner, config: self.config.clone() }
    }
}

/// The service the layer wraps around yours.
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    config: Arc<Config>,
}

/// What a refused response carries in its extensions, for an outer layer that renders a body
/// (the layer's own refusals have an empty body): the rules' states and the overall retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimited {
    /// The tier's name.
    pub tier: String,
    /// The rules decided, by name (a refusal ends the checks: later rules are not listed).
    pub limits: Vec<LimitStatus>,
    /// `false`: Redis could not decide (fail closed); `true`: a limit refused.
    pub limited: bool,
}

/// How a request is answered.
enum Disposition {
    Pass(Vec<LimitStatus>),
    Refuse(Vec<LimitStatus>),
    Unavailable(Vec<LimitStatus>),
    Status(StatusCode),
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was made ready is the one that serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let grpc = is_grpc(&parts);
            let (tier, verdict) = config.decide(&parts).await;
            let formats = &config.formats;
            match verdict {
                Disposition::Pass(statuses) => {
                    let mut res = inner.call(Request::from_parts(parts, body)).await?;
                    if !statuses.is_empty() {
                        render_into(res.headers_mut(), &statuses, formats, None);
                    }
                    Ok(res)
                }
                Disposition::Refuse(limits) => Ok(refusal(&config, tier, limits, true, grpc)),
                Disposition::Unavailable(limits) => Ok(refusal(&config, tier, limits, false, grpc)),
                Disposition::Status(s) => {
                    let mut res = Response::new(ResBody::default());
                    *res.status_mut() = s;
                    Ok(res)
                }
            }
        })
    }
}

fn is_grpc(parts: &Parts) -> bool {
    parts.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A refusal (`limited`) or an unavailable limiter: the status (or for gRPC a trailers-only
/// response with `grpc-status`), the headers of a refusal, an empty body, [`RateLimited`] in
/// the extensions.
fn refusal<B: Default>(
    config: &Config,
    tier: &str,
    limits: Vec<LimitStatus>,
    limited: bool,
    grpc: bool,
) -> Response<B> {
    let mut res = Response::new(B::default());
    if limited {
        render_into(res.headers_mut(), &limits, &config.formats, None);
    }
    if grpc {
        // gRPC answers errors in HTTP 200 with grpc-status (a trailers-only response).
        let h = res.headers_mut();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let (code, msg) = if limited { ("8", "rate limit exceeded") } else { ("14", "rate limiter unavailable") };
        h.insert("grpc-status", HeaderValue::from_static(code));
        h.insert("grpc-message", HeaderValue::from_static(msg));
    } else {
        *res.status_mut() = if limited { config.refused_status } else { config.unavailable_status };
    }
    res.extensions_mut().insert(RateLimited { tier: tier.to_owned(), limits, limited });
    res
}

impl Config {
    fn tier(&self, parts: &Parts) -> Option<&Tier> {
        let Some(select) = &self.select else { return self.tiers.first() };
        let name = select(parts)?;
        self.tiers.iter().find(|t| t.name == name).or(self.tiers.first())
    }

    async fn decide(&self, parts: &Parts) -> (&str, Disposition) {
        let stats = &self.stats;
        stats.requests.fetch_add(1, Relaxed);
        let Some(tier) = self.tier(parts) else {
            stats.unlimited.fetch_add(1, Relaxed);
            return ("", Disposition::Pass(Vec::new()));
        };
        let cost = self.cost.as_ref().map_or(1, |f| f(parts));
        let mut rules = Vec::with_capacity(tier.rules.len());
        let mut checks = Vec::with_capacity(tier.rules.len());
        for rule in &tier.rules {
            let key = match rule.key.extract(parts) {
                Some(k) => k,
                None => match rule.key.missing() {
                    Missing::Skip => continue,
                    Missing::Shared(k) => k,
                    Missing::Refuse(status) => {
                        stats.missing_key.fetch_add(1, Relaxed);
                        return (&tier.name, Disposition::Status(status));
                    }
                },
            };
            checks.push((&*rule.limiter, format!("{}{key}", rule.prefix)));
            rules.push(rule);
        }
        let outcomes = decide::decide(&checks, cost).await;
        let decided = || rules.iter().zip(&outcomes).filter_map(|(r, o)| Some((*r, o.as_ref()?)));
        // Fail closed is the only outcome that is no limit's decision; a local fallback that
        // refuses is a limit (429 with its retry).
        let unavailable = decided().any(|(_, o)| !o.allowed && o.source == Source::FailClosed);
        let refused = decided().any(|(_, o)| !o.allowed);
        let shadow = self.shadow && refused;
        let statuses = decided().map(|(rule, o)| status(rule, o, cost, shadow)).collect();
        let verdict = if shadow {
            stats.shadow_passed.fetch_add(1, Relaxed);
            Disposition::Pass(statuses)
        } else if unavailable {
            stats.unavailable.fetch_add(1, Relaxed);
            Disposition::Unavailable(statuses)
        } else if refused {
            stats.refused.fetch_add(1, Relaxed);
            Disposition::Refuse(statuses)
        } else {
            stats.admitted.fetch_add(1, Relaxed);
            Disposition::Pass(statuses)
        };
        (&tier.name, verdict)
    }
}

/// A rule's outcome as the headers show it: named after the rule, with its policy window. A
/// refused request of `cost` units shows fewer than `cost` remaining (all it can use now, even
/// while units the server still has are held back by pacing). Shadow mode shows no refusal.
fn status(rule: &Rule, o: &Outcome, cost: u64, shadow: bool) -> LimitStatus {
    let mut s = LimitStatus::from(o).named(rule.name.clone()).with_limit(&rule.limiter.limit());
    if s.refused {
        s.remaining = s.remaining.map(|r| r.min(cost.saturating_sub(1)));
    }
    if shadow {
        s.refused = false;
        s.retry_after = None;
    }
    s
}
