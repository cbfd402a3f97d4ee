//! The server: the module's own pure core on a map of key → state, called exactly as the module
//! calls it per command (`Spec::check`, then `Update::apply` when there is something to store;
//! `give_back` for RL.RETURN). Time is the server's clock: virtual time plus an epoch offset.

use redis_ratelimit_core::codec::State;
use redis_ratelimit_core::give_back::give_back;
use redis_ratelimit_core::spec::Spec;
use redis_ratelimit_core::{Decision, Nanos, Request};

/// A command as an instance sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// RL.<ALGORITHM> key … COST cost [PARTIAL].
    Check { key: usize, cost: u64, partial: bool },
    /// RL.RETURN key units [AGE age]: `age` is the time since the claim was sent.
    Return { key: usize, units: u64, age: i64 },
}

/// The server's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Decision(Decision),
    /// Units credited back by RL.RETURN.
    Credited(u64),
    /// An error reply (RL.RETURN refused, wrong type): the call failed.
    Error,
}

pub struct Server {
    specs: Vec<Spec>,
    states: Vec<Option<State>>,
    /// Units granted per key (Σ allowed).
    pub granted: Vec<u64>,
    /// Units credited back per key.
    pub credited: Vec<u64>,
    pub commands: u64,
}

impl Server {
    pub fn new(specs: Vec<Spec>) -> Server {
        let n = specs.len();
        Server { specs, states: vec![None; n], granted: vec![0; n], credited: vec![0; n], commands: 0 }
    }

    pub fn spec(&self, key: usize) -> &Spec {
        &self.specs[key]
    }

    /// Runs one command at server time `now`.
    pub fn execute(&mut self, cmd: Command, now: i64) -> Answer {
        self.commands += 1;
        match cmd {
            Command::Check { key, cost, partial } => {
                let req = Request { cost, partial };
                let Ok((d, update)) = self.specs[key].check(self.states[key].as_ref(), Nanos::new(now), req) else {
                    return Answer::Error;
                };
                if let Some(u) = update {
                    match u.apply(self.states[key].as_mut()) {
                        Ok(Some(fresh)) => self.states[key] = Some(fresh),
                        Ok(None) => {}
                        Err(_) => return Answer::Error,
                    }
                }
                self.granted[key] += d.allowed;
                Answer::Decision(d)
            }
            Command::Return { key, units, age } => {
                // A missing key is a full limiter: nothing to credit (the module answers an error
                // the client takes as 0 credited).
                let Some(state) = self.states[key].as_ref() else {
                    return Answer::Credited(0);
                };
                match give_back(state, units, Some(Nanos::new(age)), Nanos::new(now)) {
                    Ok(credit) => {
                        if let Some(s) = credit.state {
                            self.states[key] = Some(s);
                        }
                        self.credited[key] += credit.credited;
                        Answer::Credited(credit.credited)
                    }
                    Err(_) => Answer::Error,
                }
            }
        }
    }
}
