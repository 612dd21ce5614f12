//! The fuzz targets on stable: each target gets its committed seed corpus
//! (`fuzz/corpus/<target>/`, where `scripts/fuzz.sh` also keeps what libFuzzer
//! found), the seeds built in code, and seeded mutations of them, within a count
//! and a time cap. A failure prints the input to reproduce it with.

use std::path::Path;
use std::time::{Duration, Instant};

use tempo9_fuzz_targets::{generated_seeds, mutate, Rng, TARGETS};

/// Mutated inputs per target (and a time cap: the machine may be shared).
const MUTATIONS: usize = 3000;
const TIME_CAP: Duration = Duration::from_secs(12);

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut seeds: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    seeds.extend(generated_seeds(target));
    assert!(!seeds.is_empty(), "no seeds for {target}");
    seeds
}

fn run(name: &str) {
    let (_, target) = TARGETS.iter().find(|(n, _)| *n == name).expect("target");
    let seeds = corpus(name);
    let check = |input: &[u8]| {
        let r = std::panic::catch_unwind(|| target(input));
        if r.is_err() {
            panic!(
                "{name} failed on input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    };
    for s in &seeds {
        check(s);
    }
    let mut rng = Rng(0x7e39_0900 ^ name.len() as u64);
    let t = Instant::now();
    let mut n = 0;
    while n < MUTATIONS && t.elapsed() < TIME_CAP {
        let seed = &seeds[rng.below(seeds.len())];
        let mut input = mutate(&mut rng, seed);
        if rng.below(4) == 0 {
            input = mutate(&mut rng, &input);
        }
        check(&input);
        n += 1;
    }
    eprintln!(
        "{name}: {} seeds, {n} mutations in {:.1} s",
        seeds.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(
        n >= 100,
        "{name}: only {n} mutations ran within {TIME_CAP:?}"
    );
}

#[test]
fn gguf() {
    run("gguf");
}

#[test]
fn tokenizer() {
    run("tokenizer");
}

#[test]
fn chat_template() {
    run("chat_template");
}

#[test]
fn requests() {
    run("requests");
}

#[test]
fn tool_parsers() {
    run("tool_parsers");
}

#[test]
fn json_schema() {
    run("json_schema");
}

#[test]
fn ssd_files() {
    run("ssd_files");
}

#[test]
fn every_target_has_a_test_and_a_corpus() {
    for (name, _) in TARGETS {
        assert!(!corpus(name).is_empty());
        let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets");
        assert!(
            fuzz.join(format!("{name}.rs")).exists(),
            "fuzz/fuzz_targets/{name}.rs"
        );
    }
}
