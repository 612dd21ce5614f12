#![no_main]
// The target's body and its checks are in crates/fuzz-targets (shared with the
// seeded run on stable, crates/fuzz-targets/tests/seeded.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| tempo9_fuzz_targets::gguf(data));
