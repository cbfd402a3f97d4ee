//! The report (target/bench-report.md, also printed): the run's header, the tables, and the
//! targets of cases.rs checked against them. Ratios are between the values as the tables show
//! them (medians to the ns, usec_per_call to 2 places), so every ratio can be recomputed from
//! the report.

use redis_ratelimit_bench::machine;
use redis_ratelimit_bench::report::{fixed, fixed_or_na, percent, Align, Report, Table};
use redis_ratelimit_bench::stats::{self, median, ratios_of_ratios_within, ratios_within, round_to, Bound, Summary};

use crate::cases::{self, CpuCase, INCR_LABEL, MEM_SET_LABEL, PIPELINE, SET_LABEL};
use crate::{Cell, Config, Results, RowResult, Settings, Side};

/// What the header says about the run.
pub struct Run<'a> {
    pub settings: &'a Settings,
    pub cell: &'a Cell,
    pub pinned: bool,
    pub load_start: [String; 3],
    pub server_binary: String,
    pub elapsed_secs: u64,
}

/// A row's figures as the tables show them.
struct Figures {
    cpu: Summary,
    usec_per_call: f64,
    ops_per_sec: f64,
    /// Share of calls refused over all rounds (module commands).
    limited: Option<String>,
}

fn figures(row: &RowResult) -> Figures {
    let of = |f: fn(&crate::Sample) -> f64| row.samples.iter().map(f).collect::<Vec<f64>>();
    let cpu = Summary::of(&of(|s| s.cpu_us)).map_or(Summary { median: 0.0, min: 0.0, max: 0.0 }, |s| s.rounded(3));
    let usec_per_call = round_to(round_to(median(&of(|s| s.usec_per_call)).unwrap_or(0.0), 3), 2);
    let ops_per_sec = round_to(median(&of(|s| s.ops_per_sec)).unwrap_or(0.0), 3);
    let limited = row.case.algorithm.map(|_| {
        let sum = |f: fn(&crate::Counters) -> u64| row.samples.iter().filter_map(|s| s.counters.as_ref()).map(f).sum();
        percent(sum(|c| c.limited), sum(|c| c.checks))
    });
    Figures { cpu, usec_per_call, ops_per_sec, limited }
}

/// a ÷ b to 2 places, as shown (None: n/a).
fn ratio2(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    stats::ratio(a?, b?).map(|r| round_to(r, 2))
}

fn shown(r: Option<f64>) -> String {
    fixed_or_na(r, 2)
}

fn pass(ok: bool) -> String {
    if ok { "yes" } else { "**no**" }.to_string()
}

struct Tables<'a> {
    run: &'a Run<'a>,
    results: &'a Results,
}

