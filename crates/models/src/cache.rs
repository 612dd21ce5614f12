//! Cache groups: layers that keep the same kind of per-token state share one pool
//! of cells, with its own slots and attention windows.
//!
//! A sliding-window layer only ever reads the K/V of the last `window` positions,
//! so its group's pool can hold just those cells (recycled as the sequence moves
//! on), while full-attention layers keep every token. Group 0 is always [`Full`]:
//! it holds a whole sequence, so a prefix cache can be indexed on it alone.
//!
//! A [`Sliding`] group computes bit for bit what its layers compute in the
//! `swa_full` layout (every layer in group 0, sliding layers masked by
//! `mask_swa` over the whole sequence) on ggml's CPU kernels, when each
//! sequence's window there
//! - starts at a page boundary (a position multiple of 64) at or before the
//!   first position the step's first row sees (`pos - window + 1`), and ends at a
//!   page boundary at or after its last row: the tiled flash-attention kernel
//!   (prompt chunks) walks KV in tiles of 64 cells from the window's start and
//!   skips tiles that no row sees, so such a window puts every visible cell at the
//!   same place in the same tile as the full window does; the matmul decode path
//!   sums in blocks of 16 and 32 cells, which the same alignment keeps;
//! - is masked with the sliding limit ([`crate::MaskBuilder::allow_prefix_from`]
//!   with the window's first position as `base`);
//! - keeps a decode row that sees at most [`crate::MATMUL_DECODE_ABOVE`] cells
//!   under 512 cells (as the full window is), or it alone takes ggml's KV-split
//!   kernel.
//!
//! The attention kernel of a decode row is chosen on the cells its group's mask
//! lets it see, so a model whose window is at most [`crate::MATMUL_DECODE_ABOVE`]
//! cells would take flash attention in its Sliding group where `swa_full` takes
//! matmuls (Gemma 3's 512 is above it). `tests/cache_groups.rs` checks all this
//! on Gemma 3.
//!
//! [`Full`]: GroupKind::Full
//! [`Sliding`]: GroupKind::Sliding

use crate::HParams;

/// How a group of layers keeps per-token state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupKind {
    /// K/V for every token of the sequence.
    Full,
    /// Sliding-window attention: a token sees only the last `window` positions
    /// (itself included), so only their K/V matter.
    Sliding {
        /// Positions a token sees, itself included.
        window: usize,
    },
    /// Gated-DeltaNet layers: no per-token cells, a fixed-size recurrent state per
    /// sequence (convolution inputs and the delta-rule matrix). The group's "cells"
    /// are state slots: a sequence reads and writes its one slot every step, so a
    /// slot holds the state after the last token computed into it.
    Recurrent,
}

impl GroupKind {
    /// The sliding window, if the group slides.
    pub fn window(&self) -> Option<usize> {
        match self {
            GroupKind::Sliding { window } => Some(*window),
            GroupKind::Full | GroupKind::Recurrent => None,
        }
    }
}

/// Layers that keep the same kind of cache, in one pool of cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheGroup {
    /// What the group's layers keep.
    pub kind: GroupKind,
    /// The group's layers, ascending.
    pub layers: Vec<usize>,
}

/// The cache groups of a model (see [`crate::Model::cache_groups`]).
///
/// A model whose every layer slides gets one `Full` group holding them all (with
/// `mask_swa` per sequence, as in the `swa_full` layout): group 0 must be `Full`
/// for the prefix index, and such a model (none of the supported files is one)
/// is not worth a special layout.
pub(crate) fn cache_groups(hp: &HParams, swa_full: bool) -> Vec<CacheGroup> {
    if hp.ssm.is_some() {
        let (recurrent, full): (Vec<usize>, Vec<usize>) =
            (0..hp.n_layer).partition(|&il| hp.is_recurrent[il]);
        return vec![
            CacheGroup {
                kind: GroupKind::Full,
                layers: full,
            },
            CacheGroup {
                kind: GroupKind::Recurrent,
                layers: recurrent,
            },
        ];
    }
    // Layers that read another layer's K/V (Gemma 4's KV-sharing layers) keep
    // nothing: they are in no group, and attend in their source's.
    let owners = || (0..hp.n_layer).filter(|&il| hp.owns_kv(il));
    let all = || CacheGroup {
        kind: GroupKind::Full,
        layers: owners().collect(),
    };
    let window = match hp.swa_window {
        Some(w) if !swa_full => w as usize,
        _ => return vec![all()],
    };
    let (sliding, full): (Vec<usize>, Vec<usize>) = owners().partition(|&il| hp.is_swa[il]);
    if sliding.is_empty() || full.is_empty() {
        return vec![all()];
    }
    vec![
        CacheGroup {
            kind: GroupKind::Full,
            layers: full,
        },
        CacheGroup {
            kind: GroupKind::Sliding { window },
            layers: sliding,
        },
    ]
}
