//! A tiny synthetic Llama written in memory: load errors are clear, the graph runs,
//! and several sequences in one step see only their own KV cells.

use std::sync::Arc;

use tempo9_ggml::Device;
use tempo9_gguf::GgufFile;
use tempo9_models::{
    CellRun, KvStore, KvView, LoadOptions, MaskBuilder, Model, ModelError, SeqSpan, StepBatch,
    StepOutput,
};

mod common;
use common::Writer;

const E: usize = 64;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const FF: usize = 96;
const VOCAB: usize = 128;

/// A tiny Llama; `tweak` may change the writer before tensors are added.
fn tiny_llama(tweak: impl FnOnce(&mut Writer), skip: Option<&str>) -> Vec<u8> {
    tiny_llama_ff(FF, tweak, skip)
}

/// Same, declaring `ff_meta` as the feed-forward size in metadata (tensors keep `FF`).
fn tiny_llama_ff(ff_meta: usize, tweak: impl FnOnce(&mut Writer), skip: Option<&str>) -> Vec<u8> {
    let mut w = Writer::new("llama");
    w.u32("llama.embedding_length", E as u32);
    w.u32("llama.block_count", LAYERS as u32);
    w.u32("llama.attention.head_count", HEADS as u32);
    w.u32("llama.attention.head_count_kv", KV_HEADS as u32);
    w.u32("llama.feed_forward_length", ff_meta as u32);
    w.u32("llama.context_length", 256);
    w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    tweak(&mut w);
    let hd = E / HEADS;
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut add = |w: &mut Writer, name: &str, shape: &[usize]| {
        if Some(name) != skip {
            w.tensor(name, shape, &mut seed);
        }
    };
    add(&mut w, "token_embd.weight", &[E, VOCAB]);
    add(&mut w, "output_norm.weight", &[E]);
    for i in 0..LAYERS {
        add(&mut w, &format!("blk.{i}.attn_norm.weight"), &[E]);
        add(&mut w, &format!("blk.{i}.attn_q.weight"), &[E, HEADS * hd]);
        add(
            &mut w,
            &format!("blk.{i}.attn_k.weight"),
            &[E, KV_HEADS * hd],
        );
        add(
            &mut w,
            &format!("blk.{i}.attn_v.weight"),
            &[E, KV_HEADS * hd],
        );
        add(
            &mut w,
            &format!("blk.{i}.attn_output.weight"),
            &[HEADS * hd, E],
        );
        add(&mut w, &format!("blk.{i}.ffn_norm.weight"), &[E]);
        add(&mut w, &format!("blk.{i}.ffn_gate.weight"), &[E, FF]);
        add(&mut w, &format!("blk.{i}.ffn_up.weight"), &[E, FF]);
        add(&mut w, &format!("blk.{i}.ffn_down.weight"), &[FF, E]);
    }
    w.finish()
}

/// A KV store of `n_cells` cells for the model's single cache group.
fn new_kv(model: &Model, n_cells: usize) -> Arc<KvStore> {
    let groups = model.cache_groups(false);
    assert_eq!(groups.len(), 1, "a Llama keeps one cache group");
    model.new_kv(&groups, &[n_cells]).unwrap()
}

fn load(bytes: Vec<u8>) -> Result<Arc<Model>, ModelError> {
    let f = Arc::new(GgufFile::from_bytes(bytes)?);
    Model::from_gguf(f, LoadOptions::new(Device::cpu())).map(Arc::new)
}

/// One step over `seqs` (token lists), sequence i's token j in cell `base[i] + j`
/// of a 16-cell window; returns the logits of every token.
fn step(model: &Arc<Model>, seqs: &[&[u32]], base: &[usize]) -> Vec<Vec<f32>> {
    let windows: Vec<Vec<CellRun>> = base
        .iter()
        .map(|&start| vec![CellRun { start, len: 16 }])
        .collect();
    step_windows(model, seqs, &windows)
}

