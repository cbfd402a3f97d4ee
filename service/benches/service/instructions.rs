//! Envoy's instructions per proxied request with and without the rate limit filters, counted
//! by valgrind's callgrind (issue 32.5), in a report of their own
//! (target/bench-service/instructions.md; docs/PERFORMANCE.md's `service-instructions` block).
//!
//! The Envoy rows' timed figures cannot settle a 10 % target on a VM whose speed jumps ~1.66×
//! every few seconds; instruction counts are exact and do not depend on the machine's load.
//! Each row of [`Edge::ALL`] (the same services, upstream and Envoy configuration as the timed
//! rows) runs alone: Envoy (`--concurrency 1`) started under `valgrind --tool=callgrind`, warmed
//! up by the same load for BENCH_INSTR_WARMUP_SECONDS (default 6: past the quota stream's first
//! report, 5 s, so that leases are sized from the demand the counted requests make) and 200
//! requests more, then 1.5 s
//! idle for the assignments to land, its
//! counters zeroed (`callgrind_control -z`), `BENCH_INSTR_REQUESTS` (default 1,000) sequential
//! `GET /` on one keep-alive connection, the counters dumped (`callgrind_control -d`): the
//! dump's total over the requests is the row's instructions per request (every thread of
//! Envoy: the worker, and the main thread's timers and gRPC streams).
//!
//! Under callgrind Envoy runs ~50× slower, but the service pushes leases on its own clock
//! (every `QUOTA_REFRESH`, 500 ms): the leased row sees far more pushes per request than at
//! real speed. The report gives each row's pushes during the counted requests and the cost of
//! one push (the leased row at the defaults minus the one whose leases are replaced every 30 s,
//! over their difference in pushes), so the figure at any request rate follows.
//!
//! `BENCH_ONLY=edge-instructions` runs this alone (never part of the default run: a few
//! minutes). Without valgrind it says so and exits with status 2.

use super::*;

use std::process::Command;

use support::envoy::{Envoy, Upstream};

/// The mode's name for BENCH_ONLY (selected only by exactly this part).
pub const INSTRUCTIONS: &str = "edge-instructions";

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Exits with status 2, saying so, unless `valgrind` and `callgrind_control` both run.
fn require_valgrind() {
    for tool in ["valgrind", "callgrind_control"] {
        let runs = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        if !runs {
            eprintln!(
                "{INSTRUCTIONS}: `{tool} --version` does not run: install valgrind (Debian: apt-get install valgrind)"
            );
            std::process::exit(2);
        }
    }
}

