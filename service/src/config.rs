//! envoyproxy/ratelimit's YAML configuration, read unchanged, plus this service's extensions:
//! a pure loader (text in, a validated [`Config`] or a [`ConfigError`] naming the file, the
//! domain and the descriptor out) and the lookup of a request's descriptor, ported from
//! envoyproxy/ratelimit's `src/config/config_impl.go` (`GetLimit`) so that every match, wildcard,
//! `replaces`, `detailed_metric`, `value_to_metric` and `share_threshold` behaves as there.
//!
//! Extensions (keys envoyproxy/ratelimit would refuse): in `rate_limit`, `algorithm`, `burst`,
//! `period` and `lease`; at the top of a file, `failure_mode`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis_ratelimit_client::spec::{parse_duration, Algorithm, Limit};
use yaml_rust2::{Yaml, YamlLoader};

use crate::metrics::{Metrics, RuleStats, StatKey};
use crate::pb::Unit;

/// What the service does for a domain when Redis cannot answer (breaker open, timeout, error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    /// Answer the gRPC call with an error (UNAVAILABLE): Envoy's `failure_mode_deny` decides
    /// (fail open by default), as with envoyproxy/ratelimit.
    Error,
    /// Answer OK.
    Open,
    /// Answer OVER_LIMIT.
    Closed,
    /// Limit each descriptor locally at its own limit ÷ the number of instances.
    Local,
}

impl FailureMode {
    pub fn parse(s: &str) -> Result<FailureMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "error" => Ok(FailureMode::Error),
            "open" => Ok(FailureMode::Open),
            "closed" => Ok(FailureMode::Closed),
            "local" => Ok(FailureMode::Local),
            _ => Err(format!("invalid failure_mode '{s}': expected error, open, closed or local")),
        }
    }
}

/// The algorithm names of the `algorithm` extension (the core's configuration names), in any
/// case.
pub fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::from_config_name(&s.to_ascii_lowercase()).ok_or_else(|| {
        let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.config_name()).collect();
        format!("invalid algorithm '{s}': expected one of {}", names.join(", "))
    })
}

/// The length of a unit, as envoyproxy/ratelimit's `UnitToDivider` (a month is 30 days, a
/// year 365: windows aligned to the epoch, as there).
pub fn unit_period(unit: Unit) -> Option<Duration> {
    let s = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        Unit::Week => 7 * 86_400,
        Unit::Month => 30 * 86_400,
        Unit::Year => 365 * 86_400,
        Unit::Unknown => return None,
    };
    Some(Duration::from_secs(s))
}

/// The unit whose length is exactly `period`, if any (what `current_limit.unit` reports).
pub fn period_unit(period: Duration) -> Unit {
    [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year]
        .into_iter()
        .find(|u| unit_period(*u) == Some(period))
        .unwrap_or(Unit::Unknown)
}

/// One configured (or request-supplied) rate limit.
#[derive(Debug)]
pub struct Rule {
    /// The stats key (`domain`, then one component per descriptor level: `key` or `key_value`).
    pub stat_key: StatKey,
    pub name: String,
    pub replaces: Vec<String>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    pub requests_per_unit: u32,
    /// The unit reported in `current_limit` (Unknown for a `period` that is no unit).
    pub unit: Unit,
    pub period: Duration,
    pub algorithm: Algorithm,
    /// What the rule enforces, validated by the module's rules; `None` when it is `unlimited`
    /// or its `requests_per_unit` is 0 (a blocklist entry: every request refused without
    /// asking Redis).
    pub limit: Option<Limit>,
    /// `lease` extension: `Some(true)` serve from local reservations, `Some(false)` never,
    /// `None` the service's default.
    pub lease: Option<bool>,
    pub stats: Arc<RuleStats>,
}

impl Rule {
    /// The capacity the module reports ([`Limit::capacity`]); 0 for a rule that admits nothing.
    pub fn capacity(&self) -> u64 {
        self.limit.map_or(0, |l| l.capacity())
    }

    /// The window of the policy in the rate-limit headers ([`Limit::policy_window`]); the
    /// period for a rule that admits nothing.
    pub fn policy_window(&self) -> Duration {
        self.limit.map_or(self.period, |l| l.policy_window())
    }
}

