//! What a report says about the machine and the source: load, CPUs, `lscpu`, the stamp line.

use std::path::Path;
use std::process::Command;

/// Output of a command (trimmed), or None if it could not run or failed.
pub fn command_output(program: &str, args: &[&str], dir: Option<&Path>) -> Option<String> {
    let mut c = Command::new(program);
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let out = c.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// The 1, 5 and 15-minute load averages, as `/proc/loadavg` gives them.
pub fn load_averages() -> [String; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = text.split_whitespace().map(str::to_string);
    [(); 3].map(|_| it.next().unwrap_or_else(|| "?".to_string()))
}

/// The number of CPUs this process may use.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The first `n` lines of `lscpu`.
pub fn lscpu_head(n: usize) -> String {
    command_output("lscpu", &[], None).unwrap_or_default().lines().take(n).collect::<Vec<_>>().join("\n")
}

/// The report's stamp line, as `scripts/perf-doc.sh stamp` prints it for the checkout at `root`
/// (the script defines it and requires it of every report it copies into docs/PERFORMANCE.md):
/// "- Commit: `<short sha>[-dirty]` · Machine: <CPU model>, <n> CPUs".
pub fn stamp(root: &Path) -> String {
    let script = root.join("scripts/perf-doc.sh");
    command_output("bash", &[&script.to_string_lossy(), "stamp"], Some(root))
        .unwrap_or_else(|| format!("- Commit: unknown (`bash {} stamp` failed)", script.display()))
}

/// The checkout that owns `dir`'s git directory (the main worktree of a linked worktree).
pub fn main_worktree(dir: &Path) -> Option<std::path::PathBuf> {
    let common = command_output("git", &["rev-parse", "--path-format=absolute", "--git-common-dir"], Some(dir))?;
    Path::new(&common).parent().map(Path::to_path_buf)
}

/// The date and time now in UTC, as `date -u '+%Y-%m-%d %H:%M:%S UTC'` prints it.
pub fn utc_now() -> String {
    command_output("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"], None).unwrap_or_default()
}

/// The version a server binary reports (`v=7.0.15` in `redis-server --version`).
pub fn server_version(binary: &str) -> Option<String> {
    let text = command_output(binary, &["--version"], None)?;
    text.split_whitespace().find_map(|w| w.strip_prefix("v=")).map(str::to_string)
}
