//! `redis-ratelimit-sim [--quick] [--out DIR] [--only TEXT]`: runs every scenario in every
//! mode, prints the table, writes DIR/summary.json and DIR/summary.md, and exits non-zero when
//! an invariant was violated.

use crate::metrics::Summary;
use crate::scenarios::{self, Scale};
use std::fmt::Write as _;

pub fn main(args: Vec<String>) -> i32 {
    let mut scale = Scale::Full;
    let mut out = String::from("target/simulate");
    let mut only: Option<String> = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => scale = Scale::Quick,
            "--out" => out = it.next().unwrap_or(out),
            "--only" => only = it.next(),
            other => {
                eprintln!("unknown argument {other}; usage: redis-ratelimit-sim [--quick] [--out DIR] [--only TEXT]");
                return 2;
            }
        }
    }
    let summaries = run_all(scale, only.as_deref());
    let md = table(&summaries);
    print!("{md}");
    if let Err(e) = std::fs::create_dir_all(&out)
        .and_then(|_| std::fs::write(format!("{out}/summary.json"), json(&summaries)))
        .and_then(|_| std::fs::write(format!("{out}/summary.md"), &md))
    {
        eprintln!("cannot write {out}: {e}");
        return 2;
    }
    let bad: Vec<&Summary> = summaries.iter().filter(|s| !s.violations.is_empty()).collect();
    for s in &bad {
        for v in &s.violations {
            eprintln!("INVARIANT VIOLATED [{} / {}]: {v}", s.scenario, s.mode);
        }
    }
    eprintln!("wrote {out}/summary.json ({} runs, {} with violations)", summaries.len(), bad.len());
    i32::from(!bad.is_empty())
}

/// Runs every scenario in every available mode, on as many threads as there are cores (each
/// run is independent and seeded: the results do not depend on the threads), in a fixed order.
pub fn run_all(scale: Scale, only: Option<&str>) -> Vec<Summary> {
    let leases = crate::lease::factory();
    let scenarios: Vec<_> =
        scenarios::all(scale).into_iter().filter(|sc| only.is_none_or(|o| sc.name.contains(o))).collect();
    let jobs: Vec<(usize, scenarios::Mode)> =
        scenarios.iter().enumerate().flat_map(|(i, sc)| sc.modes.iter().map(move |m| (i, *m))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len().max(1));
    let mut results: Vec<(usize, Summary)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(i, mode)) = jobs.get(j) else { break };
                        let started = std::time::Instant::now();
                        match scenarios::run(&scenarios[i], mode, leases.as_deref()) {
                            Some(s) => {
                                eprintln!(
                                    "{} / {}: {} requests in {:.1} s",
                                    s.scenario,
                                    s.mode,
                                    s.requests,
                                    started.elapsed().as_secs_f64()
                                );
                                done.push((j, s));
                            }
                            None => eprintln!("{} / {}: mode not available", scenarios[i].name, mode.name()),
                        }
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a simulation thread panicked")).collect()
    });
    results.sort_by_key(|(j, _)| *j);
    results.into_iter().map(|(_, s)| s).collect()
}

fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.6}")
    } else {
        "null".into()
    }
}

fn esc(s: &str) -> String {
    let mut o = String::new();
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

/// One JSON object per scenario and mode.
pub fn json(v: &[Summary]) -> String {
    let mut o = String::from("[\n");
    for (i, s) in v.iter().enumerate() {
        let phases: Vec<String> = s
            .phases
            .iter()
            .map(|(n, c)| {
                format!(
                    "{{\"phase\": \"{}\", \"requests\": {}, \"enforced\": {}, \"open\": {}, \"fallback\": {}, \"limited\": {}, \"calls\": {}}}",
                    esc(n), c.requests, c.enforced, c.open, c.fallback, c.limited, c.calls
                )
            })
            .collect();
        let violations: Vec<String> = s.violations.iter().map(|x| format!("\"{}\"", esc(x))).collect();
        let _ = writeln!(
            o,
            "  {{\"scenario\": \"{}\", \"mode\": \"{}\", \"algorithm\": \"{}\", \"requests\": {}, \"admitted\": {}, \"redis_calls\": {}, \
\"redis_calls_per_admitted\": {}, \"calls_per_request_limited\": {}, \"max_in_window\": {}, \"bound\": {}, \
\"max_in_window_tenth\": {}, \"bound_tenth\": {}, \"utilisation\": {}, \"jain\": {}, \"p50_added_us\": {}, \
\"p99_added_us\": {}, \"p999_added_us\": {}, \"max_added_us\": {}, \"expired_units\": {}, \"returned_units\": {}, \
\"credited_units\": {}, \"timeouts\": {}, \"refused\": {}, \"phases\": [{}], \"violations\": [{}]}}{}",
            esc(&s.scenario),
            esc(&s.mode),
            esc(&s.algorithm),
            s.requests,
            s.admitted,
            s.redis_calls,
            num(s.redis_calls_per_admitted),
            s.calls_per_request_limited.map_or("null".into(), num),
            s.max_in_window,
            s.bound,
            s.max_in_window_tenth,
            s.bound_tenth,
            num(s.utilisation),
            num(s.jain),
            num(s.p50_added_us),
            num(s.p99_added_us),
            num(s.p999_added_us),
            num(s.max_added_us),
            s.expired_units,
            s.returned_units,
            s.credited_units,
            s.timeouts,
            s.refused,
            phases.join(", "),
            violations.join(", "),
            if i + 1 < v.len() { "," } else { "" }
        );
    }
    o.push_str("]\n");
    o
}

/// The markdown table of docs/local-reservations.md.
pub fn table(v: &[Summary]) -> String {
    let mut o = String::from(
        "| scenario | mode | requests | admitted | Redis calls / admitted | max in W (bound) | max in W/10 (bound) | utilisation | Jain | added p50 / p99 / p99.9 µs | expired | returned (credited) | invariants |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for s in v {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {:.4}{} | {} ({}) | {} ({}) | {:.3} | {:.3} | {:.0} / {:.0} / {:.0} | {} | {} ({}) | {} |",
            s.scenario,
            s.mode,
            s.requests,
            s.admitted,
            s.redis_calls_per_admitted,
            s.calls_per_request_limited.map_or(String::new(), |c| format!(" ({c:.4}/req limited)")),
            s.max_in_window,
            s.bound,
            s.max_in_window_tenth,
            s.bound_tenth,
            s.utilisation,
            s.jain,
            s.p50_added_us,
            s.p99_added_us,
            s.p999_added_us,
            s.expired_units,
            s.returned_units,
            s.credited_units,
            if s.violations.is_empty() { "ok".to_string() } else { format!("{} VIOLATED", s.violations.len()) }
        );
    }
    o.push_str(
        "\nPer phase (requests arriving in the phase, then per request: Redis calls sent in the phase, and the verdicts of those requests: admitted against units, admitted open, admitted by the fallback, limited):\n\n\
         | scenario | mode | phase | requests | calls | enforced | open | fallback | limited |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in v.iter().filter(|s| s.phases.len() > 1) {
        for (name, c) in &s.phases {
            let per = |x: u64| crate::metrics::ratio(x, c.requests);
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {:.4} | {:.3} | {:.3} | {:.3} | {:.3} |",
                s.scenario,
                s.mode,
                name,
                c.requests,
                per(c.calls),
                per(c.enforced),
                per(c.open),
                per(c.fallback),
                per(c.limited)
            );
        }
    }
    o
}
