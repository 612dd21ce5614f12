//! The SSD tier's files: a persistent tier left by a previous run (an index and
//! page files) with one of its files replaced by arbitrary bytes, opened again.

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use tempo9_engine::pages::{page_hash, EvictedPage, ROOT_HASH};
use tempo9_engine::ssd::{checksum, SsdConfig, SsdTier};

const PT: usize = 4;
const PB: usize = 64;
const MODEL: u64 = 42;
const PAGES: usize = 3;

/// A tier as a clean shutdown leaves it: its files by name, and the pages' hashes
/// and contents.
struct Pristine {
    files: Vec<(String, Vec<u8>)>,
    hashes: Vec<u64>,
    data: Vec<Vec<u8>>,
}

fn config(dir: PathBuf) -> SsdConfig {
    SsdConfig {
        dir,
        budget_bytes: 1 << 20,
        persist: true,
        max_pending_bytes: 1 << 20,
        fail_writes: false,
    }
}

fn scratch(name: &str) -> PathBuf {
    let t = std::thread::current().id();
    std::env::temp_dir().join(format!(
        "tempo9-fuzz-ssd-{}-{t:?}-{name}",
        std::process::id()
    ))
}

fn pristine() -> &'static Pristine {
    static P: OnceLock<Pristine> = OnceLock::new();
    P.get_or_init(|| {
        let dir = scratch("pristine");
        let _ = fs::remove_dir_all(&dir);
        let mut t = SsdTier::open(config(dir.clone()), MODEL, PT, PB, page_hash).expect("tier");
        let (mut parent, mut hashes, mut data) = (ROOT_HASH, Vec::new(), Vec::new());
        for i in 0..PAGES {
            let tokens: Vec<u32> = (0..PT as u32).map(|j| i as u32 * 10 + j).collect();
            let hash = page_hash(parent, 0, &tokens);
            let page = EvictedPage {
                page: i as _,
                hash,
                parent_hash: parent,
                salt: 0,
                tokens: tokens.into(),
            };
            let d: Vec<u8> = (0..PB).map(|j| (i * 31 + j) as u8).collect();
            t.save_wait(&page, d.clone());
            parent = hash;
            hashes.push(hash);
            data.push(d);
        }
        let tier_dir = t.dir().to_path_buf();
        drop(t);
        let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&tier_dir)
            .expect("tier dir")
            .map(|e| e.expect("entry"))
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| {
                let bytes = fs::read(e.path()).expect("tier file");
                (e.file_name().to_string_lossy().into_owned(), bytes)
            })
            .collect();
        files.sort();
        let _ = fs::remove_dir_all(&dir);
        assert!(files.iter().any(|(n, _)| n == "index.bin"), "{files:?}");
        Pristine {
            files,
            hashes,
            data,
        }
    })
}

/// Byte 0 picks the file to replace (the index, with or without a valid checksum
/// over the new bytes, or a page file) and the rest are its new bytes. Opening must
/// not panic, every page must then load as it was saved or not at all, and the
/// load must finish.
pub fn ssd_files(input: &[u8]) {
    let Some((&mode, bytes)) = input.split_first() else {
        return;
    };
    let p = pristine();
    let dir = scratch("run");
    let _ = fs::remove_dir_all(&dir);
    let tier_dir = dir.join(format!("{MODEL:016x}"));
    fs::create_dir_all(&tier_dir).expect("scratch dir");
    let pages: Vec<&(String, Vec<u8>)> = p.files.iter().filter(|(n, _)| n != "index.bin").collect();
    let target = match mode % 4 {
        0 | 1 => "index.bin".to_string(),
        2 => pages[0].0.clone(),
        _ => pages[bytes.len() % pages.len()].0.clone(),
    };
    for (name, content) in &p.files {
        let new = if *name != target {
            content.clone()
        } else if mode % 4 == 0 {
            // The index with its checksum made valid: the parser proper is reached.
            let mut b = bytes.to_vec();
            let sum = checksum(0, &b);
            b.extend_from_slice(&sum.to_le_bytes());
            b
        } else if mode % 4 == 3 && bytes.len() < content.len() {
            // A page file with a stretch overwritten (keeps most of its header).
            let mut b = content.clone();
            let at = (mode as usize * 7) % (content.len() - bytes.len() + 1);
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        } else {
            bytes.to_vec()
        };
        fs::write(tier_dir.join(name), new).expect("write tier file");
    }
    if let Ok(mut t) = SsdTier::open(config(dir.clone()), MODEL, PT, PB, page_hash) {
        let st = t.stats();
        assert!(
            st.pages <= PAGES,
            "{} pages from an index of {PAGES}",
            st.pages
        );
        let id = t.start_load(&p.hashes);
        let mut got = None;
        for _ in 0..100 {
            if let Some(r) = t.wait().into_iter().find(|r| r.id == id) {
                got = Some(r);
                break;
            }
        }
        let r = got.expect("the load finishes");
        for (i, page) in r.pages.iter().enumerate() {
            if let Some(d) = page {
                assert_eq!(
                    **d, p.data[i],
                    "page {i} loaded with other bytes than saved"
                );
            }
        }
    }
    let _ = fs::remove_dir_all(&dir);
}
