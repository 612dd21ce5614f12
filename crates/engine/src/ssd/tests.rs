use super::*;
use crate::pages::{page_hash, ROOT_HASH};

const PT: usize = 4;
const PB: usize = 1000;

/// A scratch directory removed when dropped.
struct TmpDir(PathBuf);
impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tmpdir(name: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("tempo9-ssd-unit-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    TmpDir(d)
}

fn cfg(dir: &Path) -> SsdConfig {
    SsdConfig {
        dir: dir.to_path_buf(),
        budget_bytes: 1 << 20,
        persist: false,
        max_pending_bytes: 1 << 20,
        fail_writes: false,
    }
}

/// The evicted-page records of a chain of pages over `tokens`.
fn chain(tokens: &[TokenId]) -> Vec<EvictedPage> {
    let mut parent = ROOT_HASH;
    tokens
        .chunks_exact(PT)
        .enumerate()
        .map(|(i, t)| {
            let h = page_hash(parent, 0, t);
            let e = EvictedPage {
                page: i as u32,
                hash: h,
                parent_hash: parent,
                salt: 0,
                tokens: t.into(),
            };
            parent = h;
            e
        })
        .collect()
}

fn data(i: usize) -> Vec<u8> {
    (0..PB).map(|j| (i * 31 + j) as u8).collect()
}

fn open(c: SsdConfig) -> SsdTier {
    SsdTier::open(c, 42, PT, PB, page_hash).unwrap()
}

fn load_all(t: &mut SsdTier, hashes: &[u64]) -> LoadResult {
    let id = t.start_load(hashes);
    loop {
        if let Some(r) = t.wait().into_iter().find(|r| r.id == id) {
            return r;
        }
    }
}

#[test]
fn checksum_sees_every_byte_and_length() {
    let d: Vec<u8> = (0..1000).map(|i| (i * 7) as u8).collect();
    let h = checksum(0, &d);
    assert_eq!(h, checksum(0, &d));
    assert_ne!(h, checksum(1, &d));
    for i in [0, 31, 32, 500, 990, 999] {
        let mut e = d.clone();
        e[i] ^= 0x10;
        assert_ne!(h, checksum(0, &e), "byte {i}");
    }
    assert_ne!(checksum(0, &[0; 8]), checksum(0, &[0; 9]));
    assert_ne!(checksum(0, &[]), checksum(0, &[0]));
}

#[test]
fn saved_pages_are_found_and_read_back() {
    let dir = tmpdir("roundtrip");
    let mut t = open(cfg(&dir));
    let toks: Vec<TokenId> = (0..13).collect();
    let ch = chain(&toks);
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    // Served from the write queue's copy, then from disk.
    let hashes = t.continue_prefix(ROOT_HASH, 0, &toks, 10);
    assert_eq!(hashes, ch.iter().map(|e| e.hash).collect::<Vec<_>>());
    t.flush();
    t.drain_done();
    assert_eq!(t.stats().pending_pages, 0);
    assert_eq!(t.stats().write_pages, 3);
    let r = load_all(&mut t, &hashes);
    assert_eq!(r.n_ok(), 3);
    for (i, p) in r.pages.iter().enumerate() {
        assert_eq!(**p.as_ref().unwrap(), data(i));
    }
    assert_eq!(t.stats().read_pages, 3);
    // Partial matches stop at the first differing page.
    let mut other = toks.clone();
    other[5] = 99;
    assert_eq!(t.continue_prefix(ROOT_HASH, 0, &other, 10).len(), 1);
    assert_eq!(t.continue_prefix(ROOT_HASH, 1, &toks, 10).len(), 0);
    assert_eq!(t.continue_prefix(ch[0].hash, 0, &toks[4..], 10).len(), 2);
    let d = t.dir().to_path_buf();
    drop(t);
    assert!(!d.exists(), "a private tier is removed on shutdown");
}

#[test]
fn corrupt_missing_and_foreign_pages_fail_to_load() {
    let dir = tmpdir("corrupt");
    let mut t = open(cfg(&dir));
    let toks: Vec<TokenId> = (0..16).collect();
    let ch = chain(&toks);
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.flush();
    t.drain_done();
    let hashes: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    // Page 1: flip a payload byte. Page 2: delete. Page 3: another model's header.
    let p1 = t.page_path(hashes[1]);
    let mut b = fs::read(&p1).unwrap();
    let n = b.len();
    b[n - 10] ^= 1;
    fs::write(&p1, b).unwrap();
    fs::remove_file(t.page_path(hashes[2])).unwrap();
    let p3 = t.page_path(hashes[3]);
    let mut b = fs::read(&p3).unwrap();
    b[8] ^= 1; // model id
    fs::write(&p3, b).unwrap();
    let r = load_all(&mut t, &hashes);
    assert!(r.pages[0].is_some());
    assert!(r.pages[1..].iter().all(Option::is_none));
    assert_eq!(r.n_ok(), 1);
    assert_eq!(t.stats().read_errors, 3);
    // Truncated file.
    let p0 = t.page_path(hashes[0]);
    let b = fs::read(&p0).unwrap();
    fs::write(&p0, &b[..b.len() / 2]).unwrap();
    assert_eq!(load_all(&mut t, &hashes[..1]).n_ok(), 0);
}

#[test]
fn budget_keeps_most_recent_pages_and_zero_budget_writes_nothing() {
    let dir = tmpdir("budget");
    let file = Header {
        kind: Kind::Page,
        model_id: 0,
        hash: 0,
        parent_hash: 0,
        salt: 0,
        tokens: vec![0; PT].into(),
        payload_len: PB as u64,
    }
    .file_bytes();
    let mut c = cfg(&dir);
    c.budget_bytes = 2 * file;
    let mut t = open(c.clone());
    let toks: Vec<TokenId> = (0..16).collect();
    let ch = chain(&toks);
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    let s = t.stats();
    assert_eq!((s.pages, s.bytes, s.evicted_pages), (2, 2 * file, 2));
    assert!(!t.contains(ch[0].hash) && t.contains(ch[3].hash));
    t.flush();
    let n_files = fs::read_dir(t.dir())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "page"))
        .count();
    assert_eq!(n_files, 2);

    c.budget_bytes = 0;
    let mut t = open(c);
    t.save(&ch[0], data(0));
    assert_eq!(t.stats().pages, 0);
    assert_eq!(t.stats().writes_dropped, 1);
}

