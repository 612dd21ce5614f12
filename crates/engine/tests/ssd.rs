//! The SSD tier on a real model (SmolLM2-135M): eight agents with distinct long
//! histories taking turns through a RAM KV budget a small fraction of what they
//! need; greedy outputs equal an unlimited-RAM run, prefixes come back from disk,
//! and RSS stays within the budget plus a fixed overhead. Fault tests: corrupted
//! page files, a truncated index and a full disk all end in recompute with the
//! same outputs. Persistence: a second engine finds the first one's pages.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use tempo9_engine::{EngineConfig, EngineCore, EngineStats, Request, SsdConfig};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

const N_AGENTS: usize = 8;
const N_GEN: usize = 8;
/// RAM pages (64 tokens each) of the tight engines: about a seventh of the workload.
const TIGHT_PAGES: usize = 16;

fn smollm2() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let model = load(MODELS[0].1)?;
    let tok = tokenizer(&model);
    Some((model, tok))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tempo9-ssd-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn ssd_cfg(dir: &Path, persist: bool) -> SsdConfig {
    SsdConfig {
        budget_bytes: 4 << 30,
        persist,
        ..SsdConfig::new(dir)
    }
}

fn engine(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    kv_bytes: usize,
    ssd: Option<SsdConfig>,
) -> EngineCore {
    let cfg = EngineConfig {
        // Outputs are compared bit for bit across batch compositions.
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(kv_bytes),
        ssd,
        ..EngineConfig::default()
    };
    EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine")
}

fn page_bytes(model: &Arc<Model>) -> usize {
    let hp = model.hparams();
    64 * hp.n_layer * (hp.n_embd_k() + hp.n_embd_v()) * 2
}

/// Reproducible distinct token sequences (ordinary vocabulary ids).
struct Rng(u64);
impl Rng {
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                1000 + (self.0 % 30000) as u32
            })
            .collect()
    }
}

fn greedy(prompt: Vec<u32>) -> Request {
    let mut r = Request::new(prompt, N_GEN);
    r.stop.eog = false;
    r
}

/// Runs `prompts` together, checking the engine's invariants after every step.
fn run(core: &mut EngineCore, prompts: &[Vec<u32>]) -> Vec<Output> {
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p| core.submit(greedy(p.clone())).expect("submit"))
        .collect();
    while core.has_work() {
        core.step().expect("step");
        core.check_invariants().expect("invariants");
    }
    let out: Vec<Output> = streams.iter_mut().map(collect).collect();
    for o in &out {
        assert_eq!(o.tokens.len(), N_GEN, "{:?}", o.finish);
    }
    out
}

/// The workload: agents with histories of 400..680 tokens (short enough for two
/// cores; the benchmark runs 4K). Turn 1: each agent's
/// history alone, one agent after another; turn 2: history + answer + a new
/// message, again one after another; turn 3: all agents at once (preemption and
/// swapping under the tight budget).
struct Workload {
    histories: Vec<Vec<u32>>,
    rng: Rng,
}

impl Workload {
    fn new() -> Workload {
        let mut rng = Rng(0x5eed_1234_abcd_9876);
        let histories = (0..N_AGENTS).map(|i| rng.tokens(400 + 40 * i)).collect();
        Workload { histories, rng }
    }

    fn next_turn(&mut self, prev: &[Vec<u32>], out: &[Output]) -> Vec<Vec<u32>> {
        prev.iter()
            .zip(out)
            .map(|(p, o)| {
                let mut q = p.clone();
                q.extend(&o.tokens);
                q.extend(self.rng.tokens(40));
                q
            })
            .collect()
    }
}

/// Runs the three turns; returns every output and the prompts of each turn.
fn three_turns(core: &mut EngineCore) -> (Vec<Vec<Output>>, Vec<Vec<Vec<u32>>>) {
    let mut w = Workload::new();
    let t1 = w.histories.clone();
    let o1: Vec<Output> = t1
        .iter()
        .flat_map(|p| run(core, std::slice::from_ref(p)))
        .collect();
    let t2 = w.next_turn(&t1, &o1);
    let o2: Vec<Output> = t2
        .iter()
        .flat_map(|p| run(core, std::slice::from_ref(p)))
        .collect();
    let t3 = w.next_turn(&t2, &o2);
    let o3 = run(core, &t3);
    (vec![o1, o2, o3], vec![t1, t2, t3])
}

