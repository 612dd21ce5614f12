//! What makes entries shareable: the model identity (model file and KV layout) each
//! entry file carries, and the checksum over its header and bytes.

/// Layout of the KV a page holds (and of the recurrent state a checkpoint holds):
/// entries are only shared between engines whose identities are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers.
    pub n_layer: usize,
    /// K row width per layer.
    pub n_embd_k: usize,
    /// V row width per layer.
    pub n_embd_v: usize,
    /// Tokens per page.
    pub page_tokens: usize,
    /// Bytes of one page's KV (all layers, K and V).
    pub page_bytes: usize,
    /// Element type of K and V, e.g. `"f16"`.
    pub dtype: &'static str,
    /// Device kind that computes the KV (numbers differ between backends).
    pub device: String,
    /// Bytes of one state checkpoint (all recurrent layers' states); 0 for a model
    /// without recurrent layers.
    pub state_bytes: usize,
}

/// Identity of the KV a model computes: a hash of the GGUF file's header (metadata
/// and tensor infos), its size and last MiB (weights), and the KV layout.
pub fn model_identity(gguf_bytes: &[u8], data_offset: usize, layout: &KvLayout) -> u64 {
    let head = &gguf_bytes[..data_offset.min(gguf_bytes.len())];
    let tail = &gguf_bytes[gguf_bytes.len().saturating_sub(1 << 20)..];
    let mut desc = format!(
        "{}:{}:{}:{}:{}:{}:{}:{}",
        gguf_bytes.len(),
        layout.n_layer,
        layout.n_embd_k,
        layout.n_embd_v,
        layout.page_tokens,
        layout.page_bytes,
        layout.dtype,
        layout.device
    );
    // Only when present, so a model without recurrent state keeps the identity (and
    // directory) it had before checkpoints existed: its old index is then found,
    // judged foreign by its version and its files removed, rather than left behind.
    if layout.state_bytes != 0 {
        desc.push_str(&format!(":state{}", layout.state_bytes));
    }
    let mut h = checksum(0x7e3b_0d59_1c2a_4f61, head);
    h = checksum(h, tail);
    checksum(h, desc.as_bytes())
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn round(acc: u64, w: u64) -> u64 {
    acc.wrapping_add(w.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(h: u64, acc: u64) -> u64 {
    (h ^ round(0, acc)).wrapping_mul(P1).wrapping_add(P4)
}

/// A fast 64-bit checksum (xxHash64's structure: four lanes of 8-byte rounds, each a
/// bijection of the lane, so no input is lost) of `data`, seeded.
pub fn checksum(seed: u64, data: &[u8]) -> u64 {
    let mut lanes = [
        seed.wrapping_add(P1).wrapping_add(P2),
        seed.wrapping_add(P2),
        seed,
        seed.wrapping_sub(P1),
    ];
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *lane = round(*lane, w);
        }
    }
    let mut h = lanes[0]
        .rotate_left(1)
        .wrapping_add(lanes[1].rotate_left(7))
        .wrapping_add(lanes[2].rotate_left(12))
        .wrapping_add(lanes[3].rotate_left(18));
    for &l in &lanes {
        h = merge(h, l);
    }
    h = h.wrapping_add(data.len() as u64);
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ round(0, w))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}
