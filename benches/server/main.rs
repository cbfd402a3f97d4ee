//! Server-side benchmarks of redis-ratelimit (`make bench`, or `cargo bench --bench server`):
//! server CPU per operation of every limiter command against INCR (the floor), `SET k v EX`
//! (the cheapest write that sets a TTL), redis-cell's CL.THROTTLE (a peer built from source)
//! and the seeds' Lua scripts, with keys in place and with a replica attached (whose state is
//! checked identical with DEBUG DIGEST); the sliding log at its limit for limits 10 .. 100,000;
//! memory per key, here and on the other servers scripts/compat.sh builds. Prints Markdown
//! tables and writes them to target/bench-report.md. ~14 min on an idle 2-CPU machine.
//!
//! What is measured is data (`cases.rs`); how a row is measured is `Bench` below; the tables
//! and the targets are `report.rs`. Servers, redis-benchmark runs, the server CPU reading,
//! statistics and the report writer are the `redis-ratelimit-bench` crate (benches/harness),
//! whose servers are the integration tests' (tests/common): each on a free loopback port with
//! `--save "" --appendonly no`, stopped at the end. On a machine with two or more CPUs the
//! measured server is pinned to one CPU and redis-benchmark (and the replicas) to another.
//!
//! Environment (defaults in brackets):
//!   RL_MODULE  [target/release/libredis_ratelimit.so]   (copied: a rebuild during the run
//!                                   cannot change the loaded library)
//!   RL_REDIS_SERVER [redis-server]  the measured servers' binary
//!   BENCH_REDIS_CELL_SRC            redis-cell source tarball [../shared/peers/redis-cell-0.5.0.tar.gz,
//!                                   relative to the repository root (or to the main worktree's)];
//!                                   built once into target/peers/ (needs crates.io). Absent or
//!                                   unbuildable: the redis-cell rows say so and the rest runs.
//!   BENCH_REPORT [target/bench-report.md]
//!   BENCH_ROUNDS [7]                rounds; each measures every row of a configuration once
//!   BENCH_N_PIPELINED [1000000]     requests per pipelined run (-P 16), INCR, SET and limiter rows
//!   BENCH_N_REPLICA [600000]        the same with a replica attached (each op costs the server
//!                                   ~1.5x more; the replica shares the client's CPU)
//!   BENCH_N_LUA [200000]            requests per pipelined run of the Lua rows (8-16 µs/op each)
//!   BENCH_N_UNPIPELINED [50000]     requests of the one unpipelined run per row (0: skip)
//!   BENCH_N_HAMMER [200000]         requests per sliding-log-at-its-limit row
//!   BENCH_CLIENTS [50]              redis-benchmark -c
//!   BENCH_KEYSPACE [100000]         redis-benchmark -r (random keys via __rand_int__)
//!   BENCH_MEM_KEYS [200000]         keys for the O(1) memory rows
//!   BENCH_LOG_KEYS ["20000 2000 200"]  keys for the 10 / 100 / 1,000-entry log rows
//!   BENCH_SERVERS_DIR [target/servers, else the main worktree's]  other servers for the memory
//!                                   rows, as scripts/compat.sh builds them (<dir>/<name>/bin/
//!                                   {redis,valkey}-server); absent: skipped with a note; "none": skip
//!   BENCH_SERVER_CPU [0] BENCH_CLIENT_CPU [1]
//!   BENCH_PORT                      no longer used: every server takes a free port
//!
//! Method (also printed in the report):
//! - Rounds: the CPU rows are measured in BENCH_ROUNDS rounds; a round runs every row of the
//!   configuration once (INCR, SET EX, every limiter, CL.THROTTLE, the Lua rows and redis-cell's
//!   server's rows), starting one row later than the round before, so a slow period of the
//!   machine touches every row alike instead of the rows measured during it. Each row reports
//!   the median server CPU per op over the rounds and the least and the most; ratios come from
//!   medians (and the targets table shows the range of the same ratio taken within each round).
//! - Every run: FLUSHALL (SYNC), one unmeasured call of the same command on every key of the
//!   keyspace (so keys exist and the dict is grown, as in production where clients' keys live;
//!   with a replica, its offset is then waited for), CONFIG RESETSTAT, one pipelined run. Server CPU per
//!   op = CPU time of all the server's threads during the run (utime + stime, read from Linux
//!   schedstat in ns rather than /proc/<pid>/stat's 10-ms ticks) ÷ requests: what one operation
//!   costs the server, whatever the client does. usec_per_call comes from INFO commandstats of
//!   the run (Lua rows: cmdstat_evalsha, the whole script).
//! - With a replica: the same rows (Lua excepted) in their own rounds with a replica attached
//!   (full sync done); after every run the replica is waited for (its offset reaches the
//!   primary's) and DEBUG DIGEST compared; PEXPIRETIME of a sample of keys is compared too (DEBUG
//!   DIGEST only records that a key has an expiry).
//! - redis-cell registers CL.THROTTLE as this module does, so it runs on its own server, where
//!   INCR and SET EX are measured again, in the same rounds as the module's rows: its ratios are
//!   against its own server's rows.
//! - Memory per key: used_memory before and after loading the keys (no replica attached); the
//!   SET, RL.GCRA, RL.TOKENBUCKET and RL.SLIDING rows again on every other server found.
//! - The module is loaded with DEBUG_CLOCK. That only enables RL.DEBUG (used to place sliding-log
//!   entries at distinct microseconds for the memory rows and to step the clock for the "admit
//!   one, evict one" rows); the clock follows the real clock otherwise and the hot path reads the
//!   same atomic either way (src/clock.rs: now_us).