/// `callgrind_control <flag> <pid>`, which answers once the process has done it.
fn callgrind_control(flag: &str, pid: u32) {
    let out = Command::new("callgrind_control")
        .args([flag, &pid.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("callgrind_control {flag} {pid}: {e}"));
    // It exits 0 even when it found no such callgrind process (it says so on stdout).
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !said.contains("Error"),
        "callgrind_control {flag} {pid}: {}{}",
        said,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `totals:` (or `summary:`) line of the first callgrind dump `<out>.<n>`, waited for (the
/// dump is written when the process next runs guest code).
fn dumped_total(out: &std::path::Path) -> u64 {
    let dir = out.parent().unwrap();
    let prefix = format!("{}.", out.file_name().unwrap().to_string_lossy());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let dumps = std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()).filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(&prefix).is_some_and(|n| n.parse::<u32>().is_ok())
        });
        for d in dumps {
            let text = std::fs::read_to_string(d.path()).unwrap_or_default();
            let total = text.lines().find_map(|l| {
                l.strip_prefix("totals: ").or_else(|| l.strip_prefix("summary: ")).and_then(|v| v.trim().parse().ok())
            });
            if let Some(total) = total {
                return total;
            }
        }
        assert!(Instant::now() < deadline, "no callgrind dump {}* within 120 s", out.display());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Assignments the service has pushed (every kind).
fn pushes(svc: &ServiceProc) -> u64 {
    ["lease", "deny", "allow", "local", "static"]
        .iter()
        .map(|k| svc.metric(&format!("ratelimit_service_quota_assignments{{kind=\"{k}\"}}")))
        .sum()
}

/// One row's count.
struct Count {
    per_request: f64,
    /// Answers other than 200 among the counted requests.
    other: u64,
    pushes: u64,
    seconds: f64,
    cmds_per_k: f64,
}

/// The report's section.
pub fn instruction_rows(rt: &tokio::runtime::Runtime, redis: &Server, dir: &TempDir, url: &str) -> String {
    require_valgrind();
    let n = env_num("BENCH_INSTR_REQUESTS", 1000).max(1);
    let warmup = env_num("BENCH_INSTR_WARMUP_SECONDS", 6);
    let services = EdgeServices::start(dir, url);
    let upstream = Upstream::start();
    let cg = TempDir::new("bench-callgrind");
    let mut con = redis.conn();
    let counts: Vec<Count> = Edge::ALL
        .iter()
        .enumerate()
        .map(|(k, &e)| {
            let svc = services.of(e);
            let out = cg.path().join(format!("callgrind.{k}"));
            let wrapper = [
                "valgrind".to_string(),
                "--tool=callgrind".into(),
                format!("--callgrind-out-file={}", out.display()),
                "--dump-instr=no".into(),
                // `envoy` may be pip's Python script exec'ing the binary: follow the exec.
                "--trace-children=yes".into(),
            ];
            let envoy = Envoy::start_under(&wrapper, &e.envoy_config(svc, upstream.port), Duration::from_secs(600));
            // Connections, caches, the quota stream and its first assignment.
            let (mut w_ok, mut w_other, _, _) = rt.block_on(http_load(envoy.port, 1, warmup as f64, u64::MAX));
            // At least 200 requests whatever the time (under callgrind an Envoy's first request
            // through a filter can take seconds: first-time code, connections).
            let (ok, other, _, _) = rt.block_on(http_load(envoy.port, 1, 600.0, 200));
            (w_ok, w_other) = (w_ok + ok, w_other + other);
            std::thread::sleep(Duration::from_millis(1500));
            callgrind_control("-z", envoy.pid());
            reset_stats(&mut con);
            let p0 = pushes(svc);
            let (ok, other, _, seconds) = rt.block_on(http_load(envoy.port, 1, 3600.0, n));
            callgrind_control("-d", envoy.pid());
            let p1 = pushes(svc);
            let calls = command_calls(&mut con);
            let total = dumped_total(&out);
            let c = Count {
                per_request: total as f64 / (ok + other).max(1) as f64,
                other,
                pushes: p1 - p0,
                seconds,
                cmds_per_k: calls as f64 * 1000.0 / (ok + other).max(1) as f64,
            };
            eprintln!(
                "{} under callgrind: {:.0} instructions per request ({ok} answered 200, {other} other, in {seconds:.1} s; \
                 warm-up {w_ok} 200, {w_other} other), {} assignments pushed, {:.2} Redis commands / 1000 requests",
                e.name(),
                c.per_request,
                c.pushes,
                c.cmds_per_k
            );
            c
        })
        .collect();
    let row = |e: Edge| &counts[Edge::ALL.iter().position(|x| *x == e).unwrap()];
    let (base, floor) = (row(Edge::NoFilter).per_request, row(Edge::QuotaAllowAll).per_request);
    let mut out = format!(
        "### Envoy's instructions per request (callgrind)\n\n\
         The rows through Envoy above, each alone under `valgrind --tool=callgrind` ({}): Envoy 1.40 \
         (`--concurrency 1`) proxying `GET /` to the upstream, {warmup} s of the same load and 200 requests more to warm up (past the quota stream's first report) and 1.5 s idle, counters \
         zeroed, {n} sequential requests on one keep-alive connection, counters dumped; instructions of every \
         Envoy thread over the counted requests, per request (exact: independent of the machine's load). \
         Under callgrind Envoy runs ~50× slower while the service pushes leases on its own clock (every 500 ms at \
         the defaults): the pushes column is what the service sent during the counted requests. \
         `BENCH_ONLY=edge-instructions make bench-service` (BENCH_INSTR_REQUESTS, default 1000; \
         BENCH_INSTR_WARMUP_SECONDS, default 6).\n\n\
         | Envoy | instructions / request | × no filter | × floor | assignments pushed | counted requests (s) | not 200 | Redis commands / 1,000 requests |\n\
         |---|---|---|---|---|---|---|---|\n",
        Command::new("valgrind")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    );
    for (e, c) in Edge::ALL.iter().zip(&counts) {
        let over_floor = match e {
            Edge::Quota | Edge::QuotaRarePushes | Edge::QuotaAllowAll => format!("{:.3}", c.per_request / floor),
            Edge::NoFilter | Edge::ShouldRateLimit => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.3} | {over_floor} | {} | {:.1} | {} | {:.2} |",
            e.name().trim_start_matches("edge: "),
            c.per_request,
            c.per_request / base,
            c.pushes,
            c.seconds,
            c.other,
            c.cmds_per_k,
        );
    }
    // The leased rows differ in their pushes (same filter, same token bucket): one push's cost,
    // when both answered every counted request 200 (a 429 costs Envoy less than a proxied
    // request, so a row with refusals is not comparable).
    let (q, rare) = (row(Edge::Quota), row(Edge::QuotaRarePushes));
    let extra_pushes = q.pushes.saturating_sub(rare.pushes);
    let per_push = if q.other > 0 || rare.other > 0 {
        "No push cost: a leased row refused some of the counted requests".to_string()
    } else if extra_pushes == 0 {
        "No push cost: the leased rows were pushed as often".to_string()
    } else {
        let cost = (q.per_request - rare.per_request) * n as f64 / extra_pushes as f64;
        format!(
            "One push costs Envoy about {cost:.0} instructions ((leased at the defaults − leased every 30 s) × {n} \
             requests / {extra_pushes} more pushes)"
        )
    };
    let leased = |c: &Count| {
        format!(
            "× {:.3} over the floor ({} pushes in {n} requests, {} not 200)",
            c.per_request / floor,
            c.pushes,
            c.other
        )
    };
    let _ = writeln!(
        out,
        "\nEnvoy's quota filter alone (the floor: an unlimited bucket, a static ALLOW_ALL) costs × {:.3} the \
         instructions of a proxied request without a filter: a saturated one-worker Envoy loses about that share \
         of its throughput whatever the server does. The leased rows: at the defaults {}; leases replaced every \
         30 s {}. A row with requests not 200 is not comparable (Envoy's 429 costs less than a proxied request). \
         Under callgrind a leased row sees more pushes per request than at real speed (2 per second over ~10,000 \
         requests per second: 1 per 5,000), so a leased row that answered every counted request 200 bounds what \
         the leases add from above. {per_push}. ShouldRateLimit per request: × {:.3}.",
        floor / base,
        leased(q),
        leased(rare),
        row(Edge::ShouldRateLimit).per_request / base,
    );
    out
}
