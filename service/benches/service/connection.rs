//! The connection layer's rows (issue 35.5), in a report of their own
//! (target/bench-service/connection.md; docs/PERFORMANCE.md's `service-connection` block):
//!
//! * **TLS against plain TCP**: one redis-server listening on both, two services (one dialing
//!   each port), the same open-loop load on each back to back in paired rounds (the order
//!   reversed every other round); the service's CPU per request and the p99, each round's TLS
//!   figure over the same round's TCP one, medians (BENCH_TLS_SECONDS, default 1;
//!   BENCH_TLS_ROUNDS, default 7; BENCH_TLS_RATE, default 5000 requests/s).
//! * **The failover gap**: a primary, two replicas, three sentinels (down after 500 ms), the
//!   service with `REDIS_TYPE=sentinel` and a `closed` domain, a fresh key every millisecond;
//!   the primary killed (SIGKILL) or stopped (SIGSTOP): the time from the failure to the
//!   sentinels' `+switch-master`, from `+switch-master` to the first answer decided by the new
//!   primary, and the requests answered by the failure mode (BENCH_FAILOVER_ROUNDS, default 1).
//!
//! `BENCH_ONLY=connection` runs these rows alone (`connection: tls`, `connection: failover`).

use super::*;

use redis_ratelimit_service::pb::Code;
use sentinel::{replicated, Sentinels, MASTER};

/// The rows' names for BENCH_ONLY.
pub const TLS: &str = "connection: tls";
pub const FAILOVER: &str = "connection: failover";

fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One timed run of one service.
struct TlsRun {
    /// The service's CPU per request, µs.
    cpu_us: f64,
    p50: f64,
    p99: f64,
    achieved: f64,
    errors: u64,
}

/// TLS against plain TCP: the report's section.
pub fn tls_rows(rt: &tokio::runtime::Runtime, tck: f64) -> String {
    let secs = env_num("BENCH_TLS_SECONDS", 1.0);
    let rounds = (env_num("BENCH_TLS_ROUNDS", 7.0) as usize).max(1);
    let rate = env_num("BENCH_TLS_RATE", 5000.0) as u64;
    let certs = tls::Certs::generate();
    let (tls_port, extra) = certs.server_opts(false);
    let redis = Server::start_with(common::Opts { debug_clock: false, extra, ..Default::default() });
    let dir = TempDir::new("bench-tls");
    dir.write("bench.yaml", CONFIG);
    let ca = certs.path("ca.crt").display().to_string();
    let plain_url = format!("127.0.0.1:{}", redis.port);
    let tls_url = format!("localhost:{tls_port}");
    let services = [
        ServiceProc::start(dir.path(), &["--redis-url", &plain_url, "--log-level", "info"]),
        ServiceProc::start(
            dir.path(),
            &["--redis-url", &tls_url, "--redis-tls", "true", "--redis-tls-cacert", &ca, "--log-level", "info"],
        ),
    ];
    let s = Scenario {
        baseline: false,
        leases: false,
        every_value: false,
        descriptors: 1,
        hot: true,
        instances: 1,
        rate: Some(rate),
    };
    let mut runs: [Vec<TlsRun>; 2] = [Vec::new(), Vec::new()];
    rt.block_on(async {
        let mut clients = Vec::new();
        for svc in &services {
            clients.push(vec![svc.client().await, svc.client().await]);
        }
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                drive(&clients[k], Scenario { rate: Some(1000), ..s }, 0.3).await;
                let cpu0 = cpu_seconds(services[k].pid(), tck);
                let (done, errors, lat, elapsed) = drive(&clients[k], s, secs).await;
                let cpu = cpu_seconds(services[k].pid(), tck) - cpu0;
                let r = TlsRun {
                    cpu_us: cpu * 1e6 / done.max(1) as f64,
                    p50: pct(&lat, 0.50),
                    p99: pct(&lat, 0.99),
                    achieved: done as f64 / elapsed,
                    errors,
                };
                eprintln!(
                    "{TLS} (round {}): {}: {:.0} req/s, p50 {:.3} p99 {:.3} ms, service {:.1} µs/req, {errors} errors",
                    round + 1,
                    ["plain TCP", "TLS"][k],
                    r.achieved,
                    r.p50,
                    r.p99,
                    r.cpu_us
                );
                runs[k].push(r);
            }
        }
    });
    let med = |k: usize, f: fn(&TlsRun) -> f64| median(runs[k].iter().map(f).collect());
    let ratio = |f: fn(&TlsRun) -> f64| median((0..rounds).map(|i| f(&runs[1][i]) / f(&runs[0][i])).collect());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### TLS to Redis against plain TCP\n\n\
         One redis-server with the module listening on a plain port and a TLS port (a private CA made for the \
         run, no client certificates), two services (REDIS_POOL_SIZE 4 each), one dialing each. ShouldRateLimit \
         with one hot descriptor (one Redis call per request) at {rate} requests/s, open loop, latency from \
         the scheduled send; {rounds} round(s) of {secs} s per service back to back (a 0.3 s warm-up before \
         each, the order reversed every other round). Figures are medians over the rounds; the ratios are \
         medians of each round's TLS figure over the same round's TCP one. Service CPU per request: utime + \
         stime over the run. BENCH_TLS_SECONDS, BENCH_TLS_ROUNDS, BENCH_TLS_RATE.\n"
    );
    let _ = writeln!(
        out,
        "| connection | achieved req/s | p50 ms | p99 ms | p99 × TCP | service CPU µs / request | CPU × TCP | errors |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for (k, what) in ["plain TCP", "TLS (rustls)"].iter().enumerate() {
        let errors: u64 = runs[k].iter().map(|r| r.errors).sum();
        let (p99x, cpux) = if k == 0 { (1.0, 1.0) } else { (ratio(|r| r.p99), ratio(|r| r.cpu_us)) };
        let _ = writeln!(
            out,
            "| {what} | {:.0} | {:.3} | {:.3} | {p99x:.3} | {:.1} | {cpux:.3} | {errors} |",
            med(k, |r| r.achieved),
            med(k, |r| r.p50),
            med(k, |r| r.p99),
            med(k, |r| r.cpu_us),
        );
    }
    out
}

