//! Which attention ops a step needs: the plan that maps a [`StepBatch`]'s sequences
//! onto attention ops (flash attention, or matmuls for long decode rows on the CPU),
//! one plan per cache group over the sequences' views of that group (all of what
//! follows holds within each group; a layer runs its group's ops).
//!
//! Every sequence's numbers must not depend on what else shares the step, and
//! ggml's CPU flash attention picks its kernel by shape: the tiled kernel from 64
//! query rows; for a single query row over 512 or more cells alone in its op, a
//! kernel that splits the cells between threads (llama.cpp's single-sequence
//! decode, which the parity fixtures record); otherwise one pass per query row that
//! visits cells in order and skips masked ones without touching them. So on the CPU:
//! - a prompt chunk, and a decode row over 512 or more cells, attends alone over
//!   its own window (its kernel depends only on its own shape);
//! - shorter decode rows take the one-pass kernel whether alone or not, so those
//!   whose windows start on a common grid (the page pool places sequences on a
//!   power-of-two grid) share one op over a strided view of the pool: region `j`
//!   starts `j * stride` cells after the first and is read by one row, masked to
//!   its own cells, so the row visits exactly the cells, in exactly the order, that
//!   its own window would. One op instead of one per sequence plus the concats
//!   joining them: fewer nodes, so fewer thread barriers per step (+4-8 % decode
//!   throughput at 8-16 short streams on two cores);
//! - decode rows that see more than [`MATMUL_DECODE_ABOVE`] cells skip flash
//!   attention altogether: matmuls, a softmax and an outer product, in their own
//!   ops (faster on the CPU at depth, and exact to F32 rounding).
//!
//! On a GPU (whose numbers are compared to a tolerance, not bit for bit) decode
//! rows share strided ops at any window length; its kernels compute masked cells
//! too, which the same bound on the mask scan keeps small.
//!
//! Decode rows whose windows are not on one grid (a sliding group's pages are
//! handed out as its sequences advance, so windows start anywhere and may not
//! ascend) would each need an op of their own, plus the copies joining their
//! window's pages and the concats joining their outputs: at 32 streams of a model
//! with sliding layers that is hundreds of small kernels per step, and a graph
//! rebuilt every step (the cells are part of its shape). Such a run of decode rows
//! instead shares one *gathered* op when their windows are short
//! ([`GATHER_MAX_CELLS`]): each row's window cells are gathered, in window order,
//! into a region of its own of a scratch tensor (padded with masked cells), which
//! the op reads as a strided view. A row visits the same cells in the same order
//! as in its own op, the cells are an input (not the graph's shape), and the
//! gather costs one copy of the windows per layer.

use std::borrow::Cow;

use crate::kv::NEG_INF_F16;
use crate::{CellRun, KvView, StepBatch};

/// From this many cells, a single query row alone in its op takes the KV-split
/// kernel; such rows keep their own op.
const FA_SPLIT_KV_MIN: usize = 512;

/// On the CPU, a decode row that sees more than this many cells attends through
/// matmuls (`K q`, softmax, then the V-weighted sum as an outer product) rather than
/// flash attention: ggml's CPU flash attention handles one query row cell by cell (a
/// scalar `exp` and an F16 accumulator update per cell and head), about 3x slower
/// at 2K-8K cells (llama-bench tg at depth 2048/8192, flash attention on vs off),
/// and decoding at depth is what agents sharing a long system prompt spend their
/// steps on. Prompt chunks keep flash attention (its tiled kernel is the faster one
/// for many rows). Such a row has its own ops, whose numbers depend only on the
/// cells it sees (masked cells add exact zeros), so the choice is made on those, not
/// on the padded window.
pub const MATMUL_DECODE_ABOVE: usize = 256;

/// ggml's CPU flash attention runs its tiled kernel from this many query rows (one
/// tile). That kernel gives each row the same numbers whatever other rows share its
/// tile (a row's scores, softmax and output are computed on their own; the tile
/// product is always a full tile, padded with zero rows; a KV tile skipped for all
/// rows adds nothing a row would not skip by itself), so a short chunk padded to a
/// tile computes exactly what its rows get inside a longer chunk.
pub(crate) const FA_TILE_ROWS: usize = 64;

