//! The cargo-fuzz targets (fuzz/src/lib.rs) as proptest tests, so CI runs them on random and
//! structured inputs without nightly flags; plus a replay of every input kept under
//! fuzz/regressions/<target>/ (crashes found by `scripts/fuzz.sh`, once fixed) and of any
//! fresh crash under fuzz/artifacts/<target>/.
//!
//! Note: `cargo test --release` builds without overflow checks, so an arithmetic overflow in
//! the core only shows up under cargo fuzz (built with them) or `cargo test --test fuzz_props`
//! (debug profile). `RL_FUZZ_CASES=n` sets the number of cases per property.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod targets;

use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::PathBuf;

fn cases(default: u32) -> Config {
    let n = std::env::var("RL_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    Config { cases: n, failure_persistence: None, ..Config::default() }
}

/// Argument-like tokens, joined the way args_target splits them (0x00 between arguments).
fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "10",
            "1000000000000000",
            "1000000000000001",
            "18446744073709551615",
            "18446744073709551616",
            "000000000000000000000000001",
            "-1",
            "+1",
            "1.5",
            "nan",
            "inf",
            "",
            "BURST",
            "burst",
            "COST",
            "DRYRUN",
            "PARTIAL",
            "AGE",
            "FOO",
            "GCRA",
            "SLIDINGLOG",
            "LEAKY",
            "1us",
            "1ms",
            "1s",
            "1m",
            "1h",
            "1d",
            "36525d",
            "36526d",
            "0s",
            "5x",
            "1 s",
            "3155760000000000us",
            "3155760000000001us",
            "9223372036854775807",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        "[0-9]{1,25}".prop_map(|s| s.into_bytes()),
        "[0-9]{1,6}(us|ms|s|m|h|d|US|Ms|S|D|x)?".prop_map(|s| s.into_bytes()),
        prop::collection::vec(1u8..=255, 0..12),
    ]
}

fn joined(sel: u8, toks: Vec<Vec<u8>>) -> Vec<u8> {
    let mut v = vec![sel];
    v.extend(toks.join(&0u8));
    v
}

/// Valid encodings to start from: states and sliding-log commits produced by the core.
fn valid_encoding() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<u64>(),
        0usize..6,
        1u64..50,
        prop::sample::select(vec![1_000i64, 1_000_000, 1_000_000_000, 3_600_000_000_000]),
        0u8..8,
        any::<bool>(),
    )
        .prop_map(|(seed, a, limit, period, n, commit)| {
            use redis_ratelimit_core::spec::{Spec, Update};
            use redis_ratelimit_core::Algorithm;
            use redis_ratelimit_core::{Nanos, Rate, Request, Window};
            let algo = Algorithm::ALL[a];
            let limit = if seed % 7 == 0 { redis_ratelimit_core::MAX_COUNT } else { limit };
            let spec = match algo {
                Algorithm::Gcra => Spec::Gcra(Rate::new(limit, Nanos::new(period), limit).unwrap()),
                Algorithm::TokenBucket => Spec::TokenBucket(Rate::new(limit, Nanos::new(period), limit).unwrap()),
                Algorithm::Leaky => Spec::Leaky(Rate::new(limit, Nanos::new(period), limit).unwrap()),
                Algorithm::Sliding => Spec::Sliding(Window::new(limit, Nanos::new(period)).unwrap()),
                Algorithm::Fixed => Spec::Fixed(Window::new(limit, Nanos::new(period)).unwrap()),
                Algorithm::SlidingLog => Spec::SlidingLog(Window::new(limit, Nanos::new(period)).unwrap()),
            };
            let mut state = None;
            let mut last = None;
            let mut now = 1_700_000_000_000_000_000i64 + (seed % 1_000_000_000) as i64;
            for i in 0..=n {
                now += ((seed >> (i * 4)) & 0xF) as i64 * period / 4;
                let (_, u) = spec.check(state.as_ref(), Nanos::new(now), Request::new(1 + (seed >> i) % 3)).unwrap();
                if let Some(u) = u {
                    if let Some(s) = u.apply(state.as_mut()).unwrap() {
                        state = Some(s);
                    }
                    last = Some(u);
                }
            }
            let mut out = Vec::new();
            match (last, state) {
                (Some(u @ Update::Log(_)), _) if commit => u.encode_into(&mut out),
                (_, Some(s)) => s.encode_into(&mut out),
                (Some(u), None) => u.encode_into(&mut out),
                (None, None) => {}
            }
            out
        })
}

