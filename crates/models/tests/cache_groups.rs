//! Cache groups on Gemma 3 (a tiny synthetic one and the real 270M file): with its
//! sliding-window layers in their own small pool, whose windows start at the page
//! holding the first position a step's first row sees, a model computes the same
//! numbers, bit for bit, as with every layer in one pool (`swa_full`). ggml's CPU
//! flash attention walks KV in tiles of 64 cells and skips tiles no row sees, and
//! pages are 64 cells, so such a window hands each sliding layer the same visible
//! cells at the same places in its tiles as the full window does.

use std::sync::Arc;

use tempo9_ggml::Device;
use tempo9_gguf::GgufFile;
use tempo9_models::{
    CacheGroup, CellRun, Executor, GroupKind, KvStore, KvView, LoadOptions, MaskBuilder, Model,
    ModelError, SeqSpan, StepBatch,
};

mod common;
use common::Writer;

/// Cells per page (one KV tile of ggml's CPU flash attention).
const PAGE: usize = 64;
/// Full-group windows are padded to a multiple of this many cells (as the engine
/// pads them, so that steps keep one graph shape for a while).
const FULL_PAD: usize = 256;

/// Where a sequence's pages lie in one cache group's pool: sequence page `p` in pool
/// page `first + p % ring` (a sliding group recycles the pages no later token sees).
#[derive(Debug, Clone, Copy)]
struct Place {
    first: usize,
    ring: usize,
}

impl Place {
    fn page(&self, p: usize) -> usize {
        self.first + p % self.ring
    }

    fn cell(&self, pos: usize) -> usize {
        self.page(pos / PAGE) * PAGE + pos % PAGE
    }
}

/// One sequence: its tokens and, per cache group, where its pages lie.
struct Seq {
    tokens: Vec<u32>,
    places: Vec<Place>,
}

/// A model, its KV store and the cache groups it was built for.
struct Layout {
    model: Arc<Model>,
    kv: Arc<KvStore>,
    groups: Vec<CacheGroup>,
}

impl Layout {
    fn new(model: &Arc<Model>, swa_full: bool, cells: &[usize]) -> Layout {
        let groups = model.cache_groups(swa_full);
        let kv = model.new_kv(&groups, cells).expect("KV store");
        Layout {
            model: model.clone(),
            kv,
            groups,
        }
    }

    /// One step: rows `start..end` of each `(sequence, start, end, tiled)` part
    /// (`tiled`: a chunk of a prompt of 64 tokens or more), each part's last row
    /// output. Returns the output rows' logits.
    fn step(
        &self,
        exec: &mut Executor,
        parts: &[(&Seq, usize, usize, bool)],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let hp = self.model.hparams();
        let mut b = StepBatch {
            kv_slots: vec![Vec::new(); self.groups.len()],
            batch_invariant: true,
            ..StepBatch::default()
        };
        for &(seq, start, end, tiled) in parts {
            let row_start = b.tokens.len();
            let n_rows = end - start;
            for pos in start..end {
                b.tokens.push(seq.tokens[pos]);
                b.positions.push(pos as i32);
                for (g, slots) in b.kv_slots.iter_mut().enumerate() {
                    slots.push(seq.places[g].cell(pos) as i64);
                }
            }
            let views = self
                .groups
                .iter()
                .zip(&seq.places)
                .map(|(group, place)| {
                    view(
                        group,
                        hp.is_swa.as_slice(),
                        hp.swa_window,
                        place,
                        start,
                        end,
                    )
                })
                .collect();
            b.seqs.push(SeqSpan {
                row_start,
                n_rows,
                views,
                tiled_prompt: tiled,
                state_snapshot: None,
                continues: false,
            });
            b.output_rows.push((row_start + n_rows - 1) as i32);
        }
        let n_vocab = self.model.hparams().n_vocab;
        let logits = self.model.forward(exec, &self.kv, &b)?;
        Ok(logits.chunks(n_vocab).map(<[f32]>::to_vec).collect())
    }
}