/// A strided op scans `regions × width` mask cells; it is used while that is at
/// most this factor times the cells its rows see, plus [`GROUP_SLACK_CELLS`] (a
/// masked cell costs one F16 compare, a visible one a dot product and an update).
const GROUP_SCAN_FACTOR: usize = 2;

/// See [`GROUP_SCAN_FACTOR`].
const GROUP_SLACK_CELLS: usize = 4096;

/// Most cells (regions × width) a gathered op copies per layer for K and for V.
const GATHER_MAX_CELLS: usize = 1 << 16;

/// A gathered op's region width is rounded up to a multiple of this many cells:
/// finer than [`WIDTH_GRANULE`], since padding cells are copied too (a graph is
/// rebuilt when the longest window crosses a multiple).
const GATHER_GRANULE: usize = 64;

/// A strided op's region width is rounded up to a multiple of this many cells
/// (where the pool has room), so that decoding steps keep the same graph shape
/// for this many tokens and reuse the graph; the extra cells are masked.
const WIDTH_GRANULE: usize = 256;

/// One flash-attention op of a step.
#[derive(Debug)]
pub(crate) struct AttnOp<'b> {
    /// First query row (token) in the batch.
    pub row_start: usize,
    /// Query rows; consecutive in the batch.
    pub n_rows: usize,
    /// Query rows of the flash-attention op: `n_rows`, or [`FA_TILE_ROWS`] for a
    /// short chunk of a tiled prompt (the rows after `n_rows` are padding).
    pub fa_rows: usize,
    /// The KV cells attended over, laid end to end (for a strided op: the first
    /// region).
    pub runs: Vec<CellRun>,
    /// F16 bits, `[n_kv, fa_rows]`, or `[width, regions]` for a strided op.
    pub mask: Cow<'b, [u16]>,
    /// The sliding-window mask, same shape.
    pub mask_swa: Option<Cow<'b, [u16]>>,
    /// Set when decode rows share one op over equally spaced regions of the pool,
    /// or of the gathered cells.
    pub strided: Option<Strided>,
    /// For a gathered op: the pool cell of each of its `regions × width` slots
    /// (region `j` holds row `j`'s window in window order, then padding), which
    /// the op reads as regions of stride `width` from slot 0.
    pub gather: Option<Vec<i32>>,
    /// Run as matmuls and a softmax instead of flash attention (see
    /// [`MATMUL_DECODE_ABOVE`]).
    pub matmul: bool,
}

/// The layout of a strided op: region `j` is `runs[0]` moved by `j * stride` cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Strided {
    /// Cells between the starts of consecutive regions.
    pub stride: usize,
    /// For each region, the batch row whose query reads it; a region no row uses
    /// is read by any row, fully masked.
    pub q_rows: Vec<i32>,
    /// For each query row of the op, in batch order: its region.
    pub regions: Vec<i32>,
}

impl AttnOp<'_> {
    /// Cells attended over (per region for a strided op).
    pub fn n_kv(&self) -> usize {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Shape of the mask tensor.
    pub fn mask_shape(&self) -> Vec<i64> {
        match &self.strided {
            Some(st) => vec![self.n_kv() as i64, 1, 1, st.q_rows.len() as i64],
            None => vec![self.n_kv() as i64, self.fa_rows as i64],
        }
    }
}

/// Consecutive window indices `w..w + len` that a row sees, held in cells
/// `cell..cell + len`.
#[derive(Debug, Clone, Copy)]
struct Segment {
    w: usize,
    cell: usize,
    len: usize,
}

/// A decode row that may join a strided op: its batch index and the cells it
/// sees, as segments in ascending cell order.
struct Member {
    seq: usize,
    segs: Vec<Segment>,
}

impl Member {
    fn base(&self) -> usize {
        self.segs[0].cell
    }

    fn extent(&self) -> usize {
        let last = self.segs[self.segs.len() - 1];
        last.cell + last.len - self.base()
    }

    fn visible(&self) -> usize {
        self.segs.iter().map(|g| g.len).sum()
    }
}

