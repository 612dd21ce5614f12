//! KV storage the graphs attend over, and the attention mask that tells each
//! token which cells it may see.
//!
//! Storage is a pool of cells per layer (one cell = one token's K and V rows, F16),
//! of one size for all layers of a cache group ([`crate::CacheGroup`]). Which cells
//! a sequence owns is the engine's business: a step only says where each new
//! token's K/V goes in each group (`StepBatch::kv_slots`), which window of cells
//! each sequence attends over in each group, and which of them each token sees
//! (the masks). Masked cells cost nothing in ggml's CPU flash attention.

use tempo9_ggml::{f32_to_f16_bits, Buffer, DType, Device, DeviceKind, Tensor, TensorStore};

use crate::cache::{CacheGroup, GroupKind};
use crate::weights::Offload;
use crate::{HParams, ModelError};

/// Per-layer K and V pools, one pool size per cache group.
pub struct KvStore {
    store: TensorStore,
    groups: Vec<CacheGroup>,
    /// Cells per group.
    cells: Vec<usize>,
    /// Each layer's group (a KV-sharing layer's is its source's).
    group_of: Vec<usize>,
    /// Each layer's K pool in `store` (V is the next one); a KV-sharing layer's
    /// is its source's.
    slot: Vec<usize>,
}

impl KvStore {
    /// Allocates, for every layer of a model with `hp` on `device`, `cells[g]` cells
    /// where `g` is the layer's group in `groups`.
    pub fn new(
        hp: &HParams,
        device: Device,
        groups: &[CacheGroup],
        cells: &[usize],
    ) -> Result<KvStore, ModelError> {
        KvStore::with_offload(hp, device, groups, cells, Offload::All)
    }

    /// Like [`KvStore::new`], with each layer's cells where its weights are: on
    /// `device` for the layers `offload` gives it, in host memory for the others
    /// (as llama.cpp does with `--n-gpu-layers`), so attention runs next to the
    /// layer's matmuls and a partially offloaded model keeps device memory for weights.
    pub fn with_offload(
        hp: &HParams,
        device: Device,
        groups: &[CacheGroup],
        cells: &[usize],
        offload: Offload,
    ) -> Result<KvStore, ModelError> {
        let group_of = check_groups(hp, groups, cells)?;
        let mut store = TensorStore::new(2 * hp.n_layer)?;
        // Pools of the layers that keep K/V, in layer order; the others point at
        // their source's.
        let mut slot = vec![usize::MAX; hp.n_layer];
        let mut layer_of_pool = Vec::new();
        for (il, &g) in group_of.iter().enumerate() {
            if !hp.owns_kv(il) {
                continue;
            }
            slot[il] = 2 * layer_of_pool.len();
            layer_of_pool.push(il);
            let n_cells = cells[g] as i64;
            match (&groups[g].kind, hp.ssm) {
                // A recurrent layer's "K" and "V" are its two states per slot, F32
                // like llama.cpp's (the recurrence accumulates in them).
                (GroupKind::Recurrent, Some(ssm)) => {
                    store.add(
                        &format!("cache_conv_l{il}"),
                        DType::F32,
                        &[ssm.conv_state_len() as i64, n_cells],
                    );
                    store.add(
                        &format!("cache_ssm_l{il}"),
                        DType::F32,
                        &[ssm.ssm_state_len() as i64, n_cells],
                    );
                }
                _ => {
                    store.add(
                        &format!("cache_k_l{il}"),
                        DType::F16,
                        &[hp.n_embd_k_of(il) as i64, n_cells],
                    );
                    store.add(
                        &format!("cache_v_l{il}"),
                        DType::F16,
                        &[hp.n_embd_v_of(il) as i64, n_cells],
                    );
                }
            }
        }
        for il in 0..hp.n_layer {
            slot[il] = slot[hp.kv_source[il]];
        }
        let on_device =
            |il: usize| device.kind() != DeviceKind::Cpu && offload.layer_on_device(il, hp.n_layer);
        // One buffer per place for all its layers; the OS commits host pages only
        // when tokens are written.
        for dev in [true, false] {
            let ids: Vec<usize> = (0..store.len())
                .filter(|&i| on_device(layer_of_pool[i / 2]) == dev)
                .collect();
            if ids.is_empty() {
                continue;
            }
            let buft = match dev {
                true => device.buffer_type(),
                false => Device::cpu().buffer_type(),
            };
            let align = buft.alignment().max(1);
            let mut size = 0;
            let mut offsets = Vec::with_capacity(ids.len());
            for &i in &ids {
                offsets.push(size);
                size += buft.alloc_size(store.get(i)).div_ceil(align) * align;
            }
            // Attention windows include unwritten cells (padding), masked but still
            // multiplied by zero by GPU kernels and ggml's tiled CPU attention
            // (NaN * 0 = NaN), so they must hold zeros: device memory is cleared
            // once; host memory is an anonymous map, zero and committed on write
            // (the allocator's reused heap memory can hold anything).
            let buf = if dev {
                let buf = buft.alloc(size)?;
                buf.clear(0);
                buf
            } else {
                Buffer::zeroed_host(size)?
            };
            for (&i, off) in ids.iter().zip(offsets) {
                buf.place(store.get(i), off)?;
            }
            store.keep_buffer(buf);
        }
        Ok(KvStore {
            store,
            groups: groups.to_vec(),
            cells: cells.to_vec(),
            group_of,
            slot,
        })
    }