#[test]
fn write_failures_drop_pages() {
    let dir = tmpdir("fail");
    let mut c = cfg(&dir);
    c.fail_writes = true;
    let mut t = open(c);
    let ch = chain(&[1, 2, 3, 4, 5, 6, 7, 8]);
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.flush();
    t.drain_done();
    let s = t.stats();
    assert_eq!((s.pages, s.bytes, s.write_errors), (0, 0, 2));
    assert!(t.continue_prefix(ROOT_HASH, 0, &[1, 2, 3, 4], 1).is_empty());
}

#[test]
fn persistent_index_survives_and_a_bad_one_starts_empty() {
    let dir = tmpdir("persist");
    let mut c = cfg(&dir);
    c.persist = true;
    let toks: Vec<TokenId> = (0..12).collect();
    let ch = chain(&toks);
    let mut t = open(c.clone());
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    let tier_dir = t.dir().to_path_buf();
    drop(t);
    assert!(tier_dir.join(INDEX_FILE).exists());
    let mut t = open(c.clone());
    let hashes = t.continue_prefix(ROOT_HASH, 0, &toks, 10);
    assert_eq!(hashes.len(), 3);
    assert_eq!(load_all(&mut t, &hashes).n_ok(), 3);
    drop(t);
    // Another model id: its own directory, nothing found.
    let t = SsdTier::open(c.clone(), 43, PT, PB, page_hash).unwrap();
    assert!(t.continue_prefix(ROOT_HASH, 0, &toks, 10).is_empty());
    drop(t);
    // A truncated index: empty tier, page files removed.
    let idx = tier_dir.join(INDEX_FILE);
    let b = fs::read(&idx).unwrap();
    fs::write(&idx, &b[..b.len() - 5]).unwrap();
    let t = open(c);
    assert_eq!(t.stats().pages, 0);
    assert!(t.continue_prefix(ROOT_HASH, 0, &toks, 10).is_empty());
    let pages = fs::read_dir(&tier_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "page"))
        .count();
    assert_eq!(pages, 0);
    drop(t);
    drop(dir);
}

#[test]
fn cancelled_loads_are_not_reported() {
    let dir = tmpdir("cancel");
    let mut t = open(cfg(&dir));
    let ch = chain(&[1, 2, 3, 4]);
    t.save(&ch[0], data(0));
    t.flush();
    t.drain_done();
    let id = t.start_load(&[ch[0].hash]);
    t.cancel_load(id);
    t.flush();
    assert!(t.poll().is_empty());
    assert!(!t.has_loads());
}

/// Bytes of one state checkpoint in these tests (bigger than a page, as in real
/// models, so budget arithmetic mixes sizes).
const SB: usize = 1500;

fn sdata(i: usize) -> Vec<u8> {
    (0..SB).map(|j| (i * 17 + j * 3) as u8).collect()
}

fn open_s(c: SsdConfig) -> SsdTier {
    SsdTier::open_with_states(c, 42, PT, PB, SB, page_hash).unwrap()
}