/// One step over `seqs`, sequence i's window made of the cell runs `windows[i]`
/// (token j in the window's cell j).
fn step_windows(model: &Arc<Model>, seqs: &[&[u32]], windows: &[Vec<CellRun>]) -> Vec<Vec<f32>> {
    let kv = new_kv(model, 64);
    step_on(model, &kv, seqs, windows)
}

/// Like [`step_windows`] on an existing KV store.
fn step_on(
    model: &Arc<Model>,
    kv: &Arc<KvStore>,
    seqs: &[&[u32]],
    windows: &[Vec<CellRun>],
) -> Vec<Vec<f32>> {
    let mut exec = tempo9_models::Executor::new(Device::cpu(), 1).unwrap();
    let b = prompt_batch(seqs, windows);
    let l = model.forward(&mut exec, kv, &b).unwrap();
    l.chunks(VOCAB).map(|c| c.to_vec()).collect()
}

/// The step of [`step_on`]: every sequence's tokens from position 0, all rows output.
fn prompt_batch(seqs: &[&[u32]], windows: &[Vec<CellRun>]) -> StepBatch {
    let mut b = StepBatch {
        kv_slots: vec![Vec::new()],
        ..StepBatch::default()
    };
    for (s, toks) in seqs.iter().enumerate() {
        let cells: Vec<usize> = windows[s]
            .iter()
            .flat_map(|r| r.start..r.start + r.len)
            .collect();
        let mut mask = MaskBuilder::new(cells.len(), toks.len());
        let row_start = b.tokens.len();
        for (j, &t) in toks.iter().enumerate() {
            b.tokens.push(t);
            b.positions.push(j as i32);
            b.kv_slots[0].push(cells[j] as i64);
            mask.allow_prefix(j, j as i32, None);
        }
        b.seqs.push(SeqSpan {
            row_start,
            n_rows: toks.len(),
            views: vec![KvView {
                window: windows[s].clone(),
                mask: mask.into_data(),
                mask_swa: None,
            }],
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        });
    }
    b.output_rows = (0..b.tokens.len() as i32).collect();
    b
}

/// A step of the same shape as the executor's previous one runs on the kept graph
/// (no new allocation) and computes exactly what a freshly built graph does with
/// the new inputs; a step of another shape builds a new graph.
#[test]
fn steps_of_one_shape_reuse_the_graph() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    let run = |start, len| CellRun { start, len };
    let w = [vec![run(0, 16)], vec![run(16, 16)]];
    let (a, b): (&[u32], &[u32]) = (&[1, 5, 9, 13, 2], &[7, 3, 3, 11, 4]);
    let fresh = |seqs: &[&[u32]]| step_windows(&model, seqs, &w[..seqs.len()]);
    let kv = new_kv(&model, 64);
    let mut exec = tempo9_models::Executor::new(Device::cpu(), 1).unwrap();
    let mut forward = |seqs: &[&[u32]]| {
        let before = exec.graphs_built();
        let l = model
            .forward(&mut exec, &kv, &prompt_batch(seqs, &w[..seqs.len()]))
            .unwrap();
        let built = exec.graphs_built() - before;
        (
            l.chunks(VOCAB).map(|c| c.to_vec()).collect::<Vec<_>>(),
            built,
        )
    };
    assert_eq!(forward(&[a]), (fresh(&[a]), 1));
    // Same shape, other tokens: the kept graph, new numbers.
    assert_eq!(forward(&[b]), (fresh(&[b]), 0));
    // Another shape (two sequences), then back.
    assert_eq!(forward(&[a, b]), (fresh(&[a, b]), 1));
    assert_eq!(forward(&[a]), (fresh(&[a]), 1));
}

