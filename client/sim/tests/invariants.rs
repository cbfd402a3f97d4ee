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