fn page_file() -> u64 {
    Header {
        kind: Kind::Page,
        model_id: 0,
        hash: 0,
        parent_hash: 0,
        salt: 0,
        tokens: vec![0; PT].into(),
        payload_len: PB as u64,
    }
    .file_bytes()
}

fn state_file() -> u64 {
    Header::keyed(Kind::State, 0, 0, SB as u64).file_bytes()
}

fn load_with_state(t: &mut SsdTier, hashes: &[u64], state: u64) -> LoadResult {
    let id = t.start_load_with_state(hashes, Some(state));
    loop {
        if let Some(r) = t.wait().into_iter().find(|r| r.id == id) {
            return r;
        }
    }
}

fn files(dir: &Path, ext: &str) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == ext))
        .count()
}

#[test]
fn states_are_saved_and_read_back_beside_pages() {
    let dir = tmpdir("state-roundtrip");
    let mut t = open_s(cfg(&dir));
    let ch = chain(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let h = ch[1].hash;
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.save_state(h, sdata(1));
    // A page and the checkpoint after it share the hash but not the entry.
    assert!(t.contains(h) && t.contains_state(h));
    assert!(!t.contains_state(ch[0].hash));
    let s = t.stats();
    assert_eq!((s.pages, s.states, s.pending_states), (2, 1, 1));
    assert_eq!((s.bytes, s.state_bytes), (2 * page_file(), state_file()));
    // Served from the write queue's copy.
    let r = load_with_state(&mut t, &[], h);
    assert!(r.pages.is_empty());
    assert_eq!(**r.state.as_ref().unwrap(), sdata(1));
    t.flush();
    t.drain_done();
    let s = t.stats();
    assert_eq!((s.pending_states, s.write_states), (0, 1));
    assert_eq!(s.write_state_bytes, state_file());
    assert_eq!((s.pending_pages, s.write_pages), (0, 2));
    // From disk, after the pages.
    let hashes = [ch[0].hash, h];
    let r = load_with_state(&mut t, &hashes, h);
    assert_eq!(r.n_ok(), 2);
    assert_eq!(**r.pages[1].as_ref().unwrap(), data(1));
    assert_eq!(**r.state.as_ref().unwrap(), sdata(1));
    let s = t.stats();
    assert_eq!((s.read_states, s.read_state_bytes), (1, SB as u64));
    assert_eq!(
        (s.served_states, s.read_pages, s.state_read_errors),
        (2, 2, 0)
    );
    // Plain loads carry no state; an absent checkpoint is no read error.
    assert!(load_all(&mut t, &hashes).state.is_none());
    assert!(load_with_state(&mut t, &[], ch[0].hash).state.is_none());
    assert_eq!(t.stats().state_read_errors, 0);
    // A second save under the same hash keeps the first.
    t.save_state(h, sdata(9));
    assert_eq!(
        **load_with_state(&mut t, &[], h).state.as_ref().unwrap(),
        sdata(1)
    );
    // Wrong size: dropped.
    t.save_state(ch[0].hash, vec![0; SB - 1]);
    assert!(!t.contains_state(ch[0].hash));
    assert_eq!(t.stats().state_writes_dropped, 1);
    t.forget_state(h);
    t.flush();
    assert!(!t.contains_state(h) && t.contains(h));
    assert_eq!(files(t.dir(), "state"), 0);
    assert_eq!(t.stats().states, 0);
    // A tier opened without checkpoints stores none.
    let mut plain = open(cfg(&dir));
    plain.save_state(h, sdata(1));
    assert!(!plain.contains_state(h));
    assert_eq!(plain.stats().state_writes_dropped, 1);
}

#[test]
fn corrupt_foreign_and_truncated_states_are_read_errors_and_forgotten() {
    let dir = tmpdir("state-corrupt");
    let mut t = open_s(cfg(&dir));
    let ch = chain(&(0..16).collect::<Vec<_>>());
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    for (i, &h) in hs.iter().enumerate() {
        t.save(&ch[i], data(i));
        t.save_state(h, sdata(i));
    }
    t.flush();
    t.drain_done();
    // 0: flipped payload byte. 1: another model's id. 2: truncated. 3: a page's
    // file (valid, but not a checkpoint) in its place.
    let p = t.state_path(hs[0]);
    let mut b = fs::read(&p).unwrap();
    let n = b.len();
    b[n - 7] ^= 4;
    fs::write(&p, b).unwrap();
    let p = t.state_path(hs[1]);
    let mut b = fs::read(&p).unwrap();
    b[8] ^= 1;
    fs::write(&p, b).unwrap();
    let p = t.state_path(hs[2]);
    let b = fs::read(&p).unwrap();
    fs::write(&p, &b[..b.len() - 100]).unwrap();
    fs::copy(t.page_path(hs[3]), t.state_path(hs[3])).unwrap();
    for (i, &h) in hs.iter().enumerate() {
        let r = load_with_state(&mut t, &hs[..=i], h);
        assert_eq!(r.n_ok(), i + 1, "pages are unaffected");
        assert!(r.state.is_none(), "state {i}");
        assert!(!t.contains_state(h), "state {i} is forgotten");
    }
    let s = t.stats();
    assert_eq!(
        (s.state_read_errors, s.read_states, s.served_states),
        (4, 0, 0)
    );
    assert_eq!((s.read_errors, s.states, s.state_bytes), (0, 0, 0));
    t.flush();
    assert_eq!(files(t.dir(), "state"), 0);
    // A load cancelled before its bad checkpoint arrives still forgets it.
    t.save_state(hs[0], sdata(0));
    t.flush();
    fs::write(t.state_path(hs[0]), b"short").unwrap();
    let id = t.start_load_with_state(&[], Some(hs[0]));
    t.cancel_load(id);
    t.flush();
    assert!(t.poll().is_empty());
    assert!(!t.contains_state(hs[0]));
    assert_eq!(t.stats().state_read_errors, 5);
}

#[test]
fn a_state_is_delivered_when_a_page_before_it_fails() {
    let dir = tmpdir("state-partial");
    let mut t = open_s(cfg(&dir));
    let ch = chain(&(0..12).collect::<Vec<_>>());
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.save_state(hs[2], sdata(2));
    t.flush();
    fs::remove_file(t.page_path(hs[1])).unwrap();
    let r = load_with_state(&mut t, &hs, hs[2]);
    assert_eq!(r.n_ok(), 1);
    assert!(r.pages[1].is_none() && r.pages[2].is_some());
    assert_eq!(**r.state.as_ref().unwrap(), sdata(2));
    assert_eq!((t.stats().read_errors, t.stats().state_read_errors), (1, 0));
    // Pages not in the tier at all: likewise.
    t.forget(hs[0]);
    let r = load_with_state(&mut t, &hs, hs[2]);
    assert_eq!(r.n_ok(), 0);
    assert!(r.state.is_some());
}

#[test]
fn one_budget_and_lru_over_pages_and_states() {
    let dir = tmpdir("state-budget");
    let (pf, sf) = (page_file(), state_file());
    assert!(sf > pf && sf < 2 * pf, "the arithmetic below assumes it");
    let mut c = cfg(&dir);
    c.budget_bytes = 2 * pf + sf;
    let mut t = open_s(c.clone());
    let ch = chain(&(0..16).collect::<Vec<_>>());
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    t.save(&ch[0], data(0));
    t.save(&ch[1], data(1));
    t.save_state(hs[1], sdata(1));
    assert_eq!(t.stats().bytes + t.stats().state_bytes, c.budget_bytes);
    // Using page 0 makes page 1 the least recently used: a new page evicts it.
    load_all(&mut t, &hs[..1]);
    t.save(&ch[2], data(2));
    assert!(t.contains(hs[0]) && !t.contains(hs[1]) && t.contains_state(hs[1]));
    assert_eq!(t.stats().evicted_pages, 1);
    // Now the checkpoint is the least recently used.
    t.save_state(hs[2], sdata(2));
    assert!(!t.contains_state(hs[1]) && t.contains_state(hs[2]));
    assert!(t.contains(hs[0]) && t.contains(hs[2]));
    assert_eq!(t.stats().evicted_states, 1);
    // A second checkpoint needs the room of both pages.
    t.save_state(hs[3], sdata(3));
    let s = t.stats();
    assert_eq!((s.pages, s.states), (0, 2));
    assert_eq!((s.evicted_pages, s.evicted_states), (3, 1));
    assert_eq!((s.bytes, s.state_bytes), (0, 2 * sf));
    t.flush();
    assert_eq!((files(t.dir(), "page"), files(t.dir(), "state")), (0, 2));
    drop(t);
    // A budget below one checkpoint: checkpoints are dropped, pages kept.
    c.budget_bytes = sf - 1;
    let mut t = open_s(c);
    t.save(&ch[0], data(0));
    t.save_state(hs[0], sdata(0));
    let s = t.stats();
    assert_eq!((s.pages, s.states, s.state_writes_dropped), (1, 0, 1));
}

#[test]
fn failed_state_writes_drop_the_state() {
    let dir = tmpdir("state-fail");
    let mut c = cfg(&dir);
    c.fail_writes = true;
    let mut t = open_s(c);
    t.save_state(7, sdata(0));
    t.flush();
    let s = t.stats();
    assert_eq!((s.states, s.state_bytes, s.state_write_errors), (0, 0, 1));
    assert_eq!(s.write_errors, 0);
    assert!(!t.contains_state(7));
}

#[test]
fn persistent_index_keeps_pages_and_states() {
    let dir = tmpdir("state-persist");
    let mut c = cfg(&dir);
    c.persist = true;
    let toks: Vec<TokenId> = (0..12).collect();
    let ch = chain(&toks);
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    let mut t = open_s(c.clone());
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.save_state_wait(hs[0], sdata(0));
    t.save_state_wait(hs[2], sdata(2));
    let tier_dir = t.dir().to_path_buf();
    drop(t);
    let mut t = open_s(c.clone());
    let s = t.stats();
    assert_eq!((s.pages, s.states), (3, 2));
    assert_eq!(
        (s.bytes, s.state_bytes),
        (3 * page_file(), 2 * state_file())
    );
    let hashes = t.continue_prefix(ROOT_HASH, 0, &toks, 10);
    assert_eq!(hashes, hs);
    assert!(t.contains_state(hs[0]) && !t.contains_state(hs[1]));
    let r = load_with_state(&mut t, &hashes, hs[2]);
    assert_eq!(r.n_ok(), 3);
    assert_eq!(**r.state.as_ref().unwrap(), sdata(2));
    assert_eq!(
        **load_with_state(&mut t, &[], hs[0]).state.unwrap(),
        sdata(0)
    );
    drop(t);
    // A smaller budget keeps the most recently used entries (checkpoint 0, then
    // checkpoint 2 and the pages it was read after).
    let mut small = c.clone();
    small.budget_bytes = 2 * state_file() + page_file();
    let t = open_s(small);
    assert!(t.contains_state(hs[0]) && t.contains_state(hs[2]));
    assert_eq!((t.stats().pages, t.stats().states), (1, 2));
    assert!(t.contains(hs[2]));
    drop(t);
    assert_eq!(files(&tier_dir, "page"), 1);
    // Another state size is another layout: the index is foreign, files go.
    let t = SsdTier::open_with_states(c.clone(), 42, PT, PB, SB + 8, page_hash).unwrap();
    assert_eq!((t.stats().pages, t.stats().states), (0, 0));
    drop(t);
    assert_eq!(files(&tier_dir, "page") + files(&tier_dir, "state"), 0);
    // An index of the previous version (no entry kinds) is foreign too.
    let mut t = open_s(c.clone());
    t.save(&ch[0], data(0));
    t.save_state(hs[0], sdata(0));
    drop(t);
    let idx = tier_dir.join(INDEX_FILE);
    let mut b = fs::read(&idx).unwrap();
    b[..8].copy_from_slice(b"T9KVIX01");
    let n = b.len() - 8;
    let sum = checksum(0, &b[..n]);
    b[n..].copy_from_slice(&sum.to_le_bytes());
    fs::write(&idx, b).unwrap();
    let t = open_s(c);
    assert_eq!((t.stats().pages, t.stats().states), (0, 0));
    assert_eq!(files(&tier_dir, "page") + files(&tier_dir, "state"), 0);
}

/// Bytes of a window entry in the window tests (five times a page, as Gemma 3's
/// 15 sliding layers to its 3 full ones).
const WB: usize = 5 * PB;

fn wdata(i: usize) -> Vec<u8> {
    (0..WB).map(|j| (i * 7 + j * 5) as u8).collect()
}

fn open_w(c: SsdConfig) -> SsdTier {
    let bytes = EntryBytes {
        page: PB,
        state: 0,
        window: WB,
    };
    SsdTier::open_sized(c, 42, PT, bytes, page_hash).unwrap()
}

fn load_windows(t: &mut SsdTier, hashes: &[u64], windows: &[u64]) -> LoadResult {
    let id = t.start_load_entries(hashes, None, windows);
    loop {
        if let Some(r) = t.wait().into_iter().find(|r| r.id == id) {
            return r;
        }
    }
}

fn wcfg(dir: &Path) -> SsdConfig {
    SsdConfig {
        budget_bytes: 1 << 22,
        ..cfg(dir)
    }
}

#[test]
fn windows_are_saved_and_read_back_beside_pages() {
    let dir = tmpdir("window-roundtrip");
    let mut t = open_w(wcfg(&dir));
    let ch = chain(&(0..16).collect::<Vec<_>>());
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.save_window(hs[2], wdata(2));
    t.save_window(hs[3], wdata(3));
    assert!(t.contains(hs[2]) && t.contains_window(hs[2]));
    assert!(!t.contains_window(hs[1]));
    // Queued or already written: the I/O thread may finish the first write before
    // the second save looks at what is done.
    let w = t.stats().windows;
    assert_eq!((w.entries, w.pending as u64 + w.written), (2, 2));
    // From the write queue's copy (or disk), then from disk.
    let r = load_windows(&mut t, &hs, &[hs[2], hs[3]]);
    assert!(r.complete());
    assert_eq!(**r.windows[1].as_ref().unwrap(), wdata(3));
    t.flush();
    t.drain_done();
    let w = t.stats().windows;
    assert_eq!((w.pending, w.written, w.served), (0, 2, 2));
    let r = load_windows(&mut t, &hs[2..], &[hs[3], hs[2]]);
    assert!(r.complete());
    assert_eq!(**r.windows[0].as_ref().unwrap(), wdata(3));
    assert_eq!(**r.windows[1].as_ref().unwrap(), wdata(2));
    let v = t.stats().windows;
    let read = (v.read - w.read, v.read_bytes - w.read_bytes, v.served);
    assert_eq!(read, (2, 2 * WB as u64, 4));
    // An absent window: `None`, no read error.
    let r = load_windows(&mut t, &[], &[hs[0]]);
    assert!(!r.complete() && r.windows[0].is_none());
    assert_eq!(t.stats().windows.read_errors, 0);
    // Wrong size, or a tier without windows: dropped.
    t.save_window(hs[0], vec![0; WB - 1]);
    assert!(!t.contains_window(hs[0]));
    assert_eq!(t.stats().windows.writes_dropped, 1);
    let mut plain = open(cfg(&tmpdir("window-plain")));
    plain.save_window(hs[0], wdata(0));
    assert!(!plain.contains_window(hs[0]));
    t.forget_window(hs[2]);
    t.flush();
    assert!(!t.contains_window(hs[2]) && t.contains(hs[2]));
    assert_eq!(files(t.dir(), "window"), 1);
}

#[test]
fn corrupt_and_foreign_windows_are_read_errors_and_forgotten() {
    let dir = tmpdir("window-corrupt");
    let mut t = open_w(wcfg(&dir));
    let ch = chain(&(0..16).collect::<Vec<_>>());
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
        t.save_window(hs[i], wdata(i));
    }
    t.flush();
    t.drain_done();
    // 0: flipped payload byte. 1: truncated. 2: a page's file in its place.
    let p = t.window_path(hs[0]);
    let mut b = fs::read(&p).unwrap();
    let n = b.len();
    b[n - 3] ^= 8;
    fs::write(&p, b).unwrap();
    let p = t.window_path(hs[1]);
    let b = fs::read(&p).unwrap();
    fs::write(&p, &b[..b.len() - 10]).unwrap();
    fs::copy(t.page_path(hs[2]), t.window_path(hs[2])).unwrap();
    let r = load_windows(&mut t, &hs, &hs);
    assert_eq!(r.n_ok(), 4, "pages are unaffected");
    assert!(!r.complete());
    assert!(r.windows[..3].iter().all(Option::is_none));
    assert_eq!(**r.windows[3].as_ref().unwrap(), wdata(3));
    let w = t.stats().windows;
    assert_eq!((w.read_errors, w.read, w.served, w.entries), (3, 1, 1, 1));
    assert!((0..3).all(|i| !t.contains_window(hs[i])));
    assert_eq!(t.stats().read_errors, 0);
}