/// A descriptor's match: the rule, the stats it counts into (a detailed or value_to_metric key
/// may differ from the rule's), and the wildcard patterns that replace values in the Redis key
/// (`share_threshold`), by entry index.
#[derive(Clone, Debug)]
pub struct Matched {
    pub rule: Arc<Rule>,
    pub stats: Arc<RuleStats>,
    pub share_patterns: Vec<Option<String>>,
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// Wildcard children (`key_value*` patterns), in config order, pre-split on `*`.
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<Rule>>,
    value_to_metric: bool,
    share_threshold: bool,
    wildcard_pattern: String,
}

#[derive(Debug, Default)]
pub struct Domain {
    root: Node,
    pub failure_mode: Option<FailureMode>,
}

/// A whole configuration: every domain of every file.
#[derive(Debug, Default)]
pub struct Config {
    pub domains: HashMap<String, Domain>,
    /// Files loaded (names as given), for logs and /rlconfig.
    pub files: Vec<String>,
    /// Number of rate limit rules.
    pub rules: usize,
}

/// A refused configuration: which file, domain and descriptor, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub domain: Option<String>,
    pub descriptor: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(d) = &self.domain {
            write!(f, ": domain '{d}'")?;
        }
        if let Some(d) = &self.descriptor {
            write!(f, ": descriptor '{d}'")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // Extensions.
    "algorithm",
    "burst",
    "period",
    "lease",
    "failure_mode",
];

struct Ctx<'a> {
    file: &'a str,
    domain: Option<&'a str>,
}

impl Ctx<'_> {
    fn err(&self, descriptor: Option<&str>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            domain: self.domain.map(str::to_string),
            descriptor: descriptor.map(str::to_string),
            message: message.into(),
        }
    }
}

fn scalar_string(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        Yaml::Null => Some(String::new()),
        _ => None,
    }
}

/// envoyproxy/ratelimit's key check: every mapping key a string from the known set, every list
/// a list of mappings (`metadata` is free-form).
fn validate_keys(ctx: &Ctx, v: &Yaml) -> Result<(), ConfigError> {
    if let Yaml::Hash(h) = v {
        for (k, v) in h {
            let k = match k {
                Yaml::String(s) => s,
                other => return Err(ctx.err(None, format!("config error, key is not of type string: {other:?}"))),
            };
            if !VALID_KEYS.contains(&k.as_str()) {
                return Err(ctx.err(None, format!("config error, unknown key '{k}'")));
            }
            if k == "metadata" {
                continue;
            }
            match v {
                Yaml::Array(items) => {
                    for e in items {
                        if !matches!(e, Yaml::Hash(_)) {
                            return Err(ctx.err(
                                None,
                                format!("config error, yaml file contains list of type other than map: {e:?}"),
                            ));
                        }
                        validate_keys(ctx, e)?;
                    }
                }
                Yaml::Hash(_) => validate_keys(ctx, v)?,
                _ => {}
            }
        }
    }
    Ok(())
}

fn get<'a>(h: &'a Yaml, key: &str) -> Option<&'a Yaml> {
    match h {
        Yaml::Hash(m) => m.get(&Yaml::String(key.to_string())).filter(|v| !matches!(v, Yaml::Null)),
        _ => None,
    }
}

fn get_str(ctx: &Ctx, d: Option<&str>, h: &Yaml, key: &str) -> Result<String, ConfigError> {
    match get(h, key) {
        None => Ok(String::new()),
        Some(v) => scalar_string(v).ok_or_else(|| ctx.err(d, format!("'{key}' must be a string"))),
    }
}

fn get_bool(ctx: &Ctx, d: Option<&str>, h: &Yaml, key: &str) -> Result<bool, ConfigError> {
    match get(h, key) {
        None => Ok(false),
        Some(Yaml::Boolean(b)) => Ok(*b),
        Some(Yaml::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(_) => Err(ctx.err(d, format!("'{key}' must be true or false"))),
    }
}

fn get_list<'a>(ctx: &Ctx, d: Option<&str>, h: &'a Yaml, key: &str) -> Result<&'a [Yaml], ConfigError> {
    match get(h, key) {
        None => Ok(&[]),
        Some(Yaml::Array(a)) => Ok(a),
        Some(_) => Err(ctx.err(d, format!("'{key}' must be a list"))),
    }
}

/// One file's text, parsed and checked, before merging.
pub struct FileConfig {
    pub name: String,
    root: Yaml,
}

