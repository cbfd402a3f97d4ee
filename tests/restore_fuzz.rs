//! RESTORE of malformed module values (issue 10): a DUMP payload carries a CRC64, so anyone
//! allowed to run RESTORE (and every MIGRATE or reshard, which deliver keys through RESTORE)
//! can hand the module's `rdb_load` arbitrary bytes with a valid checksum. Each case here takes
//! a real DUMP of a key of every algorithm, breaks the module value (truncations, wrong
//! opcodes, huge string lengths, flipped and inserted bytes), seals it again with a correct
//! trailer, and RESTOREs it. After each one the server must still answer PING, and the key
//! must either be refused (an error reply, nothing stored) or hold a state the module can use.
//! Runs with `sanitize-dump-payload` off (the default) and on.

mod common;
#[path = "common/robust.rs"]
mod robust;

use common::resp::{Reply, Resp};
use common::{Opts, Rng, Server};

/// CRC-64/Jones as Redis computes it (reflected, poly 0xad93d23594c935a9, init 0, no xorout).
fn crc64(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &b in data {
        crc ^= b as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ POLY_REFLECTED } else { crc >> 1 };
        }
    }
    crc
}

/// A DUMP payload: `body` + RDB version (2 bytes LE) + CRC64 of both (8 bytes LE).
fn seal(body: &[u8], rdb_version: [u8; 2]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(&rdb_version);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// RDB_TYPE_MODULE_2, then the module id as a 64-bit RDB length, then the value's opcodes.
const RDB_TYPE_MODULE_2: u8 = 7;
const RDB_64BITLEN: u8 = 0x81;
const OPCODE_AT: usize = 10;

fn states(c: &mut Resp) -> Vec<(String, Vec<u8>)> {
    let cmds: [&[&str]; 9] = [
        &["RL.GCRA", "k", "10", "1s", "BURST", "3"],
        &["RL.TOKENBUCKET", "k", "10", "1s"],
        &["RL.LEAKY", "k", "5", "1s"],
        &["RL.SLIDING", "k", "100", "1m"],
        &["RL.FIXED", "k", "100", "1m", "COST", "7"],
        &["RL.SLIDINGLOG", "k", "5", "1h"],
        // A longer sliding log: its payload is LZF-compressed by DUMP.
        &["RL.SLIDINGLOG", "k", "50", "1h"],
        &["CL.THROTTLE", "k", "5", "10", "60"],
        &["RL.GCRA", "k", "1000000", "1d", "COST", "999999"],
    ];
    let mut out = Vec::new();
    for (i, cmd) in cmds.iter().enumerate() {
        let key = format!("src{i}");
        let mut args: Vec<&str> = cmd.to_vec();
        args[1] = &key;
        let repeats = if cmd[0] == "RL.SLIDINGLOG" { cmd[2].parse::<usize>().unwrap() - 1 } else { 1 };
        for n in 0..repeats {
            let r = c.c(&args);
            assert!(!r.is_error(), "{args:?}: {r:?}");
            if cmd[0] == "RL.SLIDINGLOG" {
                // Distinct timestamps, so the log holds many entries.
                c.c(&["RL.DEBUG", "CLOCK", "ADVANCE", &(1_000 + n * 37).to_string()]);
            }
        }
        let d = c.c(&["DUMP", &key]);
        let d = d.bulk().unwrap_or_else(|| panic!("DUMP {key}: {d:?}")).to_vec();
        out.push((args.join(" "), d));
    }
    out
}

/// Mutations of one DUMP body (trailer stripped). Deterministic for a seed.
fn mutations(body: &[u8], rng: &mut Rng, random_cases: usize) -> Vec<(String, Vec<u8>)> {
    assert_eq!(body[0], RDB_TYPE_MODULE_2, "DUMP of a module value starts with RDB_TYPE_MODULE_2");
    assert_eq!(body[1], RDB_64BITLEN, "the module id is a 64-bit length");
    assert_eq!(body[OPCODE_AT], 5, "the value is one string (RDB_MODULE_OPCODE_STRING)");
    assert_eq!(*body.last().unwrap(), 0, "the value ends with RDB_MODULE_OPCODE_EOF");
    let mut out = Vec::new();
    // Every truncation after the type byte.
    for n in 1..body.len() {
        out.push((format!("truncated to {n}"), body[..n].to_vec()));
    }
    // Wrong opcodes where the string opcode and where the EOF marker are.
    let last = body.len() - 1;
    for at in [OPCODE_AT, last] {
        for op in [0u8, 1, 2, 3, 4, 5, 6, 0x3f, 0x40, 0x7f, 0x80, 0x81, 0xc0, 0xc1, 0xc2, 0xc3, 0xff] {
            let mut b = body.to_vec();
            b[at] = op;
            out.push((format!("opcode {op:#x} at {at}"), b));
        }
    }
    // The string's length replaced by huge and off-by-some lengths (6-bit, 14-bit, 32-bit,
    // 64-bit encodings), the rest kept.
    let len_at = OPCODE_AT + 1;
    let tail_from = match body[len_at] >> 6 {
        0 => len_at + 1,
        1 => len_at + 2,
        2 if body[len_at] == 0x80 => len_at + 5,
        2 => len_at + 9,
        _ => len_at + 1, // LZF or integer encoding: replace only the first byte
    };
    let tail = &body[tail_from..];
    let lens: Vec<Vec<u8>> = vec![
        vec![0x3f],
        vec![0x00],
        vec![0x7f, 0xff],
        vec![0x80, 0xff, 0xff, 0xff, 0xff],
        vec![0x80, 0x7f, 0xff, 0xff, 0xff],
        vec![0x80, 0x00, 0x01, 0x00, 0x00],
        vec![0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0x81, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00],
        vec![0x81, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        // LZF with a huge compressed and uncompressed length, and integer encodings.
        vec![0xc3, 0x80, 0xff, 0xff, 0xff, 0xff, 0x80, 0xff, 0xff, 0xff, 0xff],
        vec![0xc3, 0x05, 0x81, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0xc0, 0x05],
        vec![0xc2, 0x01, 0x02, 0x03, 0x04],
    ];
    for l in &lens {
        let mut b = body[..len_at].to_vec();
        b.extend_from_slice(l);
        b.extend_from_slice(tail);
        out.push((format!("length {l:02x?}"), b));
    }
    for i in 0..random_cases {
        let mut b = body.to_vec();
        let what = match i % 4 {
            0 => {
                // Flip 1-3 bytes after the type byte.
                for _ in 0..1 + rng.below(3) {
                    let at = 1 + rng.below(b.len() as u64 - 1) as usize;
                    b[at] ^= 1 + rng.below(255) as u8;
                }
                "flipped bytes"
            }
            1 => {
                let at = 1 + rng.below(b.len() as u64 - 1) as usize;
                let n = 1 + rng.below(8) as usize;
                let extra = rng.bytes(n);
                b.splice(at..at, extra);
                "inserted bytes"
            }
            2 => {
                let at = 1 + rng.below(b.len() as u64 - 1) as usize;
                let n = (1 + rng.below(4) as usize).min(b.len() - at);
                b.drain(at..at + n);
                "removed bytes"
            }
            _ => {
                // Flip bytes inside the value only (the module id and opcodes intact): the
                // string arrives whole and the codec must refuse it.
                let from = OPCODE_AT + 2;
                if b.len() > from + 1 {
                    let at = from + rng.below((b.len() - 1 - from) as u64) as usize;
                    b[at] ^= 1 << rng.below(8);
                }
                "flipped value bit"
            }
        };
        out.push((format!("{what} #{i}"), b));
    }
    out
}

/// RESTOREs every case (pipelined), checking after each that the server answers PING and
/// that the key is either absent (refused) or a ratelimit state RL.INFO can read, whose own
/// DUMP restores again.
fn run(sanitize: &str, seed: u64) {
    let s =
        Server::start_with(Opts { extra: vec![("sanitize-dump-payload".into(), sanitize.into())], ..Opts::default() });
    let mut c = Resp::connect(s.port);
    let dumps = states(&mut c);
    let version: [u8; 2] = {
        let d = &dumps[0].1;
        [d[d.len() - 10], d[d.len() - 9]]
    };
    // Our sealing reproduces Redis's trailer exactly.
    for (what, d) in &dumps {
        assert_eq!(&seal(&d[..d.len() - 10], version), d, "crc64 of the DUMP of {what}");
    }
    let mut rng = Rng::new(seed);
    let random_cases = if robust::long() { 2000 } else { 150 };
    let (mut refused, mut stored, mut total) = (0usize, 0usize, 0usize);
    for (what, d) in &dumps {
        let cases = mutations(&d[..d.len() - 10], &mut rng, random_cases);
        for chunk in cases.chunks(64) {
            let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
            for (_, body) in chunk {
                let payload = seal(body, version);
                cmds.push(vec![b"RESTORE".to_vec(), b"fz".to_vec(), b"0".to_vec(), payload, b"REPLACE".to_vec()]);
                cmds.push(vec![b"PING".to_vec()]);
                cmds.push(vec![b"TYPE".to_vec(), b"fz".to_vec()]);
                cmds.push(vec![b"RL.INFO".to_vec(), b"fz".to_vec()]);
                cmds.push(vec![b"DUMP".to_vec(), b"fz".to_vec()]);
                cmds.push(vec![b"DEL".to_vec(), b"fz".to_vec()]);
            }
            let replies = c.pipeline(&cmds).unwrap_or_else(|e| {
                panic!("server gone during cases of {what} (first {:?}): {e}\nalive: {}", chunk[0].0, s.alive())
            });
            for ((case, _), r) in chunk.iter().zip(replies.chunks(6)) {
                total += 1;
                let ctx = format!("{what}: {case} (sanitize-dump-payload {sanitize}, seed {seed})");
                assert_eq!(r[1], Reply::Status(b"PONG".to_vec()), "{ctx}: PING after RESTORE");
                match &r[0] {
                    Reply::Error(_) => {
                        refused += 1;
                        assert_eq!(r[2], Reply::Status(b"none".to_vec()), "{ctx}: refused RESTORE stored something");
                    }
                    Reply::Status(ok) if ok == b"OK" => {
                        stored += 1;
                        assert_eq!(r[2], Reply::Status(b"ratelimit".to_vec()), "{ctx}: restored as another type");
                        assert!(r[3].pairs().is_some(), "{ctx}: RL.INFO of the restored key: {:?}", r[3]);
                        let again = c.cmd(&[b"RESTORE", b"fz2", b"0", r[4].bulk().unwrap(), b"REPLACE"]);
                        assert_eq!(again, Reply::Status(b"OK".to_vec()), "{ctx}: the restored key's own DUMP");
                        c.c(&["DEL", "fz2"]);
                    }
                    other => panic!("{ctx}: RESTORE answered {other:?}"),
                }
            }
        }
    }
    println!("sanitize-dump-payload {sanitize}: {total} malformed payloads, {refused} refused, {stored} stored as valid states");
    assert!(refused > total / 2, "most malformed payloads are refused");
    assert!(s.alive());
    // A refused RESTORE leaves an existing key as it was.
    let r = c.c(&["RL.GCRA", "keep", "10", "1s"]);
    assert!(!r.is_error());
    let before = c.c(&["DUMP", "keep"]);
    let broken = seal(&dumps[0].1[..OPCODE_AT + 3], version);
    assert!(c.cmd(&[b"RESTORE", b"keep", b"0", &broken, b"REPLACE"]).is_error());
    assert_eq!(c.c(&["DUMP", "keep"]), before, "a refused RESTORE REPLACE leaves the key as it was");
}

#[test]
fn crc64_matches_redis_check_value() {
    // The CRC-64/Jones check value Redis's own crc64 test uses.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

#[test]
fn malformed_restore_is_refused_and_the_server_lives() {
    run("no", robust::seed(10));
}

#[test]
fn malformed_restore_is_refused_with_sanitize_dump_payload() {
    run("yes", robust::seed(11));
}