#[test]
fn persistent_index_keeps_windows_and_their_size() {
    let dir = tmpdir("window-persist");
    let mut c = wcfg(&dir);
    c.persist = true;
    let toks: Vec<TokenId> = (0..12).collect();
    let ch = chain(&toks);
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    let mut t = open_w(c.clone());
    for (i, e) in ch.iter().enumerate() {
        t.save(e, data(i));
    }
    t.save_window_wait(hs[1], wdata(1));
    t.save_window_wait(hs[2], wdata(2));
    let tier_dir = t.dir().to_path_buf();
    drop(t);
    let mut t = open_w(c.clone());
    let (s, w) = (t.stats(), t.stats().windows);
    assert_eq!((s.pages, w.entries), (3, 2));
    let wf = Header::keyed(Kind::Window, 0, 0, WB as u64).file_bytes();
    assert_eq!(w.bytes, 2 * wf);
    assert!(t.contains_window(hs[1]) && !t.contains_window(hs[0]));
    let r = load_windows(&mut t, &hs, &hs[1..]);
    assert!(r.complete());
    assert_eq!(**r.windows[1].as_ref().unwrap(), wdata(2));
    drop(t);
    // Another window size is another layout: the index is foreign, files go.
    let bytes = EntryBytes {
        page: PB,
        state: 0,
        window: WB + 2,
    };
    let t = SsdTier::open_sized(c, 42, PT, bytes, page_hash).unwrap();
    assert_eq!((t.stats().pages, t.stats().windows.entries), (0, 0));
    drop(t);
    assert_eq!(files(&tier_dir, "page") + files(&tier_dir, "window"), 0);
}

