//! RL.MULTI's decision: several limits, each against its own key's state, decided at one
//! instant and all or nothing. Pure: the module opens the keys, calls `check`, stores what it
//! says to store and replies with its decisions.

use super::codec::State;
use super::spec::{AlgorithmMismatch, Spec, Update};
use super::{Decision, Nanos, Request};

/// What a call decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiDecision {
    /// Units every limit granted (all of COST, or with PARTIAL the least any limit had); 0
    /// when refused or peeking (COST 0).
    pub allowed: u64,
    /// Units were asked for and none granted.
    pub limited: bool,
    /// When limited: the time until the whole request fits, the longest wait among the
    /// limits that refuse it. None when not limited, or when one refusing limit can never
    /// admit it (COST above its capacity).
    pub retry_after: Option<Nanos>,
    /// Each limit's part, in the order given.
    pub limits: Vec<LimitPart>,
}

/// One limit's part of an outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitPart {
    /// Its reply. Refused: nothing is consumed, and each limit shows its own state unchanged
    /// (`remaining` and `reset_after` of a peek) with its own `retry_after`.
    pub decision: Decision,
    /// What to store at its key (None: nothing).
    pub store: Option<Store>,
}

/// An update to store, and the reset it must last for (the key's TTL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    pub update: Update,
    pub reset_after: Nanos,
}

/// Decides `req` against every limit at `now`: `specs[i]` against the i-th state (None: a
/// missing key). Admitted, every limit consumes what was granted (as single calls with that
/// cost would); refused, none consumes anything, but a refusing limit whose key held another
/// rate or window keeps its converted state, exactly as the single-key command does. The first
/// limit whose key holds another algorithm's state is the error.
pub fn check<'a>(
    specs: &[Spec],
    states: impl Iterator<Item = Option<&'a State>> + Clone,
    now: Nanos,
    req: Request,
) -> Result<MultiDecision, AlgorithmMismatch> {
    // Each limit's part is decided straight into the outcome's own vector (one allocation);
    // a store is kept only where the rule below allows it.
    let decide = |req: Request| -> Result<Vec<LimitPart>, AlgorithmMismatch> {
        specs
            .iter()
            .zip(states.clone())
            .map(|(spec, st)| {
                let (decision, update) = spec.check(st, now, req)?;
                let store = update.map(|update| Store { update, reset_after: decision.reset_after });
                Ok(LimitPart { decision, store })
            })
            .collect()
    };
    // How many units every limit grants: all of COST, or with PARTIAL the least any grants.
    let first = decide(req)?;
    let grant = if req.partial {
        first.iter().map(|l| l.decision.allowed).min().unwrap_or(0)
    } else if first.iter().all(|l| l.decision.allowed == req.cost) {
        req.cost
    } else {
        0
    };
    let admitted = grant > 0;
    let mut limits = if admitted && grant != req.cost { decide(Request::new(grant))? } else { first };
    let limited = req.cost > 0 && !admitted;
    let mut retry: Option<Nanos> = None;
    let mut never = false;
    if !admitted {
        // Refused: a limit keeps its store only when it refused under new parameters (its
        // converted state, exactly as the single-key command keeps it).
        for l in &mut limits {
            if l.decision.allowed != 0 {
                l.store = None;
            }
        }
    }
    // Refused: each limit reports its view with its state unchanged.
    if limited {
        let peeks = decide(Request::new(0))?;
        for (l, p) in limits.iter_mut().zip(&peeks) {
            let d = l.decision;
            let refused = d.allowed == 0 || (!req.partial && d.allowed < req.cost);
            if refused {
                match d.retry_after {
                    Some(r) => retry = Some(retry.map_or(r, |x| x.max(r))),
                    None => never = true,
                }
            }
            let unchanged = p.decision;
            l.decision = Decision {
                allowed: 0,
                remaining: unchanged.remaining,
                reset_after: unchanged.reset_after,
                delay: None,
                ..d
            };
        }
    }
    Ok(MultiDecision {
        allowed: if admitted && req.cost > 0 { grant } else { 0 },
        limited,
        retry_after: if never || !limited { None } else { retry },
        limits,
    })
}