    /// Number of cache groups.
    pub fn n_groups(&self) -> usize {
        self.groups.len()
    }

    /// The cache groups, as built.
    pub fn groups(&self) -> &[CacheGroup] {
        &self.groups
    }

    /// Number of cells per layer of group `group`.
    pub fn n_cells(&self, group: usize) -> usize {
        self.cells[group]
    }

    /// The group of layer `layer`.
    pub fn group_of(&self, layer: usize) -> usize {
        self.group_of[layer]
    }

    /// Bytes of KV memory reserved (address space; host pages are committed on write).
    pub fn bytes(&self) -> usize {
        self.store.buffers().iter().map(|b| b.size()).sum()
    }

    /// Bytes that [`KvStore::read_cells`] returns for `n` cells of `group`: its
    /// layers' K and V rows of those cells.
    pub fn cells_bytes(&self, group: usize, n: usize) -> usize {
        self.groups[group]
            .layers
            .iter()
            .map(|&il| (self.k(il).nb()[1] + self.v(il).nb()[1]) * n)
            .sum()
    }

    /// Copies the K and V rows of cells `start..start + n` of `group` out, layer by
    /// layer of the group (K then V): [`KvStore::cells_bytes`]`(group, n)` bytes.
    /// Cells of one page are contiguous in every pool, so this is two plain copies
    /// per layer.
    pub fn read_cells(&self, group: usize, start: usize, n: usize) -> Result<Vec<u8>, ModelError> {
        assert!(
            start + n <= self.cells[group],
            "cells {start}+{n} out of range of group {group}"
        );
        let mut out = vec![0u8; self.cells_bytes(group, n)];
        let mut at = 0;
        for &il in &self.groups[group].layers {
            for t in [self.k(il), self.v(il)] {
                let row = t.nb()[1];
                t.read_bytes(start * row, &mut out[at..at + n * row])?;
                at += n * row;
            }
        }
        Ok(out)
    }

    /// Writes back what [`KvStore::read_cells`] returned for `n` cells of `group`
    /// into its cells `start..start + n`.
    pub fn write_cells(
        &self,
        group: usize,
        start: usize,
        n: usize,
        data: &[u8],
    ) -> Result<(), ModelError> {
        assert!(
            start + n <= self.cells[group],
            "cells {start}+{n} out of range of group {group}"
        );
        if data.len() != self.cells_bytes(group, n) {
            return Err(ModelError::BadHParams(format!(
                "KV data of {} bytes for {n} cells of group {group}, expected {}",
                data.len(),
                self.cells_bytes(group, n)
            )));
        }
        let mut at = 0;
        for &il in &self.groups[group].layers {
            for t in [self.k(il), self.v(il)] {
                let row = t.nb()[1];
                t.write_bytes(start * row, &data[at..at + n * row])?;
                at += n * row;
            }
        }
        Ok(())
    }