/// Chunks in codec_target's format: u16 length, bytes.
fn chunked(chunks: &[Vec<u8>]) -> Vec<u8> {
    let mut v = Vec::new();
    for c in chunks {
        v.extend((c.len() as u16).to_le_bytes());
        v.extend(c);
    }
    v
}

fn mutated(mut v: Vec<u8>, edits: Vec<(u16, u8, u8)>) -> Vec<u8> {
    for (pos, kind, byte) in edits {
        if v.is_empty() {
            v.push(byte);
            continue;
        }
        let i = pos as usize % v.len();
        match kind % 4 {
            0 => v[i] ^= 1 << (byte % 8),
            1 => v[i] = byte,
            2 => v.truncate(i),
            _ => v.insert(i, byte),
        }
    }
    v
}

proptest! {
    #![proptest_config(cases(3000))]

    #[test]
    fn fuzz_args_random_bytes(data in prop::collection::vec(any::<u8>(), 0..200)) {
        targets::args_target(&data);
    }

    #[test]
    fn fuzz_args_tokens(sel in any::<u8>(), toks in prop::collection::vec(token(), 0..10)) {
        targets::args_target(&joined(sel, toks));
    }

    #[test]
    fn fuzz_codec_random_bytes(data in prop::collection::vec(any::<u8>(), 0..300)) {
        targets::codec_target(&data);
    }

    #[test]
    fn fuzz_codec_mutated_valid_payloads(
        encs in prop::collection::vec(valid_encoding(), 1..5),
        edits in prop::collection::vec(prop::collection::vec((any::<u16>(), any::<u8>(), any::<u8>()), 0..3), 5),
        tail in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        let chunks: Vec<Vec<u8>> = encs.into_iter().zip(edits).map(|(e, ed)| mutated(e, ed)).collect();
        let mut data = chunked(&chunks);
        data.extend(tail);
        targets::codec_target(&data);
    }

    #[test]
    fn fuzz_algorithms_random_bytes(data in prop::collection::vec(any::<u8>(), 0..600)) {
        targets::algorithms_target(&data);
    }
}

/// Inputs kept under fuzz/regressions/<target>/ and fresh crashes under fuzz/artifacts/<target>/.
#[test]
fn fuzz_regressions_replay() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    let mut failed = Vec::new();
    for dir in ["regressions", "artifacts"] {
        for (target, f) in [
            ("args", targets::args_target as fn(&[u8])),
            ("codec", targets::codec_target),
            ("algorithms", targets::algorithms_target),
        ] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                eprintln!("replaying {}", e.path().display());
                if std::panic::catch_unwind(|| f(&data)).is_err() {
                    failed.push(e.path().display().to_string());
                }
                n += 1;
            }
        }
    }
    println!("fuzz regressions replayed: {n}, failed: {}", failed.len());
    assert!(failed.is_empty(), "fuzz inputs that still fail:\n{}", failed.join("\n"));
}

/// Writes the seed corpus fuzz/seeds/<target>/ (valid argument lines and valid encodings, so
/// libFuzzer starts from deep inside the parsers). Run by hand:
/// `cargo test --release --test fuzz_props write_fuzz_seeds -- --ignored`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("seeds");
    let mut runner = TestRunner::deterministic();
    let codec = root.join("codec");
    std::fs::create_dir_all(&codec).unwrap();
    let strat = prop::collection::vec(valid_encoding(), 1..4);
    for i in 0..48 {
        let encs = strat.new_tree(&mut runner).unwrap().current();
        std::fs::write(codec.join(format!("seed-{i:02}")), chunked(&encs)).unwrap();
    }
    let args = root.join("args");
    std::fs::create_dir_all(&args).unwrap();
    let lines: [&[&str]; 8] = [
        &["10", "1s"],
        &["10", "1s", "BURST", "20", "COST", "3"],
        &["100", "60000ms", "DRYRUN", "PARTIAL", "COST", "0"],
        &["1000000000000000", "36525d", "burst", "1"],
        &["5", "1h", "GCRA", "10", "1m", "SLIDINGLOG", "3", "1s", "COST", "2"],
        &["0", "10", "60", "1"],
        &["9", "20", "3600"],
        &["7", "1us", "cost", "7", "dryrun"],
    ];
    for (i, l) in lines.iter().enumerate() {
        for sel in [0u8, 3, 5, 0x1b] {
            let toks: Vec<Vec<u8>> = l.iter().map(|s| s.as_bytes().to_vec()).collect();
            std::fs::write(args.join(format!("seed-{i}-{sel}")), joined(sel, toks)).unwrap();
        }
    }
    println!("seeds written to {}", root.display());
}