mod cases;
mod report;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::thread::sleep;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_ratelimit_bench::load::{arguments, resp_commands, Benchmark};
use redis_ratelimit_bench::machine::{self, load_averages};
use redis_ratelimit_bench::servers::{cached_servers, on_path, BenchServer, ServerSpec};
use redis_ratelimit_bench::settings::{env_list, env_or, env_text};
use redis_ratelimit_bench::stats::round_to;
use redis_ratelimit_bench::Log;

use cases::{CpuCase, CELL_CASES, EXPIRY_SAMPLE, MODULE_CASES, PIPELINE};

/// FLUSHALL that frees the keys before it answers: Valkey 8 flushes in the background by default,
/// and a background free would run into the next measurement (into its used_memory, and into the
/// server CPU, which counts every thread). Redis flushes synchronously by default.
const FLUSHALL: [&str; 2] = ["FLUSHALL", "SYNC"];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The environment knobs (see the top of this file).
#[derive(Clone, Debug)]
pub struct Settings {
    pub root: PathBuf,
    pub module: PathBuf,
    pub report: PathBuf,
    pub rounds: usize,
    pub n_pipelined: u64,
    pub n_replica: u64,
    pub n_lua: u64,
    pub n_unpipelined: u64,
    pub n_hammer: u64,
    pub clients: u64,
    pub keyspace: u64,
    pub mem_keys: u64,
    pub log_keys: [u64; 3],
    /// None: BENCH_SERVERS_DIR=none.
    pub servers_dir: Option<PathBuf>,
    pub server_cpu: usize,
    pub client_cpu: usize,
    pub cell_src: PathBuf,
    /// The report's stamp line (commit and machine), taken as the run starts.
    pub stamp: String,
}

impl Settings {
    fn from_env(root: &Path) -> Result<Settings, String> {
        let main_root = machine::main_worktree(root);
        let in_root = |p: PathBuf| if p.is_absolute() { p } else { root.join(p) };
        let log_keys = env_list("BENCH_LOG_KEYS", &[20000, 2000, 200])?;
        let log_keys: [u64; 3] =
            log_keys.try_into().map_err(|v: Vec<u64>| format!("BENCH_LOG_KEYS needs 3 numbers, not {}", v.len()))?;
        let servers_dir = match env_text("BENCH_SERVERS_DIR") {
            Some(d) if d == "none" => None,
            Some(d) => Some(in_root(d.into())),
            None => {
                let mut c = vec![root.join("target/servers")];
                c.extend(main_root.iter().map(|m| m.join("target/servers")));
                Some(c.iter().find(|d| d.is_dir()).unwrap_or(&c[0]).clone())
            }
        };
        let cell_src = match env_text("BENCH_REDIS_CELL_SRC") {
            Some(s) => in_root(s.into()),
            None => {
                let name = "../shared/peers/redis-cell-0.5.0.tar.gz";
                let mut c = vec![root.join(name)];
                c.extend(main_root.iter().map(|m| m.join(name)));
                c.iter().find(|p| p.is_file()).unwrap_or(&c[0]).clone()
            }
        };
        Ok(Settings {
            root: root.to_path_buf(),
            module: in_root(
                env_text("RL_MODULE").unwrap_or_else(|| "target/release/libredis_ratelimit.so".into()).into(),
            ),
            report: in_root(env_text("BENCH_REPORT").unwrap_or_else(|| "target/bench-report.md".into()).into()),
            rounds: env_or("BENCH_ROUNDS", 7)?,
            n_pipelined: env_or("BENCH_N_PIPELINED", 1_000_000)?,
            n_replica: env_or("BENCH_N_REPLICA", 600_000)?,
            n_lua: env_or("BENCH_N_LUA", 200_000)?,
            n_unpipelined: env_or("BENCH_N_UNPIPELINED", 50_000)?,
            n_hammer: env_or("BENCH_N_HAMMER", 200_000)?,
            clients: env_or("BENCH_CLIENTS", 50)?,
            keyspace: env_or("BENCH_KEYSPACE", 100_000)?,
            mem_keys: env_or("BENCH_MEM_KEYS", 200_000)?,
            log_keys,
            servers_dir,
            server_cpu: env_or("BENCH_SERVER_CPU", 0)?,
            client_cpu: env_or("BENCH_CLIENT_CPU", 1)?,
            cell_src,
            stamp: machine::stamp(root),
        })
    }

