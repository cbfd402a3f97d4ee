//! Servers for a benchmark: started by the integration tests' harness ([`crate::common`]: a free
//! loopback port, its own directory, `--save "" --appendonly no`, stopped and removed on drop),
//! with the binary and the module chosen per server, pinned to a CPU, and the CPU time they
//! spent read from Linux schedstat.
//!
//! Commands go over a fresh connection each, as `redis-cli` sends them: no connection of the
//! benchmark stays open on a server between two commands, so none is counted in `used_memory`
//! or holds a query buffer while a measured run goes on.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::{info_field, wait_replica_synced, Opts, Server};

/// The redis-cli used for `--pipe` loading (`redis-cli` on PATH, as the old scripts did).
pub const REDIS_CLI: &str = "redis-cli";

/// What to start.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// A short name for logs.
    pub name: String,
    /// The redis-server (or valkey-server) binary; None: the harness's default
    /// (`$RL_REDIS_SERVER`, else `redis-server` on PATH).
    pub binary: Option<PathBuf>,
    /// The module to load.
    pub module: PathBuf,
    /// Load it with the argument `DEBUG_CLOCK` (this repository's module only).
    pub debug_clock: bool,
    /// Pin every thread of the server to this CPU.
    pub cpu: Option<usize>,
    /// Start as a replica of this server (and wait until it is in sync).
    pub replica_of: Option<u16>,
}

/// A running server (stopped when dropped).
pub struct BenchServer {
    pub name: String,
    pub cpu: Option<usize>,
    server: Server,
}