    /// Zeroes cells `start..start + n` of `group` in every layer of the group (a
    /// recurrent state slot before a sequence's first token).
    pub fn clear_cells(&self, group: usize, start: usize, n: usize) -> Result<(), ModelError> {
        assert!(
            start + n <= self.cells[group],
            "cells {start}+{n} out of range of group {group}"
        );
        for &il in &self.groups[group].layers {
            for t in [self.k(il), self.v(il)] {
                let row = t.nb()[1];
                t.zero_bytes(start * row, n * row)?;
            }
        }
        Ok(())
    }

    /// Returns the host memory of cells `start..start + n` of `group` to the OS in
    /// every layer of the group (whole OS pages; they read as zeros again, as
    /// unwritten cells do): the cells of free pages of an idle engine on the CPU,
    /// which a long prompt touched and nothing holds now. A no-op on a device.
    pub fn discard_cells(&self, group: usize, start: usize, n: usize) {
        assert!(
            start + n <= self.cells[group],
            "cells {start}+{n} out of range of group {group}"
        );
        for &il in &self.groups[group].layers {
            for t in [self.k(il), self.v(il)] {
                let row = t.nb()[1];
                for b in self.store.buffers() {
                    if b.discard_tensor_bytes(t, start * row, n * row) {
                        break;
                    }
                }
            }
        }
    }

    /// Copies cells `from..from + n` of `group` over cells `to..to + n`, in every
    /// layer of the group (a recurrent state checkpoint taken or restored).
    pub fn copy_cells(
        &self,
        group: usize,
        from: usize,
        to: usize,
        n: usize,
    ) -> Result<(), ModelError> {
        assert!(
            from.max(to) + n <= self.cells[group] && from.abs_diff(to) >= n,
            "cells {from}/{to}+{n} out of range of group {group}"
        );
        // On the tensors' own backend: no bytes through host memory.
        for &il in &self.groups[group].layers {
            for t in [self.k(il), self.v(il)] {
                let row = t.nb()[1];
                t.copy_within(from * row, to * row, n * row)?;
            }
        }
        Ok(())
    }

    /// K pool of layer `il`: `[n_embd_k, n_cells(group_of(il))]` (a KV-sharing
    /// layer's is its source's).
    pub fn k(&self, il: usize) -> Tensor<'_> {
        self.store.get(self.slot[il])
    }

    /// V pool of layer `il`: `[n_embd_v, n_cells(group_of(il))]`.
    pub fn v(&self, il: usize) -> Tensor<'_> {
        self.store.get(self.slot[il] + 1)
    }
}

/// Checks that `groups` with `cells` fit a model with `hp`; returns each layer's
/// group. Group 0 is `Full` (a prefix index hangs on it), every layer that keeps
/// K/V is in exactly one group and every KV-sharing layer in none (it attends in
/// its source's), and a `Sliding` group holds only sliding layers of the model's
/// window (its pool may be too short for anything else).
fn check_groups(
    hp: &HParams,
    groups: &[CacheGroup],
    cells: &[usize],
) -> Result<Vec<usize>, ModelError> {
    let bad = |s: String| Err(ModelError::BadHParams(s));
    if groups.first().is_none_or(|g| g.kind != GroupKind::Full) {
        return bad("KV store without a Full group 0".into());
    }
    if cells.len() != groups.len() {
        return bad(format!(
            "{} cell counts for {} cache groups",
            cells.len(),
            groups.len()
        ));
    }
    let mut group_of = vec![usize::MAX; hp.n_layer];
    for (g, group) in groups.iter().enumerate() {
        if cells[g] == 0 || group.layers.is_empty() {
            return bad(format!("cache group {g} has no cells or no layers"));
        }
        if group.kind == GroupKind::Recurrent && hp.ssm.is_none() {
            return bad(format!(
                "recurrent cache group {g} in a model without recurrent layers"
            ));
        }
        if let GroupKind::Sliding { window } = group.kind {
            if Some(window as u32) != hp.swa_window {
                return bad(format!(
                    "cache group {g} slides over {window} tokens, the model over {:?}",
                    hp.swa_window
                ));
            }
        }
        for &il in &group.layers {
            if il >= hp.n_layer || group_of[il] != usize::MAX {
                return bad(format!(
                    "layer {il} outside the model or in two cache groups"
                ));
            }
            if !hp.owns_kv(il) {
                return bad(format!(
                    "layer {il} reads layer {}'s K/V but is in cache group {g}",
                    hp.kv_source[il]
                ));
            }
            let recurrent = hp.is_recurrent.get(il).copied().unwrap_or(false);
            let fits = match group.kind {
                GroupKind::Full => !recurrent,
                GroupKind::Sliding { .. } => hp.is_swa[il],
                GroupKind::Recurrent => recurrent,
            };
            if !fits {
                let what = match (recurrent, hp.is_swa[il]) {
                    (true, _) => "recurrent",
                    (false, true) => "sliding-window",
                    (false, false) => "full-attention",
                };
                return bad(format!(
                    "{what} layer {il} in cache group {g} of kind {:?}",
                    group.kind
                ));
            }
            group_of[il] = g;
        }
    }
    for il in 0..hp.n_layer {
        if !hp.owns_kv(il) {
            group_of[il] = group_of[hp.kv_source[il]];
        }
    }
    if let Some(il) = group_of.iter().position(|&g| g == usize::MAX) {
        return bad(format!("layer {il} in no cache group"));
    }
    Ok(group_of)
}