impl Tables<'_> {
    fn row(&self, config: Config, side: Side, label: &str) -> Option<&RowResult> {
        self.results.rows.get(&config)?.iter().find(|r| r.side == side && r.label == label)
    }

    fn cpu(&self, config: Config, side: Side, label: &str) -> Option<f64> {
        self.row(config, side, label).map(|r| figures(r).cpu.median)
    }

    fn samples(&self, config: Config, side: Side, label: &str) -> Vec<f64> {
        self.row(config, side, label).map(|r| r.samples.iter().map(|s| s.cpu_us).collect()).unwrap_or_default()
    }

    fn shown_label(row: &RowResult) -> String {
        if row.side == Side::Cell && !row.case.peer {
            format!("{} (redis-cell's server)", row.label)
        } else {
            row.label.clone()
        }
    }

    fn cpu_table(&self, r: &mut Report, config: Config) {
        let s = self.run.settings;
        let (c, k, rounds) = (s.clients, s.keyspace, s.rounds);
        r.section(match config {
            Config::Alone => {
                format!("Server CPU per operation, keys in place (-P {PIPELINE}, -c {c}, -r {k}; median of {rounds} rounds)")
            }
            Config::Replica => format!(
                "Server CPU per operation with a replica attached (-P {PIPELINE}, -c {c}, -r {k}; median of {rounds} rounds)"
            ),
        });
        let mut columns = vec![
            ("command", Align::Left),
            ("requests/run", Align::Right),
            ("server CPU µs/op (median)", Align::Right),
            ("min–max", Align::Right),
            ("spread", Align::Right),
            ("× INCR", Align::Right),
            ("× SET EX", Align::Right),
            ("usec_per_call", Align::Right),
            ("× INCR", Align::Right),
            ("ops/s", Align::Right),
            ("limited", Align::Right),
        ];
        let replica_column =
            format!("replica (DEBUG DIGEST, PEXPIRETIME of {} keys; every round)", cases::EXPIRY_SAMPLE);
        if config == Config::Replica {
            columns.push((&replica_column, Align::Left));
        }
        let mut t = Table::new(columns);
        for side in [Side::Module, Side::Cell] {
            if side == Side::Cell && self.run.cell.library.is_none() {
                t.row([self.run.cell.label(), self.run.cell.status.clone().unwrap_or_default()]);
                continue;
            }
            let base_incr = self.cpu(config, side, INCR_LABEL);
            let base_set = self.cpu(config, side, SET_LABEL);
            let base_usec = self.row(config, side, INCR_LABEL).map(|r| figures(r).usec_per_call);
            for row in self.results.rows[&config].iter().filter(|r| r.side == side) {
                let f = figures(row);
                let mut cells = vec![
                    Self::shown_label(row),
                    row.requests.to_string(),
                    fixed(f.cpu.median, 3),
                    format!("{}–{}", fixed(f.cpu.min, 3), fixed(f.cpu.max, 3)),
                    stats::ratio(50.0 * (f.cpu.max - f.cpu.min), f.cpu.median)
                        .map_or("n/a".into(), |x| format!("±{x:.0}%")),
                    shown(ratio2(Some(f.cpu.median), base_incr)),
                    shown(ratio2(Some(f.cpu.median), base_set)),
                    fixed(f.usec_per_call, 2),
                    shown(ratio2(Some(f.usec_per_call), base_usec)),
                    fixed(f.ops_per_sec, 0),
                    f.limited.unwrap_or_else(|| "–".into()),
                ];
                if config == Config::Replica {
                    cells.push(row.replica.clone().unwrap_or_default());
                }
                t.row(cells);
            }
        }
        r.table(&t);
    }

    fn round_samples(&self, r: &mut Report) {
        let rounds = self.run.settings.rounds;
        r.blank();
        r.line("#### Server CPU µs/op in each round (the samples behind the medians; each round starts one row later than the one before)");
        r.blank();
        let numbers: Vec<String> = (1..=rounds).map(|i| i.to_string()).collect();
        let mut columns = vec![("configuration".to_string(), Align::Left), ("command".to_string(), Align::Left)];
        columns.extend(numbers.into_iter().map(|n| (n, Align::Right)));
        let mut t = Table::new(columns);
        for (config, name) in [(Config::Alone, "keys in place"), (Config::Replica, "with a replica")] {
            for row in &self.results.rows[&config] {
                let mut cells = vec![name.to_string(), Self::shown_label(row)];
                cells.extend(row.samples.iter().map(|s| fixed(s.cpu_us, 3)));
                t.row(cells);
            }
        }
        r.table(&t);
        r.blank();
        r.line(format!(
            "Rounds: each configuration (keys in place; with a replica) was measured in {rounds} rounds; a round runs every row of the table once, the module's server's and redis-cell's, starting one row later than the round before, so that a slow period of the machine touches all rows alike. Every run: FLUSHALL, one unmeasured call of the same command on every key of the keyspace (with a replica: its offset waited for), CONFIG RESETSTAT, one pipelined run of the requests shown. Server CPU µs/op: CPU time (utime + stime, from schedstat) of all the measured server's threads during the run ÷ requests; the median over the rounds, with the least and the most; spread: ±half of (max − min) ÷ median. Ratios are between medians. usec_per_call: INFO commandstats of each run, median (Lua rows: cmdstat_evalsha, the whole script). ops/s: redis-benchmark's, median (on this machine one client cannot saturate the server with the cheap commands, so ops/s partly measure the client). Limited: share of calls refused over all rounds (module counters). redis-cell runs on its own server (both modules register CL.THROTTLE); its ratios are against INCR and SET EX measured again on that server, in the same rounds. With a replica: the replica runs on the client's CPU; after every run the replica's offset is waited for, then DEBUG DIGEST of the two servers is compared, and PEXPIRETIME of {} keys. (redis-cell replicates the command itself, so its replica recomputes every call with its own clock: its state differs from the primary's.)",
            cases::EXPIRY_SAMPLE
        ));
    }

    fn unpipelined(&self, r: &mut Report) {
        let s = self.run.settings;
        if s.n_unpipelined == 0 {
            return;
        }
        r.section(format!("Unpipelined (-P 1, -c {}, -n {}, -r {}; one run)", s.clients, s.n_unpipelined, s.keyspace));
        let mut t = Table::new([
            ("command", Align::Left),
            ("server CPU µs/op", Align::Right),
            ("× INCR", Align::Right),
            ("usec_per_call", Align::Right),
            ("ops/s", Align::Right),
            ("× INCR", Align::Right),
        ]);
        let u = &self.results.unpipelined;
        let incr = u.get(INCR_LABEL);
        for case in cases::MODULE_CASES {
            let Some(x) = u.get(case.label) else { continue };
            t.row([
                case.label.to_string(),
                fixed(x.cpu_us, 3),
                shown(ratio2(Some(x.cpu_us), incr.map(|i| i.cpu_us))),
                fixed(x.usec_per_call, 2),
                fixed(x.ops_per_sec, 0),
                shown(ratio2(Some(x.ops_per_sec), incr.map(|i| i.ops_per_sec))),
            ]);
        }
        r.table(&t);
        r.blank();
        r.line("One request per round trip: system calls dominate the server's CPU per op.");
    }

    fn hammer(&self, r: &mut Report) {
        let s = self.run.settings;
        r.section(format!(
            "RL.SLIDINGLOG at its limit, one key hammered (-P {PIPELINE}, -c {}, -n {})",
            s.clients, s.n_hammer
        ));
        let mut t = Table::new(
            [
                "limit",
                "admit one, evict one: usec_per_call",
                "× INCR",
                "admitted",
                "log entries",
                "refused (log full): usec_per_call",
                "× INCR",
                "server CPU µs/op",
                "refused",
                "log entries",
            ]
            .map(|h| (h, Align::Right)),
        );
        let base_usec = self.row(Config::Alone, Side::Module, INCR_LABEL).map(|r| figures(r).usec_per_call);
        for h in &self.results.hammer {
            let counters = |s: &crate::Sample| s.counters.unwrap_or_default();
            let (a, f) = (counters(&h.admit), counters(&h.refused));
            t.row([
                h.limit.to_string(),
                fixed(h.admit.usec_per_call, 2),
                shown(ratio2(Some(h.admit.usec_per_call), base_usec)),
                percent(a.admitted_units, a.checks),
                h.admit_entries.to_string(),
                fixed(h.refused.usec_per_call, 2),
                shown(ratio2(Some(h.refused.usec_per_call), base_usec)),
                fixed(h.refused.cpu_us, 3),
                percent(f.limited, f.checks),
                h.refused_entries.to_string(),
            ]);
        }
        r.table(&t);
        r.blank();
        r.line("Admit one, evict one: window = limit seconds, filled with limit entries one second apart (debug clock); each measured call is `EVALSHA` of a two-line helper that steps the debug clock by one second and calls `RL.SLIDINGLOG key <limit> <limit>s`, so every call evicts the oldest entry and admits one; the usec_per_call shown is RL.SLIDINGLOG's own line in commandstats (not the script's, whose CPU the server CPU figure would include). Refused: limit entries 1 µs apart with a 1-minute window, then the clock back on the real clock and RL.SLIDINGLOG sent directly: every call finds the log full and computes retry_after. × INCR: against pipelined INCR's usec_per_call (median). One run each.");
    }

    fn memory_bytes(&self, label: &str) -> Option<f64> {
        self.results.memory.iter().find(|(l, _)| *l == label).map(|(_, m)| m.bytes_per_key)
    }

    fn memory(&self, r: &mut Report) {
        let s = self.run.settings;
        r.section("Memory per key (used_memory delta / keys; FLUSHALL between rows)");
        let base = self.memory_bytes(MEM_SET_LABEL).unwrap_or(0.0);
        let mut t = Table::new([
            ("value", Align::Left),
            ("keys", Align::Right),
            ("bytes/key", Align::Right),
            ("over the SET baseline", Align::Right),
        ]);
        for (label, m) in &self.results.memory {
            t.row([
                label.to_string(),
                m.keys.to_string(),
                fixed(m.bytes_per_key, 1),
                format!("{:+.1}", m.bytes_per_key - base),
            ]);
        }
        let cell = self.run.cell;
        match &self.results.cell_memory {
            Some((throttle, set)) => {
                t.row([
                    format!(
                        "{}, on its own server (where the SET baseline is {})",
                        cell.label(),
                        fixed(set.bytes_per_key, 1)
                    ),
                    throttle.keys.to_string(),
                    fixed(throttle.bytes_per_key, 1),
                    format!("{:+.1}", throttle.bytes_per_key - set.bytes_per_key),
                ]);
            }
            None => {
                t.row([cell.label(), "–".into(), cell.status.clone().unwrap_or_default()]);
            }
        }
        r.table(&t);

        r.section(format!(
            "Memory per key on other servers (used_memory delta / {} keys, same keys and commands)",
            s.mem_keys
        ));
        if self.results.others.is_empty() {
            r.line(format!("Other servers: {}.", self.results.others_status.clone().unwrap_or_default()));
        } else {
            let labels: Vec<&str> = cases::other_server_cases().map(|c| c.label).collect();
            let mut columns = vec![("server", Align::Left)];
            columns.extend(labels.iter().map(|l| (*l, Align::Right)));
            let mut t = Table::new(columns);
            let version = machine::server_version(&self.run.server_binary).unwrap_or_default();
            let mut first = vec![format!("{} {version} (Debian; the table above)", self.run.server_binary)];
            first.extend(labels.iter().map(|l| fixed_or_na(self.memory_bytes(l), 1)));
            t.row(first);
            for o in &self.results.others {
                let mut cells = vec![format!("{} ({} {})", o.name, o.binary, o.version)];
                cells.extend(o.memory.iter().map(|(_, m)| fixed(m.bytes_per_key, 1)));
                t.row(cells);
            }
            r.table(&t);
            r.blank();
            let dir = s.servers_dir.as_deref().map(|d| d.display().to_string()).unwrap_or_default();
            r.line(format!("Bytes per key; servers built by `scripts/compat.sh` from {dir}, the module loaded as on the main server, one server at a time on the measured CPU. Each server lays keys out its own way (Valkey 8 embeds the key and its expiry in the entry) with its own bundled jemalloc: these rows show what a newer server does to the same keys."));
        }

        r.section("Memory of the logs (10 / 100 / 1,000 stored requests per key)");
        let mut t = Table::new([
            ("log", Align::Left),
            ("entries/key", Align::Right),
            ("keys", Align::Right),
            ("bytes/key", Align::Right),
            ("bytes/entry (total)", Align::Right),
            ("bytes/entry (marginal, from 10)", Align::Right),
        ]);
        let sizes = cases::LOG_SIZES;
        for (case, bytes) in cases::LOG_CASES.iter().zip(&self.results.logs) {
            for i in 0..sizes.len() {
                let marginal = match i {
                    0 => "–".to_string(),
                    _ => fixed((bytes[i] - bytes[0]) / (sizes[i] - sizes[0]) as f64, 2),
                };
                t.row([
                    case.label.to_string(),
                    sizes[i].to_string(),
                    s.log_keys[i].to_string(),
                    fixed(bytes[i], 1),
                    fixed(bytes[i] / sizes[i] as f64, 2),
                    marginal,
                ]);
            }
        }
        r.table(&t);
        r.blank();
        r.line("The sorted-set rows include the script's `:seq` key (one per log). RL.SLIDINGLOG entries at distinct microseconds (`RL.DEBUG CLOCK ADVANCE 1` between rounds of calls: one entry per request). Keys per row: BENCH_LOG_KEYS. Marginal bytes/entry: (bytes/key − bytes/key at 10 entries) / (entries − 10).");
    }

    /// "measured" and "met" cells of a ratio target: the ratio of medians with the range of the
    /// same ratio within rounds; met by the ratio of medians, with the number of rounds in which
    /// it held when not all (or none) did.
    fn ratio_cells(&self, r: Option<f64>, bound: Bound, rounds: Option<Vec<f64>>) -> (String, String) {
        let rounds = rounds.unwrap_or_default();
        let range = match Summary::of(&rounds) {
            Some(s) => format!("{}–{}", fixed(s.min, 2), fixed(s.max, 2)),
            None => "n/a".to_string(),
        };
        let held = bound.held_in(&rounds);
        let mut met = r.map_or("n/a".to_string(), |r| pass(bound.holds(r)));
        if held != 0 && held != self.run.settings.rounds {
            met = format!("{met} ({held} of {} rounds)", rounds.len());
        }
        (format!("{}× (rounds: {range})", shown(r)), met)
    }

    fn targets(&self, r: &mut Report) {
        r.section("Targets");
        r.line("CPU ratios are ratios of medians; \"rounds:\" gives the least and the most of the same ratio taken within each round (the rows of one round are measured at most a few minutes apart). Met is decided by the ratio of medians; when not every round agrees, the number of rounds in which the target held is shown.");
        r.blank();
        let mut t = Table::new([("target", Align::Left), ("measured", Align::Left), ("met", Align::Left)]);
        let (m, cell) = (Side::Module, self.run.cell);
        let cell_label = cell.label();
        for (config, place) in [(Config::Alone, "keys in place"), (Config::Replica, "with a replica")] {
            let set = self.cpu(config, m, SET_LABEL);
            let set_samples = self.samples(config, m, SET_LABEL);
            for label in cases::O1_LIMITERS {
                let ratio = ratio2(self.cpu(config, m, label), set);
                let rounds = ratios_within(&self.samples(config, m, label), &set_samples);
                let (measured, met) = self.ratio_cells(ratio, cases::VS_SET_EX, rounds);
                t.row([format!("{label} server CPU/op {}× SET EX's, {place}", cases::VS_SET_EX), measured, met]);
            }
            if cell.library.is_none() {
                t.row([
                    format!("O(1) limiters {}× redis-cell's CL.THROTTLE, {place}", cases::VS_REDIS_CELL),
                    format!("redis-cell {}", cell.status.clone().unwrap_or_default()),
                    "n/a".to_string(),
                ]);
                continue;
            }
            let theirs = self.cpu(config, Side::Cell, &cell_label);
            let cell_x = ratio2(theirs, self.cpu(config, Side::Cell, SET_LABEL));
            for label in cases::O1_LIMITERS {
                let ours_x = ratio2(self.cpu(config, m, label), set);
                let raw = ratio2(self.cpu(config, m, label), theirs);
                let rounds = ratios_of_ratios_within(
                    &self.samples(config, m, label),
                    &set_samples,
                    &self.samples(config, Side::Cell, &cell_label),
                    &self.samples(config, Side::Cell, SET_LABEL),
                );
                let (measured, met) = self.ratio_cells(ratio2(ours_x, cell_x), cases::VS_REDIS_CELL, rounds);
                t.row([
                    format!("{label} server CPU/op {}× redis-cell's CL.THROTTLE, {place} (each × its own server's SET EX; raw µs ratio of medians after the range)", cases::VS_REDIS_CELL),
                    format!("{measured}, raw {}×", shown(raw)),
                    met,
                ]);
            }
        }
        let replicated =
            |side: Side, label: &str| self.row(Config::Replica, side, label).and_then(|r| r.replica.clone());
        let differ = cases::MODULE_CASES
            .iter()
            .filter(|c: &&CpuCase| c.with_replica)
            .filter(|c| replicated(m, c.label).as_deref() != Some("identical"))
            .count();
        t.row([
            "the module's replica holds identical state and expiry after every row (DEBUG DIGEST, PEXPIRETIME sample)"
                .to_string(),
            format!("{differ} row(s) differ"),
            pass(differ == 0),
        ]);
        if cell.library.is_some() {
            t.row([
                "(reference) redis-cell's replica after its CL.THROTTLE row".to_string(),
                replicated(Side::Cell, &cell_label).unwrap_or_default(),
                "–".into(),
            ]);
        }
        let ratio = ratio2(self.cpu(Config::Alone, m, "RL.SLIDINGLOG"), self.cpu(Config::Alone, m, "RL.GCRA"));
        let rounds =
            ratios_within(&self.samples(Config::Alone, m, "RL.SLIDINGLOG"), &self.samples(Config::Alone, m, "RL.GCRA"));
        let (measured, met) = self.ratio_cells(ratio, cases::LOG_VS_GCRA, rounds);
        t.row([format!("RL.SLIDINGLOG server CPU/op {}× RL.GCRA's (random keys)", cases::LOG_VS_GCRA), measured, met]);

        let admit: Vec<f64> = self.results.hammer.iter().map(|h| h.admit.usec_per_call).collect();
        if let (Some(lo), Some(hi)) = (admit.first(), admit.last()) {
            let w = cases::LOG_FLAT_WITHIN;
            let shown: Vec<String> = admit.iter().map(|u| fixed(*u, 2)).collect();
            t.row([
                format!("RL.SLIDINGLOG flat from limit 10 to 100,000 (admit+evict usec_per_call, ±{:.0}%)", 100.0 * w),
                format!("{} usec", shown.join(" → ")),
                pass(*hi <= (1.0 + w) * lo && *hi >= (1.0 - w) * lo),
            ]);
        }
        let [log10, _, log1000] = self.results.logs[0];
        let (sizes, bound) = (cases::LOG_SIZES, cases::LOG_BYTES_PER_ENTRY);
        let slope = round_to((log1000 - log10) / (sizes[2] - sizes[0]) as f64, 2);
        t.row([
            format!("RL.SLIDINGLOG memory {bound} B per stored request (+ a constant)"),
            format!("{} B/entry + {} B/key (fit 10 → 1,000)", fixed(slope, 2), fixed(log10 - 10.0 * slope, 0)),
            pass(bound.holds(slope)),
        ]);
        for label in cases::MEMORY_LIMITERS {
            let bytes = self.memory_bytes(label);
            t.row([
                format!("{label} memory {} B/key", cases::BYTES_PER_KEY),
                format!("{} B/key", fixed_or_na(bytes, 1)),
                bytes.map_or("n/a".into(), |b| pass(cases::BYTES_PER_KEY.holds(b))),
            ]);
        }
        t.row([
            "(reference) redis-cell memory per key".to_string(),
            match &self.results.cell_memory {
                Some((throttle, _)) => fixed(throttle.bytes_per_key, 1),
                None => cell.status.clone().unwrap_or_default(),
            },
            "–".into(),
        ]);
        for o in &self.results.others {
            let bytes =
                |label: &str| fixed_or_na(o.memory.iter().find(|(l, _)| *l == label).map(|(_, m)| m.bytes_per_key), 1);
            t.row([
                format!("(reference) on {}: RL.GCRA / RL.TOKENBUCKET / RL.SLIDING memory per key", o.name),
                format!(
                    "{} / {} / {} B/key (SET k 1 EX: {})",
                    bytes("RL.GCRA"),
                    bytes("RL.TOKENBUCKET"),
                    bytes("RL.SLIDING"),
                    bytes(MEM_SET_LABEL)
                ),
                "–".into(),
            ]);
        }
        for (ours, lua) in cases::LUA_PAIRS {
            let ratio = ratio2(self.cpu(Config::Alone, m, lua), self.cpu(Config::Alone, m, ours));
            let rounds = ratios_within(&self.samples(Config::Alone, m, lua), &self.samples(Config::Alone, m, ours));
            let (measured, met) = self.ratio_cells(ratio, cases::VS_LUA, rounds);
            t.row([format!("{ours} {}× cheaper per op (server CPU) than {lua}", cases::VS_LUA), measured, met]);
        }
        r.table(&t);
    }
}

