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
//! requests more, then 1.5 s idle for the assignments to land; its counters zeroed
//! (`callgrind_control -z`), `BENCH_INSTR_REQUESTS` (default 1,000) sequential `GET /` on one
//! keep-alive connection, the counters dumped (`callgrind_control -d`): the dump's total over
//! the requests is the row's instructions per request (every thread of Envoy: the worker, and
//! the main thread's timers and gRPC streams).
//!
//! Then counters zeroed, BENCH_INSTR_IDLE_SECONDS (default 3) without requests, dumped: Envoy's
//! instructions per second idle (timers, the quota stream and the service's pushes), which land
//! on the counted requests in proportion to their time (stretched by the machine's load); the
//! rows' ratios are of the totals less that rate over the counted requests' time.
//!
//! Under callgrind Envoy runs ~50× slower, but the service pushes leases on its own clock
//! (every `QUOTA_REFRESH`, 500 ms): a leased row sees far more pushes per request than at real
//! speed; the report gives the pushes during the counted requests.
//!
//! `BENCH_ONLY=edge-instructions` runs this alone (never part of the default run: a few
//! minutes). Without valgrind it says so and exits with status 2.

use super::*;

use std::process::Command;

use support::envoy::{Envoy, Upstream};

/// The mode's name for BENCH_ONLY (selected only by exactly this part).
pub const INSTRUCTIONS: &str = "edge-instructions";

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

/// The `totals:` (or `summary:`) line of the newest callgrind dump `<out>.<n>` once there are
/// `count` of them, waited for (a dump is written when the process next runs guest code).
fn dumped_total(out: &std::path::Path, count: usize) -> u64 {
    let dir = out.parent().unwrap();
    let prefix = format!("{}.", out.file_name().unwrap().to_string_lossy());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut dumps: Vec<(u32, u64)> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().strip_prefix(&prefix)?.parse::<u32>().ok()?;
                let text = std::fs::read_to_string(e.path()).ok()?;
                let total = text.lines().find_map(|l| {
                    l.strip_prefix("totals: ")
                        .or_else(|| l.strip_prefix("summary: "))
                        .and_then(|v| v.trim().parse().ok())
                })?;
                Some((n, total))
            })
            .collect();
        dumps.sort_unstable();
        if dumps.len() >= count {
            return dumps.last().unwrap().1;
        }
        assert!(Instant::now() < deadline, "no callgrind dump {}* number {count} within 120 s", out.display());
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
    /// Every instruction over the counted requests, per request.
    per_request: f64,
    /// Envoy's instructions per second idle (its timers, the quota stream and its pushes)
    /// right after the counted requests.
    idle_per_s: f64,
    /// `per_request` less the idle rate over the counted requests' time: the requests' own.
    net: f64,
    /// Answers other than 200 among the counted requests.
    other: u64,
    pushes: u64,
    seconds: f64,
    cmds_per_k: f64,
}

