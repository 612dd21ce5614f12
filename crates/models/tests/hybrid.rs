//! A tiny synthetic Qwen3.5-MoE (gated-DeltaNet layers with recurrent states,
//! gated full attention, routed and shared experts) written in memory: it loads
//! into a Full and a Recurrent cache group, a prompt computed in chunks or token
//! by token ends where it does in one step, sequences batched together compute
//! what they compute alone, and malformed files fail with a message naming the key
//! or tensor.

use std::sync::Arc;

use tempo9_ggml::Device;
use tempo9_gguf::GgufFile;
use tempo9_models::{
    CellRun, GroupKind, KvStore, KvView, LoadOptions, MaskBuilder, Model, ModelError, SeqSpan,
    StateSnapshot, StepBatch,
};

mod common;
use common::Writer;

const E: usize = 64;
const LAYERS: usize = 4;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = 32;
const VOCAB: usize = 128;
const EXPERTS: usize = 8;
const USED: usize = 2;
const FF_EXP: usize = 32;
const STATE: usize = 16;
const K_HEADS: usize = 2;
const V_HEADS: usize = 4;
const CONV: usize = 4;

/// The tiny Qwen3.5-MoE; `tweak` may change metadata, `skip` leaves a tensor out.
fn tiny(tweak: impl FnOnce(&mut Writer), skip: Option<&str>) -> Vec<u8> {
    tiny_mtp(false, tweak, skip)
}