/// Parses one YAML file (the first document) and checks its keys.
pub fn parse_file(name: &str, text: &str) -> Result<FileConfig, ConfigError> {
    let ctx = Ctx { file: name, domain: None };
    let docs = YamlLoader::load_from_str(text).map_err(|e| ctx.err(None, format!("error loading config file: {e}")))?;
    let root = docs.into_iter().next().unwrap_or(Yaml::Null);
    match &root {
        Yaml::Hash(_) | Yaml::Null => {}
        _ => return Err(ctx.err(None, "error loading config file: the document is not a mapping")),
    }
    validate_keys(&ctx, &root)?;
    Ok(FileConfig { name: name.to_string(), root })
}

/// Settings of the loader that come from the service's environment.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// `MERGE_DOMAIN_CONFIG`: several files may add to one domain.
    pub merge_domains: bool,
}

/// Builds a configuration from parsed files (in order). Stats counters come from `metrics`, so
/// they keep counting across reloads.
pub fn build(files: &[FileConfig], opts: LoadOptions, metrics: &Metrics) -> Result<Config, ConfigError> {
    let mut config = Config::default();
    for f in files {
        config.files.push(f.name.clone());
        let ctx0 = Ctx { file: &f.name, domain: None };
        let domain = get_str(&ctx0, None, &f.root, "domain")?;
        if domain.is_empty() {
            return Err(ctx0.err(None, "config file cannot have empty domain"));
        }
        let ctx = Ctx { file: &f.name, domain: Some(&domain) };
        let failure_mode = match get(&f.root, "failure_mode") {
            None => None,
            Some(v) => {
                let s = scalar_string(v).unwrap_or_default();
                Some(FailureMode::parse(&s).map_err(|e| ctx.err(None, e))?)
            }
        };
        for key in ["key", "value", "rate_limit", "unit", "requests_per_unit", "name"] {
            if get(&f.root, key).is_some() {
                return Err(ctx.err(None, format!("'{key}' belongs in a descriptor, not at the top of the file")));
            }
        }
        let descriptors = get_list(&ctx, None, &f.root, "descriptors")?;
        let d = match config.domains.get_mut(&domain) {
            Some(d) if opts.merge_domains => d,
            Some(_) => return Err(ctx.err(None, format!("duplicate domain '{domain}' in config file"))),
            None => config.domains.entry(domain.clone()).or_default(),
        };
        if failure_mode.is_some() {
            if d.failure_mode.is_some() && d.failure_mode != failure_mode {
                return Err(ctx.err(None, "failure_mode differs from another file of this domain"));
            }
            d.failure_mode = failure_mode;
        }
        let parent = vec![domain.clone()];
        config.rules += load_descriptors(&ctx, &mut d.root, &parent, descriptors, metrics)?;
    }
    Ok(config)
}

fn load_descriptors(
    ctx: &Ctx,
    node: &mut Node,
    parent: &[String],
    descriptors: &[Yaml],
    metrics: &Metrics,
) -> Result<usize, ConfigError> {
    let mut rules = 0;
    for dc in descriptors {
        let here = parent[1..].join(".");
        let here = (!here.is_empty()).then_some(here);
        let key = get_str(ctx, here.as_deref(), dc, "key")?;
        if key.is_empty() {
            return Err(ctx.err(here.as_deref(), "descriptor has empty key"));
        }
        let value = get_str(ctx, here.as_deref(), dc, "value")?;
        let final_key = if value.is_empty() { key.clone() } else { format!("{key}_{value}") };
        let mut path = parent.to_vec();
        path.push(final_key.clone());
        let dpath = path[1..].join(".");
        let dp = Some(dpath.as_str());
        if node.children.contains_key(&final_key) {
            return Err(ctx.err(dp, format!("duplicate descriptor composite key '{}'", path.join("."))));
        }
        let shadow_mode = get_bool(ctx, dp, dc, "shadow_mode")?;
        let detailed_metric = get_bool(ctx, dp, dc, "detailed_metric")?;
        let value_to_metric = get_bool(ctx, dp, dc, "value_to_metric")?;
        let share_threshold = get_bool(ctx, dp, dc, "share_threshold")?;
        if get_bool(ctx, dp, dc, "quota_mode")? {
            return Err(ctx.err(dp, "quota_mode is not supported by this service"));
        }
        let limit = match get(dc, "rate_limit") {
            None => None,
            Some(rl @ Yaml::Hash(_)) => {
                rules += 1;
                Some(Arc::new(load_rate_limit(ctx, dp, rl, &path, shadow_mode, detailed_metric, metrics)?))
            }
            Some(_) => return Err(ctx.err(dp, "'rate_limit' must be a mapping")),
        };
        for k in ["algorithm", "burst", "period", "lease", "unit", "requests_per_unit", "unlimited", "replaces"] {
            if get(dc, k).is_some() {
                return Err(ctx.err(dp, format!("'{k}' belongs in the descriptor's rate_limit block")));
            }
        }
        if share_threshold && !final_key.contains('*') {
            return Err(ctx.err(
                dp,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                ),
            ));
        }
        let wildcard_pattern = if share_threshold { final_key.clone() } else { String::new() };
        if final_key.contains('*') {
            node.wildcards.push((final_key.clone(), final_key.split('*').map(str::to_string).collect()));
        }
        let mut child = Node {
            children: HashMap::new(),
            wildcards: Vec::new(),
            limit,
            value_to_metric,
            share_threshold,
            wildcard_pattern,
        };
        let nested = get_list(ctx, dp, dc, "descriptors")?;
        rules += load_descriptors(ctx, &mut child, &path, nested, metrics)?;
        node.children.insert(final_key, child);
    }
    Ok(rules)
}