/// What rows `start..end` of a sequence placed at `place` attend over in `group`:
/// in a Full group the whole sequence, padded to [`FULL_PAD`] cells; in a Sliding
/// group the pages from the one holding the first position row `start` sees,
/// through the page holding `end - 1`.
fn view(
    group: &CacheGroup,
    is_swa: &[bool],
    swa_window: Option<u32>,
    place: &Place,
    start: usize,
    end: usize,
) -> KvView {
    let (base, stop) = match group.kind {
        GroupKind::Full => (0, end.next_multiple_of(FULL_PAD)),
        GroupKind::Sliding { window } => (
            (start + 1).saturating_sub(window) / PAGE * PAGE,
            end.next_multiple_of(PAGE),
        ),
        GroupKind::Recurrent => unreachable!("Gemma 3 has no recurrent layers"),
    };
    let n_pages = (stop - base) / PAGE;
    assert!(
        n_pages <= place.ring,
        "the window's pages overlap in the ring"
    );
    let mut window: Vec<CellRun> = Vec::new();
    for p in base / PAGE..stop / PAGE {
        let cell = place.page(p) * PAGE;
        match window.last_mut() {
            Some(r) if r.start + r.len == cell => r.len += PAGE,
            _ => window.push(CellRun {
                start: cell,
                len: PAGE,
            }),
        }
    }
    let (n_kv, n_rows) = (stop - base, end - start);
    let mut mask = MaskBuilder::new(n_kv, n_rows);
    let slides = group.layers.iter().any(|&il| is_swa[il]);
    let mut mask_swa =
        (group.kind == GroupKind::Full && slides).then(|| MaskBuilder::new(n_kv, n_rows));
    for (r, pos) in (start..end).enumerate() {
        let limit = group.kind.window().map(|w| w as u32);
        mask.allow_prefix_from(r, pos as i32, limit, base as i32);
        if let Some(m) = mask_swa.as_mut() {
            m.allow_prefix(r, pos as i32, swa_window);
        }
    }
    KvView {
        window,
        mask: mask.into_data(),
        mask_swa: mask_swa.map(MaskBuilder::into_data),
    }
}

/// Pseudo-random token ids in `lo..hi`.
fn tokens(n: usize, seed: u64, lo: u32, hi: u32) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (x % (hi - lo) as u64) as u32
        })
        .collect()
}

/// Asserts two steps' logits are bit-identical, saying where they differ.
fn assert_same_bits(what: &str, want: &[Vec<f32>], got: &[Vec<f32>]) {
    assert_eq!(want.len(), got.len(), "{what}: output rows");
    for (row, (w, g)) in want.iter().zip(got).enumerate() {
        let differ = w
            .iter()
            .zip(g)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max = w
            .iter()
            .zip(g)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            differ == 0,
            "{what}, output row {row}: {differ} of {} logits differ (max |diff| {max:e})",
            w.len()
        );
    }
}

/// A prompt computed in chunks ending at `chunk_ends` (the last one: the prompt's
/// length), then `n_decode` decode steps, in the `swa_full` layout and with the
/// sliding layers in a ring of `ring` pages: every step's logits must be
/// bit-identical.
fn long_prompt_two_groups_equal_swa_full(
    model: &Arc<Model>,
    chunk_ends: &[usize],
    n_decode: usize,
    ring: usize,
) {
    let n_prompt = *chunk_ends.last().expect("a prompt");
    let hp = model.hparams();
    assert!(
        hp.swa_window.is_some(),
        "a model with sliding-window layers"
    );
    let n = n_prompt + n_decode;
    let toks = tokens(n, 0x9e37_79b9_7f4a_7c15, 1, hp.n_vocab as u32);
    let full_pages = n.next_multiple_of(FULL_PAD) / PAGE;
    let full = Place {
        first: 0,
        ring: full_pages,
    };
    // The ring starts two pages into its pool: windows wrap around its end.
    let sliding = Place { first: 2, ring };
    let one = Layout::new(model, true, &[full_pages * PAGE]);
    let two = Layout::new(model, false, &[full_pages * PAGE, (ring + 2) * PAGE]);
    assert_eq!(one.groups.len(), 1);
    assert_eq!(two.groups.len(), 2);
    let seq_one = Seq {
        tokens: toks.clone(),
        places: vec![full],
    };
    let seq_two = Seq {
        tokens: toks,
        places: vec![full, sliding],
    };
    let mut steps: Vec<(usize, usize)> = std::iter::once(0)
        .chain(chunk_ends.iter().copied())
        .zip(chunk_ends.iter().copied())
        .collect();
    steps.extend((n_prompt..n).map(|p| (p, p + 1)));
    let mut exec_one = Executor::new(Device::cpu(), 2).unwrap();
    let mut exec_two = Executor::new(Device::cpu(), 2).unwrap();
    for &(start, end) in &steps {
        let tiled = start < n_prompt && n_prompt >= PAGE;
        let want = one
            .step(&mut exec_one, &[(&seq_one, start, end, tiled)])
            .unwrap();
        let got = two
            .step(&mut exec_two, &[(&seq_two, start, end, tiled)])
            .unwrap();
        assert!(want[0].iter().all(|x| x.is_finite()));
        assert_same_bits(&format!("rows {start}..{end}"), &want, &got);
    }
}