    /// Requests per run of a row: about a second of server CPU or more (the Lua rows cost
    /// 8-16 µs/op; with a replica every op costs more).
    fn requests(&self, case: &CpuCase, config: Config) -> u64 {
        match (case.stat, config) {
            ("evalsha", _) => self.n_lua,
            (_, Config::Replica) => self.n_replica,
            (_, Config::Alone) => self.n_pipelined,
        }
    }
}

/// Which server a row runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Module,
    Cell,
}

/// Keys in place, or with a replica attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Config {
    Alone,
    Replica,
}

/// The module's INFO counters of one algorithm (or their change over a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub checks: u64,
    pub admitted_units: u64,
    pub limited: u64,
}

impl Counters {
    fn since(&self, before: &Counters) -> Counters {
        Counters {
            checks: self.checks - before.checks,
            admitted_units: self.admitted_units - before.admitted_units,
            limited: self.limited - before.limited,
        }
    }
}

/// One measured run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Server CPU µs per request, to the ns (as the report shows it).
    pub cpu_us: f64,
    /// INFO commandstats' usec_per_call of the row's command over the run.
    pub usec_per_call: f64,
    /// redis-benchmark's requests per second.
    pub ops_per_sec: f64,
    /// The module's counters over the run (rows of a module command).
    pub counters: Option<Counters>,
}

/// One row of a configuration and its runs, one per round in round order.
#[derive(Debug)]
pub struct RowResult {
    pub side: Side,
    /// As the tables show it (the peer's command under the peer's label).
    pub label: String,
    pub case: &'static CpuCase,
    pub requests: u64,
    pub samples: Vec<Sample>,
    /// With a replica: "identical", or what differed and in which round first.
    pub replica: Option<String>,
}

/// One sliding-log-at-its-limit row.
#[derive(Debug)]
pub struct HammerRow {
    pub limit: u64,
    pub admit: Sample,
    pub admit_entries: i64,
    pub refused: Sample,
    pub refused_entries: i64,
}

/// A memory row: bytes per key (one place) and the keys the server held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Memory {
    pub bytes_per_key: f64,
    pub keys: u64,
}

/// The memory rows on another server.
#[derive(Debug)]
pub struct OtherServer {
    pub name: String,
    pub binary: String,
    pub version: String,
    pub memory: Vec<(&'static str, Memory)>,
}

/// redis-cell: built, or why not.
#[derive(Debug)]
pub struct Cell {
    pub library: Option<PathBuf>,
    pub version: Option<String>,
    /// Why it is not measured.
    pub status: Option<String>,
}

impl Cell {
    pub fn label(&self) -> String {
        match &self.version {
            Some(v) => format!("CL.THROTTLE (redis-cell {v})"),
            None => "CL.THROTTLE (redis-cell)".to_string(),
        }
    }
}

/// Everything the report is written from.
#[derive(Debug)]
pub struct Results {
    pub rows: HashMap<Config, Vec<RowResult>>,
    pub round_loads: HashMap<Config, Vec<String>>,
    pub unpipelined: HashMap<&'static str, Sample>,
    pub hammer: Vec<HammerRow>,
    pub memory: Vec<(&'static str, Memory)>,
    /// redis-cell's CL.THROTTLE and the SET baseline, on its own server.
    pub cell_memory: Option<(Memory, Memory)>,
    /// Bytes per key of each log kind (cases::LOG_CASES) at each of cases::LOG_SIZES.
    pub logs: [[f64; 3]; 2],
    pub others: Vec<OtherServer>,
    /// Why there are no other servers' rows.
    pub others_status: Option<String>,
}

/// A private folder for the run, removed at the end.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> Result<WorkDir, String> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("rl-bench.{}.{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn now_unix_us() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    (secs * 1_000_000).to_string()
}

fn run() -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let settings = Settings::from_env(&root)?;
    let log = Log::new("bench");
    let load_start = load_averages();
    let server_binary = env_text("RL_REDIS_SERVER").unwrap_or_else(|| "redis-server".into());
    for tool in [server_binary.as_str(), "redis-cli", "redis-benchmark"] {
        if !on_path(tool) {
            return Err(format!("{tool} not found"));
        }
    }
    if !settings.module.is_file() {
        return Err(format!(
            "module not found at {}: run cargo build --release (make build)",
            settings.module.display()
        ));
    }
    if env_text("BENCH_PORT").is_some() {
        log.say("BENCH_PORT is no longer used: every server takes a free loopback port");
    }
    let work = WorkDir::create()?;
    // A private copy of the module: a rebuild during the run cannot change the loaded library.
    let module = work.0.join("module.so");
    std::fs::copy(&settings.module, &module).map_err(|e| format!("copying {}: {e}", settings.module.display()))?;
    let pinned = on_path("taskset") && machine::cpus() >= 2;
    let on_cpu = |cpu: usize| pinned.then_some(cpu);
    let module_spec = ServerSpec {
        name: "rl".into(),
        binary: None,
        module: module.clone(),
        debug_clock: true,
        cpu: on_cpu(settings.server_cpu),
        replica_of: None,
    };
    let started = |s: &BenchServer, binary: &str| {
        let cpu = s.cpu.map(|c| format!(" (CPU {c})")).unwrap_or_default();
        log.say(&format!("{}: {binary} pid {} on port {}{cpu}", s.name, s.pid(), s.port()));
    };
    let rl = BenchServer::start(&module_spec)?;
    started(&rl, &server_binary);