fn load_rate_limit(
    ctx: &Ctx,
    dp: Option<&str>,
    rl: &Yaml,
    path: &[String],
    shadow_mode: bool,
    detailed_metric: bool,
    metrics: &Metrics,
) -> Result<Rule, ConfigError> {
    let unlimited = get_bool(ctx, dp, rl, "unlimited")?;
    let unit_text = get_str(ctx, dp, rl, "unit")?;
    let unit = match unit_text.to_ascii_uppercase().as_str() {
        "SECOND" => Some(Unit::Second),
        "MINUTE" => Some(Unit::Minute),
        "HOUR" => Some(Unit::Hour),
        "DAY" => Some(Unit::Day),
        "WEEK" => Some(Unit::Week),
        "MONTH" => Some(Unit::Month),
        "YEAR" => Some(Unit::Year),
        _ => None,
    };
    let period = match get(rl, "period") {
        None => None,
        Some(v) => {
            let s = scalar_string(v).unwrap_or_default();
            Some(parse_duration(&s).map_err(|e| ctx.err(dp, format!("invalid period: {e}")))?)
        }
    };
    let requests_per_unit = match get(rl, "requests_per_unit") {
        None => 0,
        Some(Yaml::Integer(i)) if (0..=u32::MAX as i64).contains(i) => *i as u32,
        Some(v) => {
            return Err(ctx.err(
                dp,
                format!(
                    "invalid requests_per_unit {}: expected an integer from 0 to 4294967295",
                    scalar_string(v).unwrap_or_else(|| format!("{v:?}"))
                ),
            ))
        }
    };
    let algorithm = match get(rl, "algorithm") {
        None => Algorithm::Fixed,
        Some(v) => parse_algorithm(&scalar_string(v).unwrap_or_default()).map_err(|e| ctx.err(dp, e))?,
    };
    let burst = match get(rl, "burst") {
        None => None,
        Some(Yaml::Integer(i)) if *i >= 0 => Some(*i as u64),
        Some(_) => return Err(ctx.err(dp, "invalid burst: expected an integer")),
    };
    let lease = match get(rl, "lease") {
        None => None,
        Some(_) => Some(get_bool(ctx, dp, rl, "lease")?),
    };
    let name = get_str(ctx, dp, rl, "name")?;
    let mut replaces = Vec::new();
    for r in get_list(ctx, dp, rl, "replaces")? {
        let n = get_str(ctx, dp, r, "name")?;
        if n.is_empty() {
            return Err(ctx.err(dp, "should not have an empty replaces entry"));
        }
        if n == name {
            return Err(ctx.err(dp, "replaces should not contain name of same descriptor"));
        }
        replaces.push(n);
    }
    let (unit, period) = if unlimited {
        if unit.is_some() {
            return Err(ctx.err(dp, "should not specify rate limit unit when unlimited"));
        }
        for k in ["period", "algorithm", "burst"] {
            if get(rl, k).is_some() {
                return Err(ctx.err(dp, format!("should not specify {k} when unlimited")));
            }
        }
        (Unit::Unknown, Duration::from_secs(1))
    } else {
        match (unit, period) {
            (Some(_), Some(_)) => return Err(ctx.err(dp, "give either unit or period, not both")),
            (Some(u), None) => (u, unit_period(u).expect("a known unit")),
            (None, Some(p)) => (period_unit(p), p),
            (None, None) if get(rl, "unit").is_some() => {
                return Err(ctx.err(dp, format!("invalid rate limit unit '{unit_text}'")))
            }
            (None, None) => return Err(ctx.err(dp, "invalid rate limit unit '': give unit or period")),
        }
    };
    // The module's rules, the core's one statement of them (a rule of 0 requests per unit
    // builds none but is checked as a limit of 1).
    let limit = if unlimited {
        None
    } else {
        let checked = Limit::new(algorithm, u64::from(requests_per_unit.max(1)), period)
            .and_then(|l| burst.map_or(Ok(l), |b| l.with_burst(b)))
            .map_err(|e| ctx.err(dp, format!("invalid rate_limit: {e}")))?;
        (requests_per_unit > 0).then_some(checked)
    };
    let stat_key = StatKey::new(path[0].clone(), path[1..].to_vec());
    let stats = metrics.rule_stats(&stat_key);
    Ok(Rule {
        stat_key,
        name,
        replaces,
        unlimited,
        shadow_mode,
        detailed_metric,
        requests_per_unit,
        unit,
        period,
        algorithm,
        limit,
        lease,
        stats,
    })
}