#[test]
fn one_budget_over_pages_and_windows() {
    let dir = tmpdir("window-budget");
    let wf = Header::keyed(Kind::Window, 0, 0, WB as u64).file_bytes();
    let mut c = wcfg(&dir);
    c.budget_bytes = 2 * wf;
    let mut t = open_w(c);
    let ch = chain(&(0..12).collect::<Vec<_>>());
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    t.save_window(hs[0], wdata(0));
    t.save(&ch[0], data(0));
    // The page needs room: the least recently used entry, the window, goes.
    t.save_window(hs[1], wdata(1));
    let (s, w) = (t.stats(), t.stats().windows);
    assert_eq!((s.pages, w.entries, w.evicted), (1, 1, 1));
    assert!(!t.contains_window(hs[0]) && t.contains_window(hs[1]));
    assert!(s.bytes + w.bytes <= 2 * wf);
}

#[test]
fn identity_depends_on_state_bytes_only_when_present() {
    let gguf: Vec<u8> = (0..5000).map(|i| (i % 251) as u8).collect();
    let mut l = KvLayout {
        n_layer: 4,
        n_embd_k: 64,
        n_embd_v: 64,
        page_tokens: 16,
        page_bytes: 4 * 2 * 64 * 16 * 2,
        dtype: "f16",
        device: "Cpu".into(),
        state_bytes: 0,
    };
    let id0 = model_identity(&gguf, 100, &l);
    // Without recurrent state the identity is what it was before checkpoints.
    let desc = format!("5000:4:64:64:16:{}:f16:Cpu", l.page_bytes);
    let old = checksum(
        checksum(checksum(0x7e3b_0d59_1c2a_4f61, &gguf[..100]), &gguf),
        desc.as_bytes(),
    );
    assert_eq!(id0, old);
    l.state_bytes = 4096;
    let id1 = model_identity(&gguf, 100, &l);
    l.state_bytes = 8192;
    let id2 = model_identity(&gguf, 100, &l);
    assert!(id0 != id1 && id1 != id2 && id0 != id2);
    assert_eq!(id2, model_identity(&gguf, 100, &l));
}