/// [`tiny`], with one trailing MTP block when `mtp` (the trunk's weights unchanged).
fn tiny_mtp(mtp: bool, tweak: impl FnOnce(&mut Writer), skip: Option<&str>) -> Vec<u8> {
    let a = "qwen35moe";
    let mut w = Writer::new(a);
    let k = |s: &str| format!("{a}.{s}");
    w.u32(&k("embedding_length"), E as u32);
    w.u32(&k("block_count"), (LAYERS + usize::from(mtp)) as u32);
    if mtp {
        w.u32(&k("nextn_predict_layers"), 1);
    }
    w.u32(&k("attention.head_count"), HEADS as u32);
    w.u32(&k("attention.head_count_kv"), KV_HEADS as u32);
    w.u32(&k("attention.key_length"), HD as u32);
    w.u32(&k("attention.value_length"), HD as u32);
    w.u32(&k("context_length"), 4096);
    w.f32(&k("attention.layer_norm_rms_epsilon"), 1e-6);
    w.u32(&k("rope.dimension_count"), (HD / 4) as u32);
    w.i32_array(&k("rope.dimension_sections"), &[2, 1, 1, 0]);
    w.f32(&k("rope.freq_base"), 1e7);
    w.u32(&k("ssm.conv_kernel"), CONV as u32);
    w.u32(&k("ssm.state_size"), STATE as u32);
    w.u32(&k("ssm.group_count"), K_HEADS as u32);
    w.u32(&k("ssm.time_step_rank"), V_HEADS as u32);
    w.u32(&k("ssm.inner_size"), (V_HEADS * STATE) as u32);
    w.u32(&k("full_attention_interval"), 4);
    w.u32(&k("expert_count"), EXPERTS as u32);
    w.u32(&k("expert_used_count"), USED as u32);
    w.u32(&k("expert_feed_forward_length"), FF_EXP as u32);
    w.u32(&k("expert_shared_feed_forward_length"), FF_EXP as u32);
    tweak(&mut w);
    let mut seed = 0x5eed_1234_abcd_ef01u64;
    let mut add = |w: &mut Writer, name: &str, shape: &[usize]| {
        if Some(name) != skip {
            w.tensor(name, shape, &mut seed);
        }
    };
    add(&mut w, "token_embd.weight", &[E, VOCAB]);
    add(&mut w, "output_norm.weight", &[E]);
    add(&mut w, "output.weight", &[E, VOCAB]);
    let inner = V_HEADS * STATE;
    let channels = 2 * K_HEADS * STATE + inner;
    for i in 0..LAYERS {
        let n = |s: &str| format!("blk.{i}.{s}");
        add(&mut w, &n("attn_norm.weight"), &[E]);
        add(&mut w, &n("post_attention_norm.weight"), &[E]);
        if (i + 1) % 4 != 0 {
            add(&mut w, &n("attn_qkv.weight"), &[E, channels]);
            add(&mut w, &n("attn_gate.weight"), &[E, inner]);
            add(&mut w, &n("ssm_conv1d.weight"), &[CONV, channels]);
            add(&mut w, &n("ssm_dt.bias"), &[V_HEADS]);
            if Some(n("ssm_a").as_str()) != skip {
                // -exp(A_log): negative, so the state decays.
                w.tensor_values(&n("ssm_a"), &[V_HEADS], vec![-0.1, -0.3, -0.7, -1.5]);
            }
            add(&mut w, &n("ssm_beta.weight"), &[E, V_HEADS]);
            add(&mut w, &n("ssm_alpha.weight"), &[E, V_HEADS]);
            add(&mut w, &n("ssm_norm.weight"), &[STATE]);
            add(&mut w, &n("ssm_out.weight"), &[inner, E]);
        } else {
            add(&mut w, &n("attn_q.weight"), &[E, 2 * HEADS * HD]);
            add(&mut w, &n("attn_k.weight"), &[E, KV_HEADS * HD]);
            add(&mut w, &n("attn_v.weight"), &[E, KV_HEADS * HD]);
            add(&mut w, &n("attn_q_norm.weight"), &[HD]);
            add(&mut w, &n("attn_k_norm.weight"), &[HD]);
            add(&mut w, &n("attn_output.weight"), &[HEADS * HD, E]);
        }
        add(&mut w, &n("ffn_gate_inp.weight"), &[E, EXPERTS]);
        add(&mut w, &n("ffn_gate_exps.weight"), &[E, FF_EXP, EXPERTS]);
        add(&mut w, &n("ffn_up_exps.weight"), &[E, FF_EXP, EXPERTS]);
        add(&mut w, &n("ffn_down_exps.weight"), &[FF_EXP, E, EXPERTS]);
        add(&mut w, &n("ffn_gate_shexp.weight"), &[E, FF_EXP]);
        add(&mut w, &n("ffn_up_shexp.weight"), &[E, FF_EXP]);
        add(&mut w, &n("ffn_down_shexp.weight"), &[FF_EXP, E]);
        add(&mut w, &n("ffn_gate_inp_shexp.weight"), &[E]);
    }
    if mtp {
        // The converter's MTP block: a gated-attention block with the experts, plus
        // the projection of (embedding ; hidden state) and its norms.
        let n = |s: &str| format!("blk.{LAYERS}.{s}");
        for (name, shape) in [
            ("nextn.eh_proj.weight", vec![2 * E, E]),
            ("nextn.enorm.weight", vec![E]),
            ("nextn.hnorm.weight", vec![E]),
            ("nextn.shared_head_norm.weight", vec![E]),
            ("attn_norm.weight", vec![E]),
            ("post_attention_norm.weight", vec![E]),
            ("attn_q.weight", vec![E, 2 * HEADS * HD]),
            ("attn_k.weight", vec![E, KV_HEADS * HD]),
            ("attn_v.weight", vec![E, KV_HEADS * HD]),
            ("attn_q_norm.weight", vec![HD]),
            ("attn_k_norm.weight", vec![HD]),
            ("attn_output.weight", vec![HEADS * HD, E]),
            ("ffn_gate_inp.weight", vec![E, EXPERTS]),
            ("ffn_gate_exps.weight", vec![E, FF_EXP, EXPERTS]),
            ("ffn_up_exps.weight", vec![E, FF_EXP, EXPERTS]),
            ("ffn_down_exps.weight", vec![FF_EXP, E, EXPERTS]),
            ("ffn_gate_shexp.weight", vec![E, FF_EXP]),
            ("ffn_up_shexp.weight", vec![E, FF_EXP]),
            ("ffn_down_shexp.weight", vec![FF_EXP, E]),
            ("ffn_gate_inp_shexp.weight", vec![E]),
        ] {
            add(&mut w, &n(name), &shape);
        }
    }
    w.finish()
}