/// Sequences of `lens` prompt tokens (each prefilled alone in chunks of `chunk`)
/// decode one token each in one step with two cache groups: each row's logits are
/// bit-identical to the row decoded alone, and to the `swa_full` layout's. Each
/// sequence owns a region of `region` pages in each pool (its sliding ring: the
/// first `ring` pages of it), so short windows start on a common grid and share
/// strided attention ops.
fn decode_batch_two_groups_equals_alone(
    model: &Arc<Model>,
    lens: &[usize],
    chunk: usize,
    region: usize,
    ring: usize,
) {
    let hp = model.hparams();
    let cells = lens.len() * region * PAGE;
    let one = Layout::new(model, true, &[cells]);
    let two = Layout::new(model, false, &[cells, cells]);
    let seqs: Vec<(Seq, Seq)> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let toks = tokens(len + 1, 7 + i as u64, 1, hp.n_vocab as u32);
            let full = Place {
                first: i * region,
                ring: region,
            };
            let sliding = Place {
                first: i * region,
                ring,
            };
            (
                Seq {
                    tokens: toks.clone(),
                    places: vec![full],
                },
                Seq {
                    tokens: toks,
                    places: vec![full, sliding],
                },
            )
        })
        .collect();
    let mut exec = Executor::new(Device::cpu(), 2).unwrap();
    for (s1, s2) in &seqs {
        let len = s1.tokens.len() - 1;
        for start in (0..len).step_by(chunk) {
            let end = (start + chunk).min(len);
            let tiled = len >= PAGE;
            one.step(&mut exec, &[(s1, start, end, tiled)]).unwrap();
            two.step(&mut exec, &[(s2, start, end, tiled)]).unwrap();
        }
    }
    let decode = |s: &Seq| {
        let pos = s.tokens.len() - 1;
        (pos, pos + 1)
    };
    let parts: Vec<(&Seq, usize, usize, bool)> = seqs
        .iter()
        .map(|(_, s)| (s, decode(s).0, decode(s).1, false))
        .collect();
    let together = two.step(&mut exec, &parts).unwrap();
    for (i, (s1, s2)) in seqs.iter().enumerate() {
        let (start, end) = decode(s2);
        let alone = two.step(&mut exec, &[(s2, start, end, false)]).unwrap();
        assert_same_bits(
            &format!("sequence {i} (len {}) batched vs alone", lens[i]),
            &alone,
            &together[i..i + 1],
        );
        let full = one.step(&mut exec, &[(s1, start, end, false)]).unwrap();
        assert_same_bits(
            &format!("sequence {i} (len {}) two groups vs swa_full", lens[i]),
            &full,
            &alone,
        );
    }
}

/// Sizes of the synthetic Gemma 3.
const E: usize = 64;
const LAYERS: usize = 6;
const HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const FF: usize = 96;
const VOCAB: usize = 128;
/// Sliding window of the synthetic Gemma 3: not a multiple of a page, and above
/// `MATMUL_DECODE_ABOVE` (see `groups_need_window_above_matmul_threshold` below).
const WINDOW: u32 = 300;

/// A tiny Gemma 3 (F32 weights): layers 0-4 slide over [`WINDOW`] tokens, layer 5
/// attends globally.
fn tiny_gemma3() -> Arc<Model> {
    let mut w = Writer::new("gemma3");
    w.u32("gemma3.embedding_length", E as u32);
    w.u32("gemma3.block_count", LAYERS as u32);
    w.u32("gemma3.attention.head_count", HEADS as u32);
    w.u32("gemma3.attention.head_count_kv", 1);
    w.u32("gemma3.attention.key_length", HEAD_DIM as u32);
    w.u32("gemma3.attention.value_length", HEAD_DIM as u32);
    w.u32("gemma3.feed_forward_length", FF as u32);
    w.u32("gemma3.context_length", 4096);
    w.u32("gemma3.attention.sliding_window", WINDOW);
    w.f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6);
    w.f32("gemma3.rope.freq_base", 1e6);
    let mut seed = 0x2468_ace0_1357_9bdfu64;
    w.tensor("token_embd.weight", &[E, VOCAB], &mut seed);
    w.tensor("output_norm.weight", &[E], &mut seed);
    let (q, kv) = (HEADS * HEAD_DIM, HEAD_DIM);
    for i in 0..LAYERS {
        let mut t = |name: &str, shape: &[usize]| {
            w.tensor(&format!("blk.{i}.{name}"), shape, &mut seed);
        };
        t("attn_norm.weight", &[E]);
        t("attn_q.weight", &[E, q]);
        t("attn_k.weight", &[E, kv]);
        t("attn_v.weight", &[E, kv]);
        t("attn_q_norm.weight", &[HEAD_DIM]);
        t("attn_k_norm.weight", &[HEAD_DIM]);
        t("attn_output.weight", &[q, E]);
        t("post_attention_norm.weight", &[E]);
        t("ffn_norm.weight", &[E]);
        t("ffn_gate.weight", &[E, FF]);
        t("ffn_up.weight", &[E, FF]);
        t("ffn_down.weight", &[FF, E]);
        t("post_ffw_norm.weight", &[E]);
    }
    let f = Arc::new(GgufFile::from_bytes(w.finish()).expect("gguf"));
    Arc::new(Model::from_gguf(f, LoadOptions::new(Device::cpu())).expect("load"))
}