/// The header: the command, its settings, the servers, the machine and its load.
fn header(run: &Run, results: &Results) -> Report {
    let s = run.settings;
    let mut h = Report::new();
    h.line("## redis-ratelimit benchmark report").blank();
    h.line(&s.stamp);
    h.line(format!(
        "- Command: `cargo bench --bench server` (what `make bench` runs, before `cargo bench --bench core`), in {}",
        s.root.display()
    ));
    let servers_dir = s.servers_dir.as_deref().map_or("none".to_string(), |d| d.display().to_string());
    let log_keys: Vec<String> = s.log_keys.iter().map(u64::to_string).collect();
    h.line(format!(
        "- Settings: BENCH_ROUNDS={} BENCH_N_PIPELINED={} BENCH_N_REPLICA={} BENCH_N_LUA={} BENCH_N_HAMMER={} BENCH_N_UNPIPELINED={} BENCH_CLIENTS={} BENCH_KEYSPACE={} BENCH_MEM_KEYS={} BENCH_LOG_KEYS=\"{}\" BENCH_SERVERS_DIR={servers_dir}",
        s.rounds, s.n_pipelined, s.n_replica, s.n_lua, s.n_hammer, s.n_unpipelined, s.clients, s.keyspace, s.mem_keys, log_keys.join(" ")
    ));
    let cell = match (&run.cell.version, &run.cell.status) {
        (_, Some(status)) => format!("redis-cell ({status})"),
        (Some(v), None) => format!("redis-cell {v} (built from {})", s.cell_src.display()),
        (None, None) => format!("redis-cell (built from {})", s.cell_src.display()),
    };
    let pinning = if run.pinned {
        format!(
            "measured servers pinned with `taskset -c {}`, redis-benchmark and the replicas with `taskset -c {}`",
            s.server_cpu, s.client_cpu
        )
    } else {
        "no CPU pinning (taskset missing or a single CPU)".to_string()
    };
    h.line(format!(
        "- Servers: `{} --save \"\" --appendonly no --loadmodule libredis_ratelimit.so DEBUG_CLOCK` (tests/common's, each on a free loopback port), and one with {cell}; {pinning}",
        run.server_binary
    ));
    let loads = |c: Config| results.round_loads.get(&c).map(|l| l.join(", ")).unwrap_or_default();
    let end = machine::load_averages();
    h.line(format!(
        "- Date: {}; load average (1/5/15 min) at the start: {}, at the end: {}; 1-minute load average at the start of each round: keys in place {}; with a replica {}; run time {} min {} s",
        machine::utc_now(),
        run.load_start.join(" "),
        end.join(" "),
        loads(Config::Alone),
        loads(Config::Replica),
        run.elapsed_secs / 60,
        run.elapsed_secs % 60
    ));
    if run.load_start[0].parse::<f64>().is_ok_and(|l| l > 0.5) {
        h.line(format!(
            "- **Note:** the machine was not idle when the run started (1-minute load average {}): other processes competed for the CPUs; every row was measured in each of the {} rounds, so disturbances spread over all rows; see each row's min–max.",
            run.load_start[0], s.rounds
        ));
    }
    let version = machine::command_output(&run.server_binary, &["--version"], None).unwrap_or_default();
    h.line(format!("- `{} --version`: {version}", run.server_binary));
    h.line(format!("- `nproc`: {}", machine::cpus()));
    h.blank().line("```").line("$ lscpu | head").line(machine::lscpu_head(10)).line("```");
    h
}

/// The whole report.
pub fn write(run: &Run, results: &Results) -> Report {
    let tables = Tables { run, results };
    let mut r = header(run, results);
    tables.cpu_table(&mut r, Config::Alone);
    tables.cpu_table(&mut r, Config::Replica);
    tables.round_samples(&mut r);
    tables.unpipelined(&mut r);
    tables.hammer(&mut r);
    tables.memory(&mut r);
    tables.targets(&mut r);
    r
}