#[cfg(unix)]
#[test]
fn files_are_private_and_symlinks_are_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmpdir("private");
    let toks: Vec<TokenId> = (0..4).collect();
    let ch = chain(&toks);
    let mut t = open(cfg(&dir));
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(t.dir()), 0o700);
    // A symlink planted where the page's file will go, at a file of the victim's.
    let victim = dir.join("victim");
    fs::write(&victim, b"precious").unwrap();
    let path = entry_path(t.dir(), (Kind::Page, ch[0].hash));
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    t.save(&ch[0], data(0));
    t.flush();
    assert_eq!(
        fs::read(&victim).unwrap(),
        b"precious",
        "written through the symlink"
    );
    assert!(!fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(mode(&path), 0o600);
    let hashes = t.continue_prefix(ROOT_HASH, 0, &toks, 10);
    assert_eq!(load_all(&mut t, &hashes).n_ok(), 1);
    // A symlink swapped in afterwards is not read through.
    fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    assert_eq!(load_all(&mut t, &hashes).n_ok(), 0);
    drop(t);
    // A pre-existing world-readable directory is made private.
    let d2 = tmpdir("private-existing");
    fs::create_dir_all(&*d2).unwrap();
    fs::set_permissions(&*d2, fs::Permissions::from_mode(0o755)).unwrap();
    let t = open(cfg(&d2));
    assert_eq!(mode(&d2), 0o700);
    drop(t);
}