/// A greedy `forward_step` returns each output row's top logit, as the logits graph
/// computes it, and its graph is kept apart from the logits graph of the same step.
#[test]
fn greedy_step_picks_each_rows_top_logit() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    let run = |start, len| CellRun { start, len };
    let w = [vec![run(0, 16)], vec![run(16, 16)]];
    let seqs: [&[u32]; 2] = [&[1, 5, 9, 13, 2], &[7, 3, 3, 11, 4, 6]];
    let kv = new_kv(&model, 64);
    let mut exec = tempo9_models::Executor::new(Device::cpu(), 1).unwrap();
    let b = prompt_batch(&seqs, &w);
    let logits = model.forward(&mut exec, &kv, &b).unwrap();
    let top: Vec<u32> = logits
        .chunks(VOCAB)
        .map(|l| {
            let best = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(l.iter().filter(|&&x| x == best).count(), 1, "a tie");
            l.iter().position(|&x| x == best).unwrap() as u32
        })
        .collect();
    let top = StepOutput::Tokens(top);
    let built = exec.graphs_built();
    assert_eq!(model.forward_step(&mut exec, &kv, &b, true).unwrap(), top);
    assert_eq!(
        exec.graphs_built(),
        built + 1,
        "greedy steps need their own graph"
    );
    // The kept greedy graph, then back to logits: the same numbers again.
    assert_eq!(model.forward_step(&mut exec, &kv, &b, true).unwrap(), top);
    assert_eq!(exec.graphs_built(), built + 1);
    assert_eq!(model.forward(&mut exec, &kv, &b).unwrap(), logits);
    assert!(!model.greedy_on_device(), "the CPU samples on the host");
}

/// A window scattered over several runs of cells (a paged cache) computes exactly
/// what one contiguous window does.
#[test]
fn scattered_window_equals_contiguous() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    let a: &[u32] = &[1, 5, 9, 13, 2, 8, 8, 3, 4, 11];
    let contiguous = step(&model, &[a], &[0]);
    let run = |start, len| CellRun { start, len };
    let scattered = step_windows(
        &model,
        &[a],
        &[vec![run(40, 4), run(8, 4), run(60, 2), run(20, 6)]],
    );
    assert_eq!(
        contiguous, scattered,
        "logits depend on where the cells lie"
    );
    // The window is built by one block copy that puts the longest run in place
    // (here the second, not the first) and then copies the others over it; when
    // no run's block fits the pool, the block starts at cell 0.
    for runs in [vec![run(2, 2), run(30, 14)], vec![run(60, 4), run(0, 12)]] {
        let scattered = step_windows(&model, &[a], std::slice::from_ref(&runs));
        assert_eq!(contiguous, scattered, "logits differ for runs {runs:?}");
    }
}

/// Cells a sequence's mask hides may hold another sequence's old K/V (reused
/// pages): the result must not depend on them.
#[test]
fn masked_stale_cells_do_not_matter() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    let a: &[u32] = &[1, 5, 9, 13, 2];
    let fresh = step(&model, &[a], &[0]);
    let kv = new_kv(&model, 64);
    let run = |start, len| CellRun { start, len };
    // Another sequence leaves K/V in cells 5..16 first.
    let b: Vec<u32> = (0..11).map(|i| 3 + i).collect();
    step_on(&model, &kv, &[&b], &[vec![run(5, 16)]]);
    let dirty = step_on(&model, &kv, &[a], &[vec![run(0, 16)]]);
    assert_eq!(
        fresh, dirty,
        "masked cells with stale K/V changed the result"
    );
}