/// Runs `f` with the environment variables set (Some) or removed (None), then restores them.
/// The harness of tests/common reads the server binary and the module from `RL_REDIS_SERVER`
/// and `RL_MODULE` when it starts a server; benchmarks start servers from one thread.
fn with_env<T>(vars: &[(&str, Option<OsString>)], f: impl FnOnce() -> T) -> T {
    let saved: Vec<(&str, Option<OsString>)> = vars.iter().map(|(k, _)| (*k, std::env::var_os(k))).collect();
    let set = |vars: &[(&str, Option<OsString>)]| {
        for (k, v) in vars {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    };
    set(vars);
    let out = f();
    set(&saved);
    out
}

impl BenchServer {
    pub fn start(spec: &ServerSpec) -> Result<BenchServer, String> {
        let mut vars = vec![("RL_MODULE", Some(spec.module.clone().into_os_string()))];
        if let Some(b) = &spec.binary {
            vars.push(("RL_REDIS_SERVER", Some(b.clone().into_os_string())));
        }
        let opts = Opts { debug_clock: spec.debug_clock, replica_of: spec.replica_of, ..Opts::default() };
        let server = with_env(&vars, || Server::start_with(opts));
        let s = BenchServer { name: spec.name.clone(), cpu: spec.cpu, server };
        if let Some(cpu) = spec.cpu {
            s.pin(cpu)?;
        }
        Ok(s)
    }

    /// Pins every thread of the server to `cpu` (`taskset -a -c -p`).
    fn pin(&self, cpu: usize) -> Result<(), String> {
        let pid = self.pid().to_string();
        let cpu = cpu.to_string();
        let status = Command::new("taskset")
            .args(["-a", "-c", "-p", &cpu, &pid])
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("taskset: {e}"))?;
        status.success().then_some(()).ok_or_else(|| format!("taskset -a -c -p {cpu} {pid} failed: {status}"))
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    pub fn pid(&self) -> u32 {
        self.server.pid().expect("a started server has a process")
    }

    /// The harness's server, for what this type does not wrap.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// CPU time (user + system) of all the server's threads so far, in ns: the first field of
    /// each thread's `/proc/<pid>/task/<tid>/schedstat`; where schedstat is unavailable, the
    /// process's ticks from `/proc/<pid>/stat`.
    pub fn cpu_ns(&self) -> Result<u64, String> {
        let pid = self.pid();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| format!("/proc/{pid}/task: {e}"))?;
        let mut total = 0u64;
        for t in tasks.flatten() {
            match std::fs::read_to_string(t.path().join("schedstat")) {
                Ok(s) => total += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
                // A thread that exited between listing and reading took its time with it
                // (as in the shell version); no schedstat at all: fall back to ticks.
                Err(_) if t.path().exists() => return ticks_ns(pid),
                Err(_) => {}
            }
        }
        Ok(total)
    }

    /// One command on a fresh connection; an error reply is an error naming the command.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> Result<T, String> {
        let mut con = self.server.conn();
        let mut c = redis::Cmd::new();
        for a in args {
            c.arg(*a);
        }
        c.query(&mut con).map_err(|e| format!("{}: '{}' failed: {e}", self.name, args.join(" ")))
    }

    /// One command whose reply is not needed.
    pub fn run(&self, args: &[&str]) -> Result<(), String> {
        self.query::<redis::Value>(args).map(drop)
    }

    /// Many commands pipelined on one fresh connection.
    pub fn query_pipelined<T: redis::FromRedisValue>(&self, commands: &[Vec<String>]) -> Result<T, String> {
        let mut con = self.server.conn();
        let mut p = redis::pipe();
        for c in commands {
            let mut cmd = redis::Cmd::new();
            for a in c {
                cmd.arg(a);
            }
            p.add_command(cmd);
        }
        p.query(&mut con).map_err(|e| format!("{}: pipeline failed: {e}", self.name))
    }

    /// `INFO <section>` (a fresh connection).
    pub fn info(&self, section: &str) -> String {
        self.server.info(section)
    }

    /// A numeric field of `INFO <section>`.
    pub fn info_number(&self, section: &str, field: &str) -> Result<f64, String> {
        let info = self.info(section);
        info_field(&info, field)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{}: INFO {section} has no number {field}", self.name))
    }

    /// Sends RESP text through `redis-cli --pipe`; an error unless every reply succeeded.
    pub fn pipe(&self, what: &str, resp: &[u8]) -> Result<(), String> {
        let mut child = Command::new(REDIS_CLI)
            .args(["-p", &self.port().to_string(), "--pipe"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{REDIS_CLI}: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        // Written from a thread: redis-cli answers while it reads.
        let data = resp.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&data));
        let out = child.wait_with_output().map_err(|e| format!("{REDIS_CLI} --pipe: {e}"))?;
        let _ = writer.join();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let last = text.lines().last().unwrap_or("");
        if last.contains("errors: 0,") {
            Ok(())
        } else {
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            Err(format!("{what} failed ({}):\n{}", self.name, tail.into_iter().rev().collect::<Vec<_>>().join("\n")))
        }
    }

    /// Starts a replica of this server as `spec` says and waits until it is in sync.
    pub fn attach_replica(&self, spec: &ServerSpec) -> Result<BenchServer, String> {
        let spec = ServerSpec { replica_of: Some(self.port()), ..spec.clone() };
        let replica = BenchServer::start(&spec)?;
        wait_replica_synced(&self.server, &replica.server);
        Ok(replica)
    }

    /// Waits until `replica` has processed everything this server had sent when called (its
    /// `slave_repl_offset` reaches this `master_repl_offset`: at least, since the primary's own
    /// PINGs to its replicas move the offset on). Err("<got> of <want>") after `timeout`.
    pub fn wait_replica(&self, replica: &BenchServer, timeout: Duration) -> Result<(), String> {
        let want = self.info_number("replication", "master_repl_offset")? as u64;
        let deadline = Instant::now() + timeout;
        loop {
            let got = replica.info_number("replication", "slave_repl_offset").ok().map(|v| v as u64);
            match got {
                Some(g) if g >= want => return Ok(()),
                _ if Instant::now() >= deadline => {
                    return Err(format!("{} of {want}", got.map_or("?".to_string(), |g| g.to_string())));
                }
                _ => sleep(Duration::from_millis(50)),
            }
        }
    }
}

fn ticks_ns(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 after the name.
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    let hz: u64 = crate::machine::command_output("getconf", &["CLK_TCK"], None)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100);
    Ok(ticks * 1_000_000_000 / hz)
}

/// The binaries under `dir` as `scripts/compat.sh` caches them: `<dir>/<name>/bin/redis-server`
/// (all names, sorted), then `<dir>/<name>/bin/valkey-server`; only executable files.
pub fn cached_servers(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    let mut found = Vec::new();
    for binary in ["redis-server", "valkey-server"] {
        for name in &names {
            let bin = dir.join(name).join("bin").join(binary);
            if is_executable(&bin) {
                found.push((name.clone(), bin));
            }
        }
    }
    found
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether a program can be found on PATH (or is a path to an executable).
pub fn on_path(program: &str) -> bool {
    if program.contains('/') {
        return is_executable(Path::new(program));
    }
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| is_executable(&d.join(program))))
}