/// The report's section.
pub fn instruction_rows(rt: &tokio::runtime::Runtime, redis: &Server, dir: &TempDir, url: &str) -> String {
    require_valgrind();
    let n: u64 = env_num("BENCH_INSTR_REQUESTS", 1000).max(1);
    let warmup: u64 = env_num("BENCH_INSTR_WARMUP_SECONDS", 6);
    let idle: u64 = env_num("BENCH_INSTR_IDLE_SECONDS", 3);
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
            let total = dumped_total(&out, 1);
            // What Envoy runs per second with no request (its timers, the quota stream): it
            // lands on the counted requests in proportion to their time, which the machine's
            // load stretches.
            callgrind_control("-z", envoy.pid());
            let t = Instant::now();
            std::thread::sleep(Duration::from_secs(idle));
            callgrind_control("-d", envoy.pid());
            let idle_per_s = dumped_total(&out, 2) as f64 / t.elapsed().as_secs_f64();
            let answered = (ok + other).max(1) as f64;
            let c = Count {
                per_request: total as f64 / answered,
                idle_per_s,
                net: (total as f64 - idle_per_s * seconds) / answered,
                other,
                pushes: p1 - p0,
                seconds,
                cmds_per_k: calls as f64 * 1000.0 / answered,
            };
            eprintln!(
                "{} under callgrind: {:.0} instructions per request, {:.0} net of {:.0} per second idle ({ok} answered \
                 200, {other} other, in {seconds:.1} s; warm-up {w_ok} 200, {w_other} other), {} assignments pushed, \
                 {:.2} Redis commands / 1000 requests",
                e.name(),
                c.per_request,
                c.net,
                c.idle_per_s,
                c.pushes,
                c.cmds_per_k
            );
            c
        })
        .collect();
    let row = |e: Edge| &counts[Edge::ALL.iter().position(|x| *x == e).unwrap()];
    let (base, floor) = (row(Edge::NoFilter).net, row(Edge::QuotaAllowAll).net);
    let mut out = format!(
        "### Envoy's instructions per request (callgrind)\n\n\
         The rows through Envoy above, each alone under `valgrind --tool=callgrind` ({}): Envoy 1.40 \
         (`--concurrency 1`) proxying `GET /` to the upstream; {warmup} s of the same load and 200 requests more to \
         warm up (past the quota stream's first report), 1.5 s idle; counters zeroed, {n} sequential requests on \
         one keep-alive connection, counters dumped (every Envoy thread); then counters zeroed, {idle} s idle, \
         dumped: what Envoy runs per second without requests (timers, the quota stream and the service's pushes), \
         which lands on the counted requests in proportion to their time, stretched by the machine's load. The \
         net figure (the total less that idle rate over the counted requests' time) is the requests' own; the \
         ratios are of net figures. Instruction counts are exact; the idle rate's share moves a row by a few \
         tenths of a per cent between runs. Under callgrind Envoy serves a few hundred requests per second while \
         the service pushes leases on its own clock: the pushes column is what the service sent during the \
         counted requests, far more per request than at real speed (2 per second over ~10,000 requests per \
         second); a push's own cost is in the idle rate. A request not answered 200 costs Envoy less than a \
         proxied one: a row with such requests is not comparable. \
         `BENCH_ONLY=edge-instructions make bench-service` (BENCH_INSTR_REQUESTS, default 1000; \
         BENCH_INSTR_WARMUP_SECONDS, default 6; BENCH_INSTR_IDLE_SECONDS, default 3).\n\n\
         | Envoy | instructions / request | idle instructions / s | net / request | × no filter | × floor | \
         assignments pushed | counted requests (s) | not 200 | Redis commands / 1,000 requests |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        Command::new("valgrind")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    );
    for (e, c) in Edge::ALL.iter().zip(&counts) {
        let over_floor = match e {
            Edge::Quota | Edge::QuotaRarePushes | Edge::QuotaAllowAll => format!("{:.3}", c.net / floor),
            Edge::NoFilter | Edge::ShouldRateLimit => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.3} | {over_floor} | {} | {:.1} | {} | {:.2} |",
            e.name().trim_start_matches("edge: "),
            c.per_request,
            c.idle_per_s,
            c.net,
            c.net / base,
            c.pushes,
            c.seconds,
            c.other,
            c.cmds_per_k,
        );
    }
    let (q, rare) = (row(Edge::Quota), row(Edge::QuotaRarePushes));
    let leased = |c: &Count| {
        let refused = if c.other > 0 { format!(", {} not 200: not comparable", c.other) } else { String::new() };
        format!("× {:.3} over the floor{refused}", c.net / floor)
    };
    let _ = writeln!(
        out,
        "\nEnvoy's quota filter alone (the floor: an unlimited bucket, a static ALLOW_ALL) costs × {:.3} the \
         instructions of a proxied request without a filter: a saturated one-worker Envoy loses about that share \
         of its throughput whatever the server does. The leased buckets (a token bucket): at the defaults {}; \
         leases replaced every 30 s {}. ShouldRateLimit per request: × {:.3}.",
        floor / base,
        leased(q),
        leased(rare),
        row(Edge::ShouldRateLimit).net / base,
    );
    out
}