fn tokens(o: &[Output]) -> Vec<Vec<u32>> {
    o.iter().map(|o| o.tokens.clone()).collect()
}

/// (current, peak) resident set of this process in bytes.
fn rss() -> (usize, usize) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

fn page_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "page"))
                .collect()
        })
        .unwrap_or_default()
}

fn report(what: &str, s: &EngineStats) {
    let x = &s.ssd;
    eprintln!(
        "{what}: RAM pages {} (cached {}), prefix hits RAM {} tok, SSD {} tok ({} pages); \
         SSD {} pages {:.1} MiB; written {} pages {:.1} MiB in {:.2} s, read {} pages {:.1} MiB in {:.2} s; \
         read errors {}, write errors {}, dropped {}; computed {} tokens, {} preemptions",
        s.kv_pages_total,
        s.kv_pages_cached,
        s.prefix_hit_tokens,
        x.hit_tokens,
        x.hit_pages,
        x.pages,
        x.bytes as f64 / (1 << 20) as f64,
        x.write_pages,
        x.write_bytes as f64 / (1 << 20) as f64,
        x.write_secs,
        x.read_pages,
        x.read_bytes as f64 / (1 << 20) as f64,
        x.read_secs,
        x.read_errors,
        x.write_errors,
        x.writes_dropped,
        s.computed_tokens_total,
        s.preemptions_total,
    );
}