    let cell = build_cell(&settings, &work.0, &log);
    let cell_spec = cell.library.as_ref().map(|lib| ServerSpec {
        name: "cell".into(),
        module: lib.clone(),
        debug_clock: false,
        ..module_spec.clone()
    });
    let cell_server = match &cell_spec {
        Some(spec) => {
            let s = BenchServer::start(spec)?;
            started(&s, &server_binary);
            Some(s)
        }
        None => None,
    };
    if let Some(status) = &cell.status {
        log.say(&format!("redis-cell {status}"));
    }

    let mut scripts = HashMap::new();
    for (name, path) in cases::SCRIPTS {
        let body = std::fs::read_to_string(root.join(path)).map_err(|e| format!("{path}: {e}"))?;
        let sha: String = rl.query(&["SCRIPT", "LOAD", &body])?;
        if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("SCRIPT LOAD {path} failed: {sha}"));
        }
        scripts.insert(*name, sha);
    }
    let bench = Bench { settings, log, rl, cell_server, cell, scripts, replicas: None };
    // Every command answers as expected before anything is measured.
    for command in cases::SANITY {
        let command = bench.resolve(command);
        bench.rl.run(&command.split_whitespace().collect::<Vec<_>>())?;
    }
    bench.rl.run(&FLUSHALL)?;
    bench.measure_all(module_spec, cell_spec, load_start, server_binary)
}

/// Builds redis-cell from its source tarball once into target/peers/redis-cell (again when the
/// tarball is newer than the library) and copies the library into the work folder.
fn build_cell(settings: &Settings, work: &Path, log: &Log) -> Cell {
    let src = &settings.cell_src;
    let not = |why: String| Cell { library: None, version: None, status: Some(format!("not measured: {why}")) };
    if !src.is_file() {
        return not(format!("no redis-cell source at {} (set BENCH_REDIS_CELL_SRC)", src.display()));
    }
    let dir = settings.root.join("target/peers/redis-cell");
    let lib = dir.join("target/release/libredis_cell.so");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if !lib.is_file() || mtime(src) > mtime(&lib) {
        log.say(&format!("building redis-cell from {}", src.display()));
        let build_log = work.join("cell-build.log");
        if let Err(e) = build_cell_in(src, &dir, &build_log) {
            let text = std::fs::read_to_string(&build_log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            eprintln!("{e}\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            return not(format!(
                "building redis-cell from {} failed (see cargo build --release in target/peers/redis-cell)",
                src.display()
            ));
        }
    }
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    let version =
        manifest.lines().find_map(|l| l.strip_prefix("version").and_then(|r| r.split('"').nth(1))).map(str::to_string);
    let copy = work.join("cell.so");
    if let Err(e) = std::fs::copy(&lib, &copy) {
        return not(format!("copying {}: {e}", lib.display()));
    }
    Cell { library: Some(copy), version, status: None }
}

fn build_cell_in(src: &Path, dir: &Path, build_log: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let status = Command::new("tar")
        .arg("xzf")
        .arg(src)
        .arg("-C")
        .arg(dir)
        .arg("--strip-components=1")
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar xzf {} failed", src.display()));
    }
    // An empty [workspace] table: under target/ it would otherwise count as a stray member of
    // this repository's workspace, and cargo refuses to build it.
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| e.to_string())?;
    if !text.lines().any(|l| l.starts_with("[workspace]")) {
        std::fs::write(&manifest, format!("{text}\n[workspace]\n")).map_err(|e| e.to_string())?;
    }
    let out = std::fs::File::create(build_log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--lib"])
        .current_dir(dir)
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    status.success().then_some(()).ok_or_else(|| "cargo build --release of redis-cell failed".into())
}