/// One decode row per `(token, position, window)`, in one step, batch-invariant
/// (`StepBatch::batch_invariant`: a lone row of this F32 model's tinyBLAS weights
/// is multiplied as a batch would be); returns each row's logits. The token's K/V
/// goes to the window's cell at its position.
fn decode_step(
    model: &Arc<Model>,
    kv: &Arc<KvStore>,
    rows: &[(u32, usize, Vec<CellRun>)],
) -> Vec<Vec<f32>> {
    let mut exec = tempo9_models::Executor::new(Device::cpu(), 2).unwrap();
    let mut b = StepBatch {
        batch_invariant: true,
        kv_slots: vec![Vec::new()],
        ..StepBatch::default()
    };
    for (i, (tok, pos, window)) in rows.iter().enumerate() {
        let cells: Vec<usize> = window
            .iter()
            .flat_map(|r| r.start..r.start + r.len)
            .collect();
        let mut mask = MaskBuilder::new(cells.len(), 1);
        mask.allow_prefix(0, *pos as i32, None);
        b.tokens.push(*tok);
        b.positions.push(*pos as i32);
        b.kv_slots[0].push(cells[*pos] as i64);
        b.seqs.push(SeqSpan {
            row_start: i,
            n_rows: 1,
            views: vec![KvView {
                window: window.clone(),
                mask: mask.into_data(),
                mask_swa: None,
            }],
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        });
    }
    b.output_rows = (0..rows.len() as i32).collect();
    let l = model.forward(&mut exec, kv, &b).unwrap();
    l.chunks(VOCAB).map(|c| c.to_vec()).collect()
}

/// Decode rows that share one strided attention op compute bit for bit what each
/// computes alone; so do rows that keep their own op (a long one, one whose cells
/// do not ascend) in a batch.
#[test]
fn decode_rows_batched_equal_alone() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    let run = |start, len| CellRun { start, len };
    let prompt = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 7 + seed * 13) % VOCAB as u32)
            .collect()
    };
    // The first two start on a grid of 2048 cells (one strided op); the third is
    // too long (its own op, ggml's KV-split kernel), the last one's cells do not
    // ascend (its own op).
    let seqs = [
        (prompt(5, 1), vec![run(0, 16)]),
        (prompt(3, 3), vec![run(2048, 16)]),
        (prompt(600, 2), vec![run(1024, 640)]),
        (prompt(7, 4), vec![run(3000, 4), run(2980, 12)]),
    ];
    let kv = new_kv(&model, 4096);
    for (p, w) in &seqs {
        step_on(&model, &kv, &[p], std::slice::from_ref(w));
    }
    let rows: Vec<(u32, usize, Vec<CellRun>)> = seqs
        .iter()
        .enumerate()
        .map(|(i, (p, w))| (i as u32 + 1, p.len(), w.clone()))
        .collect();
    let together = decode_step(&model, &kv, &rows);
    for (i, r) in rows.iter().enumerate() {
        let alone = decode_step(&model, &kv, std::slice::from_ref(r));
        assert_eq!(alone[0], together[i], "decode row {i} changed by batching");
    }
}

#[test]
fn tiny_llama_runs_and_sequences_are_isolated() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    assert_eq!(model.hparams().n_vocab, VOCAB);
    let a: &[u32] = &[1, 5, 9, 13, 2];
    let b: &[u32] = &[7, 3, 3];
    let alone_a = step(&model, &[a], &[0]);
    let alone_b = step(&model, &[b], &[48]);
    assert!(alone_a.iter().flatten().all(|x| x.is_finite()));
    // Both in one step, in other cells: each sees only its own.
    let both = step(&model, &[a, b], &[16, 32]);
    for (x, y) in both[..a.len()]
        .iter()
        .flatten()
        .zip(alone_a.iter().flatten())
    {
        assert!((x - y).abs() < 1e-4, "sequence a changed by b: {x} vs {y}");
    }
    for (x, y) in both[a.len()..]
        .iter()
        .flatten()
        .zip(alone_b.iter().flatten())
    {
        assert!((x - y).abs() < 1e-4, "sequence b changed by a: {x} vs {y}");
    }
    // Causality: a prefix's logits do not depend on later tokens.
    let prefix = step(&model, &[&a[..2]], &[0]);
    for (x, y) in prefix.iter().flatten().zip(alone_a[..2].iter().flatten()) {
        assert!((x - y).abs() < 1e-4);
    }
}