#[test]
fn agents_take_turns_through_a_tight_ram_budget_and_faults_recompute() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let pb = page_bytes(&model);
    let tight = TIGHT_PAGES * pb;
    let dir = tmp("agents");

    // Warm up (weights resident), then measure the tight run's memory first.
    run(&mut engine(&model, &tok, 16 * pb, None), &[vec![1000; 70]]);
    let (rss0, _) = rss();
    let mut ssd = engine(&model, &tok, tight, Some(ssd_cfg(&dir, true)));
    let t = std::time::Instant::now();
    let (got, prompts) = three_turns(&mut ssd);
    let secs_ssd = t.elapsed().as_secs_f64();
    let (_, peak) = rss();
    let st = ssd.stats();
    report("tight RAM + SSD", &st);
    let tier_dir = ssd.ssd_dir().expect("tier on").to_path_buf();
    let need: usize = prompts[2].iter().map(|p| p.len().div_ceil(64)).sum();
    eprintln!(
        "workload needs {need} pages, RAM budget {TIGHT_PAGES} pages ({:.1} MiB); \
         RSS growth {:.1} MiB over {:.1} MiB; {secs_ssd:.1} s",
        tight as f64 / (1 << 20) as f64,
        peak.saturating_sub(rss0) as f64 / (1 << 20) as f64,
        rss0 as f64 / (1 << 20) as f64,
    );
    assert!(TIGHT_PAGES * 4 < need, "the budget is a small fraction");
    assert_eq!(
        st.kv_pages_total, TIGHT_PAGES,
        "RAM pages never exceed the budget"
    );
    assert!(st.ssd.hit_pages > 0, "prefixes came back from disk: {st:?}");
    assert!(st.preemptions_total > 0, "turn 3 swaps requests out");
    assert_eq!(st.ssd.read_errors + st.ssd.write_errors, 0);
    // Fixed overhead: compute buffers, the bounded write queue, read buffers.
    let overhead = 256 << 20;
    assert!(
        peak.saturating_sub(rss0) < tight + overhead,
        "RSS grew {} bytes, budget {tight} + overhead {overhead}",
        peak - rss0
    );
    drop(ssd); // persists the RAM cache and the index

    // Unlimited RAM: the reference.
    let mut big = engine(&model, &tok, 512 << 20, None);
    let t = std::time::Instant::now();
    let (want, _) = three_turns(&mut big);
    let secs_big = t.elapsed().as_secs_f64();
    report("unlimited RAM", &big.stats());
    eprintln!("unlimited: {secs_big:.1} s");
    for turn in 0..3 {
        assert_eq!(tokens(&got[turn]), tokens(&want[turn]), "turn {}", turn + 1);
    }
    let recompute_tokens = big.stats().computed_tokens_total;
    drop(big);

    // Persistence: a new engine serves turn 2's prompts from the first one's pages.
    let mut again = engine(&model, &tok, tight, Some(ssd_cfg(&dir, true)));
    let out = run(&mut again, &prompts[1][..2]);
    assert_eq!(tokens(&out), tokens(&want[1][..2]));
    let st = again.stats();
    report("restarted", &st);
    assert!(
        st.ssd.hit_tokens as usize * 2 > prompts[1][..2].iter().map(Vec::len).sum::<usize>(),
        "a restart serves most of the prompts from disk"
    );
    assert!(st.computed_tokens_total < recompute_tokens / 4);
    drop(again);

    // Corrupted page files: every page fails its checksum; outputs are recomputed.
    let files = page_files(&tier_dir);
    assert!(!files.is_empty());
    for f in &files {
        let mut b = std::fs::read(f).unwrap();
        let n = b.len();
        b[n - 100] ^= 0x5a;
        std::fs::write(f, b).unwrap();
    }
    let mut corrupt = engine(&model, &tok, tight, Some(ssd_cfg(&dir, true)));
    let out = run(&mut corrupt, &prompts[1][..2]);
    assert_eq!(tokens(&out), tokens(&want[1][..2]), "corrupt pages");
    let st = corrupt.stats();
    report("corrupted pages", &st);
    assert!(st.ssd.read_errors > 0);
    assert_eq!(st.ssd.hit_pages, 0);
    drop(corrupt);

    // A truncated index: the tier starts empty; outputs are recomputed.
    let index = tier_dir.join("index.bin");
    let b = std::fs::read(&index).expect("index written on shutdown");
    std::fs::write(&index, &b[..b.len() / 2]).unwrap();
    let mut truncated = engine(&model, &tok, tight, Some(ssd_cfg(&dir, true)));
    let out = run(&mut truncated, &prompts[1][2..4]);
    assert_eq!(tokens(&out), tokens(&want[1][2..4]), "truncated index");
    let st = truncated.stats();
    report("truncated index", &st);
    assert_eq!((st.ssd.hit_pages, st.ssd.read_errors), (0, 0));
    drop(truncated);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn full_disk_and_zero_budget_recompute() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let pb = page_bytes(&model);
    let mut w = Workload::new();
    let prompts: Vec<Vec<u32>> = w.histories.drain(..2).collect();
    let mut big = engine(&model, &tok, 256 << 20, None);
    let o1 = run(&mut big, &prompts);
    let second = w.next_turn(&prompts, &o1);
    let want = run(&mut big, &second);
    drop(big);

    // Tight RAM without an SSD tier first: the control.
    for (name, fail_writes, budget) in [
        ("no-ssd", false, None),
        ("disk-full", true, Some(4u64 << 30)),
        ("zero-budget", false, Some(0)),
    ] {
        let dir = tmp(name);
        let cfg = budget.map(|budget_bytes| SsdConfig {
            budget_bytes,
            fail_writes,
            ..ssd_cfg(&dir, false)
        });
        let with_ssd = cfg.is_some();
        // Ten pages: the second agent's history evicts the first one's pages.
        let mut core = engine(&model, &tok, 10 * pb, cfg);
        for p in &prompts {
            run(&mut core, std::slice::from_ref(p));
        }
        core.flush_ssd();
        let got: Vec<Output> = second
            .iter()
            .flat_map(|p| run(&mut core, std::slice::from_ref(p)))
            .collect();
        assert_eq!(tokens(&got), tokens(&want), "{name}");
        // Let the last evictions' writes finish (or fail) before counting.
        core.flush_ssd();
        let st = core.stats();
        report(name, &st);
        assert_eq!(st.ssd.hit_pages, 0);
        assert_eq!(st.ssd.pages, 0);
        if !with_ssd {
            assert_eq!(st.ssd, Default::default());
        } else if fail_writes {
            assert!(st.ssd.write_errors > 0);
        } else {
            assert!(st.ssd.writes_dropped > 0);
        }
        drop(core);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