/// envoyproxy/ratelimit's wildcard match over a pattern pre-split on `*`: each `*` matches zero
/// or more characters, segments in order.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    if parts.len() == 1 {
        return parts[0] == value;
    }
    let (first, last) = (&parts[0], &parts[parts.len() - 1]);
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if value.len() < fixed {
        return false;
    }
    let mut remaining = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match remaining.find(part.as_str()) {
            Some(i) => remaining = &remaining[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// One entry's step down the descriptor tree from `parent`, as envoyproxy/ratelimit's
/// `GetLimit` takes it: the child `key_value`, else the first wildcard child (config order)
/// matching `key_value`, else the child `key`.
struct Step<'a> {
    node: Option<&'a Node>,
    /// The wildcard pattern that matched.
    wildcard: Option<&'a str>,
    /// Matched with the value (exactly or by a wildcard), not by the key alone.
    by_value: bool,
}

fn step<'a>(parent: &'a Node, key: &str, value: &str) -> Step<'a> {
    let final_key = format!("{key}_{value}");
    if let Some(n) = parent.children.get(&final_key) {
        return Step { node: Some(n), wildcard: None, by_value: true };
    }
    for (pattern, parts) in &parent.wildcards {
        if wildcard_match(parts, &final_key) {
            return match parent.children.get(pattern) {
                Some(n) => Step { node: Some(n), wildcard: Some(pattern), by_value: true },
                None => Step { node: parent.children.get(key), wildcard: Some(pattern), by_value: false },
            };
        }
    }
    Step { node: parent.children.get(key), wildcard: None, by_value: false }
}

/// An order of a descriptor's unordered entries (a quota bucket id) under which the
/// configuration has a rule: see [`Config::order_entries`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ordered {
    /// Indices into the entries, in descriptor order.
    pub order: Vec<usize>,
    /// Another order reaches a different rule (the first one in the walk's order is kept).
    pub ambiguous: bool,
}