/// Builds the F16 attention mask `[n_kv, n_tokens]` of a step: 0 where a token may
/// attend to a cell, -inf elsewhere. Rows start fully masked. Rows given in order
/// are written in one pass (the usual case: a mask at a 10K-token depth is 10 MB per
/// 512 rows, built every step).
#[derive(Debug, Clone)]
pub struct MaskBuilder {
    n_kv: usize,
    n_tokens: usize,
    /// The rows written so far (whole rows), then all of them by `into_data`.
    data: Vec<u16>,
}

/// -inf as F16 bits: a masked cell.
pub(crate) const NEG_INF_F16: u16 = 0xFC00;

impl MaskBuilder {
    /// A fully masked `[n_kv, n_tokens]` mask.
    pub fn new(n_kv: usize, n_tokens: usize) -> MaskBuilder {
        MaskBuilder::reusing(Vec::new(), n_kv, n_tokens)
    }

    /// Like [`MaskBuilder::new`], in `buf`'s memory (its contents are dropped): a
    /// caller building masks step after step hands back the last step's, rather than
    /// have every mask written to freshly mapped pages.
    pub fn reusing(mut buf: Vec<u16>, n_kv: usize, n_tokens: usize) -> MaskBuilder {
        buf.clear();
        buf.reserve(n_kv * n_tokens);
        MaskBuilder {
            n_kv,
            n_tokens,
            data: buf,
        }
    }

    /// Lets token row `row` at position `pos` see cells `0..=pos` of its window, when
    /// cell `i` of the window holds position `i` (a sequence stored in order from the
    /// window's start); `window` limits how far back a sliding layer looks.
    pub fn allow_prefix(&mut self, row: usize, pos: i32, window: Option<u32>) {
        self.allow_prefix_from(row, pos, window, 0);
    }

    /// Like [`MaskBuilder::allow_prefix`] for a window that starts later in the
    /// sequence: cell `i` holds position `base + i` (a sliding group's window drops
    /// the pages no row of the step can see). Row `row` sees positions
    /// `max(base, pos - window + 1)..=pos`; `base <= pos` (a token sees itself).
    pub fn allow_prefix_from(&mut self, row: usize, pos: i32, window: Option<u32>, base: i32) {
        self.allow_through_from(row, pos, window, base, pos);
    }

    /// Like [`MaskBuilder::allow_prefix_from`], the row also seeing the cells
    /// after its own up to position `through` (`>= pos`): bidirectional
    /// attention among an image's cells (Gemma 4's sliding layers, as llama.cpp
    /// decodes an image non-causally), the window still bounding how far back.
    pub fn allow_through_from(
        &mut self,
        row: usize,
        pos: i32,
        window: Option<u32>,
        base: i32,
        through: i32,
    ) {
        assert!(row < self.n_tokens && base >= 0 && pos >= base && through >= pos);
        assert!(
            ((through - base) as usize) < self.n_kv,
            "position {through} outside the window"
        );
        let first = window
            .map_or(0, |w| pos as i64 - w as i64 + 1)
            .max(base as i64);
        let lo = (first - base as i64) as usize;
        let hi = (through - base) as usize + 1;
        let zero = f32_to_f16_bits(0.0);
        let start = row * self.n_kv;
        if self.data.len() <= start {
            // Masked rows up to this one, then this one, each cell written once.
            self.data.resize(start + lo, NEG_INF_F16);
            self.data.resize(start + hi, zero);
            self.data.resize(start + self.n_kv, NEG_INF_F16);
        } else {
            self.data[start + lo..start + hi].fill(zero);
        }
    }