#[test]
fn load_errors_are_clear() {
    let err = |bytes| load(bytes).err().expect("must fail").to_string();
    let e = err(tiny_llama(|_| {}, Some("blk.1.ffn_up.weight")));
    assert!(e.contains("missing tensor blk.1.ffn_up.weight"), "{e}");
    let e = err(tiny_llama(
        |w| w.u32("llama.attention.head_count_kv", 3),
        None,
    ));
    assert!(e.contains("head_count"), "{e}");
    let mut bytes = tiny_llama(|_| {}, None);
    let n = bytes.len();
    bytes.truncate(n - 100);
    assert!(load(bytes).is_err(), "truncated data section must fail");
    let mut w = Writer::new("mamba9");
    w.u32("mamba9.block_count", 1);
    let e = err(w.finish());
    assert!(e.contains("unsupported model architecture 'mamba9'"), "{e}");
    // The error lists every architecture the loader knows, by its GGUF name.
    for a in tempo9_models::Arch::ALL {
        assert!(e.contains(a.name()), "{e} does not list {}", a.name());
        assert_eq!(tempo9_models::Arch::from_name(a.name()), Some(a));
    }
    let e = err(tiny_llama_ff(FF * 2, |_| {}, None));
    assert!(e.contains("blk.0.ffn_gate.weight has shape"), "{e}");
    // Llama 3's rope divisors must have one value per rotated pair.
    let e = err(tiny_llama(
        |w| w.tensor_values("rope_freqs.weight", &[3], vec![1.0; 3]),
        None,
    ));
    assert!(e.contains("rope_freqs.weight has shape [3]"), "{e}");
    let e = err(tiny_llama(|w| w.u32("llama.vocab_size", 5), None)
        .into_iter()
        .take(40)
        .collect());
    assert!(
        e.contains("tensor count 20") && e.contains("impossible"),
        "{e}"
    );
}

/// Cells no token has written yet must read as zeros, not as whatever the process's
/// allocator last kept there: a padded attention window includes such cells, and
/// ggml's tiled CPU attention (prompt chunks) multiplies masked cells by zero, so a
/// NaN left there by freed memory turned a whole chunk's output into NaN.
#[test]
fn unwritten_kv_cells_read_as_zero_even_after_heap_garbage() {
    let model = load(tiny_llama(|_| {}, None)).expect("load");
    let per_cell = new_kv(&model, 64).bytes() / 64;
    let n_cells = (8 << 20) / per_cell;
    // Raise glibc's mmap threshold above the pool's size (a freed 32 MiB mapping
    // does), then free NaN-patterned heap blocks of about that size.
    drop(std::hint::black_box(vec![1u8; 32 << 20]));
    for _ in 0..4 {
        drop(std::hint::black_box(vec![0xFFu8; (8 << 20) + 4096]));
    }
    let kv = new_kv(&model, n_cells);
    let mut buf = vec![0u8; kv.k(0).nbytes()];
    for il in 0..LAYERS {
        for t in [kv.k(il), kv.v(il)] {
            buf.resize(t.nbytes(), 0);
            t.read_bytes(0, &mut buf).unwrap();
            assert!(
                buf.iter().all(|&b| b == 0),
                "layer {il}: a fresh KV pool holds garbage"
            );
        }
    }
}

