//! Load: one `redis-benchmark` run against a server, with the server CPU it cost; the RESP text
//! of many commands for `redis-cli --pipe`.

use std::process::Command;

use crate::servers::BenchServer;

/// How `redis-benchmark` is run.
#[derive(Clone, Debug)]
pub struct Benchmark {
    /// `-c`: parallel connections.
    pub clients: u64,
    /// `-n`: requests in the run.
    pub requests: u64,
    /// `-P`: requests per pipeline.
    pub pipeline: u64,
    /// `-r`: `__rand_int__` in the command becomes a 12-digit number below this.
    pub keyspace: u64,
    /// Pin redis-benchmark to this CPU (`taskset -c`).
    pub cpu: Option<usize>,
}

/// One run's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunFigures {
    /// Requests per second, as redis-benchmark reports them.
    pub ops_per_sec: f64,
    /// CPU time of all the server's threads during the run, in ns.
    pub server_cpu_ns: u64,
}

impl RunFigures {
    /// Server CPU µs per request over `requests`.
    pub fn server_cpu_us_per_op(&self, requests: u64) -> f64 {
        self.server_cpu_ns as f64 / 1000.0 / requests as f64
    }
}

impl Benchmark {
    /// Runs `command` against `server` once (`--csv`): its requests per second and the server
    /// CPU time between just before and just after.
    pub fn run(&self, server: &BenchServer, command: &[String]) -> Result<RunFigures, String> {
        let mut c = match self.cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu.to_string(), "redis-benchmark"]);
                c
            }
            None => Command::new("redis-benchmark"),
        };
        let port = server.port().to_string();
        let args = [
            ("-p", port),
            ("-c", self.clients.to_string()),
            ("-n", self.requests.to_string()),
            ("-P", self.pipeline.to_string()),
            ("-r", self.keyspace.to_string()),
        ];
        for (flag, value) in &args {
            c.arg(flag).arg(value);
        }
        c.arg("--csv").args(command).stderr(std::process::Stdio::null());
        let before = server.cpu_ns()?;
        let out = c.output().map_err(|e| format!("redis-benchmark: {e}"))?;
        let after = server.cpu_ns()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "test","rps",... then one line per test: "INCR key:__rand_int__","123456.79",...
        let ops_per_sec = text
            .lines()
            .nth(1)
            .and_then(|l| l.split("\",\"").nth(1))
            .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
            .ok_or_else(|| format!("redis-benchmark failed for: {}\n{text}", command.join(" ")))?;
        Ok(RunFigures { ops_per_sec, server_cpu_ns: after.saturating_sub(before) })
    }
}

/// The RESP text of `rounds` × `keys` commands from `template` (split at spaces): an `@` in it
/// becomes each key's 12-digit number (the names `__rand_int__` makes), 0 to keys − 1 in
/// order; with rounds > 1, `RL.DEBUG CLOCK ADVANCE 1` separates the rounds (so that every
/// sliding-log entry gets its own microsecond).
pub fn resp_commands(keys: u64, rounds: u64, template: &str) -> Vec<u8> {
    let (head, tail) = template.split_once('@').map_or((template, None), |(h, t)| (h, Some(t)));
    let mut out = Vec::new();
    for _ in 0..rounds {
        for i in 0..keys {
            match tail {
                Some(t) => push_resp(&mut out, &format!("{head}{i:012}{t}")),
                None => push_resp(&mut out, template),
            }
        }
        if rounds > 1 {
            push_resp(&mut out, "RL.DEBUG CLOCK ADVANCE 1");
        }
    }
    out
}

fn push_resp(out: &mut Vec<u8>, command: &str) {
    let args: Vec<&str> = command.split_whitespace().collect();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
}

/// `template` (split at spaces) as arguments, with `__rand_int__` left for redis-benchmark.
pub fn arguments(command: &str) -> Vec<String> {
    command.split_whitespace().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_numbers_keys_like_rand_int() {
        let r = resp_commands(2, 1, "SET k:@ 1");
        assert_eq!(
            String::from_utf8(r).unwrap(),
            "*3\r\n$3\r\nSET\r\n$14\r\nk:000000000000\r\n$1\r\n1\r\n*3\r\n$3\r\nSET\r\n$14\r\nk:000000000001\r\n$1\r\n1\r\n"
        );
    }

    #[test]
    fn resp_rounds_are_separated_by_a_clock_step() {
        let r = String::from_utf8(resp_commands(1, 2, "PING")).unwrap();
        assert_eq!(r.matches("PING").count(), 2);
        assert_eq!(r.matches("ADVANCE").count(), 2);
        assert_eq!(String::from_utf8(resp_commands(3, 1, "PING")).unwrap().matches("PING").count(), 3);
    }
}