    /// Number of cells (mask width).
    pub fn n_kv(&self) -> usize {
        self.n_kv
    }

    /// The mask as F16 bit patterns, row-major by token.
    pub fn into_data(mut self) -> Vec<u16> {
        self.data.resize(self.n_kv * self.n_tokens, NEG_INF_F16);
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row allowed in a test mask: `(row, pos, window, base)`, where window cell
    /// `c` holds position `base + c`.
    type Row = (usize, i32, Option<u32>, i32);

    /// The mask cell by cell: what every way of building it must give.
    fn naive(n_kv: usize, rows: &[Row], n_tokens: usize) -> Vec<u16> {
        let mut m = vec![NEG_INF_F16; n_kv * n_tokens];
        for &(row, pos, window, base) in rows {
            for c in 0..n_kv as i64 {
                let p = base as i64 + c;
                let seen = p <= pos as i64 && window.is_none_or(|w| p > pos as i64 - w as i64);
                if seen {
                    m[row * n_kv + c as usize] = f32_to_f16_bits(0.0);
                }
            }
        }
        m
    }

    #[test]
    fn image_rows_see_through_the_image_within_the_window() {
        // An image in cells 10..16 from base 4 (cell c holds position 4 + c):
        // each row sees back to its window's start and forward to the image's
        // last position, 19; a text row after it only its past.
        let (n_kv, n_tokens) = (20, 7);
        let mut b = MaskBuilder::new(n_kv, n_tokens);
        for r in 0..6 {
            b.allow_through_from(r, 14 + r as i32, Some(4), 4, 19);
        }
        b.allow_through_from(6, 20, Some(4), 4, 20);
        let m = b.into_data();
        let zero = f32_to_f16_bits(0.0);
        for r in 0..n_tokens {
            let pos = 14 + r as i64;
            let through = if r < 6 { 19 } else { pos };
            for c in 0..n_kv {
                let p = 4 + c as i64;
                let want = p > pos - 4 && p <= through;
                assert_eq!(m[r * n_kv + c] == zero, want, "row {r} cell {c}");
            }
        }
    }

    #[test]
    fn mask_rows_in_order_out_of_order_and_reused() {
        let n_kv = 40;
        let cases: [&[Row]; 5] = [
            // A prompt chunk: rows in order, one skipped (stays masked).
            &[(0, 10, None, 0), (1, 11, None, 0), (3, 13, None, 0)],
            // Sliding window, a row given twice, rows out of order.
            &[
                (2, 30, Some(8), 0),
                (0, 5, Some(8), 0),
                (2, 12, None, 0),
                (1, 39, Some(3), 0),
            ],
            // Nothing allowed at all.
            &[],
            // A window from position 64 (a sliding group's): rows whose sliding
            // limit falls before it, inside it, and a full row from its start.
            &[
                (0, 64, Some(8), 64),
                (1, 70, Some(8), 64),
                (2, 100, Some(8), 64),
                (3, 103, None, 64),
            ],
            // Out of order, with the window's last cell.
            &[
                (3, 79, Some(16), 40),
                (1, 41, Some(1), 40),
                (0, 60, Some(30), 40),
            ],
        ];
        let mut buf = vec![7u16; 3];
        for rows in cases {
            let n_tokens = 4;
            let mut b = MaskBuilder::reusing(buf, n_kv, n_tokens);
            for &(row, pos, window, base) in rows {
                if base == 0 {
                    b.allow_prefix(row, pos, window);
                } else {
                    b.allow_prefix_from(row, pos, window, base);
                }
            }
            let got = b.into_data();
            assert_eq!(got, naive(n_kv, rows, n_tokens), "{rows:?}");
            buf = got;
        }
    }
}