fn load(bytes: Vec<u8>) -> Result<Arc<Model>, ModelError> {
    let f = Arc::new(GgufFile::from_bytes(bytes)?);
    Model::from_gguf(f, LoadOptions::new(Device::cpu())).map(Arc::new)
}

/// A KV store with 256 cells of attention and 8 state slots.
fn new_kv(model: &Model) -> Arc<KvStore> {
    model.new_kv(&model.cache_groups(false), &[256, 8]).unwrap()
}

/// A sequence's part of a step: `tokens` at positions `start..`, its K/V in cells
/// `base + position` of a window of `base..base + 64`, its state in `slot`.
struct Part<'t> {
    tokens: &'t [u32],
    start: usize,
    base: usize,
    slot: usize,
    /// Also write the state this many rows before the end into that slot.
    snapshot: Option<StateSnapshot>,
    /// Continues the previous part's sequence (see [`SeqSpan::continues`]).
    continues: bool,
}

/// Runs one step of `parts`; returns every row's logits.
fn step(model: &Arc<Model>, kv: &Arc<KvStore>, parts: &[Part<'_>]) -> Vec<Vec<f32>> {
    step_with(model, kv, parts, false)
}

/// [`step`], with batch-invariant numbers when `invariant` (see
/// [`StepBatch::batch_invariant`]).
fn step_with(
    model: &Arc<Model>,
    kv: &Arc<KvStore>,
    parts: &[Part<'_>],
    invariant: bool,
) -> Vec<Vec<f32>> {
    let mut b = StepBatch {
        kv_slots: vec![Vec::new(), Vec::new()],
        batch_invariant: invariant,
        ..StepBatch::default()
    };
    for p in parts {
        let row_start = b.tokens.len();
        let mut mask = MaskBuilder::new(64, p.tokens.len());
        for (j, &t) in p.tokens.iter().enumerate() {
            let pos = p.start + j;
            b.tokens.push(t);
            b.positions.push(pos as i32);
            b.kv_slots[0].push((p.base + pos) as i64);
            b.kv_slots[1].push(p.slot as i64);
            mask.allow_prefix(j, pos as i32, None);
        }
        b.seqs.push(SeqSpan {
            row_start,
            n_rows: p.tokens.len(),
            views: vec![
                KvView {
                    window: vec![CellRun {
                        start: p.base,
                        len: 64,
                    }],
                    mask: mask.into_data(),
                    mask_swa: None,
                },
                KvView {
                    window: vec![CellRun {
                        start: p.slot,
                        len: 1,
                    }],
                    mask: Vec::new(),
                    mask_swa: None,
                },
            ],
            tiled_prompt: false,
            state_snapshot: p.snapshot,
            continues: p.continues,
        });
    }
    b.output_rows = (0..b.tokens.len() as i32).collect();
    let mut exec = tempo9_models::Executor::new(Device::cpu(), 1).unwrap();
    let l = model.forward(&mut exec, kv, &b).unwrap();
    l.chunks(VOCAB).map(|c| c.to_vec()).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const PROMPT: [u32; 20] = [
    3, 77, 12, 90, 5, 41, 41, 8, 100, 63, 2, 19, 127, 54, 33, 7, 88, 61, 25, 9,
];

#[test]
fn loads_into_full_and_recurrent_groups() {
    let model = load(tiny(|_| {}, None)).expect("load");
    let hp = model.hparams();
    assert_eq!(hp.is_recurrent, vec![true, true, true, false]);
    let groups = model.cache_groups(false);
    assert_eq!(groups.len(), 2);
    assert_eq!(
        (groups[0].kind.clone(), groups[0].layers.clone()),
        (GroupKind::Full, vec![3])
    );
    assert_eq!(
        (groups[1].kind.clone(), groups[1].layers.clone()),
        (GroupKind::Recurrent, vec![0, 1, 2])
    );
    let kv = new_kv(&model);
    let ssm = hp.ssm.unwrap();
    // One slot: per recurrent layer, a convolution and a delta-rule state in F32.
    assert_eq!(
        kv.cells_bytes(1, 1),
        3 * 4 * (ssm.conv_state_len() + ssm.ssm_state_len())
    );
}

/// The recurrent state carries a prompt across steps: computed in one step, in
/// chunks or token by token, its last token's logits agree (to float rounding of
/// matmuls over different row counts), and so does every row along the way.
#[test]
fn chunked_prompt_matches_one_step() {
    let model = load(tiny(|_| {}, None)).expect("load");
    let whole = {
        let kv = new_kv(&model);
        step(
            &model,
            &kv,
            &[Part {
                tokens: &PROMPT,
                start: 0,
                base: 0,
                slot: 2,
                snapshot: None,
                continues: false,
            }],
        )
    };
    let mut worst = 0f32;
    for chunks in [vec![7, 7, 6], vec![1; 20], vec![19, 1]] {
        let kv = new_kv(&model);
        let mut at = 0;
        for n in &chunks {
            let rows = step(
                &model,
                &kv,
                &[Part {
                    tokens: &PROMPT[at..at + n],
                    start: at,
                    base: 0,
                    slot: 2,
                    snapshot: None,
                    continues: false,
                }],
            );
            for (j, r) in rows.iter().enumerate() {
                let d = max_diff(r, &whole[at + j]);
                worst = worst.max(d);
                assert!(d < 1e-4, "chunks {chunks:?}: row {} differs by {d}", at + j);
            }
            at += n;
        }
    }
    // And the states matter: without them (a fresh slot each chunk) the rows differ.
    let kv = new_kv(&model);
    step(
        &model,
        &kv,
        &[Part {
            tokens: &PROMPT[..10],
            start: 0,
            base: 0,
            slot: 2,
            snapshot: None,
            continues: false,
        }],
    );
    kv.clear_cells(1, 2, 1).unwrap();
    let rows = step(
        &model,
        &kv,
        &[Part {
            tokens: &PROMPT[10..],
            start: 10,
            base: 0,
            slot: 2,
            snapshot: None,
            continues: false,
        }],
    );
    let d = max_diff(&rows[9], &whole[19]);
    eprintln!("chunked vs one step: {worst:.2e}; without the state: {d:.2e}");
    assert!(
        d > 1e-3 && d > 100.0 * worst,
        "the state made no difference"
    );
}

/// A state snapshot keeps, in another slot, the state as it was some rows before
/// the end of a chunk: what computing the chunk only up to there leaves (to float
/// rounding of matmuls over different row counts), for two sequences of one op.
#[test]
fn a_snapshot_keeps_the_state_of_a_row_inside_the_chunk() {
    let model = load(tiny(|_| {}, None)).expect("load");
    let other: Vec<u32> = PROMPT.iter().map(|t| (t * 7 + 3) % VOCAB as u32).collect();
    let floats = |kv: &KvStore, slot: usize| -> Vec<f32> {
        kv.read_cells(1, slot, 1)
            .unwrap()
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let kv = new_kv(&model);
    let snap = |slot: u32, back: usize| Some(StateSnapshot { slot, back });
    step(
        &model,
        &kv,
        &[
            Part {
                tokens: &PROMPT,
                start: 0,
                base: 0,
                slot: 2,
                snapshot: snap(5, 6),
                continues: false,
            },
            Part {
                tokens: &other,
                start: 0,
                base: 64,
                slot: 3,
                snapshot: snap(6, 3),
                continues: false,
            },
        ],
    );
    for (tokens, back, slot) in [(&PROMPT[..], 6, 5), (&other[..], 3, 6)] {
        let alone = new_kv(&model);
        step(
            &model,
            &alone,
            &[Part {
                tokens: &tokens[..20 - back],
                start: 0,
                base: 0,
                slot: 1,
                snapshot: None,
                continues: false,
            }],
        );
        let (want, got) = (floats(&alone, 1), floats(&kv, slot));
        let d = max_diff(&want, &got);
        eprintln!("snapshot {back} rows back: {d:.2e} from the state of a chunk ending there");
        assert!(d < 1e-4, "snapshot {back} rows back differs by {d}");
        assert!(want.iter().any(|&x| x != 0.0), "an empty state");
    }
    // The final states are the chunks' own, not the snapshots.
    assert!(max_diff(&floats(&kv, 2), &floats(&kv, 5)) > 1e-3);
}

/// A sequence's rows as one-row spans that continue each other (how the engine
/// verifies drafts) compute bit for bit what decoding them one step at a time
/// computes: each row attends alone, and the state walks through the rows in
/// order; each span's snapshot keeps the state after its row, and the last leaves
/// the final state in the sequence's slot. Batched beside a plain prompt chunk,
/// with batch-invariant numbers (as the engine verifies drafts).
#[test]
fn continuing_spans_compute_what_one_row_steps_compute() {
    let model = load(tiny(|_| {}, None)).expect("load");
    let floats = |kv: &KvStore, slot: usize| -> Vec<f32> {
        kv.read_cells(1, slot, 1)
            .unwrap()
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    fn one(tokens: &[u32], start: usize) -> Part<'_> {
        Part {
            tokens,
            start,
            base: 0,
            slot: 2,
            snapshot: None,
            continues: false,
        }
    }
    // The prompt's first 15 tokens in one step, then 5 one-row steps.
    let (head, rows) = (15, 5);
    let steps = new_kv(&model);
    step_with(&model, &steps, &[one(&PROMPT[..head], 0)], true);
    let mut want = Vec::new();
    let mut want_states = Vec::new();
    for at in head..head + rows {
        want.push(step_with(&model, &steps, &[one(&PROMPT[at..at + 1], at)], true).remove(0));
        want_states.push(floats(&steps, 2));
    }
    // The same prompt head, then the 5 rows as continuing spans in one step, after
    // another sequence's chunk.
    let kv = new_kv(&model);
    step_with(&model, &kv, &[one(&PROMPT[..head], 0)], true);
    let other: Vec<u32> = PROMPT.iter().map(|t| (t * 5 + 1) % VOCAB as u32).collect();
    let mut parts = vec![Part {
        tokens: &other[..9],
        start: 0,
        base: 64,
        slot: 3,
        snapshot: None,
        continues: false,
    }];
    for (j, at) in (head..head + rows).enumerate() {
        parts.push(Part {
            snapshot: (j + 1 < rows).then_some(StateSnapshot {
                slot: 4 + j as u32,
                back: 0,
            }),
            continues: j > 0,
            ..one(&PROMPT[at..at + 1], at)
        });
    }
    let got = step_with(&model, &kv, &parts, true);
    for j in 0..rows {
        assert_eq!(got[9 + j], want[j], "row {j} of the continuing spans");
        let state = if j + 1 < rows { 4 + j } else { 2 };
        assert_eq!(floats(&kv, state), want_states[j], "state after row {j}");
    }
    assert!(max_diff(&want_states[0], &want_states[rows - 1]) > 1e-3);
}

/// Sequences in one step (a prompt chunk, a decode row, another chunk) each read
/// and write only their own state slot and cells: each gets what it gets alone.
#[test]
fn batched_sequences_keep_their_own_states() {
    let model = load(tiny(|_| {}, None)).expect("load");
    let (a, b, c) = (&PROMPT[..9], &PROMPT[4..5], &PROMPT[6..18]);
    let alone = |tokens: &[u32], slot| {
        let kv = new_kv(&model);
        step(
            &model,
            &kv,
            &[Part {
                tokens,
                start: 0,
                base: 64 * slot,
                slot,
                snapshot: None,
                continues: false,
            }],
        )
    };
    let want = [alone(a, 0), alone(b, 1), alone(c, 3)];
    let kv = new_kv(&model);
    let got = step(
        &model,
        &kv,
        &[
            Part {
                tokens: a,
                start: 0,
                base: 0,
                slot: 0,
                snapshot: None,
                continues: false,
            },
            Part {
                tokens: b,
                start: 0,
                base: 64,
                slot: 1,
                snapshot: None,
                continues: false,
            },
            Part {
                tokens: c,
                start: 0,
                base: 192,
                slot: 3,
                snapshot: None,
                continues: false,
            },
        ],
    );
    let mut row = 0;
    let mut worst = 0f32;
    for w in &want {
        for r in w {
            worst = worst.max(max_diff(r, &got[row]));
            row += 1;
        }
    }
    eprintln!("batched vs alone: max |logit difference| {worst:.2e}");
    assert!(worst < 1e-4, "batched rows differ by {worst}");
    // Then each continues by one decode row, all three in one step (one state op).
    let next = step(
        &model,
        &kv,
        &[
            Part {
                tokens: &[11],
                start: 9,
                base: 0,
                slot: 0,
                snapshot: None,
                continues: false,
            },
            Part {
                tokens: &[12],
                start: 1,
                base: 64,
                slot: 1,
                snapshot: None,
                continues: false,
            },
            Part {
                tokens: &[13],
                start: 12,
                base: 192,
                slot: 3,
                snapshot: None,
                continues: false,
            },
        ],
    );
    let cont = |tokens: &[u32], t: u32, slot: usize| {
        let kv = new_kv(&model);
        step(
            &model,
            &kv,
            &[Part {
                tokens,
                start: 0,
                base: 64 * slot,
                slot,
                snapshot: None,
                continues: false,
            }],
        );
        step(
            &model,
            &kv,
            &[Part {
                tokens: &[t],
                start: tokens.len(),
                base: 64 * slot,
                slot,
                snapshot: None,
                continues: false,
            }],
        )
    };
    for (i, (toks, t, slot)) in [(a, 11, 0), (b, 12, 1), (c, 13, 3)].into_iter().enumerate() {
        let d = max_diff(&next[i], &cont(toks, t, slot)[0]);
        assert!(d < 1e-4, "decode row {i} differs by {d}");
    }
}

#[test]
fn malformed_files_name_the_key_or_tensor() {
    let err = |bytes| load(bytes).err().expect("must fail").to_string();
    let e = err(tiny(|_| {}, Some("blk.1.ssm_a")));
    assert!(e.contains("blk.1.ssm_a"), "{e}");
    let e = err(tiny(|_| {}, Some("blk.3.attn_q_norm.weight")));
    assert!(e.contains("blk.3.attn_q_norm.weight"), "{e}");
    let e = err(tiny(|w| w.u32("qwen35moe.expert_used_count", 9), None));
    assert!(e.contains("expert"), "{e}");
    let e = err(tiny(|w| w.u32("qwen35moe.ssm.inner_size", 60), None));
    assert!(e.contains("inner_size"), "{e}");
    let e = err(tiny(
        |w| w.u32("qwen35moe.full_attention_interval", 0),
        None,
    ));
    assert!(e.contains("full_attention_interval"), "{e}");
}

/// A file with an MTP block loads it (a missing tensor of it is named), keeps it out
/// of the trunk (4 layers, same cache groups) and computes what the file without it
/// computes.
#[test]
fn mtp_blocks_load_and_leave_the_trunk_alone() {
    let plain = load(tiny(|_| {}, None)).expect("load");
    let with = load(tiny_mtp(true, |_| {}, None)).expect("load with MTP");
    assert_eq!(
        (with.hparams().n_layer, with.hparams().n_nextn),
        (LAYERS, 1)
    );
    assert_eq!(with.cache_groups(false), plain.cache_groups(false));
    let run = |m: &Arc<Model>| {
        let kv = new_kv(m);
        step(
            m,
            &kv,
            &[Part {
                tokens: &PROMPT,
                start: 0,
                base: 0,
                slot: 0,
                snapshot: None,
                continues: false,
            }],
        )
    };
    assert_eq!(run(&with), run(&plain));
    let e = load(tiny_mtp(true, |_| {}, Some("blk.4.nextn.eh_proj.weight")))
        .err()
        .expect("must fail")
        .to_string();
    assert!(e.contains("blk.4.nextn.eh_proj.weight"), "{e}");
}
