//! The discrete-event loop: arrivals, calls travelling to the server and back, client ticks,
//! instances joining, leaving and crashing. Virtual time in integer nanoseconds; events at the
//! same instant run in the order they were scheduled, so a run is a function of its seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::model::{Admission, CallId, CallResult, CallerId, ClientModel, Effect};
use crate::net::{sample_rtt, Availability, Outages};
use crate::rng::Rng;
use crate::server::{Answer, Command, Server};
use redis_ratelimit_core::spec::Spec;

/// The server's clock at virtual time 0 (late 2025, not aligned to any window).
pub const SERVER_EPOCH: i64 = 1_764_000_123_456_789_000;

/// Demand for one key: a Poisson process whose rate (per second) changes at given instants.
#[derive(Clone, Debug)]
pub struct Traffic {
    pub key: usize,
    /// (from, rate per second), sorted by time; rate 0 before the first entry.
    pub rate: Vec<(i64, f64)>,
}

impl Traffic {
    fn rate_at(&self, t: i64) -> (f64, Option<i64>) {
        let i = self.rate.iter().rposition(|(from, _)| *from <= t);
        let rate = i.map_or(0.0, |i| self.rate[i].1);
        let next = self.rate.get(i.map_or(0, |i| i + 1)).map(|(from, _)| *from);
        (rate, next)
    }

    /// The next arrival after `t` (memoryless: at a rate change, draw again from there).
    fn next_after(&self, mut t: i64, rng: &mut Rng) -> Option<i64> {
        loop {
            let (rate, change) = self.rate_at(t);
            let next = if rate > 0.0 { Some(t + (rng.exp(1e9 / rate) as i64).max(1)) } else { None };
            match (next, change) {
                (Some(n), Some(c)) if n >= c => t = c,
                (None, Some(c)) => t = c,
                (n, _) => return n,
            }
        }
    }
}

/// How an instance leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Shuts down and gives back what it holds.
    Graceful,
    /// Disappears holding whatever it holds; its calls in flight are lost.
    Crash,
}

#[derive(Clone, Debug)]
pub struct InstancePlan {
    pub start: i64,
    pub exit: Option<(i64, Exit)>,
    /// Share of the traffic while running (relative to the other running instances).
    pub weight: f64,
}

#[derive(Clone, Debug)]
pub struct Setup {
    pub specs: Vec<Spec>,
    pub sources: Vec<Traffic>,
    pub instances: Vec<InstancePlan>,
    pub duration: i64,
    pub outages: Outages,
    /// Named phase starts (sorted); counters are kept per phase.
    pub phases: Vec<(i64, &'static str)>,
    pub timeout: i64,
    pub seed: u64,
}

/// A ledger of the units an instance received for a key, each usable until its claim's send
/// plus the lease length: every admission against granted units must find one (earliest
/// expiry first, which serves the most). Returns are ignored, which only makes it lenient.
#[derive(Default)]
struct Ledger(BinaryHeap<Reverse<(i64, u64)>>);

impl Ledger {
    fn receive(&mut self, usable_until: i64, units: u64) {
        if units > 0 {
            self.0.push(Reverse((usable_until, units)));
        }
    }

