//! Every scenario at the quick scale, in every available mode: the invariants hold (never
//! timings), and a run is a pure function of its seed.

use redis_ratelimit_sim::cli::{json, run_all};
use redis_ratelimit_sim::scenarios::Scale;

#[test]
fn quick_scenarios_keep_every_invariant() {
    let summaries = run_all(Scale::Quick, None);
    assert!(summaries.len() >= 11, "every scenario ran in at least the baseline mode");
    let bad: Vec<String> = summaries
        .iter()
        .flat_map(|s| s.violations.iter().map(move |v| format!("{} / {}: {v}", s.scenario, s.mode)))
        .collect();
    assert!(bad.is_empty(), "invariants violated:\n{}", bad.join("\n"));
}

#[test]
fn runs_are_deterministic() {
    let a = json(&run_all(Scale::Quick, Some("S2")));
    let b = json(&run_all(Scale::Quick, Some("S2")));
    assert_eq!(a, b);
}

/// The checks are not vacuous: a client that admits without claiming is caught.
#[test]
fn a_client_that_admits_without_claiming_is_caught() {
    use redis_ratelimit_sim::model::{
        Admission, CallId, CallResult, CallerId, ClientModel, Effect, FailurePolicy, ModelCounters,
    };
    use redis_ratelimit_sim::scenarios::{run, s2, LeaseFactory, Mode};

    struct AdmitsEverything;
    impl ClientModel for AdmitsEverything {
        fn request(
            &mut self,
            _: i64,
            _: usize,
            caller: CallerId,
            _: &mut dyn FnMut() -> CallId,
            out: &mut Vec<Effect>,
        ) {
            out.push(Effect::Admission { caller, verdict: Admission::Enforced });
        }
        fn outcome(&mut self, _: i64, _: CallId, _: CallResult, _: &mut dyn FnMut() -> CallId, _: &mut Vec<Effect>) {}
        fn tick(&mut self, _: i64, _: &mut dyn FnMut() -> CallId, _: &mut Vec<Effect>) {}
        fn next_tick(&self) -> Option<i64> {
            None
        }
        fn shutdown(&mut self, _: i64, _: &mut dyn FnMut() -> CallId, _: &mut Vec<Effect>) {}
        fn counters(&self) -> ModelCounters {
            ModelCounters::default()
        }
    }
    let factory: Box<LeaseFactory> = Box::new(|_, _, _| Box::new(AdmitsEverything));
    let s = run(&s2(Scale::Quick), Mode::Leases(FailurePolicy::Closed), Some(&*factory)).unwrap();
    let all = s.violations.join("\n");
    assert!(all.contains("not covered"), "{all}");
    assert!(all.contains("max in window"), "{all}");
    assert!(all.contains("granted"), "{all}");
}