/// One failover: (failure → +switch-master, +switch-master → first answer decided by the new
/// primary, answers by the failure mode, slowest answer), in ms but for the count.
fn one_failover(rt: &tokio::runtime::Runtime, stop_it: bool) -> (f64, f64, u64, f64) {
    let (mut primary, _replicas) = replicated(2);
    let sentinels = Sentinels::start(&primary, 3);
    let dir = TempDir::new("bench-failover");
    dir.write(
        "fo.yaml",
        "domain: fo\nfailure_mode: closed\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n",
    );
    let url = format!("{MASTER},{}", sentinels.addrs().join(","));
    let svc = ServiceProc::start(
        dir.path(),
        &["--redis-type", "sentinel", "--redis-url", &url, "--redis-timeout", "100ms", "--log-level", "info"],
    );
    let watch = sentinels.watch_switch();
    let result = rt.block_on(async {
        let client = svc.client().await;
        // Connected and decided from Redis first.
        let t = Instant::now();
        loop {
            let r = client.clone().should_rate_limit(request("fo", vec![desc(&[("k", "first")])])).await;
            if r.is_ok_and(|r| r.get_ref().overall_code() == Code::Ok) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "the service never decided from the primary");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A fresh key every millisecond: (sent, answered, decided by Redis).
        let seen: Arc<Mutex<Vec<(Instant, Instant, bool)>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let load = {
            let (seen, stop, client) = (seen.clone(), stop.clone(), client.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(1));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    every.tick().await;
                    n += 1;
                    let (mut c, seen) = (client.clone(), seen.clone());
                    tokio::spawn(async move {
                        let t = Instant::now();
                        let r = c.should_rate_limit(request("fo", vec![desc(&[("k", &format!("n{n}"))])])).await;
                        let decided = r.is_ok_and(|r| r.get_ref().overall_code() == Code::Ok);
                        seen.lock().unwrap().push((t, Instant::now(), decided));
                    });
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let failed = Instant::now();
        if stop_it {
            let pid = primary.pid().unwrap().to_string();
            assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
        } else {
            primary.kill9();
        }
        let (switched, _) = tokio::task::block_in_place(|| watch.wait(Duration::from_secs(20)));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        stop.store(true, Ordering::Relaxed);
        load.await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = seen.lock().unwrap().clone();
        let first = seen.iter().filter(|s| s.2 && s.1 >= switched).map(|s| s.1).min();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let failure_mode = seen.iter().filter(|s| !s.2).count() as u64;
        let slowest = seen.iter().map(|s| s.1 - s.0).max().unwrap_or_default();
        (ms(switched - failed), first.map_or(f64::NAN, |f| ms(f - switched)), failure_mode, ms(slowest))
    });
    primary.kill9();
    result
}

/// The failover rows: the report's section.
pub fn failover_rows(rt: &tokio::runtime::Runtime) -> String {
    let rounds = (env_num("BENCH_FAILOVER_ROUNDS", 1.0) as usize).max(1);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### The failover gap (Redis Sentinel)\n\n\
         A primary with the module, two replicas, three sentinels (quorum 2, down-after-milliseconds 500), the \
         service with REDIS_TYPE=sentinel, REDIS_TIMEOUT 100 ms and a `closed` domain; ShouldRateLimit for a \
         fresh key every millisecond; the primary killed (SIGKILL) or stopped (SIGSTOP) 0.3 s in, the load kept \
         1 s past the sentinels' `+switch-master` (heard on a subscription of the bench's own). {rounds} \
         failover(s) per row (BENCH_FAILOVER_ROUNDS), medians. The first figure is Sentinel's (its \
         down-after-milliseconds and the election); the second is the service's.\n"
    );
    let _ = writeln!(
        out,
        "| failure | failure → +switch-master ms | +switch-master → first answer from the new primary ms | answered by the failure mode | slowest answer ms |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (stop_it, what) in [(false, "SIGKILL"), (true, "SIGSTOP")] {
        let r: Vec<(f64, f64, u64, f64)> = (0..rounds)
            .map(|i| {
                let r = one_failover(rt, stop_it);
                eprintln!(
                    "{FAILOVER} ({what}, {}): switch {:.0} ms after the failure, first answer from the new primary {:.1} ms after it, {} answered by the failure mode, slowest {:.1} ms",
                    i + 1,
                    r.0,
                    r.1,
                    r.2,
                    r.3
                );
                r
            })
            .collect();
        let mut fm: Vec<u64> = r.iter().map(|x| x.2).collect();
        fm.sort_unstable();
        let _ = writeln!(
            out,
            "| {what} | {:.0} | {:.1} | {} | {:.1} |",
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
            fm[fm.len() / 2],
            median(r.iter().map(|x| x.3).collect()),
        );
    }
    out
}
