#![no_main]
//! cargo fuzz target: see rl_fuzz::codec_target (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rl_fuzz::codec_target(data));
