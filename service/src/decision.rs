//! The all-or-nothing rule of a request's descriptors, in one place and pure: given each
//! descriptor's own answer (from Redis, a lease's local pool, or the local fallback), whether
//! the request is admitted and, per descriptor, what must still be taken or given back.
//!
//! A request is admitted only if every enforced descriptor admits; then every descriptor that
//! admits (shadow-mode ones included) ends with its units taken, and every other one with
//! none. A refused request consumes nothing. The callers only execute the plan: a single
//! command already settles it inside Redis (the limiter command, `RL.MULTI`, the script); the
//! cross-slot protocol commits what [`Action::Take`] says after its dry runs and gives back
//! what [`Action::GiveBack`] says after a refused commit; the leased path refunds its local
//! pools; the local fallback takes from its buckets.

/// One descriptor's own answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Its limit admits the request's units.
    pub admits: bool,
    /// It can refuse the request (not in shadow mode).
    pub enforced: bool,
    /// Its units are taken already (a real run, a lease's local pool).
    pub taken: bool,
}

/// What a descriptor still needs once the request's fate is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// As it is.
    Keep,
    /// Its units must be taken (it admits, the request is admitted, it ran dry).
    Take,
    /// Its units were taken and must be given back (the request is refused).
    GiveBack,
}

/// A request's outcome: admitted or not, and each descriptor's [`Action`], in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub admitted: bool,
    pub actions: Vec<Action>,
}

/// The rule (see the module docs). `refused_elsewhere`: an enforced descriptor refused
/// without an answer here (no limit at all, more hits than its capacity, another part of the
/// request): the request is refused whatever these answers say.
pub fn settle(answers: &[Answer], refused_elsewhere: bool) -> Plan {
    let admitted = !refused_elsewhere && answers.iter().all(|a| a.admits || !a.enforced);
    let actions = answers
        .iter()
        .map(|a| match (a.taken, admitted && a.admits) {
            (false, true) => Action::Take,
            (true, false) => Action::GiveBack,
            _ => Action::Keep,
        })
        .collect();
    Plan { admitted, actions }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    fn a(admits: bool, enforced: bool, taken: bool) -> Answer {
        Answer { admits, enforced, taken }
    }

    #[test]
    fn admitted_when_every_enforced_descriptor_admits() {
        // Dry runs that all admit: take them all, the admitting shadow one too.
        let p = settle(&[a(true, true, false), a(true, false, false), a(true, true, false)], false);
        assert_eq!(p, Plan { admitted: true, actions: vec![Take, Take, Take] });
        // A shadow descriptor refusing vetoes nothing and takes nothing.
        let p = settle(&[a(true, true, false), a(false, false, false)], false);
        assert_eq!(p, Plan { admitted: true, actions: vec![Take, Keep] });
        // Already taken (one atomic command): nothing left to do.
        let p = settle(&[a(true, true, true), a(true, false, true)], false);
        assert_eq!(p, Plan { admitted: true, actions: vec![Keep, Keep] });
        // No descriptor at all: admitted.
        assert_eq!(settle(&[], false), Plan { admitted: true, actions: vec![] });
    }

    #[test]
    fn a_refused_request_consumes_nothing() {
        // One enforced refusal: what was taken goes back (a committed slot, a leased unit, an
        // admitting shadow descriptor), what ran dry stays untouched.
        let p =
            settle(&[a(true, true, true), a(false, true, false), a(true, false, true), a(true, true, false)], false);
        assert_eq!(p, Plan { admitted: false, actions: vec![GiveBack, Keep, GiveBack, Keep] });
        // Refused elsewhere (a descriptor without a limit, hits above a capacity): the leased
        // units taken before it was known go back.
        let p = settle(&[a(true, true, true), a(true, true, false)], true);
        assert_eq!(p, Plan { admitted: false, actions: vec![GiveBack, Keep] });
        assert_eq!(settle(&[], true), Plan { admitted: false, actions: vec![] });
    }
}