/// The layout a set of members would share: (first cell, stride, regions, width).
fn layout(members: &[&Member]) -> (usize, usize, usize, usize) {
    let b0 = members.iter().map(|m| m.base()).min().unwrap_or(0);
    let b1 = members.iter().map(|m| m.base()).max().unwrap_or(0);
    let stride = members.iter().fold(0, |g, m| gcd(g, m.base() - b0));
    let regions = (b1 - b0).checked_div(stride).map_or(1, |n| n + 1);
    let width = members.iter().map(|m| m.extent()).max().unwrap_or(0);
    (b0, stride, regions, width)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The attention ops of `batch` in cache group `cg` (over each sequence's
/// `views[cg]`), in row order, for the group's pool of `n_cells` cells. `cpu`: the
/// graph runs on ggml's CPU backend, whose kernel choice limits which rows may
/// share an op (see the module docs). Groups are planned independently: each
/// sequence's numbers in a group depend only on its own view there.
pub(crate) fn plan(batch: &StepBatch, cg: usize, n_cells: usize, cpu: bool) -> Vec<AttnOp<'_>> {
    plan_with(batch, cg, n_cells, cpu, true)
}

/// [`plan`], with gathered ops allowed or not (`gather`; the tests of the
/// strided grouping rules turn them off).
fn plan_with(
    batch: &StepBatch,
    cg: usize,
    n_cells: usize,
    cpu: bool,
    gather: bool,
) -> Vec<AttnOp<'_>> {
    let mut ops = Vec::with_capacity(batch.seqs.len());
    let pl = Planner {
        batch,
        cg,
        n_cells,
        gather,
    };
    // Consecutive decode rows that may share an op, planned together.
    let mut run: Vec<usize> = Vec::new();
    for (i, s) in batch.seqs.iter().enumerate() {
        let view = &s.views[cg];
        let decode = s.n_rows == 1 && !s.tiled_prompt;
        let matmul = cpu && decode && !batch.flash_decode && matmul_decode(view);
        if decode && (!cpu || (view.n_kv() < FA_SPLIT_KV_MIN && !matmul)) {
            run.push(i);
            continue;
        }
        pl.decode_run(&run, &mut ops);
        run.clear();
        ops.push(pl.own_op(i, cpu, matmul));
    }
    pl.decode_run(&run, &mut ops);
    ops
}

/// What the ops of one cache group are planned over.
struct Planner<'b> {
    batch: &'b StepBatch,
    /// The cache group.
    cg: usize,
    /// Cells of its pool.
    n_cells: usize,
    /// Whether decode rows may share a gathered op.
    gather: bool,
}

/// Whether `m` may join `group`: its window starts elsewhere than every member's
/// (one row per region), the strided view stays inside the pool (also as ggml
/// sizes a view: regions × width cells from the first), and the mask scan is not
/// much larger than the cells the rows see.
fn fits(group: &[Member], m: &Member, n_cells: usize) -> bool {
    if group.iter().any(|g| g.base() == m.base()) {
        return false;
    }
    let all: Vec<&Member> = group.iter().chain([m]).collect();
    let (b0, stride, regions, width) = layout(&all);
    let b1 = b0 + (regions - 1) * stride;
    let visible: usize = all.iter().map(|m| m.visible()).sum();
    b1 + width <= n_cells
        && b0 + regions * width <= n_cells
        && regions * width <= GROUP_SCAN_FACTOR * visible + GROUP_SLACK_CELLS
}

/// Whether a decode row's `view` has it attend through matmuls on the CPU
/// ([`MATMUL_DECODE_ABOVE`]).
fn matmul_decode(view: &KvView) -> bool {
    view.mask.iter().filter(|&&m| m != NEG_INF_F16).count() > MATMUL_DECODE_ABOVE
}