/// The real Gemma 3 270M, if present (see `common::model_path`).
fn gemma3_270m() -> Option<Arc<Model>> {
    let p = common::model_path("gemma-3-270m-q4_k_m.gguf")?;
    Some(Arc::new(
        Model::load(&p, LoadOptions::new(Device::cpu())).expect("load Gemma 3"),
    ))
}

#[test]
fn cache_groups_of_gemma3() {
    let model = tiny_gemma3();
    let full = |layers: Vec<usize>| CacheGroup {
        kind: GroupKind::Full,
        layers,
    };
    assert_eq!(
        model.cache_groups(false),
        vec![
            full(vec![5]),
            CacheGroup {
                kind: GroupKind::Sliding {
                    window: WINDOW as usize
                },
                layers: vec![0, 1, 2, 3, 4],
            },
        ]
    );
    assert_eq!(model.cache_groups(true), vec![full((0..LAYERS).collect())]);
}

/// The store sizes each layer's pools by its group, and reads and writes cells of
/// one group (only that group's layers) without touching the other.
#[test]
fn kv_store_sizes_and_copies_cells_per_group() {
    let model = tiny_gemma3();
    let groups = model.cache_groups(false);
    let kv = model.new_kv(&groups, &[256, 128]).unwrap();
    assert_eq!(kv.n_groups(), 2);
    assert_eq!(kv.groups(), groups.as_slice());
    assert_eq!((kv.n_cells(0), kv.n_cells(1)), (256, 128));
    for il in 0..LAYERS {
        let g = if il == 5 { 0 } else { 1 };
        assert_eq!(kv.group_of(il), g);
        assert_eq!(kv.k(il).ne()[1] as usize, kv.n_cells(g));
        assert_eq!(kv.v(il).ne()[1] as usize, kv.n_cells(g));
    }
    // F16 K and V rows of HEAD_DIM per layer.
    let per_cell = 2 * HEAD_DIM * 2;
    assert_eq!(kv.cells_bytes(0, 3), 3 * per_cell);
    assert_eq!(kv.cells_bytes(1, 3), 3 * 5 * per_cell);
    let data: Vec<u8> = (0..kv.cells_bytes(1, 3)).map(|i| (i % 251) as u8).collect();
    kv.write_cells(1, 100, 3, &data).unwrap();
    assert_eq!(kv.read_cells(1, 100, 3).unwrap(), data);
    assert!(kv.read_cells(0, 100, 3).unwrap().iter().all(|&b| b == 0));
    assert!(kv.write_cells(1, 0, 2, &data).is_err(), "wrong size");
    // Cell counts and groups must fit the model.
    let err = |groups: &[CacheGroup], cells: &[usize]| {
        model
            .new_kv(groups, cells)
            .err()
            .expect("must fail")
            .to_string()
    };
    assert!(err(&groups, &[256]).contains("2 cache groups"));
    assert!(err(&groups, &[256, 0]).contains("no cells"));
    let swapped = [groups[1].clone(), groups[0].clone()];
    assert!(err(&swapped, &[64, 64]).contains("Full group 0"));
    let mut wrong = groups.clone();
    wrong[1].layers.push(5);
    assert!(err(&wrong, &[64, 64]).contains("two cache groups"));
    wrong[0].layers.clear();
    assert!(err(&wrong, &[64, 64]).contains("no layers"));
    let mut missing = groups.clone();
    missing[1].layers.pop();
    assert!(err(&missing, &[64, 64]).contains("layer 4 in no cache group"));
    let mut full_in_sliding = groups.clone();
    full_in_sliding[1].layers.push(5);
    full_in_sliding[0].layers = vec![0];
    full_in_sliding[1].layers.retain(|&l| l != 0);
    assert!(err(&full_in_sliding, &[64, 64]).contains("full-attention layer 5"));
}

