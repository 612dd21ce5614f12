//! The page hash: a page's name, chained through its parent's. Apart from the pool
//! because it is a format rather than bookkeeping: the SSD tier names pages on disk by
//! it, so it must stay the same across runs and platforms whatever the pool does.

use super::*;

const K0: u64 = 0xa076_1d64_78bd_642f;
const K1: u64 = 0xe703_7ed1_a0b4_28db;
const K2: u64 = 0x8ebc_6af0_9c88_c6e3;

/// 64x64 -> 128-bit multiply folded to 64 bits (wyhash's mixing step).
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// The default [`PageHasher`]: a wyhash-style chain over four tokens per step.
///
/// Deterministic across runs and platforms, so a hash can also name a page on disk.
/// `salt` stands for everything besides the tokens that changes the KV (model
/// identity, LoRA, image hashes).
pub fn page_hash(parent: u64, salt: u64, tokens: &[TokenId]) -> u64 {
    let pack = |q: &[TokenId]| {
        (
            u64::from(q[0]) | (u64::from(q[1]) << 32),
            u64::from(q[2]) | (u64::from(q[3]) << 32),
        )
    };
    let mut h = fold_mul(parent ^ K0, salt ^ K1);
    let mut quads = tokens.chunks_exact(4);
    for q in &mut quads {
        let (a, b) = pack(q);
        h = fold_mul(a ^ K1, b ^ h);
    }
    let mut last = [0; 4];
    last[..quads.remainder().len()].copy_from_slice(quads.remainder());
    let (a, b) = pack(&last[..]);
    h = fold_mul(a ^ K2, b ^ h);
    // The length tells zero padding from real zero tokens.
    fold_mul(h ^ K0, tokens.len() as u64 ^ K1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn page_hash_depends_on_every_input() {
        let base = [1u32, 2, 3, 4, 5, 6];
        let h = page_hash(ROOT_HASH, 0, &base);
        assert_eq!(h, page_hash(ROOT_HASH, 0, &base), "deterministic");
        assert_ne!(h, page_hash(ROOT_HASH ^ 1, 0, &base));
        assert_ne!(h, page_hash(ROOT_HASH, 1, &base));
        for i in 0..base.len() {
            let mut t = base;
            t[i] ^= 1 << (i * 5);
            assert_ne!(h, page_hash(ROOT_HASH, 0, &t), "token {i}");
        }
        assert_ne!(
            page_hash(ROOT_HASH, 0, &[0]),
            page_hash(ROOT_HASH, 0, &[0, 0])
        );
        // Distinct pages of a small vocabulary never collide in practice.
        let mut seen = HashSet::new();
        for a in 0..64u32 {
            for b in 0..64u32 {
                assert!(seen.insert(page_hash(ROOT_HASH, 0, &[a, b, a ^ b, 7])));
            }
        }
    }
}
