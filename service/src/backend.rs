//! The Redis side: connections (one server or a Redis Cluster), the commands a request's
//! checks become, and the protocol that keeps a request all-or-nothing across cluster slots.
//!
//! A request's checks (one per descriptor with a limit) are decided together: admitted only if
//! every enforced check admits, and a refused request consumes nothing. Shadow-mode checks
//! ("soft") never veto: each consumes only when the request is admitted and it admits itself.
//!
//! * **One group** (a single server, or every key in one cluster slot): exactly one command.
//!   All checks enforced with one cost: the limiter command itself for one check, `RL.MULTI`
//!   for several. Otherwise (shadow-mode checks, or different `hits_addend`s): one `EVALSHA` of
//!   [`SCRIPT`], which dry-runs every enforced check, then, if all admit, runs them and the soft
//!   ones for real, atomically (a script runs alone on the server).
//! * **Several slots** (Redis Cluster, keys in different slots): check, then commit. Phase 1
//!   dry-runs each slot's group (in parallel); any refusal refuses the request and nothing was
//!   written anywhere. Phase 2 commits each group for real: first the groups whose limits all
//!   accept `RL.RETURN` (all but the sliding log and the leaky bucket), in parallel, then the groups
//!   holding one of those. A group can still refuse in phase 2 when another request took the
//!   last units between the phases; the groups already committed are then given back with
//!   `RL.RETURN key cost AGE ms` (AGE: the time since their commit was sent plus the return's
//!   own transit, at most the call timeout, by the client's one rule, `commands::return_age`; so
//!   a bucket credits `cost − rate × AGE`: it never ends above the state where the units were
//!   never taken, whatever the transit) and the request is refused. docs/service.md ("Redis
//!   Cluster") states what holds.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::cluster_routing::Slot;
use redis::{Cmd, FromRedisValue, Value};
use redis_ratelimit_client::breaker::{Breaker, BreakerConfig, Permit};
use redis_ratelimit_client::commands::{each_limit_arg, give_back_cmd, limit_cmd, multi_cmd, return_age, Options};
use redis_ratelimit_client::spec::Limit;
use redis_ratelimit_client::{Decision, MultiDecision, Nanos};

use crate::connection::Conns;
pub use crate::connection::{BackendError, Target};
use crate::decision::{settle, Action, Answer};
use crate::metrics::{Metrics, RedisOp};

/// The script for a group that cannot be one `RL.MULTI` (see the module docs).
pub const SCRIPT: &str = r#"
-- redis-ratelimit-service: checks that cannot share one RL.MULTI (shadow-mode checks, or
-- different costs), decided atomically. KEYS: the limiter keys. ARGV[1]: '1' for a dry run;
-- then per key: the command, soft ('1': shadow mode, never vetoes), the cost, the number of
-- limit arguments, the limit arguments. Enforced checks: all or nothing. A soft check
-- consumes only when the request is admitted and it admits.
local dry = ARGV[1] == '1'
local specs, pos = {}, 2
for i = 1, #KEYS do
  local n = tonumber(ARGV[pos + 3])
  local s = {cmd = ARGV[pos], soft = ARGV[pos + 1] == '1', cost = ARGV[pos + 2], args = {}}
  for j = 1, n do s.args[j] = ARGV[pos + 3 + j] end
  specs[i] = s
  pos = pos + 4 + n