    /// Takes one unit usable at `t`; false when there is none.
    fn take(&mut self, t: i64) -> bool {
        while let Some(Reverse((until, units))) = self.0.pop() {
            if until < t {
                continue; // expired
            }
            if units > 1 {
                self.0.push(Reverse((until, units - 1)));
            }
            return true;
        }
        false
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct PhaseCounters {
    pub requests: u64,
    pub enforced: u64,
    pub open: u64,
    pub fallback: u64,
    pub limited: u64,
    pub calls: u64,
}

#[derive(Clone, Debug, Default)]
pub struct InstanceRecord {
    pub demand: u64,
    pub admitted: u64,
    /// Units granted in answers this instance received (claims and per-request checks).
    pub units_received: u64,
    /// Units this instance sent back with RL.RETURN.
    pub units_sent_back: u64,
    pub enforced: u64,
    pub counters: crate::model::ModelCounters,
}

/// Everything a run leaves behind for the metrics and the invariants.
#[derive(Debug, Default)]
pub struct Record {
    /// Per key: the instants of admissions against granted units, in order.
    pub enforced_at: Vec<Vec<i64>>,
    /// Fallback admissions: (instance, key, instant).
    pub fallback_at: Vec<(usize, usize, i64)>,
    /// Added latency of every request, ns (0 for a local decision).
    pub latency: Vec<u32>,
    pub instances: Vec<InstanceRecord>,
    pub phases: Vec<(&'static str, i64, PhaseCounters)>,
    pub checks_sent: u64,
    pub returns_sent: u64,
    pub refused: u64,
    pub timeouts: u64,
    pub granted: Vec<u64>,
    pub credited: Vec<u64>,
    /// What a zero-latency central limiter (the core checked at every arrival) admits, per key.
    pub ideal_admitted: Vec<u64>,
    pub demand: Vec<u64>,
    pub duration: i64,
    /// Admissions against granted units that no unexpired received unit covers (must be 0).
    pub uncovered: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Start(usize),
    Exit(usize),
    Arrival(usize),
    ServerReceives(CallId),
    Deliver(CallId),
    Tick(usize),
}

struct Call {
    instance: usize,
    generation: u64,
    command: Command,
    sent: i64,
    outcome: Option<CallResult>,
}

struct Instance {
    model: Option<Box<dyn ClientModel>>,
    generation: u64,
    /// The instance's monotonic clock reads virtual time + offset.
    offset: i64,
    tick_at: Option<i64>,
}

struct Pending {
    arrival: i64,
    instance: usize,
    key: usize,
}

pub struct Engine<'a> {
    setup: &'a Setup,
    make_model: &'a dyn Fn(usize) -> Box<dyn ClientModel>,
    now: i64,
    seq: u64,
    queue: BinaryHeap<Reverse<(i64, u64, Event)>>,
    server: Server,
    ideal: Server,
    instances: Vec<Instance>,
    calls: HashMap<CallId, Call>,
    next_call: CallId,
    pending: HashMap<CallerId, Pending>,
    next_caller: CallerId,
    arrivals_rng: Vec<Rng>,
    ledgers: HashMap<(usize, usize), Ledger>,
    /// How long after its claim's send a granted unit may be admitted (the lease, or the
    /// timeout for per-request checks).
    usable_for: i64,
    routing_rng: Rng,
    net_rng: Rng,
    record: Record,
}

impl<'a> Engine<'a> {
    pub fn run(setup: &'a Setup, usable_for: i64, make_model: &'a dyn Fn(usize) -> Box<dyn ClientModel>) -> Record {
        let keys = setup.specs.len();
        let mut clock_rng = Rng::fork(setup.seed, 3);
        let instances = (0..setup.instances.len())
            .map(|_| Instance {
                model: None,
                generation: 0,
                offset: clock_rng.below(1_000_000_000_000) as i64,
                tick_at: None,
            })
            .collect();
        let mut e = Engine {
            setup,
            make_model,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            server: Server::new(setup.specs.clone()),
            ideal: Server::new(setup.specs.clone()),
            instances,
            calls: HashMap::new(),
            next_call: 0,
            pending: HashMap::new(),
            next_caller: 0,
            ledgers: HashMap::new(),
            usable_for,
            arrivals_rng: (0..setup.sources.len()).map(|i| Rng::fork(setup.seed, 1000 + i as u64)).collect(),
            routing_rng: Rng::fork(setup.seed, 1),
            net_rng: Rng::fork(setup.seed, 2),
            record: Record {
                enforced_at: vec![Vec::new(); keys],
                instances: vec![InstanceRecord::default(); setup.instances.len()],
                phases: setup.phases.iter().map(|(t, n)| (*n, *t, PhaseCounters::default())).collect(),
                ideal_admitted: vec![0; keys],
                demand: vec![0; keys],
                duration: setup.duration,
                ..Default::default()
            },
        };
        for (i, plan) in setup.instances.iter().enumerate() {
            e.schedule(plan.start, Event::Start(i));
            if let Some((at, _)) = plan.exit {
                e.schedule(at, Event::Exit(i));
            }
        }
        for s in 0..setup.sources.len() {
            if let Some(t) = setup.sources[s].next_after(0, &mut e.arrivals_rng[s]) {
                e.schedule(t, Event::Arrival(s));
            }
        }
        while let Some(Reverse((t, _, ev))) = e.queue.pop() {
            if t > setup.duration {
                break;
            }
            e.now = t;
            e.handle(ev);
        }
        e.now = setup.duration;
        for i in 0..e.instances.len() {
            if let Some(m) = e.instances[i].model.as_ref() {
                e.record.instances[i].counters = m.counters();
            }
        }
        e.record.granted = e.server.granted.clone();
        e.record.credited = e.server.credited.clone();
        e.record.ideal_admitted = e.ideal.granted.clone();
        e.record
    }

    fn schedule(&mut self, t: i64, ev: Event) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, ev)));
    }

    fn phase(&mut self) -> &mut PhaseCounters {
        self.phase_at(self.now)
    }

    fn phase_at(&mut self, t: i64) -> &mut PhaseCounters {
        let i = self.record.phases.iter().rposition(|(_, from, _)| *from <= t).unwrap_or(0);
        &mut self.record.phases[i].2
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Start(i) => {
                let inst = &mut self.instances[i];
                inst.generation += 1;
                inst.model = Some((self.make_model)(i));
                inst.tick_at = None;
                self.after_model(i);
            }
            Event::Exit(i) => {
                if self.setup.instances[i].exit.map(|(_, x)| x) == Some(Exit::Graceful) {
                    self.drive(i, |m, now, ids, out| m.shutdown(now, ids, out));
                }
                if let Some(m) = self.instances[i].model.take() {
                    self.record.instances[i].counters = m.counters();
                }
                self.instances[i].generation += 1;
                // Callers still waiting on this instance get no verdict (their process is gone).
                self.pending.retain(|_, p| p.instance != i);
            }
            Event::Arrival(s) => {
                let src = &self.setup.sources[s];
                let key = src.key;
                if let Some(t) = src.next_after(self.now, &mut self.arrivals_rng[s]) {
                    self.schedule(t, Event::Arrival(s));
                }
                self.record.demand[key] += 1;
                self.ideal.execute(Command::Check { key, cost: 1, partial: false }, self.now + SERVER_EPOCH);
                let Some(i) = self.route() else { return };
                self.record.instances[i].demand += 1;
                self.phase().requests += 1;
                let caller = self.next_caller;
                self.next_caller += 1;
                self.pending.insert(caller, Pending { arrival: self.now, instance: i, key });
                self.drive(i, |m, now, ids, out| m.request(now, key, caller, ids, out));
            }
            Event::ServerReceives(id) => {
                let Some(call) = self.calls.get(&id) else { return };
                let command = call.command;
                if self.setup.outages.at(self.now) != Availability::Up {
                    return; // lost with the connection: the caller times out
                }
                let answer = self.server.execute(command, self.now + SERVER_EPOCH);
                self.calls.get_mut(&id).unwrap().outcome = Some(CallResult::Answer(answer));
            }
            Event::Deliver(id) => {
                let Some(call) = self.calls.remove(&id) else { return };
                let i = call.instance;
                if call.generation != self.instances[i].generation || self.instances[i].model.is_none() {
                    return; // the instance is gone: a crash loses what was in flight
                }
                let outcome = match call.outcome {
                    Some(o) if self.now - call.sent <= self.setup.timeout => o,
                    Some(CallResult::Refused) => CallResult::Refused,
                    _ => CallResult::Timeout,
                };
                match outcome {
                    CallResult::Refused => self.record.refused += 1,
                    CallResult::Timeout => self.record.timeouts += 1,
                    CallResult::Answer(Answer::Decision(d)) => {
                        self.record.instances[i].units_received += d.allowed;
                        if let Command::Check { key, .. } = call.command {
                            self.ledgers.entry((i, key)).or_default().receive(call.sent + self.usable_for, d.allowed);
                        }
                    }
                    CallResult::Answer(_) => {}
                }
                self.drive(i, |m, now, ids, out| m.outcome(now, id, outcome, ids, out));
            }
            Event::Tick(i) => {
                let inst = &self.instances[i];
                let due = inst.tick_at.map(|t| t - inst.offset);
                if due != Some(self.now) || inst.model.is_none() {
                    return; // superseded
                }
                self.instances[i].tick_at = None;
                self.drive(i, |m, now, ids, out| m.tick(now, ids, out));
            }
        }
    }

    /// Runs one model entry point on instance `i` (in its own clock), then carries out what
    /// it asked for.
    fn drive(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut dyn ClientModel, i64, &mut dyn FnMut() -> CallId, &mut Vec<Effect>),
    ) {
        let now = self.now + self.instances[i].offset;
        let mut out = Vec::new();
        let next = &mut self.next_call;
        let mut ids = || {
            *next += 1;
            *next
        };
        let Some(m) = self.instances[i].model.as_mut() else { return };
        f(m.as_mut(), now, &mut ids, &mut out);
        self.apply(i, out);
    }

    /// Picks a running instance by weight.
    fn route(&mut self) -> Option<usize> {
        let total: f64 = self.running().map(|i| self.setup.instances[i].weight).sum();
        if total <= 0.0 {
            return None;
        }
        let mut x = self.routing_rng.unit() * total;
        let mut last = None;
        for i in self.running() {
            last = Some(i);
            x -= self.setup.instances[i].weight;
            if x <= 0.0 {
                return Some(i);
            }
        }
        last
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.instances.len()).filter(|&i| self.instances[i].model.is_some())
    }

    fn apply(&mut self, i: usize, out: Vec<Effect>) {
        for effect in out {
            match effect {
                Effect::Send { call, command } => self.send(i, call, command),
                Effect::Admission { caller, verdict } => self.verdict(i, caller, verdict),
            }
        }
        self.after_model(i);
    }

    /// Reschedules the instance's tick after the model changed.
    fn after_model(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        let Some(m) = inst.model.as_ref() else { return };
        let want = m.next_tick();
        if want != inst.tick_at {
            inst.tick_at = want;
            if let Some(t) = want {
                let at = (t - inst.offset).max(self.now);
                inst.tick_at = Some(at + inst.offset);
                self.schedule(at, Event::Tick(i));
            }
        }
    }

    fn send(&mut self, i: usize, id: CallId, command: Command) {
        match command {
            Command::Check { .. } => self.record.checks_sent += 1,
            Command::Return { units, .. } => {
                self.record.returns_sent += 1;
                self.record.instances[i].units_sent_back += units;
            }
        }
        self.phase().calls += 1;
        let rtt = sample_rtt(&mut self.net_rng);
        let generation = self.instances[i].generation;
        let mut call = Call { instance: i, generation, command, sent: self.now, outcome: None };
        match self.setup.outages.at(self.now) {
            Availability::Up => {
                self.schedule(self.now + rtt / 2, Event::ServerReceives(id));
                self.schedule(self.now + rtt.min(self.setup.timeout), Event::Deliver(id));
            }
            Availability::Refusing => {
                call.outcome = Some(CallResult::Refused);
                self.schedule(self.now + (rtt / 2).min(self.setup.timeout), Event::Deliver(id));
            }
            Availability::Hanging => self.schedule(self.now + self.setup.timeout, Event::Deliver(id)),
        }
        self.calls.insert(id, call);
    }

    fn verdict(&mut self, i: usize, caller: CallerId, verdict: Admission) {
        let Some(p) = self.pending.remove(&caller) else { return };
        debug_assert_eq!(p.instance, i);
        let waited = (self.now - p.arrival).clamp(0, u32::MAX as i64) as u32;
        self.record.latency.push(waited);
        let rec = &mut self.record.instances[i];
        if verdict != Admission::Limited {
            rec.admitted += 1;
        }
        match verdict {
            Admission::Enforced => {
                rec.enforced += 1;
                self.record.enforced_at[p.key].push(self.now);
                if !self.ledgers.entry((i, p.key)).or_default().take(self.now) {
                    self.record.uncovered += 1;
                }
                self.phase_at(p.arrival).enforced += 1;
            }
            Admission::Open => self.phase_at(p.arrival).open += 1,
            Admission::Fallback => {
                self.record.fallback_at.push((i, p.key, self.now));
                self.phase_at(p.arrival).fallback += 1;
            }
            Admission::Limited => self.phase_at(p.arrival).limited += 1,
        }
    }
}