#[test]
fn two_tiers_cannot_share_a_directory() {
    let dir = tmpdir("lock");
    let mut c = cfg(&dir);
    c.persist = true;
    let toks: Vec<TokenId> = (0..8).collect();
    let mut first = open(c.clone());
    for (i, e) in chain(&toks).iter().enumerate() {
        first.save_wait(e, data(i));
    }
    let err = SsdTier::open(c.clone(), 42, PT, PB, page_hash).unwrap_err();
    assert!(err.to_string().contains("in use by another"), "{err}");
    // The first tier's pages were left alone.
    assert_eq!(first.continue_prefix(ROOT_HASH, 0, &toks, 10).len(), 2);
    drop(first);
    assert!(SsdTier::open(c, 42, PT, PB, page_hash).is_ok());
}

#[test]
fn temp_dirs_of_dead_processes_are_swept() {
    let dir = tmpdir("sweep");
    fs::create_dir_all(dir.join("tmp-999999-0-00000000000000aa")).unwrap();
    fs::write(dir.join("tmp-999999-0-00000000000000aa/x.page"), b"old").unwrap();
    // A live tier's directory (this process holds its lock) stays.
    let live = open(cfg(&dir));
    let other = open(cfg(&dir));
    assert!(!dir.join("tmp-999999-0-00000000000000aa").exists());
    assert!(live.dir().exists() && other.dir().exists());
    let kept = live.dir().to_path_buf();
    drop(other);
    assert!(kept.exists());
    drop(live);
    assert!(!kept.exists());
}