impl<'b> Planner<'b> {
    /// The ops of consecutive decode rows `run`: strided groups of rows whose
    /// windows ascend on a common grid, own ops for the others, or, when that
    /// would take more than one op, gathered ops of as many rows as
    /// [`GATHER_MAX_CELLS`] allows (if fewer ops).
    fn decode_run(&self, run: &[usize], ops: &mut Vec<AttnOp<'b>>) {
        let mut planned = Vec::new();
        let mut group: Vec<Member> = Vec::new();
        for &i in run {
            let view = &self.batch.seqs[i].views[self.cg];
            let Some(segs) = ascending_visible(&view.window, &view.mask) else {
                self.flush(&mut group, &mut planned);
                planned.push(self.own_op(i, false, false));
                continue;
            };
            let m = Member { seq: i, segs };
            if !group.is_empty() && !fits(&group, &m, self.n_cells) {
                self.flush(&mut group, &mut planned);
            }
            group.push(m);
        }
        self.flush(&mut group, &mut planned);
        if self.gather && planned.len() > 1 {
            // As many rows per gathered op as GATHER_MAX_CELLS allows, when that
            // still takes fewer ops.
            let view = |i: usize| &self.batch.seqs[i].views[self.cg];
            let width = run.iter().map(|&i| view(i).n_kv()).max().unwrap_or(0);
            let per_op = GATHER_MAX_CELLS / width.next_multiple_of(GATHER_GRANULE).max(1);
            if per_op >= 2 && run.len().div_ceil(per_op) < planned.len() {
                ops.extend(run.chunks(per_op).filter_map(|c| self.gathered_op(c)));
                return;
            }
        }
        ops.extend(planned);
    }