end
local function call(i, real)
  local s = specs[i]
  local a = {s.cmd, KEYS[i]}
  for _, v in ipairs(s.args) do a[#a + 1] = v end
  a[#a + 1] = 'COST'
  a[#a + 1] = s.cost
  if not real then a[#a + 1] = 'DRYRUN' end
  return redis.call(unpack(a))
end
local function admits(i, r) return r[1] == tonumber(specs[i].cost) end
local out, ok = {}, true
for i = 1, #KEYS do
  if not specs[i].soft then
    out[i] = call(i, false)
    if not admits(i, out[i]) then ok = false end
  end
end
local real = ok and not dry
for i = 1, #KEYS do
  if specs[i].soft or real then out[i] = call(i, real) end
end
local reply = {ok and 1 or 0, real and 1 or 0}
for i = 1, #KEYS do
  reply[#reply + 1] = admits(i, out[i]) and 1 or 0
  reply[#reply + 1] = out[i]
end
return reply
"#;

/// One descriptor's check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorCheck {
    pub key: String,
    pub limit: Limit,
    /// Units (hits_addend; 0 peeks). Never above the limit's capacity (decided locally).
    pub cost: u64,
    /// Shadow mode: never vetoes the request.
    pub soft: bool,
    /// Served from leases: the leasing rule's id (the service decides which checks lease; the
    /// backend decides every check it is given per request).
    pub lease: Option<String>,
}

/// A check's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// The limiter's reply; `remaining` is what is left after this request's outcome (unchanged
    /// when nothing was consumed).
    pub decision: Decision,
    /// This check admits (or would have, in a refused request).
    pub admitted: bool,
    /// Its units were taken.
    pub consumed: bool,
}

/// A request's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestResult {
    /// Every enforced check admitted (and, unless a dry run, consumed).
    pub admitted: bool,
    pub verdicts: Vec<CheckResult>,
}

#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub target: Target,
    /// Connections to a single server (each multiplexed).
    pub pool_size: usize,
    /// Per call (and per connection attempt).
    pub timeout: Duration,
    pub breaker: BreakerConfig,
    /// Benchmark baseline ([`crate::baseline`]): send what envoyproxy/ratelimit sends instead
    /// of the module's commands.
    pub baseline: bool,
}

/// The Redis backend of the service.
pub struct Backend {
    pub(crate) conns: Conns,
    pub(crate) timeout: Duration,
    pub breaker: Breaker,
    pub(crate) metrics: Arc<Metrics>,
    sha: String,
    epoch: Instant,
    /// Cluster: keys carry a `{domain}` hash tag (set by the service), so this is informative.
    pub cluster: bool,
    baseline: bool,
    /// Whether Redis has the module: [`MODULE_UNKNOWN`], [`MODULE_LOADED`], [`MODULE_MISSING`].
    module: AtomicU8,
    /// Redis refused the module probe (said once).
    probe_refused: AtomicBool,
}

/// The module's name in `INFO modules` (src/lib.rs's `redis_module!`).
const MODULE_NAME: &str = "ratelimit";
const MODULE_UNKNOWN: u8 = 0;
const MODULE_LOADED: u8 = 1;
const MODULE_MISSING: u8 = 2;

/// The text of every string in a reply (a cluster's `INFO` is one per node).
fn reply_text(v: &Value, out: &mut String) {
    match v {
        Value::BulkString(b) => out.push_str(&String::from_utf8_lossy(b)),
        Value::SimpleString(t) | Value::VerbatimString { text: t, .. } => out.push_str(t),
        Value::Array(a) | Value::Set(a) => a.iter().for_each(|x| reply_text(x, out)),
        Value::Map(m) => m.iter().for_each(|(k, x)| {
            reply_text(k, out);
            reply_text(x, out);
        }),
        _ => {}
    }
}

impl Backend {
    pub fn new(cfg: &BackendConfig, metrics: Arc<Metrics>) -> Result<Backend, String> {
        let conns = Conns::new(&cfg.target, cfg.pool_size, cfg.timeout)?;
        let cluster = conns.is_cluster();
        Ok(Backend {
            conns,
            timeout: cfg.timeout,
            breaker: Breaker::new(cfg.breaker),
            metrics,
            sha: redis::Script::new(SCRIPT).get_hash().to_string(),
            epoch: Instant::now(),
            cluster,
            baseline: cfg.baseline,
            module: AtomicU8::new(MODULE_UNKNOWN),
            probe_refused: AtomicBool::new(false),
        })
    }

    /// Redis answered without the module (issue 31.8): every request is decided by the
    /// failure mode, so the health checks fail (server.rs).
    pub fn module_missing(&self) -> bool {
        self.module.load(Ordering::Relaxed) == MODULE_MISSING
    }

    /// Redis is not known to have the module (never asked, or missing): worth asking.
    pub fn module_unconfirmed(&self) -> bool {
        self.module.load(Ordering::Relaxed) != MODULE_LOADED
    }

    /// Records whether Redis has the module, logging each change.
    fn set_module(&self, loaded: bool) {
        let new = if loaded { MODULE_LOADED } else { MODULE_MISSING };
        match (self.module.swap(new, Ordering::Relaxed), loaded) {
            (old, false) if old != MODULE_MISSING => tracing::error!(
                "Redis does not have the redis-ratelimit module loaded (no '{MODULE_NAME}' in INFO modules, \
                 RL.* commands unknown): every request is decided by the failure mode and the health checks \
                 fail; load it (--loadmodule, or MODULE LOAD)"
            ),
            (MODULE_MISSING, true) => tracing::info!("the redis-ratelimit module is loaded in Redis now"),
            _ => {}
        }
    }

    /// Asks Redis whether it has the module (`INFO modules`; outside the breaker and the
    /// metrics), records the answer and returns it; None: Redis did not answer, or refused
    /// (a user without `+info|modules`: said once, since then a missing module is not seen).
    pub async fn probe_module(&self) -> Option<bool> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("modules");
        let v = match self.conns.call(&cmd, None, tokio::time::Instant::now() + self.timeout).await {
            Ok(v) => v,
            Err(BackendError::Unavailable(_)) => return None,
            Err(e) => {
                if !self.probe_refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "Redis refused INFO modules ({e}): whether the redis-ratelimit module is loaded cannot be \
                         checked, so a missing module would not fail the health checks; grant the service's \
                         Redis user +info|modules (docs/service.md, \"The Redis user\")"
                    );
                }
                return None;
            }
        };
        let mut text = String::new();
        reply_text(&v, &mut text);
        let loaded = text.lines().any(|l| l.starts_with(&format!("module:name={MODULE_NAME},")));
        self.set_module(loaded);
        Some(loaded)
    }

    fn now_ns(&self) -> Nanos {
        Nanos::from(self.epoch.elapsed())
    }

    /// The connection layer (shared with the leases; its status for /healthcheck).
    pub fn connection(&self) -> &redis_ratelimit_client::Connection {
        self.conns.connection()
    }

    /// Is the breaker letting calls through (for /healthcheck)?
    pub fn healthy(&self) -> bool {
        !self.breaker.is_open()
    }

    /// One command, with the timeout, the breaker and the metrics.
    pub(crate) async fn call(&self, op: RedisOp, cmd: &Cmd, slot: Option<Slot>) -> Result<Value, BackendError> {
        self.call_by(op, cmd, slot, None).await
    }

    /// [`Backend::call`] ending by `deadline` too (the request's: see `Service::deadline`),
    /// getting a connection included. A call cut by the deadline is no verdict on Redis: the
    /// breaker does not count it (a deadline shorter than Redis's usual answer would open it).
    pub(crate) async fn call_by(
        &self,
        op: RedisOp,
        cmd: &Cmd,
        slot: Option<Slot>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Value, BackendError> {
        if let Permit::Reject { .. } = self.breaker.permit(self.now_ns()) {
            if !self.conns.reconnected_since_breaker_opened() {
                self.metrics.breaker_rejects.fetch_add(1, Ordering::Relaxed);
                return Err(BackendError::Unavailable("circuit breaker open".into()));
            }
        }
        let started = Instant::now();
        self.metrics.redis_call(op, 1);
        let own = tokio::time::Instant::now() + self.timeout;
        let cut = deadline.filter(|d| *d < own);
        let result = self.conns.call(cmd, slot, cut.unwrap_or(own)).await;
        if matches!(result, Err(BackendError::Unavailable(_))) && cut.is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            self.metrics.redis_latency.observe(started.elapsed());
            self.metrics.deadline_exceeded.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::Unavailable("no answer before the caller's deadline".into()));
        }
        self.metrics.redis_latency.observe(started.elapsed());
        let result = match result {
            // RL.RETURN refuses (ERR) only a key that is gone: a limiter that expired is full,
            // nothing to give back (the service gives back only to limits that take returns).
            Err(BackendError::Invalid(_)) if op == RedisOp::Return => Ok(Value::Int(0)),
            Err(BackendError::Invalid(m)) => Err(self.invalid(m)),
            r => r,
        };
        match &result {
            Ok(_) | Err(BackendError::Reply(_) | BackendError::NoScript | BackendError::Invalid(_)) => {
                self.breaker.on_success()
            }
            Err(BackendError::Unavailable(_)) => {
                self.metrics.redis_failures.fetch_add(1, Ordering::Relaxed);
                if self.breaker.on_failure(self.now_ns()) {
                    self.conns.breaker_opened();
                    self.metrics.breaker_opens.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "redis circuit breaker opened: {}",
                        result.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
                    );
                }
            }
        }
        result
    }

    /// Redis refused a request as invalid, or answered what the command never answers. With
    /// the module loaded that is the service's bug: counted, logged at ERROR (at powers of two:
    /// a flood stays a few lines), and the request is decided by the failure mode like any
    /// request Redis did not decide (never an accidental fail-open). Redis is asked again
    /// whether it has the module (the health loop asks within a second): an unknown command
    /// is the module missing, which the health checks report instead.
    pub(crate) fn invalid(&self, m: String) -> BackendError {
        if !self.module_missing() {
            let n = self.metrics.redis_invalid_requests.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::error!("Redis refused a request of the service as invalid ({n} so far; a bug): {m}");
            }
            let _ = self.module.compare_exchange(MODULE_LOADED, MODULE_UNKNOWN, Ordering::Relaxed, Ordering::Relaxed);
        }
        BackendError::Invalid(m)
    }

    /// A reply read as `T`; one that is not is [`Backend::invalid`].
    pub(crate) fn parse<T: FromRedisValue>(&self, v: Value) -> Result<T, BackendError> {
        T::from_redis_value(v).map_err(|e| self.invalid(format!("unexpected reply: {e}")))
    }

    pub(crate) fn slot_of(&self, key: &str) -> Option<Slot> {
        self.cluster.then(|| Slot::for_key(key))
    }

    /// Decides `checks` (see the module docs): one command when they share a slot; every call
    /// ends by `deadline` (a cross-slot give-back goes on after it, in the background).
    pub async fn decide(
        self: &Arc<Self>,
        checks: &[DescriptorCheck],
        dry_run: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<RequestResult, BackendError> {
        if checks.is_empty() {
            return Ok(RequestResult { admitted: true, verdicts: Vec::new() });
        }
        if self.baseline {
            return crate::baseline::decide(self, checks).await;
        }
        // Group by slot, keeping request order inside a group.
        let mut groups: Vec<(Option<Slot>, Vec<usize>)> = Vec::new();
        for (i, c) in checks.iter().enumerate() {
            let s = self.slot_of(&c.key);
            match groups.iter_mut().find(|(gs, _)| *gs == s) {
                Some((_, v)) => v.push(i),
                None => groups.push((s, vec![i])),
            }
        }
        if let [(slot, idx)] = groups.as_slice() {
            let (admitted, verdicts) = self.exec_group(checks, idx, *slot, dry_run, deadline).await?;
            return Ok(RequestResult { admitted, verdicts });
        }
        self.decide_across_slots(checks, &groups, dry_run, deadline).await
    }

    /// Check every slot, then commit (see the module docs); [`settle`] decides after each phase
    /// what the request is and what must be given back.
    async fn decide_across_slots(
        self: &Arc<Self>,
        checks: &[DescriptorCheck],
        groups: &[(Option<Slot>, Vec<usize>)],
        dry_run: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<RequestResult, BackendError> {
        let mut verdicts: Vec<Option<CheckResult>> = vec![None; checks.len()];
        let answers = |vs: &[Option<CheckResult>]| -> Vec<Answer> {
            checks
                .iter()
                .zip(vs)
                .map(|(c, v)| {
                    let v = v.expect("every check has a verdict");
                    Answer { admits: v.admitted, enforced: !c.soft, taken: v.consumed }
                })
                .collect()
        };
        let done = |admitted: bool, vs: Vec<Option<CheckResult>>| RequestResult {
            admitted,
            verdicts: vs.into_iter().map(|v| v.expect("every check has a verdict")).collect(),
        };
        // Phase 1: every group dry.
        let phase1 = join_all(groups.iter().map(|(s, idx)| self.exec_group(checks, idx, *s, true, deadline))).await;
        for ((_, idx), r) in groups.iter().zip(phase1) {
            for (i, v) in idx.iter().zip(r?.1) {
                verdicts[*i] = Some(v);
            }
        }
        let plan = settle(&answers(&verdicts), false);
        if !plan.admitted || dry_run {
            return Ok(done(plan.admitted, verdicts));
        }
        // Phase 2: commit, the groups whose limits all take returns first.
        let returnable = |idx: &Vec<usize>| idx.iter().all(|i| checks[*i].limit.algorithm().returnable());
        let mut sent = vec![Nanos::ZERO; checks.len()];
        let mut failure: Option<BackendError> = None;
        for pass in [true, false] {
            let batch: Vec<&(Option<Slot>, Vec<usize>)> =
                groups.iter().filter(|(_, idx)| returnable(idx) == pass).collect();
            let at = self.now_ns();
            let results =
                join_all(batch.iter().map(|(s, idx)| self.exec_group(checks, idx, *s, false, deadline))).await;
            let mut refused = false;
            for ((_, idx), r) in batch.iter().zip(results) {
                match r {
                    Ok((ok, vs)) => {
                        refused |= !ok;
                        for (i, v) in idx.iter().zip(vs) {
                            verdicts[*i] = Some(v);
                            sent[*i] = at;
                        }
                    }
                    Err(e) => failure = Some(e),
                }
            }
            if refused || failure.is_some() {
                break;
            }
        }
        let plan = settle(&answers(&verdicts), failure.is_some());
        let give_back: Vec<usize> = (0..checks.len()).filter(|&i| plan.actions[i] == Action::GiveBack).collect();
        if !give_back.is_empty() {
            for &i in &give_back {
                let v = verdicts[i].as_mut().expect("every check has a verdict");
                if checks[i].limit.algorithm().returnable() {
                    v.consumed = false;
                    v.decision.remaining = (v.decision.remaining + checks[i].cost).min(v.decision.limit);
                }
            }
            self.give_back(checks, &give_back, &sent, deadline).await;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(done(plan.admitted, verdicts)),
        }
    }

    /// Gives back what the committed groups of a refused request took (`RL.RETURN … AGE`, to
    /// the limits that take returns), waiting for it until `deadline`; past it the returns go
    /// on in the background.
    async fn give_back(
        self: &Arc<Self>,
        checks: &[DescriptorCheck],
        which: &[usize],
        sent: &[Nanos],
        deadline: Option<tokio::time::Instant>,
    ) {
        self.metrics.cluster_compensations.fetch_add(1, Ordering::Relaxed);
        let calls: Vec<(Cmd, Option<Slot>)> = which
            .iter()
            .filter(|&&i| checks[i].limit.algorithm().returnable())
            .map(|&i| {
                let age = return_age(sent[i], self.now_ns(), self.timeout.into());
                (give_back_cmd(&checks[i].key, checks[i].cost, Some(age)), self.slot_of(&checks[i].key))
            })
            .collect();
        let me = self.clone();
        let returns = tokio::spawn(async move {
            for r in join_all(calls.iter().map(|(c, s)| me.call(RedisOp::Return, c, *s))).await {
                if let Err(e) = r {
                    tracing::warn!("RL.RETURN after a cross-slot refusal failed: {e}");
                }
            }
        });
        match deadline {
            None => drop(returns.await),
            Some(d) => drop(tokio::time::timeout_at(d, returns).await),
        }
    }

    /// One group (one slot) in one command: the limiter command for one check, `RL.MULTI` for
    /// several enforced ones of one cost, else the script. Returns whether the group admits.
    async fn exec_group(
        &self,
        checks: &[DescriptorCheck],
        idx: &[usize],
        slot: Option<Slot>,
        dry: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(bool, Vec<CheckResult>), BackendError> {
        let group: Vec<&DescriptorCheck> = idx.iter().map(|i| &checks[*i]).collect();
        let cost = group[0].cost;
        let simple = group.iter().all(|c| !c.soft && c.cost == cost);
        if simple && group.len() == 1 {
            let c = group[0];
            let opts = Options { cost: Some(c.cost), dry_run: dry, partial: false };
            let v = self.call_by(RedisOp::Check, &limit_cmd(&c.key, &c.limit, opts), slot, deadline).await?;
            let d: Decision = self.parse(v)?;
            let admitted = d.allowed == c.cost;
            return Ok((admitted, vec![verdict(d, c.cost, admitted, admitted && !dry)]));
        }
        if simple {
            let opts = Options { cost: Some(cost), dry_run: dry, partial: false };
            let cmd = multi_cmd(group.iter().map(|c| (c.key.as_str(), &c.limit)), opts);
            let v = self.call_by(RedisOp::Multi, &cmd, slot, deadline).await?;
            let m: MultiDecision = self.parse(v)?;
            if m.limits.len() != group.len() {
                return Err(self.invalid(format!("RL.MULTI answered {} limits for {}", m.limits.len(), group.len())));
            }
            let ok = m.allowed == cost;
            // On a refusal each limit reports its own retry (None: it would have admitted, since
            // no cost here is above a capacity) and its unchanged remaining.
            let vs = m
                .limits
                .iter()
                .map(|d| {
                    if ok {
                        verdict(*d, cost, true, !dry)
                    } else {
                        CheckResult { decision: *d, admitted: d.retry_after.is_none(), consumed: false }
                    }
                })
                .collect();
            return Ok((ok, vs));
        }
        // numkeys, keys, then the script's ARGV (each limit's arguments by the client's one
        // encoding).
        let mut args: Vec<Vec<u8>> = vec![group.len().to_string().into_bytes()];
        args.extend(group.iter().map(|c| c.key.clone().into_bytes()));
        args.push(if dry { b"1" } else { b"0" }.to_vec());
        for c in &group {
            let mut la = Vec::new();
            each_limit_arg(&c.limit, |a| la.push(a.to_vec()));
            args.push(c.limit.algorithm().command().as_bytes().to_vec());
            args.push(if c.soft { b"1" } else { b"0" }.to_vec());
            args.push(c.cost.to_string().into_bytes());
            args.push(la.len().to_string().into_bytes());
            args.extend(la);
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(&args);
        let v = match self.call_by(RedisOp::Script, &cmd, slot, deadline).await {
            Err(BackendError::NoScript) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(SCRIPT).arg(&args);
                self.call_by(RedisOp::Script, &eval, slot, deadline).await?
            }
            r => r?,
        };
        parse_script_reply(&v, &group).map_err(|m| self.invalid(m))
    }
}

fn verdict(mut d: Decision, cost: u64, admitted: bool, consumed: bool) -> CheckResult {
    if admitted && !consumed {
        // A dry run reports what would remain after taking `cost`; nothing was taken.
        d.remaining = d.remaining.saturating_add(cost).min(d.limit);
    }
    CheckResult { decision: d, admitted, consumed }
}

fn parse_script_reply(v: &Value, group: &[&DescriptorCheck]) -> Result<(bool, Vec<CheckResult>), String> {
    let bad = || format!("unexpected script reply {v:?}");
    let items = match v {
        Value::Array(a) if a.len() == 2 + 2 * group.len() => a,
        _ => return Err(bad()),
    };
    let int = |x: &Value| match x {
        Value::Int(i) => Ok(*i),
        _ => Err(bad()),
    };
    let ok = int(&items[0])? == 1;
    let real = int(&items[1])? == 1;
    let mut vs = Vec::with_capacity(group.len());
    for (k, c) in group.iter().enumerate() {
        let admitted = int(&items[2 + 2 * k])? == 1;
        let d = Decision::from_redis_value_ref(&items[3 + 2 * k]).map_err(|e| e.to_string())?;
        let consumed = real && admitted && c.cost > 0;
        if admitted && !consumed {
            vs.push(verdict(d, c.cost, true, false));
        } else {
            vs.push(CheckResult { decision: d, admitted, consumed });
        }
    }
    Ok((ok, vs))
}