/// The servers, the scripts and the settings of a run.
struct Bench {
    settings: Settings,
    log: Log,
    rl: BenchServer,
    cell_server: Option<BenchServer>,
    cell: Cell,
    /// Script name (cases::SCRIPTS) → SHA1.
    scripts: HashMap<&'static str, String>,
    /// The replicas of `rl` and `cell_server`, while attached.
    replicas: Option<(BenchServer, Option<BenchServer>)>,
}

impl Bench {
    /// A command of cases.rs with the scripts' SHA1s filled in, as arguments.
    fn resolve(&self, command: &str) -> String {
        let mut c = command.to_string();
        for (name, sha) in &self.scripts {
            c = c.replace(&format!("{{{name}}}"), sha);
        }
        c
    }

    fn server(&self, side: Side) -> &BenchServer {
        match side {
            Side::Module => &self.rl,
            Side::Cell => self.cell_server.as_ref().expect("redis-cell's rows run only when it is built"),
        }
    }

    fn replica(&self, side: Side) -> Option<&BenchServer> {
        let (rl, cell) = self.replicas.as_ref()?;
        match side {
            Side::Module => Some(rl),
            Side::Cell => cell.as_ref(),
        }
    }

    /// The rows of a configuration, both servers', in measuring order.
    fn rows(&self, config: Config) -> Vec<(Side, String, &'static CpuCase)> {
        let mut rows = Vec::new();
        let sides: &[(Side, &'static [CpuCase])] = &[(Side::Module, MODULE_CASES), (Side::Cell, CELL_CASES)];
        for (side, cases) in sides {
            if *side == Side::Cell && self.cell_server.is_none() {
                continue;
            }
            for case in cases.iter().filter(|c| config == Config::Alone || c.with_replica) {
                let label = if case.peer { self.cell.label() } else { case.label.to_string() };
                rows.push((*side, label, case));
            }
        }
        rows
    }

    fn benchmark(&self, requests: u64, pipeline: u64) -> Benchmark {
        Benchmark {
            clients: self.settings.clients,
            requests,
            pipeline,
            keyspace: self.settings.keyspace,
            cpu: self.rl.cpu.map(|_| self.settings.client_cpu),
        }
    }

    /// The module's counters of `algorithm` (INFO ratelimit: `…_<algorithm>_checks` etc.).
    fn counters(server: &BenchServer, algorithm: &str) -> Counters {
        let info = server.info("ratelimit");
        let field = |suffix: &str| {
            let suffix = format!("_{algorithm}_{suffix}");
            info.lines()
                .filter_map(|l| l.trim().split_once(':'))
                .filter(|(k, _)| k.ends_with(&suffix))
                .filter_map(|(_, v)| v.trim().parse().ok())
                .next_back()
                .unwrap_or(0)
        };
        Counters { checks: field("checks"), admitted_units: field("admitted_units"), limited: field("limited") }
    }

    /// calls and usec_per_call of `cmdstat_<stat>` (0, 0 when absent).
    fn cmdstat(server: &BenchServer, stat: &str) -> (u64, f64) {
        let info = server.info("commandstats");
        let prefix = format!("cmdstat_{stat}:");
        let Some(line) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else { return (0, 0.0) };
        let field =
            |name: &str| line.trim().split(',').find_map(|kv| kv.strip_prefix(name).and_then(|r| r.strip_prefix('=')));
        (
            field("calls").and_then(|v| v.parse().ok()).unwrap_or(0),
            field("usec_per_call").and_then(|v| v.parse().ok()).unwrap_or(0.0),
        )
    }

    /// One measured run: CONFIG RESETSTAT, redis-benchmark, then commandstats (which must have
    /// seen every request) and the module's counters over the run.
    fn measure(
        &self,
        server: &BenchServer,
        requests: u64,
        pipeline: u64,
        stat: &str,
        algorithm: Option<&str>,
        command: &[String],
    ) -> Result<Sample, String> {
        let before = algorithm.map(|a| Self::counters(server, a));
        server.run(&["CONFIG", "RESETSTAT"])?;
        let run = self.benchmark(requests, pipeline).run(server, command)?;
        let (calls, usec_per_call) = Self::cmdstat(server, stat);
        if calls < requests {
            return Err(format!(
                "'{}': commandstats saw {calls} calls of {stat}, expected {requests}",
                command.join(" ")
            ));
        }
        let counters = match (algorithm, before) {
            (Some(a), Some(b)) => Some(Self::counters(server, a).since(&b)),
            _ => None,
        };
        Ok(Sample {
            cpu_us: round_to(run.server_cpu_us_per_op(requests), 3),
            usec_per_call,
            ops_per_sec: run.ops_per_sec,
            counters,
        })
    }

    /// The rounds of a configuration: each round prepares and measures every row once (one
    /// pipelined run), starting one row later than the round before. With a replica, the
    /// replica is checked after every run; alone, the module's rows also get one unpipelined
    /// run in the first round.
    fn run_rounds(
        &self,
        config: Config,
        loads: &mut Vec<String>,
        unpipelined: &mut HashMap<&'static str, Sample>,
    ) -> Result<Vec<RowResult>, String> {
        let s = &self.settings;
        let mut results: Vec<RowResult> = self
            .rows(config)
            .into_iter()
            .map(|(side, label, case)| RowResult {
                side,
                label,
                case,
                requests: s.requests(case, config),
                samples: Vec::new(),
                replica: None,
            })
            .collect();
        let n = results.len();
        for round in 1..=s.rounds {
            let [load, _, _] = load_averages();
            loads.push(load.clone());
            let name = if config == Config::Alone { "alone" } else { "replica" };
            self.log.say(&format!("{name}: round {round} of {} ({n} rows; load {load})", s.rounds));
            for j in 0..n {
                let row = &mut results[(j + round - 1) % n];
                let server = self.server(row.side);
                let command = self.resolve(row.case.command);
                server.run(&FLUSHALL)?;
                let warm_up = resp_commands(s.keyspace, 1, &command.replace("__rand_int__", "@"));
                server.pipe(&format!("warming up {}", row.label), &warm_up)?;
                let replica = self.replica(row.side).filter(|_| config == Config::Replica);
                // The replica receives the warm-up as well: let it finish before the measured run.
                if let Some(r) = replica {
                    server.wait_replica(r, Duration::from_secs(30)).map_err(|behind| {
                        format!("replica of {} behind after warming up {} ({behind})", server.name, row.label)
                    })?;
                }
                let argv = arguments(&command);
                let sample = self.measure(server, row.requests, PIPELINE, row.case.stat, row.case.algorithm, &argv)?;
                row.samples.push(sample);
                if let Some(r) = replica {
                    let check = self.check_replica(server, r)?;
                    if check != "identical" {
                        self.log.say(&format!("  {}, round {round}: replica {check}", row.label));
                    }
                    if round == 1 || row.replica.as_deref() == Some("identical") {
                        row.replica =
                            Some(if check == "identical" { check } else { format!("{check} (round {round})") });
                    }
                } else if round == 1 && row.side == Side::Module && s.n_unpipelined > 0 {
                    let u = self.measure(server, s.n_unpipelined, 1, row.case.stat, row.case.algorithm, &argv)?;
                    unpipelined.insert(row.case.label, u);
                }
            }
        }
        Ok(results)
    }

    /// Waits until the replica has processed everything, then compares DEBUG DIGEST and the
    /// absolute expiry (PEXPIRETIME) of a sample of the keyspace: "identical" or what differs.
    fn check_replica(&self, primary: &BenchServer, replica: &BenchServer) -> Result<String, String> {
        if let Err(behind) = primary.wait_replica(replica, Duration::from_secs(30)) {
            return Ok(format!("replica behind (offset {behind})"));
        }
        let digest = |s: &BenchServer| s.query::<String>(&["DEBUG", "DIGEST"]);
        if digest(primary)? != digest(replica)? {
            return Ok("**DEBUG DIGEST differs**".into());
        }
        let sample = expiry_sample(self.settings.keyspace);
        let expiry = |s: &BenchServer| s.query_pipelined::<Vec<i64>>(&sample);
        if expiry(primary)? != expiry(replica)? {
            return Ok("**expiry differs**".into());
        }
        Ok("identical".into())
    }

    /// The entries of a sliding log (RL.INFO's `entries`).
    fn log_entries(&self, key: &str) -> Result<i64, String> {
        let info: Vec<redis::Value> = self.rl.query(&["RL.INFO", key])?;
        info.windows(2)
            .find_map(|w| match (&w[0], &w[1]) {
                (redis::Value::BulkString(k), redis::Value::Int(v)) if k == b"entries" => Some(*v),
                (redis::Value::SimpleString(k), redis::Value::Int(v)) if k == "entries" => Some(*v),
                _ => None,
            })
            .ok_or_else(|| format!("RL.INFO {key} has no entries"))
    }

    /// `limit` entries in the log at `key`, `step_us` apart on the debug clock.
    fn fill_log(&self, key: &str, limit: u64, window: &str, step_us: u64) -> Result<(), String> {
        self.rl.run(&["DEL", key])?;
        self.rl.run(&["RL.DEBUG", "CLOCK", "SET", &now_unix_us()])?;
        let command = self.resolve(&format!("EVALSHA {{log_step}} 1 {key} {limit} {window} {step_us}"));
        self.rl.pipe(&format!("filling {key}"), &resp_commands(limit, 1, &command))?;
        let entries = self.log_entries(key)?;
        if entries != limit as i64 {
            return Err(format!("filling {key} left {entries} entries, not {limit}"));
        }
        Ok(())
    }

    /// The sliding log at its limit, one key hammered:
    /// a) admit one, evict one: the log is filled to `limit` entries one second apart on the
    ///    debug clock (window = limit seconds; the helper script steps the clock before each
    ///    call), then every measured call steps the clock one second, evicts the oldest entry
    ///    and admits one. usec_per_call is RL.SLIDINGLOG's own (commands called from a script
    ///    are counted in commandstats). The step is a second, not a µs, so that the key's TTL
    ///    (= reset_after, on the server's real clock) is seconds long and the key cannot expire
    ///    during the run.
    /// b) refused: the same fill with a 1-minute window, then the clock follows the real clock
    ///    and RL.SLIDINGLOG is sent directly: every call finds the log full and computes the
    ///    exact retry_after (nothing is written).
    fn hammer(&self) -> Result<Vec<HammerRow>, String> {
        let n = self.settings.n_hammer;
        let mut rows = Vec::new();
        for limit in cases::HAMMER_LIMITS {
            self.log.say(&format!("sliding log at its limit: {limit}"));
            let key = format!("hot:{limit}");
            let window = format!("{limit}s");
            self.fill_log(&key, limit, &window, 1_000_000)?;
            let step = arguments(&self.resolve(&format!("EVALSHA {{log_step}} 1 {key} {limit} {window} 1000000")));
            let admit = self.measure(&self.rl, n, PIPELINE, "rl.slidinglog", Some("slidinglog"), &step)?;
            let admit_entries = self.log_entries(&key)?;
            self.fill_log(&key, limit, "1m", 1)?;
            self.rl.run(&["RL.DEBUG", "CLOCK", "REAL"])?;
            let direct = arguments(&format!("RL.SLIDINGLOG {key} {limit} 1m"));
            let refused = self.measure(&self.rl, n, PIPELINE, "rl.slidinglog", Some("slidinglog"), &direct)?;
            let refused_entries = self.log_entries(&key)?;
            self.rl.run(&["DEL", &key])?;
            rows.push(HammerRow { limit, admit, admit_entries, refused, refused_entries });
        }
        self.rl.run(&["RL.DEBUG", "CLOCK", "REAL"])?;
        Ok(rows)
    }

    /// used_memory before and after loading `keys` keys (`rounds` calls each) ÷ keys. On the
    /// servers with this module (`debug_clock`) the debug clock is pinned while loading.
    fn memory(
        server: &BenchServer,
        keys: u64,
        rounds: u64,
        command: &str,
        debug_clock: bool,
    ) -> Result<Memory, String> {
        server.run(&FLUSHALL)?;
        if debug_clock {
            server.run(&["RL.DEBUG", "CLOCK", "SET", &now_unix_us()])?;
        }
        sleep(Duration::from_millis(200));
        let before = server.info_number("memory", "used_memory")?;
        server.pipe(&format!("loading '{command}'"), &resp_commands(keys, rounds, command))?;
        let after = server.info_number("memory", "used_memory")?;
        let keys_held: u64 = server.query(&["DBSIZE"])?;
        if debug_clock {
            server.run(&["RL.DEBUG", "CLOCK", "REAL"])?;
        }
        Ok(Memory { bytes_per_key: round_to((after - before) / keys as f64, 1), keys: keys_held })
    }

    fn measure_all(
        mut self,
        module_spec: ServerSpec,
        cell_spec: Option<ServerSpec>,
        load_start: [String; 3],
        server_binary: String,
    ) -> Result<(), String> {
        let s = self.settings.clone();
        let mut round_loads = HashMap::new();
        let mut unpipelined = HashMap::new();
        let mut rows = HashMap::new();
        let mut loads = Vec::new();
        rows.insert(Config::Alone, self.run_rounds(Config::Alone, &mut loads, &mut unpipelined)?);
        round_loads.insert(Config::Alone, loads);

        let hammer = self.hammer()?;

        let mut memory = Vec::new();
        for case in cases::MEMORY_CASES {
            self.log.say(&format!("memory: {}", case.label));
            memory.push((case.label, Self::memory(&self.rl, s.mem_keys, 1, &self.resolve(case.command), true)?));
        }
        let mut logs = [[0.0; 3]; 2];
        for (i, (size, keys)) in cases::LOG_SIZES.iter().zip(s.log_keys).enumerate() {
            self.log.say(&format!("memory: logs of {size} entries × {keys} keys"));
            for (k, case) in cases::LOG_CASES.iter().enumerate() {
                logs[k][i] = Self::memory(&self.rl, keys, *size, &self.resolve(case.command), true)?.bytes_per_key;
            }
        }
        self.rl.run(&FLUSHALL)?;
        let cell_memory = match &self.cell_server {
            Some(cell) => {
                self.log.say(&format!("memory: {}", self.cell.label()));
                let throttle = Self::memory(cell, s.mem_keys, 1, cases::CELL_MEMORY_COMMAND, false)?;
                let set = Self::memory(cell, s.mem_keys, 1, cases::CELL_MEMORY_SET_COMMAND, false)?;
                cell.run(&FLUSHALL)?;
                Some((throttle, set))
            }
            None => None,
        };

        // The same rows on the other servers scripts/compat.sh builds (Redis 7.2, 7.4, 8.0,
        // Valkey 8; newer servers lay keys out differently, e.g. Valkey 8 embeds the key in its
        // entry), one server at a time, with the module loaded as above.
        let (found, mut others_status) = match &s.servers_dir {
            None => (Vec::new(), Some("skipped (BENCH_SERVERS_DIR=none)".to_string())),
            Some(dir) => (cached_servers(dir), None),
        };
        if found.is_empty() && others_status.is_none() {
            others_status = Some(format!(
                "skipped: no server built in {} (`bash scripts/compat.sh build` builds them; BENCH_SERVERS_DIR names another folder)",
                s.servers_dir.as_deref().unwrap_or(Path::new("")).display()
            ));
        }
        let mut others = Vec::new();
        for (name, binary) in found {
            let bin = binary.to_string_lossy().into_owned();
            let version = machine::server_version(&bin).unwrap_or_default();
            let spec =
                ServerSpec { name: format!("other-{name}"), binary: Some(binary.clone()), ..module_spec.clone() };
            let server = BenchServer::start(&spec)?;
            let file_name = binary.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            self.log.say(&format!("{}: {bin} pid {} on port {}", spec.name, server.pid(), server.port()));
            let mut memory = Vec::new();
            for case in cases::other_server_cases() {
                self.log.say(&format!("memory on {name}: {}", case.label));
                memory.push((case.label, Self::memory(&server, s.mem_keys, 1, &self.resolve(case.command), true)?));
            }
            others.push(OtherServer { name, binary: file_name, version, memory });
        }

        // With a replica attached: the same rounds, the module's server and redis-cell's each
        // with its own replica (on the client's CPU).
        let replica_cpu = self.rl.cpu.map(|_| s.client_cpu);
        let rl_replica = self.rl.attach_replica(&ServerSpec {
            name: "rl-replica".into(),
            cpu: replica_cpu,
            ..module_spec.clone()
        })?;
        let cell_replica = match (&self.cell_server, &cell_spec) {
            (Some(cell), Some(spec)) => Some(cell.attach_replica(&ServerSpec {
                name: "cell-replica".into(),
                cpu: replica_cpu,
                ..spec.clone()
            })?),
            _ => None,
        };
        self.replicas = Some((rl_replica, cell_replica));
        let mut loads = Vec::new();
        rows.insert(Config::Replica, self.run_rounds(Config::Replica, &mut loads, &mut unpipelined)?);
        round_loads.insert(Config::Replica, loads);
        self.rl.run(&FLUSHALL)?;
        if let Some(cell) = &self.cell_server {
            cell.run(&FLUSHALL)?;
        }

        let results =
            Results { rows, round_loads, unpipelined, hammer, memory, cell_memory, logs, others, others_status };
        let run = report::Run {
            settings: &s,
            cell: &self.cell,
            pinned: self.rl.cpu.is_some(),
            load_start,
            server_binary,
            elapsed_secs: self.log.elapsed_secs(),
        };
        let text = report::write(&run, &results);
        print!("{}", text.text());
        text.write_to(&s.report).map_err(|e| format!("{}: {e}", s.report.display()))?;
        self.log.say(&format!("report written to {}", s.report.display()));
        Ok(())
    }
}

/// PEXPIRETIME of EXPIRY_SAMPLE keys of the keyspace, the same pseudo-random sample every time.
fn expiry_sample(keyspace: u64) -> Vec<Vec<String>> {
    let mut x: u64 = 7;
    (0..EXPIRY_SAMPLE)
        .map(|_| {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vec!["PEXPIRETIME".to_string(), format!("key:{:012}", x % keyspace.max(1))]
        })
        .collect()
}