    /// Decode rows `run` (consecutive in the batch) in one op over their windows
    /// gathered into regions of [`GATHER_GRANULE`]-rounded width; `None` when that
    /// is over [`GATHER_MAX_CELLS`].
    fn gathered_op(&self, run: &[usize]) -> Option<AttnOp<'b>> {
        let view = |i: usize| &self.batch.seqs[i].views[self.cg];
        let width = run
            .iter()
            .map(|&i| view(i).n_kv())
            .max()?
            .next_multiple_of(GATHER_GRANULE);
        if width * run.len() > GATHER_MAX_CELLS {
            return None;
        }
        let swa = view(run[0]).mask_swa.is_some();
        let mut gather = Vec::with_capacity(width * run.len());
        let mut mask = vec![NEG_INF_F16; width * run.len()];
        let mut mask_swa = swa.then(|| vec![NEG_INF_F16; width * run.len()]);
        for (j, &i) in run.iter().enumerate() {
            let v = view(i);
            let at = j * width;
            gather.extend(
                v.window
                    .iter()
                    .flat_map(|r| r.start as i32..(r.start + r.len) as i32),
            );
            // Padding reads a cell of the window, masked.
            let pad = v.window.first().map_or(0, |r| r.start as i32);
            gather.resize(at + width, pad);
            mask[at..at + v.n_kv()].copy_from_slice(&v.mask);
            if let (Some(dst), Some(src)) = (mask_swa.as_mut(), v.mask_swa.as_ref()) {
                dst[at..at + v.n_kv()].copy_from_slice(src);
            }
        }
        let first = &self.batch.seqs[run[0]];
        Some(AttnOp {
            row_start: first.row_start,
            n_rows: run.len(),
            fa_rows: run.len(),
            runs: vec![CellRun {
                start: 0,
                len: width,
            }],
            mask: Cow::Owned(mask),
            mask_swa: mask_swa.map(Cow::Owned),
            strided: Some(Strided {
                stride: width,
                q_rows: run
                    .iter()
                    .map(|&i| self.batch.seqs[i].row_start as i32)
                    .collect(),
                regions: (0..run.len() as i32).collect(),
            }),
            gather: Some(gather),
            matmul: false,
        })
    }

    /// Emits the pending group: one strided op, or the lone row's own op.
    fn flush(&self, group: &mut Vec<Member>, ops: &mut Vec<AttnOp<'b>>) {
        match group.len() {
            0 => {}
            // Members are decode rows (never a tiled prompt's chunk): nothing to pad.
            1 => ops.push(self.own_op(group[0].seq, false, false)),
            _ => ops.push(self.strided_op(group)),
        }
        group.clear();
    }

    /// Sequence `i` attending over its own window; on the CPU a short chunk of a
    /// tiled prompt is padded to [`FA_TILE_ROWS`] query rows (the padding rows'
    /// masks repeat the last row's, so the tile skips exactly the KV tiles it would
    /// skip unpadded). `matmul`: a decode row attending through matmuls
    /// ([`matmul_decode`]).
    fn own_op(&self, i: usize, cpu: bool, matmul: bool) -> AttnOp<'b> {
        let s = &self.batch.seqs[i];
        let view = &s.views[self.cg];
        let fa_rows = if cpu && s.tiled_prompt && s.n_rows < FA_TILE_ROWS {
            FA_TILE_ROWS
        } else {
            s.n_rows
        };
        let pad = |m: &[u16]| {
            let n_kv = view.n_kv();
            let mut out = m.to_vec();
            let last = &m[(s.n_rows - 1) * n_kv..];
            for _ in s.n_rows..fa_rows {
                out.extend_from_slice(last);
            }
            out
        };
        let (mask, mask_swa) = if fa_rows > s.n_rows {
            (
                Cow::Owned(pad(&view.mask)),
                view.mask_swa.as_deref().map(|m| Cow::Owned(pad(m))),
            )
        } else {
            (
                Cow::Borrowed(view.mask.as_slice()),
                view.mask_swa.as_deref().map(Cow::Borrowed),
            )
        };
        AttnOp {
            row_start: s.row_start,
            n_rows: s.n_rows,
            fa_rows,
            runs: view.window.clone(),
            mask,
            mask_swa,
            strided: None,
            gather: None,
            matmul,
        }
    }

    /// Decode rows `group` (consecutive in the batch, windows on a common grid)
    /// attending in one op over equally spaced regions of the pool, each
    /// [`WIDTH_GRANULE`]-rounded when the pool has room.
    fn strided_op(&self, group: &[Member]) -> AttnOp<'b> {
        let n_cells = self.n_cells;
        let (b0, stride, n_regions, width) = layout(&group.iter().collect::<Vec<_>>());
        let rounded = width.next_multiple_of(WIDTH_GRANULE);
        let b1 = b0 + (n_regions - 1) * stride;
        let width = if b1 + rounded <= n_cells && b0 + n_regions * rounded <= n_cells {
            rounded
        } else {
            width
        };
        let view = |m: &Member| &self.batch.seqs[m.seq].views[self.cg];
        let swa = view(&group[0]).mask_swa.is_some();
        let first = &self.batch.seqs[group[0].seq];
        let mut q_rows = vec![first.row_start as i32; n_regions];
        let mut regions = Vec::with_capacity(group.len());
        let mut mask = vec![NEG_INF_F16; width * n_regions];
        let mut mask_swa = swa.then(|| vec![NEG_INF_F16; width * n_regions]);
        for m in group {
            let (s, v) = (&self.batch.seqs[m.seq], view(m));
            let j = (m.base() - b0) / stride;
            q_rows[j] = s.row_start as i32;
            regions.push(j as i32);
            for g in &m.segs {
                let at = j * width + g.cell - m.base();
                mask[at..at + g.len].copy_from_slice(&v.mask[g.w..g.w + g.len]);
                if let (Some(dst), Some(src)) = (mask_swa.as_mut(), v.mask_swa.as_ref()) {
                    dst[at..at + g.len].copy_from_slice(&src[g.w..g.w + g.len]);
                }
            }
        }
        AttnOp {
            row_start: first.row_start,
            n_rows: group.len(),
            fa_rows: group.len(),
            runs: vec![CellRun {
                start: b0,
                len: width,
            }],
            mask: Cow::Owned(mask),
            mask_swa: mask_swa.map(Cow::Owned),
            strided: Some(Strided {
                stride,
                q_rows,
                regions,
            }),
            gather: None,
            matmul: false,
        }
    }
}