/// A batch must give every group its slots and views, each in range.
#[test]
fn batches_are_checked_per_group() {
    let model = tiny_gemma3();
    let two = Layout::new(&model, false, &[256, 128]);
    let seq = Seq {
        tokens: vec![3; 8],
        places: vec![Place { first: 0, ring: 4 }, Place { first: 0, ring: 2 }],
    };
    let mut exec = Executor::new(Device::cpu(), 1).unwrap();
    assert!(two.step(&mut exec, &[(&seq, 0, 8, false)]).is_ok());
    let hp = model.hparams();
    let good = || {
        let mut b = StepBatch {
            tokens: vec![3; 8],
            positions: (0..8).collect(),
            kv_slots: vec![(0..8).collect(), (0..8).collect()],
            output_rows: vec![7],
            ..StepBatch::default()
        };
        b.seqs.push(SeqSpan {
            row_start: 0,
            n_rows: 8,
            views: two
                .groups
                .iter()
                .zip(&seq.places)
                .map(|(g, p)| view(g, &hp.is_swa, hp.swa_window, p, 0, 8))
                .collect(),
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        });
        b
    };
    let mut err = |b: StepBatch| {
        model
            .forward(&mut exec, &two.kv, &b)
            .expect_err("must fail")
            .to_string()
    };
    let mut b = good();
    b.kv_slots.pop();
    assert!(
        err(b).contains("kv_slots for 1 cache groups"),
        "slots per group"
    );
    let mut b = good();
    b.kv_slots[1][7] = 128;
    assert!(err(b).contains("pool of cache group 1"));
    let mut b = good();
    b.seqs[0].views.pop();
    assert!(err(b).contains("1 KV views for 2 cache groups"));
    let mut b = good();
    b.seqs[0].views[1].window[0].start = 100;
    assert!(err(b).contains("KV run 100+64 of cache group 1"));
    let mut b = good();
    b.seqs[0].views[1].mask.pop();
    assert!(err(b).contains("mask size in cache group 1"));
    let mut b = good();
    b.seqs[0].views[0].mask_swa = Some(b.seqs[0].views[0].mask.clone());
    assert!(err(b).contains("cache group 0 has no sliding-window layers"));
    // In the swa_full layout, group 0 needs mask_swa.
    let one = Layout::new(&model, true, &[256]);
    let mut b = good();
    b.kv_slots.pop();
    b.seqs[0].views.pop();
    let e = model
        .forward(&mut exec, &one.kv, &b)
        .expect_err("must fail")
        .to_string();
    assert!(
        e.contains("has sliding-window layers but a sequence has no mask_swa"),
        "{e}"
    );
}

#[test]
fn tiny_gemma3_long_prompt_two_groups_equal_swa_full() {
    // Chunks up to position 1000, one of them shorter than a tile (44 rows, padded
    // to 64 query rows as after a prefix hit), then 4 decode steps; windows of up
    // to 12 pages in a ring of 12.
    long_prompt_two_groups_equal_swa_full(&tiny_gemma3(), &[256, 300, 556, 1000], 4, 12);
}

#[test]
fn tiny_gemma3_decode_batch_two_groups_equals_alone() {
    // 20, 90, 200: short decodes sharing strided ops in both groups; 400, 700: long
    // ones (matmul attention), 700 in a wrapped ring.
    decode_batch_two_groups_equals_alone(&tiny_gemma3(), &[20, 90, 200, 400, 700], 256, 16, 10);
}

#[test]
fn gemma3_270m_long_prompt_two_groups_equal_swa_full() {
    let Some(model) = gemma3_270m() else { return };
    assert_eq!(model.hparams().swa_window, Some(512));
    // 1500 tokens in chunks of 512, then 4 decode steps; the third chunk's window
    // (positions 512..1536) wraps around a ring of 18 pages.
    long_prompt_two_groups_equal_swa_full(&model, &[512, 1024, 1500], 4, 18);
}

#[test]
fn gemma3_270m_decode_batch_two_groups_equals_alone() {
    let Some(model) = gemma3_270m() else { return };
    decode_batch_two_groups_equals_alone(&model, &[40, 100, 200, 700, 1300], 512, 32, 20);
}