#[test]
fn an_index_claiming_endless_entries_is_refused() {
    let dir = tmpdir("huge-index");
    let mut c = cfg(&dir);
    c.persist = true;
    let t = open(c.clone());
    let tier_dir = t.dir().to_path_buf();
    drop(t);
    let mut b = fs::read(tier_dir.join(INDEX_FILE)).unwrap();
    b.truncate(b.len() - 8);
    // The entry count (at byte 48) as large as it goes.
    b[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&[0, 42, 0, 0, 0, 0, 0, 0, 0]);
    let sum = checksum(0, &b);
    b.extend_from_slice(&sum.to_le_bytes());
    fs::write(tier_dir.join(INDEX_FILE), &b).unwrap();
    let t = open(c);
    assert_eq!(t.stats().pages, 0);
}

#[test]
fn a_killed_tier_is_recovered_from_its_files_page_by_page() {
    // A kill -9 leaves no index (it is removed at start and written at a clean
    // shutdown), whole entry files, perhaps a `.part` of a write in flight, and
    // perhaps a damaged file. The next start keeps each whole file of this model.
    let dir = tmpdir("killed");
    let mut c = cfg(&dir);
    c.persist = true;
    let toks: Vec<TokenId> = (0..16).collect();
    let ch = chain(&toks);
    let hs: Vec<u64> = ch.iter().map(|e| e.hash).collect();
    let mut t = open_s(c.clone());
    for (i, e) in ch.iter().enumerate() {
        t.save_wait(e, data(i));
    }
    t.save_state_wait(hs[3], sdata(3));
    let tier_dir = t.dir().to_path_buf();
    drop(t);
    fs::remove_file(tier_dir.join(INDEX_FILE)).unwrap();
    // A write in flight, a page cut short, a page of another model under a valid name.
    fs::write(tier_dir.join(format!("{:016x}.page.part", hs[3])), b"half").unwrap();
    let p2 = entry_path(&tier_dir, (Kind::Page, hs[2]));
    let b = fs::read(&p2).unwrap();
    fs::write(&p2, &b[..b.len() - 1]).unwrap();
    let p1 = entry_path(&tier_dir, (Kind::Page, hs[1]));
    let mut b = fs::read(&p1).unwrap();
    b[8] ^= 1; // the model id
    fs::write(&p1, b).unwrap();
    let mut t = open_s(c.clone());
    assert_eq!((t.stats().pages, t.stats().states), (2, 1));
    // Pages 0 and 3 are back, with their bytes; 1 and 2 are gone, files too.
    let r = load_all(&mut t, &hs);
    let got: Vec<bool> = r.pages.iter().map(|p| p.is_some()).collect();
    assert_eq!(got, [true, false, false, true]);
    assert_eq!(**r.pages[3].as_ref().unwrap(), data(3));
    assert!(t.contains_state(hs[3]));
    assert_eq!(files(&tier_dir, "page"), 2);
    assert_eq!(files(&tier_dir, "part"), 0);
    // Its accounting matches the files: a clean stop writes an index of the same.
    drop(t);
    let t = open_s(c);
    assert_eq!((t.stats().pages, t.stats().states), (2, 1));
    assert_eq!(t.stats().bytes, 2 * page_file());
    drop(t);
    drop(dir);
}

#[test]
fn polling_an_idle_tier_settles_its_pending_writes() {
    // Found by the soak (bench/soak): an idle engine never took in its last write,
    // and /metrics showed a page pending forever. The engine thread now polls.
    let dir = tmpdir("settle");
    let mut t = open(cfg(&dir));
    let ch = chain(&[1, 2, 3, 4]);
    t.save(&ch[0], data(0));
    assert!(t.has_pending_writes());
    let t0 = std::time::Instant::now();
    while t.has_pending_writes() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "write never settled"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        t.poll_writes();
    }
    assert_eq!((t.stats().pending_pages, t.stats().pages), (0, 1));
    drop(t);
    drop(dir);
}