/// The cells a one-row sequence's mask lets it see, as segments, if they ascend
/// (so a strided op visits them in window order); else `None`.
fn ascending_visible(window: &[CellRun], mask: &[u16]) -> Option<Vec<Segment>> {
    let mut out: Vec<Segment> = Vec::new();
    let mut w = 0;
    for r in window {
        for cell in r.start..r.start + r.len {
            if mask[w] != NEG_INF_F16 {
                match out.last_mut() {
                    Some(g) if g.w + g.len == w && g.cell + g.len == cell => g.len += 1,
                    Some(g) if g.cell + g.len > cell => return None,
                    _ => out.push(Segment { w, cell, len: 1 }),
                }
            }
            w += 1;
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MaskBuilder, SeqSpan};

    /// The plan of the single cache group of these tests, without gathered ops
    /// (the strided grouping rules).
    fn plan(b: &StepBatch, n_cells: usize, cpu: bool) -> Vec<AttnOp<'_>> {
        super::plan_with(b, 0, n_cells, cpu, false)
    }

    fn decode(row: usize, runs: &[(usize, usize)], pos: i32) -> SeqSpan {
        let window: Vec<CellRun> = runs
            .iter()
            .map(|&(start, len)| CellRun { start, len })
            .collect();
        let n_kv = window.iter().map(|r| r.len).sum();
        let mut m = MaskBuilder::new(n_kv, 1);
        m.allow_prefix(0, pos, None);
        SeqSpan {
            row_start: row,
            n_rows: 1,
            views: vec![KvView {
                window,
                mask: m.into_data(),
                mask_swa: None,
            }],
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        }
    }

    fn batch(seqs: Vec<SeqSpan>) -> StepBatch {
        let n: usize = seqs.iter().map(|s| s.n_rows).sum();
        StepBatch {
            tokens: vec![0; n],
            positions: vec![0; n],
            kv_slots: vec![vec![0; n]],
            seqs,
            output_rows: vec![0],
            ..StepBatch::default()
        }
    }

    /// Decode rows whose windows start at cells 64, 0 and 192 (one grid of stride
    /// 64), and a fourth that sees cells 8, 9, 10, 11, 4 (not ascending).
    fn three_on_a_grid_and_one_off() -> StepBatch {
        batch(vec![
            decode(0, &[(64, 16)], 2),
            decode(1, &[(0, 16)], 3),
            decode(2, &[(192, 16)], 0),
            decode(3, &[(8, 4), (4, 4)], 4),
        ])
    }

    #[test]
    fn decodes_on_a_grid_share_one_strided_op() {
        // Windows at cells 64, 0 and 192 (stride 64, region 2 unused); the fourth
        // sees cells 8, 9, 10, 11, 4 (not ascending) and keeps its own op.
        let b = three_on_a_grid_and_one_off();
        // A 512-cell pool has no room for 4 regions of a rounded width.
        let ops = plan(&b, 512, true);
        assert_eq!(ops.len(), 2);
        let g = &ops[0];
        assert_eq!((g.row_start, g.n_rows), (0, 3));
        assert_eq!(g.runs, vec![CellRun { start: 0, len: 4 }]);
        let st = g.strided.as_ref().expect("strided");
        assert_eq!(st.stride, 64);
        assert_eq!(st.q_rows, vec![1, 0, 0, 2]);
        assert_eq!(st.regions, vec![1, 0, 3]);
        assert_eq!(g.mask_shape(), vec![4, 1, 1, 4]);
        let visible = |region: usize| -> Vec<usize> {
            (0..4)
                .filter(|&c| g.mask[region * 4 + c] != NEG_INF_F16)
                .collect()
        };
        assert_eq!(visible(0), vec![0, 1, 2, 3]);
        assert_eq!(visible(1), vec![0, 1, 2]);
        assert_eq!(visible(2), Vec::<usize>::new());
        assert_eq!(visible(3), vec![0]);
        assert_eq!((ops[1].row_start, ops[1].n_rows), (3, 1));
        assert!(ops[1].strided.is_none());
        // On a GPU too (the same grouping).
        assert_eq!(plan(&b, 512, false).len(), 2);
        // With room, each region is WIDTH_GRANULE cells: the same visible cells.
        let wide = plan(&b, 1024, true);
        let w = &wide[0];
        assert_eq!(
            w.runs,
            vec![CellRun {
                start: 0,
                len: WIDTH_GRANULE
            }]
        );
        assert_eq!(w.mask_shape(), vec![WIDTH_GRANULE as i64, 1, 1, 4]);
        for region in 0..4 {
            let row = &w.mask[region * WIDTH_GRANULE..(region + 1) * WIDTH_GRANULE];
            assert_eq!(&row[..4], &g.mask[region * 4..region * 4 + 4]);
            assert!(row[4..].iter().all(|&m| m == NEG_INF_F16));
        }
    }

    /// Decode rows that would take more than one op (here a strided group and a
    /// row whose window does not ascend) share one gathered op: each region is its
    /// row's window cells in window order, padded to the gather granule with a masked
    /// cell of the window; the graph's shape does not depend on the cells.
    #[test]
    fn decode_rows_off_one_grid_share_a_gathered_op() {
        let b = three_on_a_grid_and_one_off();
        assert_eq!(plan(&b, 512, true).len(), 2);
        for cpu in [true, false] {
            let ops = super::plan(&b, 0, 512, cpu);
            assert_eq!(ops.len(), 1);
            let op = &ops[0];
            assert_eq!((op.row_start, op.n_rows), (0, 4));
            assert_eq!(
                op.runs,
                vec![CellRun {
                    start: 0,
                    len: GATHER_GRANULE
                }]
            );
            let st = op
                .strided
                .as_ref()
                .expect("strided over the gathered cells");
            assert_eq!(st.stride, GATHER_GRANULE);
            assert_eq!(st.q_rows, vec![0, 1, 2, 3]);
            assert_eq!(st.regions, vec![0, 1, 2, 3]);
            let cells = op.gather.as_ref().expect("gathered");
            assert_eq!(cells.len(), 4 * GATHER_GRANULE);
            let region = |j: usize| &cells[j * GATHER_GRANULE..(j + 1) * GATHER_GRANULE];
            assert_eq!(&region(0)[..16], (64..80).collect::<Vec<i32>>());
            assert!(region(0)[16..].iter().all(|&c| c == 64));
            assert_eq!(&region(3)[..8], &[8, 9, 10, 11, 4, 5, 6, 7]);
            assert!(region(3)[8..].iter().all(|&c| c == 8));
            for (j, s) in b.seqs.iter().enumerate() {
                let m = &op.mask[j * GATHER_GRANULE..(j + 1) * GATHER_GRANULE];
                let n = s.views[0].n_kv();
                assert_eq!(&m[..n], s.views[0].mask.as_slice());
                assert!(m[n..].iter().all(|&x| x == NEG_INF_F16));
            }
        }
        // One strided op is kept as it is (no copy).
        let grid = batch(vec![decode(0, &[(64, 16)], 2), decode(1, &[(0, 16)], 3)]);
        let ops = super::plan(&grid, 0, 512, true);
        assert_eq!(ops.len(), 1);
        assert!(ops[0].gather.is_none());
        // More rows than one gathered op holds: as many ops as needed, each full.
        let many: Vec<SeqSpan> = (0..40)
            .map(|i| decode(i, &[(i * 5000 + 3000, 1000), (i * 5000, 1000)], 1999))
            .collect();
        let many = batch(many);
        let ops = super::plan(&many, 0, 1 << 20, false);
        let per_op = GATHER_MAX_CELLS / 2048;
        assert_eq!(ops.len(), 40usize.div_ceil(per_op));
        assert!(ops.iter().all(|o| o.gather.is_some()));
        assert_eq!(ops[0].n_rows, per_op);
        assert_eq!(ops[1].row_start, per_op);
        // Windows too long to copy keep their ops (here one each: they do not
        // ascend).
        let long: Vec<SeqSpan> = (0..2)
            .map(|i| {
                let at = i * 100_000;
                decode(i, &[(at + 50_000, 20_000), (at, 20_000)], 39_999)
            })
            .collect();
        let long = batch(long);
        let ops = super::plan(&long, 0, 1 << 20, false);
        assert_eq!(ops.len(), 2);
        assert!(ops.iter().all(|o| o.gather.is_none()));
    }

    #[test]
    fn long_decodes_keep_their_own_op() {
        let b = batch(vec![
            decode(0, &[(0, 512)], 300),
            decode(1, &[(1024, 16)], 3),
        ]);
        let ops = plan(&b, 2048, true);
        assert_eq!(ops.len(), 2);
        assert!(ops.iter().all(|o| o.strided.is_none()));
        // A GPU has no such kernel switch: they share one op.
        let ops = plan(&b, 2048, false);
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].strided.as_ref().map(|s| s.stride), Some(1024));
    }

    #[test]
    fn sparse_grids_shared_starts_and_prompt_chunks_split_groups() {
        // Far apart is fine; many unused regions between are not (the mask scan
        // would dwarf the work).
        let far = batch(vec![decode(0, &[(0, 4)], 3), decode(1, &[(96_000, 4)], 3)]);
        assert_eq!(plan(&far, 1 << 20, true).len(), 1);
        let sparse = batch(vec![
            decode(0, &[(0, 4)], 3),
            decode(1, &[(64, 4)], 3),
            decode(2, &[(96_000, 4)], 3),
        ]);
        let ops = plan(&sparse, 1 << 20, true);
        let shape: Vec<(usize, usize)> = ops.iter().map(|o| (o.row_start, o.n_rows)).collect();
        assert_eq!(shape, vec![(0, 2), (2, 1)]);
        // Two rows starting at the same cell (a shared prefix) cannot share a region.
        let shared = batch(vec![
            decode(0, &[(0, 8)], 5),
            decode(1, &[(0, 4), (16, 4)], 5),
        ]);
        assert_eq!(plan(&shared, 1024, true).len(), 2);
        // The view must stay inside the pool.
        let edge = batch(vec![decode(0, &[(0, 16)], 15), decode(1, &[(16, 16)], 15)]);
        assert_eq!(plan(&edge, 32, true).len(), 1);
        assert_eq!(plan(&edge, 31, true).len(), 2);
        // A prompt chunk between decodes ends the group.
        let mut chunk = decode(2, &[(128, 4)], 1);
        chunk.n_rows = 2;
        let mut m = MaskBuilder::new(4, 2);
        m.allow_prefix(0, 0, None);
        m.allow_prefix(1, 1, None);
        chunk.views[0].mask = m.into_data();
        let b = batch(vec![
            decode(0, &[(0, 4)], 3),
            decode(1, &[(64, 4)], 3),
            chunk,
            decode(4, &[(192, 4)], 3),
        ]);
        let ops = plan(&b, 1024, true);
        let shape: Vec<(usize, usize)> = ops.iter().map(|o| (o.row_start, o.n_rows)).collect();
        assert_eq!(shape, vec![(0, 2), (2, 2), (4, 1)]);
    }

    /// Each cache group is planned on its own views: decode rows whose full-group
    /// windows are long (their own ops, ggml's KV-split kernel) share one strided
    /// op in a sliding group where their windows are short.
    #[test]
    fn each_cache_group_is_planned_on_its_views() {
        let with_sliding = |row: usize, full_start: usize, ring_start: usize| {
            let mut s = decode(row, &[(full_start, 600)], 200);
            // The sliding view holds positions 128..256; the row sees 181..=200.
            let mut m = MaskBuilder::new(128, 1);
            m.allow_prefix_from(0, 200, Some(20), 128);
            s.views.push(KvView {
                window: vec![CellRun {
                    start: ring_start,
                    len: 128,
                }],
                mask: m.into_data(),
                mask_swa: None,
            });
            s
        };
        let mut b = batch(vec![with_sliding(0, 0, 0), with_sliding(1, 1024, 256)]);
        b.kv_slots.push(vec![0; 2]);
        let full = super::plan(&b, 0, 2048, true);
        assert_eq!(full.len(), 2);
        assert!(full.iter().all(|o| o.strided.is_none() && !o.matmul));
        let sliding = super::plan(&b, 1, 512, true);
        assert_eq!(sliding.len(), 1);
        let op = &sliding[0];
        let st = op.strided.as_ref().expect("strided");
        assert_eq!((st.stride, st.regions.clone()), (256, vec![0, 1]));
        // Each region is its row's 20 visible cells, from cell 53 of its window.
        assert_eq!(op.runs, vec![CellRun { start: 53, len: 20 }]);
        assert!(op.mask.iter().all(|&m| m != NEG_INF_F16));
        assert_eq!(op.mask.len(), 40);
    }
}