/// Llama 3's `rope_freqs.weight` divides each rotated pair's frequency: divisors of
/// 1 change nothing, divisors of 2 everywhere equal linear rope scaling by 2
/// (`freq_scale` 0.5), and Llama-3-like divisors (1 for the fast pairs, larger for
/// the slow ones) move every position but the first (rope at position 0 is the
/// identity).
#[test]
fn llama3_rope_freqs_divide_rotary_frequencies() {
    let pairs = E / HEADS / 2;
    let with_freqs =
        |f: Vec<f32>| move |w: &mut Writer| w.tensor_values("rope_freqs.weight", &[pairs], f);
    let toks: &[u32] = &[5, 17, 99, 3, 64, 12, 1, 77];
    let run = |bytes| step(&load(bytes).expect("load"), &[toks], &[0]);
    let plain = run(tiny_llama(|_| {}, None));
    let ones = run(tiny_llama(with_freqs(vec![1.0; pairs]), None));
    assert_eq!(plain, ones, "divisors of 1 must not change the logits");

    let twos = run(tiny_llama(with_freqs(vec![2.0; pairs]), None));
    let linear = run(tiny_llama(
        |w| {
            w.string("llama.rope.scaling.type", "linear");
            w.f32("llama.rope.scaling.factor", 2.0);
        },
        None,
    ));
    let max_diff = |a: &[Vec<f32>], b: &[Vec<f32>], from: usize| {
        a[from..]
            .iter()
            .flatten()
            .zip(b[from..].iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    assert!(
        max_diff(&twos, &linear, 0) < 1e-6,
        "divisors of 2 vs linear scaling by 2: {}",
        max_diff(&twos, &linear, 0)
    );
    // (The tiny random model's attention moves its logits by ~5e-4: far above
    // rounding, which the exact equalities above show is absent.)
    assert!(
        max_diff(&twos, &plain, 1) > 1e-5,
        "divisors of 2 had no effect"
    );

    let llama3: Vec<f32> = (0..pairs)
        .map(|i| match i * 4 / pairs {
            0 => 1.0,
            1 => 1.5,
            _ => 8.0,
        })
        .collect();
    let scaled = run(tiny_llama(with_freqs(llama3), None));
    assert_eq!(scaled[0], plain[0], "position 0 is not rotated");
    assert!(
        max_diff(&scaled, &plain, 1) > 1e-5,
        "Llama 3 divisors had no effect"
    );
}

/// Mistral 3's YaRN and query temperature, read as llama.cpp reads them: the
/// extrapolation mix on, the magnitude factor `mscale(16, 1) / mscale(16, 1)`
/// divided by the `1 + 0.1 ln 16` ggml's rope multiplies back in, YaRN's original
/// context from its key, and the query scale `1 + 0.1 ln(floor(p / 256) + 1)`.
#[test]
fn mistral3_yarn_and_temperature_hparams() {
    let mut w = Writer::new("mistral3");
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", 1),
        ("attention.head_count", 4),
        ("feed_forward_length", 96),
        ("context_length", 4096),
        ("rope.scaling.original_context_length", 256),
    ] {
        w.u32(&format!("mistral3.{k}"), v);
    }
    w.string("mistral3.rope.scaling.type", "yarn");
    for (k, v) in [
        ("rope.scaling.factor", 16.0),
        ("rope.scaling.yarn_beta_fast", 24.0),
        ("rope.scaling.yarn_log_multiplier", 1.0),
        ("attention.temperature_scale", 0.1),
    ] {
        w.f32(&format!("mistral3.{k}"), v);
    }
    let mut seed = 1;
    w.tensor("token_embd.weight", &[64, 8], &mut seed);
    let f = GgufFile::from_bytes(w.finish()).expect("gguf");
    let hp = tempo9_models::HParams::from_gguf(&f).expect("hparams");
    let r = hp.rope;
    assert_eq!((r.mode, r.n_ctx_orig, r.freq_scale), (0, 256, 1.0 / 16.0));
    assert_eq!((r.ext_factor, r.beta_fast, r.beta_slow), (1.0, 24.0, 1.0));
    let want = 1.0 / (1.0 + 0.1 * 16f32.ln());
    assert!((r.attn_factor - want).abs() < 1e-6, "{}", r.attn_factor);
    let t = hp.attn_temp.expect("temperature scaling");
    assert_eq!((t.scale, t.floor), (0.1, 256));
    assert_eq!((t.at(0), t.at(255)), (1.0, 1.0));
    for (p, steps) in [(256, 1.0f64), (1000, 3.0), (1024, 4.0)] {
        let want = ((steps + 1.0).ln() * 0.1 + 1.0) as f32;
        assert_eq!(t.at(p), want, "position {p}");
    }
}