impl Config {
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The limit for one descriptor of `domain` (`None`: no rule applies), as envoyproxy/ratelimit's
    /// `GetLimit` finds it. A descriptor's own `limit` override is handled by the caller.
    pub fn get_limit(&self, domain: &str, entries: &[(&str, &str)], metrics: &Metrics) -> Option<Matched> {
        let d = self.domains.get(domain)?;
        let mut prev = &d.root;
        let mut detailed: Vec<String> = Vec::with_capacity(entries.len());
        let mut v2m: Vec<String> = Vec::with_capacity(entries.len());
        let mut share: Vec<Option<String>> = vec![None; entries.len()];
        let mut found: Option<Arc<Rule>> = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            detailed.push(format!("{key}_{value}"));
            let Step { node: next, wildcard: matched_wildcard, by_value: matched_using_value } = step(prev, key, value);
            if let (Some(w), Some(n)) = (matched_wildcard, next) {
                if n.share_threshold && !n.wildcard_pattern.is_empty() {
                    let prefix = format!("{key}_");
                    share[i] =
                        Some(n.wildcard_pattern.strip_prefix(&prefix).unwrap_or(&n.wildcard_pattern).to_string());
                    let _ = w;
                }
            }
            match next {
                Some(n) => {
                    let value_to_use: String = if let Some(w) = matched_wildcard {
                        if let Some(p) = &share[i] {
                            p.clone()
                        } else if n.value_to_metric {
                            value.to_string()
                        } else {
                            w.strip_prefix(&format!("{key}_")).unwrap_or(w).to_string()
                        }
                    } else if matched_using_value || n.value_to_metric {
                        value.to_string()
                    } else {
                        String::new()
                    };
                    v2m.push(if value_to_use.is_empty() { key.to_string() } else { format!("{key}_{value_to_use}") });
                }
                None => v2m.push(key.to_string()),
            }
            if let Some(n) = next {
                if let Some(l) = &n.limit {
                    if i == entries.len() - 1 {
                        found = Some(l.clone());
                    }
                }
            }
            match next {
                Some(n) if !n.children.is_empty() => prev = n,
                _ => break,
            }
        }
        let rule = found?;
        let has_share = share.iter().any(Option::is_some);
        let stats = if rule.detailed_metric {
            let comps: Vec<String> = if has_share {
                entries
                    .iter()
                    .enumerate()
                    .map(|(i, (k, v))| match &share[i] {
                        Some(p) => format!("{k}_{p}"),
                        None if v.is_empty() => k.to_string(),
                        None => format!("{k}_{v}"),
                    })
                    .collect()
            } else {
                detailed
            };
            metrics.try_rule_stats(&StatKey::new(domain.to_string(), comps), true).unwrap_or_else(|| rule.stats.clone())
        } else if v2m != rule.stat_key.components {
            metrics.try_rule_stats(&StatKey::new(domain.to_string(), v2m), true).unwrap_or_else(|| rule.stats.clone())
        } else {
            rule.stats.clone()
        };
        Some(Matched { rule, stats, share_patterns: share })
    }

    /// Orders unordered entries (a quota bucket id's map) as one descriptor of `domain` with a
    /// rule: the descriptor tree is walked depth first, each level trying the remaining entries
    /// in ascending byte order of their keys with [`get_limit`](Self::get_limit)'s step, and the
    /// first order that uses every entry and ends on a rule wins. The walk visits each
    /// configured node at most once (a node is reached by one sequence of keys), so it costs at
    /// most the configuration's size times the entries. `None`: no order has a rule.
    pub fn order_entries(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Ordered> {
        fn walk(
            node: &Node,
            entries: &[(&str, &str)],
            by_key: &[usize],
            path: &mut Vec<usize>,
            found: &mut Option<(Vec<usize>, Arc<Rule>)>,
            ambiguous: &mut bool,
        ) {
            for &i in by_key {
                if *ambiguous {
                    return;
                }
                if path.contains(&i) {
                    continue;
                }
                let (key, value) = entries[i];
                let Some(next) = step(node, key, value).node else { continue };
                path.push(i);
                if path.len() == entries.len() {
                    if let Some(rule) = &next.limit {
                        match found {
                            None => *found = Some((path.clone(), rule.clone())),
                            Some((_, first)) if !Arc::ptr_eq(first, rule) => *ambiguous = true,
                            Some(_) => {}
                        }
                    }
                } else if !next.children.is_empty() {
                    walk(next, entries, by_key, path, found, ambiguous);
                }
                path.pop();
            }
        }
        let d = self.domains.get(domain)?;
        if entries.is_empty() {
            return None;
        }
        let mut by_key: Vec<usize> = (0..entries.len()).collect();
        by_key.sort_by(|a, b| entries[*a].0.as_bytes().cmp(entries[*b].0.as_bytes()));
        let (mut found, mut ambiguous) = (None, false);
        walk(&d.root, entries, &by_key, &mut Vec::with_capacity(entries.len()), &mut found, &mut ambiguous);
        found.map(|(order, _)| Ordered { order, ambiguous })
    }

    /// A readable dump (one line per rule), as envoyproxy/ratelimit's /rlconfig.
    pub fn dump(&self) -> String {
        fn walk(n: &Node, out: &mut Vec<String>) {
            if let Some(l) = &n.limit {
                out.push(format!(
                    "{}: unit={} requests_per_unit={}, period={:?}, algorithm={}, burst={:?}, unlimited={}, shadow_mode={}",
                    l.stat_key.full(),
                    l.unit.as_str_name(),
                    l.requests_per_unit,
                    l.period,
                    l.algorithm.config_name(),
                    l.limit.and_then(|l| l.burst()),
                    l.unlimited,
                    l.shadow_mode
                ));
            }
            for c in n.children.values() {
                walk(c, out);
            }
        }
        let mut out = Vec::new();
        for d in self.domains.values() {
            walk(&d.root, &mut out);
        }
        out.sort();
        out.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(files: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m = Metrics::new(100);
        let parsed: Result<Vec<_>, _> = files.iter().map(|(n, t)| parse_file(n, t)).collect();
        build(&parsed?, LoadOptions { merge_domains: false }, &m)
    }

    fn limit_of(c: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<(u32, String)> {
        let m = Metrics::new(100);
        c.get_limit(domain, entries, &m).map(|x| (x.rule.requests_per_unit, x.stats.key.full()))
    }

    #[test]
    fn wildcards_match_like_envoyproxy() {
        let p = |s: &str| s.split('*').map(str::to_string).collect::<Vec<_>>();
        assert!(wildcard_match(&p("key_value*"), "key_value1"));
        assert!(wildcard_match(&p("key_value*"), "key_value"));
        assert!(!wildcard_match(&p("key_value*"), "key_valu"));
        assert!(wildcard_match(&p("path_/api/*/action"), "path_/api/123/action"));
        assert!(!wildcard_match(&p("path_/api/*/action"), "path_/api/123/other"));
        assert!(wildcard_match(&p("r_/api/*/resource/*/action"), "r_/api/v1/resource/9/action"));
        assert!(!wildcard_match(&p("a*a"), "a"));
    }

    #[test]
    fn errors_name_file_domain_and_descriptor() {
        let e = load(&[("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: days\n")])
            .unwrap_err();
        assert_eq!(e.to_string(), "f.yaml: domain 'd': descriptor 'k': invalid rate limit unit 'days'");
        let e = load(&[("g.yaml", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n        rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding, burst: 3}\n")]).unwrap_err();
        assert_eq!(e.descriptor.as_deref(), Some("a.b_c"));
        assert_eq!(e.message, "invalid rate_limit: BURST is not an option of RL.SLIDING", "{e}");
        let e = load(&[("h.yaml", "domain: d\nfoo: 1\n")]).unwrap_err();
        assert_eq!(e.to_string(), "h.yaml: config error, unknown key 'foo'");
        let e = load(&[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")]).unwrap_err();
        assert_eq!(e.to_string(), "b.yaml: domain 'd': duplicate domain 'd' in config file");
        assert!(load(&[("x.yaml", "descriptors: []\n")]).unwrap_err().message.contains("empty domain"));
        assert!(load(&[(
            "y.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n"
        )])
        .is_err());
        assert!(load(&[("z.yaml", "domain: [\n")]).unwrap_err().message.starts_with("error loading config file"));
    }

    #[test]
    fn limits_the_module_would_refuse_are_refused_with_their_path() {
        let rule = |rl: &str| {
            format!(
                "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {{{rl}}}\n"
            )
        };
        for (rl, why) in [
            ("requests_per_unit: 5, unit: second, algorithm: gcra, burst: 0", "BURST 0: must be from 1 to"),
            (
                "requests_per_unit: 1, period: 36525d, algorithm: gcra, burst: 3",
                "refilling it would take more than 200 years",
            ),
            ("requests_per_unit: 5, period: 36526d", "period"),
            ("requests_per_unit: 0, unit: second, algorithm: fixed, burst: 2", "BURST is not an option of RL.FIXED"),
        ] {
            let e = load(&[("r.yaml", rule(rl).as_str())]).unwrap_err();
            assert_eq!(
                (e.file.as_str(), e.domain.as_deref(), e.descriptor.as_deref()),
                ("r.yaml", Some("d"), Some("a.b")),
                "{e}"
            );
            assert!(e.message.starts_with("invalid rate_limit: ") && e.message.contains(why), "{rl}: {e}");
        }
        // A blocklist entry (0 per unit) builds no limit: every request is refused locally.
        let c = load(&[("z.yaml", rule("requests_per_unit: 0, unit: second").as_str())]).unwrap();
        let m = Metrics::new(10);
        let x = c.get_limit("d", &[("a", ""), ("b", "")], &m).unwrap();
        assert_eq!((x.rule.limit, x.rule.capacity(), x.rule.policy_window()), (None, 0, Duration::from_secs(1)));
    }

    #[test]
    fn extensions_parse() {
        let c = load(&[(
            "e.yaml",
            "domain: d\nfailure_mode: local\ndescriptors:\n  - key: ip\n    rate_limit: {requests_per_unit: 50, period: 30s, algorithm: gcra, burst: 60, lease: true}\n",
        )])
        .unwrap();
        let m = Metrics::new(10);
        let x = c.get_limit("d", &[("ip", "1.2.3.4")], &m).unwrap();
        assert_eq!(x.rule.period, Duration::from_secs(30));
        assert_eq!(x.rule.unit, Unit::Unknown);
        assert_eq!(x.rule.algorithm, Algorithm::Gcra);
        assert_eq!(x.rule.limit.and_then(|l| l.burst()), Some(60));
        assert_eq!(x.rule.capacity(), 60);
        assert_eq!(c.domains["d"].failure_mode, Some(FailureMode::Local));
        // Any length; a period that is one unit reports that unit.
        for (period, secs, unit) in [("5m", 300, Unit::Unknown), ("1500ms", 1, Unit::Unknown), ("1h", 3600, Unit::Hour)]
        {
            let y = format!(
                "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {{requests_per_unit: 9, period: {period}}}\n"
            );
            let c = load(&[("p.yaml", y.as_str())]).unwrap();
            let x = c.get_limit("p", &[("k", "v")], &m).unwrap();
            assert_eq!((x.rule.period.as_secs(), x.rule.unit), (secs, unit), "{period}");
        }
        assert!(load(&[(
            "q.yaml",
            "domain: q\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 9, period: 5m, unit: minute}\n"
        )])
        .is_err());
    }

    #[test]
    fn unordered_entries_are_ordered_by_the_descriptor_tree() {
        let c = load(&[(
            "q.yaml",
            "domain: q\ndescriptors:\n  - key: path\n    value: /api\n    descriptors:\n      - key: user\n        rate_limit: {requests_per_unit: 5, unit: second}\n  - key: user\n    descriptors:\n      - key: tier\n        value: gold\n        rate_limit: {requests_per_unit: 7, unit: second}\n      - key: tier\n        rate_limit: {requests_per_unit: 3, unit: second}\n  - key: ip\n    rate_limit: {requests_per_unit: 9, unit: second}\n",
        )])
        .unwrap();
        let order = |e: &[(&str, &str)]| c.order_entries("q", e).map(|o| (o.order, o.ambiguous));
        // Whatever order the map came in, the tree decides: path before user.
        assert_eq!(order(&[("user", "alice"), ("path", "/api")]), Some((vec![1, 0], false)));
        assert_eq!(order(&[("path", "/api"), ("user", "alice")]), Some((vec![0, 1], false)));
        // user before tier; the value match (gold) and the key match both found by get_limit's step.
        assert_eq!(order(&[("tier", "gold"), ("user", "bob")]), Some((vec![1, 0], false)));
        let m = Metrics::new(10);
        let x = c.get_limit("q", &[("user", "bob"), ("tier", "gold")], &m).unwrap();
        assert_eq!(x.rule.requests_per_unit, 7);
        assert_eq!(order(&[("tier", "silver"), ("user", "bob")]), Some((vec![1, 0], false)));
        // One entry; no rule at that depth; unknown keys; an unknown domain; no entries.
        assert_eq!(order(&[("ip", "1.2.3.4")]), Some((vec![0], false)));
        assert_eq!(order(&[("user", "alice")]), None);
        assert_eq!(order(&[("path", "/api"), ("user", "a"), ("ip", "1")]), None);
        assert_eq!(order(&[("nope", "x")]), None);
        assert_eq!(c.order_entries("other", &[("ip", "1")]), None);
        assert_eq!(order(&[]), None);
    }

    #[test]
    fn an_ambiguous_bucket_takes_the_first_order_by_key_and_says_so() {
        let c = load(&[(
            "a.yaml",
            "domain: a\ndescriptors:\n  - key: x\n    descriptors:\n      - key: y\n        rate_limit: {requests_per_unit: 1, unit: second}\n  - key: y\n    descriptors:\n      - key: x\n        rate_limit: {requests_per_unit: 2, unit: second}\n",
        )])
        .unwrap();
        let o = c.order_entries("a", &[("y", "1"), ("x", "2")]).unwrap();
        // x sorts before y: x → y.
        assert_eq!((o.order, o.ambiguous), (vec![1, 0], true));
        // Many entries: the walk is bounded by the tree, not by the orders (32! here).
        let keys: Vec<String> = (0..32).map(|i| format!("k{i:02}")).collect();
        let entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
        assert_eq!(c.order_entries("a", &entries), None);
    }

    #[test]
    fn depth_must_match() {
        let c = load(&[(
            "4.yaml",
            "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: {requests_per_unit: 300, unit: second}\n",
        )])
        .unwrap();
        assert_eq!(limit_of(&c, "example4", &[("key", "value"), ("subkey", "subvalue")]), None);
        assert_eq!(limit_of(&c, "example4", &[("key", "value")]).unwrap().0, 300);
    }
}
