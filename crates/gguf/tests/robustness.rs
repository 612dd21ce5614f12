//! Truncation and random corruption: the parser must return Ok or Err,
//! never panic, and never make an allocation out of proportion to the input.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{sample, Builder, Rng, Val, T};
use tempo9_gguf::GgufFile;

/// Records the largest single allocation request made by this test binary.
struct MaxAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator; only records request sizes.
unsafe impl GlobalAlloc for MaxAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: MaxAlloc = MaxAlloc;

/// Largest allocation any parse of a file this small may make.
const ALLOC_LIMIT: usize = 4 << 20;

fn parse_bounded(bytes: &[u8]) -> bool {
    let ok = GgufFile::from_bytes(bytes.to_vec()).is_ok();
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest < ALLOC_LIMIT,
        "allocation of {largest} bytes for a {}-byte input",
        bytes.len()
    );
    ok
}

/// A file with more structure: many strings, nested arrays, several tensors.
fn richer() -> Builder {
    let tokens: Vec<String> = (0..300).map(|i| format!("tok{i}")).collect();
    let refs: Vec<&str> = tokens.iter().map(|s| s.as_str()).collect();
    let mut b = sample()
        .kv("tokenizer.ggml.tokens2", Val::strs(&refs))
        .kv(
            "nested",
            Val::nested(&[Val::u32s(&[1, 2, 3]), Val::strs(&["x", "y"])]),
        )
        .kv("general.alignment", Val::u32(64))
        .tensor(T::raw("blk.0.ffn.weight", &[256, 2], 12, 288))
        .tensor(T::raw("blk.0.ffn_down.weight", &[32, 4, 1, 2], 8, 34 * 8));
    b.align = 64;
    b
}

#[test]
fn every_prefix_of_a_small_file_fails() {
    let built = sample().build();
    assert!(parse_bounded(&built.bytes));
    for len in 0..built.bytes.len() {
        assert!(
            !parse_bounded(&built.bytes[..len]),
            "prefix of {len} bytes accepted"
        );
    }
}

#[test]
fn every_prefix_of_a_richer_file_fails() {
    let built = richer().build();
    assert!(built.bytes.len() > 4000);
    assert!(parse_bounded(&built.bytes));
    for len in 0..built.bytes.len() {
        assert!(
            !parse_bounded(&built.bytes[..len]),
            "prefix of {len} bytes accepted"
        );
    }
}

#[test]
fn every_structural_truncation_fails() {
    let built = richer().build();
    assert!(parse_bounded(&built.bytes));
    assert!(built.marks.len() > 100, "{} marks", built.marks.len());
    for &m in &built.marks {
        for cut in [m.saturating_sub(1), m, m + 1] {
            if cut < built.bytes.len() {
                assert!(
                    !parse_bounded(&built.bytes[..cut]),
                    "truncation at {cut} accepted"
                );
            }
        }
    }
}

const INTERESTING: [u64; 10] = [
    0,
    1,
    31,
    32,
    u32::MAX as u64,
    1 << 32,
    1 << 60,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

fn corrupt(rng: &mut Rng, bytes: &mut [u8], header_len: usize) {
    let n_edits = 1 + rng.below(4);
    for _ in 0..n_edits {
        let at = rng.below(header_len);
        match rng.below(4) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at] = rng.next_u64() as u8,
            2 => {
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let w = if rng.below(2) == 0 { 8 } else { 4 };
                for (i, b) in v.iter().take(w).enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
            _ => {
                let v = rng.next_u64().to_le_bytes();
                for (i, b) in v.iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
        }
    }
}

fn fuzz(built: common::Built, seed: u64, cases: usize) -> (usize, usize) {
    let mut rng = Rng(seed);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..cases {
        let mut bytes = built.bytes.clone();
        corrupt(&mut rng, &mut bytes, built.data_offset);
        if rng.below(8) == 0 {
            let cut = rng.below(bytes.len() + 1);
            bytes.truncate(cut);
        }
        if parse_bounded(&bytes) {
            ok += 1;
        } else {
            err += 1;
        }
    }
    (ok, err)
}

#[test]
fn random_header_corruption_small() {
    let (ok, err) = fuzz(sample().build(), 0x5EED_0001, 20_000);
    eprintln!("small: ok={ok} err={err}");
    // Both outcomes occur: corruption inside values is often harmless.
    assert!(ok > 0 && err > 0, "ok={ok} err={err}");
}

#[test]
fn random_header_corruption_rich() {
    let (ok, err) = fuzz(richer().build(), 0x5EED_0002, 5_000);
    eprintln!("rich: ok={ok} err={err}");
    assert!(ok > 0 && err > 0, "ok={ok} err={err}");
}

#[test]
fn random_garbage_after_magic() {
    let mut rng = Rng(0x5EED_0003);
    for _ in 0..5_000 {
        let len = rng.below(200);
        let mut bytes: Vec<u8> = b"GGUF\x03\x00\x00\x00".to_vec();
        bytes.extend((0..len).map(|_| rng.next_u64() as u8));
        parse_bounded(&bytes);
    }
}
