//! The SSD tier: a second, larger tier of KV pages in files on local disk.
//!
//! The RAM page pool ([`crate::pages`]) stays the owner of RAM page state. When it
//! evicts an unreferenced cached page, the engine copies the page's KV out (before
//! the next model step can overwrite it) and hands it to [`SsdTier::save`]; the
//! page then lives here under its chained page hash, so its prefix stays reachable.
//! A prefix lookup that runs out of RAM pages continues here
//! ([`SsdTier::continue_prefix`]); the engine gives the request fresh RAM pages,
//! [`SsdTier::start_load`] reads the pages in, and the request is not scheduled
//! until [`SsdTier::poll`] reports its load done (other requests keep stepping).
//!
//! Each disk page is in one state: **writing** (queued for the I/O thread; lookups
//! are served from the in-memory copy) or **on disk**. Budget overflow removes the
//! least recently used pages.
//!
//! Integrity: a page file carries a header with the [model identity](model_identity)
//! (model file and KV layout), its hash, its parent's hash, its salt and tokens, and a
//! 64-bit checksum over header and KV bytes. A read checks all of them against the
//! index entry; a bad, missing or foreign page is reported as a failure and the
//! engine recomputes from that page on. Write errors (disk full, I/O errors) drop the
//! page with a warning: the prefix is recomputed when next needed.
//!
//! All file I/O runs on one I/O thread fed through a bounded queue; it takes jobs in
//! batches, reads before writes, so a waiting request's pages are not stuck behind
//! write-out. Bytes of queued writes are bounded ([`SsdConfig::max_pending_bytes`]);
//! beyond that, evicted pages are dropped rather than stalling the step loop.
//!
//! A disk page is named by its 64-bit chained hash; a read also checks the page's own
//! tokens and its parent's hash, so a wrong page needs a 64-bit collision of the
//! chained hashes of two different prefixes.
//!
//! Persistence ([`SsdConfig::persist`]): the tier's directory is named after the model
//! identity and its index is written on shutdown; the next start with the same model
//! and layout finds its pages again. A missing, truncated or foreign index starts an
//! empty tier (its page files are removed). Without persistence the tier lives in a
//! private directory removed on shutdown.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::pages::{EvictedPage, PageHasher, TokenId};

const PAGE_MAGIC: &[u8; 8] = b"T9KVPG01";
const INDEX_MAGIC: &[u8; 8] = b"T9KVIX01";
const INDEX_FILE: &str = "index.bin";
/// Jobs the I/O queue holds.
const QUEUE_JOBS: usize = 4096;

/// Settings of the SSD tier.
#[derive(Debug, Clone, PartialEq)]
pub struct SsdConfig {
    /// Directory for page files (created if missing); the tier uses a subdirectory.
    pub dir: PathBuf,
    /// Most bytes of page files; the least recently used pages are removed beyond it.
    /// 0 writes nothing.
    pub budget_bytes: u64,
    /// Keep the pages and their index across restarts.
    pub persist: bool,
    /// Most bytes of pages queued for writing; more evicted pages are dropped
    /// (recomputed when needed) rather than stalling the step loop.
    pub max_pending_bytes: usize,
    /// Test hook: every page write fails as if the disk were full.
    #[doc(hidden)]
    pub fail_writes: bool,
}

impl SsdConfig {
    /// The default settings under `dir`: a budget of [`default_budget`]`(dir)`, no
    /// persistence, 256 MiB of queued writes.
    pub fn new(dir: impl Into<PathBuf>) -> SsdConfig {
        let dir = dir.into();
        SsdConfig {
            budget_bytes: default_budget(&dir),
            dir,
            persist: false,
            max_pending_bytes: 256 << 20,
            fail_writes: false,
        }
    }
}

/// `$XDG_CACHE_HOME/tempo9/kv`, else `~/.cache/tempo9/kv`, else `./tempo9-kv`.
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("tempo9/kv");
    }
    match std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/tempo9/kv"),
        None => PathBuf::from("tempo9-kv"),
    }
}

/// min(16 GiB, a quarter of the free space of the file system holding `dir` (or its
/// nearest existing ancestor)); 16 GiB when the free space cannot be read.
pub fn default_budget(dir: &Path) -> u64 {
    const CAP: u64 = 16 << 30;
    free_disk_bytes(dir).map_or(CAP, |f| (f / 4).min(CAP))
}

/// Free bytes for unprivileged users on the file system of `dir`, from `df -Pk`
/// (portable and needs no FFI).
fn free_disk_bytes(dir: &Path) -> Option<u64> {
    let mut p = dir;
    while !p.exists() {
        p = p.parent()?;
    }
    let out = std::process::Command::new("df")
        .arg("-Pk")
        .arg(p)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let line = text.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

/// Layout of the KV a page holds: pages are only shared between engines whose
/// identities are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers.
    pub n_layer: usize,
    /// K row width per layer.
    pub n_embd_k: usize,
    /// V row width per layer.
    pub n_embd_v: usize,
    /// Tokens per page.
    pub page_tokens: usize,
    /// Bytes of one page's KV (all layers, K and V).
    pub page_bytes: usize,
    /// Element type of K and V, e.g. `"f16"`.
    pub dtype: &'static str,
    /// Device kind that computes the KV (numbers differ between backends).
    pub device: String,
}

/// Identity of the KV a model computes: a hash of the GGUF file's header (metadata
/// and tensor infos), its size and last MiB (weights), and the KV layout.
pub fn model_identity(gguf_bytes: &[u8], data_offset: usize, layout: &KvLayout) -> u64 {
    let head = &gguf_bytes[..data_offset.min(gguf_bytes.len())];
    let tail = &gguf_bytes[gguf_bytes.len().saturating_sub(1 << 20)..];
    let desc = format!(
        "{}:{}:{}:{}:{}:{}:{}:{}",
        gguf_bytes.len(),
        layout.n_layer,
        layout.n_embd_k,
        layout.n_embd_v,
        layout.page_tokens,
        layout.page_bytes,
        layout.dtype,
        layout.device
    );
    let mut h = checksum(0x7e3b_0d59_1c2a_4f61, head);
    h = checksum(h, tail);
    checksum(h, desc.as_bytes())
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn round(acc: u64, w: u64) -> u64 {
    acc.wrapping_add(w.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(h: u64, acc: u64) -> u64 {
    (h ^ round(0, acc)).wrapping_mul(P1).wrapping_add(P4)
}

/// A fast 64-bit checksum (xxHash64's structure: four lanes of 8-byte rounds, each a
/// bijection of the lane, so no input is lost) of `data`, seeded.
pub fn checksum(seed: u64, data: &[u8]) -> u64 {
    let mut lanes = [
        seed.wrapping_add(P1).wrapping_add(P2),
        seed.wrapping_add(P2),
        seed,
        seed.wrapping_sub(P1),
    ];
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *lane = round(*lane, w);
        }
    }
    let mut h = lanes[0]
        .rotate_left(1)
        .wrapping_add(lanes[1].rotate_left(7))
        .wrapping_add(lanes[2].rotate_left(12))
        .wrapping_add(lanes[3].rotate_left(18));
    for &l in &lanes {
        h = merge(h, l);
    }
    h = h.wrapping_add(data.len() as u64);
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ round(0, w))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// Counters of the SSD tier.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SsdStats {
    /// Pages in the tier (on disk or being written).
    pub pages: usize,
    /// Bytes of those pages' files.
    pub bytes: u64,
    /// Pages queued for writing.
    pub pending_pages: usize,
    /// The byte budget.
    pub budget_bytes: u64,
    /// Pages served to requests (read back and verified).
    pub hit_pages: u64,
    /// Prompt tokens served from the tier.
    pub hit_tokens: u64,
    /// Page files read.
    pub read_pages: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Seconds the I/O thread spent reading.
    pub read_secs: f64,
    /// Page files written.
    pub write_pages: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Seconds the I/O thread spent writing.
    pub write_secs: f64,
    /// Reads that failed (missing, truncated, corrupt or foreign page): recomputed.
    pub read_errors: u64,
    /// Writes that failed (disk full, I/O error): those pages are recomputed.
    pub write_errors: u64,
    /// Evicted pages not written because the write queue was full or the budget too
    /// small for one page.
    pub writes_dropped: u64,
    /// Pages removed to stay within the budget.
    pub evicted_pages: u64,
}

/// Identifies a load started by [`SsdTier::start_load`].
pub type LoadId = u64;

/// Where a disk page is.
#[derive(Debug)]
enum State {
    /// Queued for the I/O thread; lookups use this copy.
    Writing(Arc<Vec<u8>>),
    OnDisk,
}

#[derive(Debug)]
struct DiskPage {
    parent_hash: u64,
    salt: u64,
    tokens: Box<[TokenId]>,
    state: State,
    /// LRU position (key in `SsdTier::lru`).
    tick: u64,
    /// Distinguishes this entry from an earlier one of the same hash.
    gen: u64,
    file_bytes: u64,
}

/// What a page file must hold.
#[derive(Debug, Clone)]
struct Header {
    model_id: u64,
    hash: u64,
    parent_hash: u64,
    salt: u64,
    tokens: Box<[TokenId]>,
    payload_len: u64,
}

impl Header {
    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(56 + 4 * self.tokens.len());
        b.extend_from_slice(PAGE_MAGIC);
        for x in [self.model_id, self.hash, self.parent_hash, self.salt] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b.extend_from_slice(&(self.tokens.len() as u64).to_le_bytes());
        for t in self.tokens.iter() {
            b.extend_from_slice(&t.to_le_bytes());
        }
        b.extend_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Size of the whole file: header, checksum, payload.
    fn file_bytes(&self) -> u64 {
        self.bytes().len() as u64 + 8 + self.payload_len
    }
}

enum Job {
    Write {
        hash: u64,
        gen: u64,
        header: Header,
        data: Arc<Vec<u8>>,
    },
    Read {
        load: LoadId,
        idx: usize,
        header: Header,
    },
    Delete {
        hash: u64,
    },
    /// Reply once every earlier job is done.
    Flush(Sender<()>),
}

enum Done {
    Written {
        hash: u64,
        gen: u64,
        result: Result<u64, String>,
        secs: f64,
    },
    Read {
        load: LoadId,
        idx: usize,
        result: Result<Vec<u8>, String>,
        secs: f64,
    },
}

struct Load {
    pages: Vec<Option<Arc<Vec<u8>>>>,
    failed: Vec<bool>,
    outstanding: usize,
}

/// A finished load: for each requested page in order, its KV bytes, or `None` when
/// it could not be used (the caller recomputes from the first `None` on).
pub struct LoadResult {
    /// The load.
    pub id: LoadId,
    /// Page data in request order.
    pub pages: Vec<Option<Arc<Vec<u8>>>>,
}

impl LoadResult {
    /// Leading pages that loaded.
    pub fn n_ok(&self) -> usize {
        self.pages.iter().take_while(|p| p.is_some()).count()
    }
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// The SSD tier of one engine. See the module docs.
pub struct SsdTier {
    cfg: SsdConfig,
    model_id: u64,
    page_tokens: usize,
    page_bytes: usize,
    hasher: PageHasher,
    dir: PathBuf,
    index: HashMap<u64, DiskPage>,
    /// tick -> hash, least recently used first.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    gen: u64,
    disk_bytes: u64,
    pending_bytes: usize,
    pending_pages: usize,
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    loads: HashMap<LoadId, Load>,
    /// Loads whose every page is in; handed out by `poll`.
    finished: VecDeque<LoadId>,
    next_load: LoadId,
    stats: SsdStats,
}

impl std::fmt::Debug for SsdTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsdTier")
            .field("dir", &self.dir)
            .field("model_id", &format_args!("{:016x}", self.model_id))
            .field("stats", &self.stats)
            .finish()
    }
}

impl SsdTier {
    /// Opens the tier for KV of identity `model_id` (see [`model_identity`]) in pages
    /// of `page_tokens` tokens and `page_bytes` bytes, hashed with `hasher` (the page
    /// pool's). With persistence, loads the index a previous run left.
    pub fn open(
        cfg: SsdConfig,
        model_id: u64,
        page_tokens: usize,
        page_bytes: usize,
        hasher: PageHasher,
    ) -> std::io::Result<SsdTier> {
        let dir = if cfg.persist {
            cfg.dir.join(format!("{model_id:016x}"))
        } else {
            let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
            cfg.dir
                .join(format!("tmp-{}-{n}-{model_id:016x}", std::process::id()))
        };
        if !cfg.persist && dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        let (jobs_tx, jobs_rx) = mpsc::sync_channel(QUEUE_JOBS);
        let (done_tx, done_rx) = mpsc::channel();
        let io_dir = dir.clone();
        let fail_writes = cfg.fail_writes;
        let thread = std::thread::Builder::new()
            .name("tempo9-kv-io".into())
            .spawn(move || io_thread(io_dir, jobs_rx, done_tx, fail_writes))?;
        let mut tier = SsdTier {
            stats: SsdStats {
                budget_bytes: cfg.budget_bytes,
                ..SsdStats::default()
            },
            cfg,
            model_id,
            page_tokens,
            page_bytes,
            hasher,
            dir,
            index: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            gen: 0,
            disk_bytes: 0,
            pending_bytes: 0,
            pending_pages: 0,
            jobs: Some(jobs_tx),
            done: done_rx,
            thread: Some(thread),
            loads: HashMap::new(),
            finished: VecDeque::new(),
            next_load: 0,
        };
        if tier.cfg.persist {
            match tier.load_index() {
                Ok(n) => {
                    tracing::info!(pages = n, dir = %tier.dir.display(), "KV SSD tier: index loaded")
                }
                Err(why) => {
                    if why != "no index" {
                        tracing::warn!(dir = %tier.dir.display(), %why, "KV SSD tier: index unusable; starting empty");
                    }
                    tier.index.clear();
                    tier.lru.clear();
                    tier.disk_bytes = 0;
                    tier.remove_page_files();
                }
            }
            // A crash from here on leaves no index that could outlive its files.
            let _ = fs::remove_file(tier.dir.join(INDEX_FILE));
        }
        tier.sync_stats();
        Ok(tier)
    }

    /// The tier's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Current counters.
    pub fn stats(&self) -> SsdStats {
        self.stats
    }

    /// Counts prompt tokens the engine served from this tier.
    pub fn add_hit_tokens(&mut self, pages: usize) {
        self.stats.hit_pages += pages as u64;
        self.stats.hit_tokens += (pages * self.page_tokens) as u64;
    }

    /// Whether a page of this hash is in the tier.
    pub fn contains(&self, hash: u64) -> bool {
        self.index.contains_key(&hash)
    }

    fn touch(&mut self, hash: u64) {
        if let Some(e) = self.index.get_mut(&hash) {
            self.lru.remove(&e.tick);
            self.tick += 1;
            e.tick = self.tick;
            self.lru.insert(self.tick, hash);
        }
    }

    /// The pages continuing a prefix: starting under `parent_hash` (the last RAM
    /// page's hash, or the root hash), the hashes of the consecutive full pages of
    /// `tokens` found here, at most `max_pages`.
    pub fn continue_prefix(
        &self,
        mut parent_hash: u64,
        salt: u64,
        tokens: &[TokenId],
        max_pages: usize,
    ) -> Vec<u64> {
        let mut found = Vec::new();
        for page in tokens.chunks_exact(self.page_tokens).take(max_pages) {
            let h = (self.hasher)(parent_hash, salt, page);
            match self.index.get(&h) {
                Some(e) if e.parent_hash == parent_hash && e.salt == salt && *e.tokens == *page => {
                    found.push(h);
                    parent_hash = h;
                }
                _ => break,
            }
        }
        found
    }

    /// Stores an evicted RAM page's KV (`data`, [`SsdTier::page_bytes`] bytes). Drops
    /// it (counted) when the budget cannot hold a page or the write queue is full.
    pub fn save(&mut self, page: &EvictedPage, data: Vec<u8>) {
        self.drain_done();
        if self.index.contains_key(&page.hash) {
            self.touch(page.hash);
            return;
        }
        let header = Header {
            model_id: self.model_id,
            hash: page.hash,
            parent_hash: page.parent_hash,
            salt: page.salt,
            tokens: page.tokens.clone(),
            payload_len: data.len() as u64,
        };
        let file_bytes = header.file_bytes();
        if data.len() != self.page_bytes
            || file_bytes > self.cfg.budget_bytes
            || self.pending_bytes + data.len() > self.cfg.max_pending_bytes
        {
            self.stats.writes_dropped += 1;
            return;
        }
        while self.disk_bytes + file_bytes > self.cfg.budget_bytes {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            self.remove(victim);
            self.stats.evicted_pages += 1;
        }
        let data = Arc::new(data);
        self.gen += 1;
        let job = Job::Write {
            hash: page.hash,
            gen: self.gen,
            header,
            data: data.clone(),
        };
        if !self.send(job) {
            self.stats.writes_dropped += 1;
            return;
        }
        self.pending_bytes += data.len();
        self.pending_pages += 1;
        self.tick += 1;
        self.index.insert(
            page.hash,
            DiskPage {
                parent_hash: page.parent_hash,
                salt: page.salt,
                tokens: page.tokens.clone(),
                state: State::Writing(data),
                tick: self.tick,
                gen: self.gen,
                file_bytes,
            },
        );
        self.lru.insert(self.tick, page.hash);
        self.disk_bytes += file_bytes;
        self.sync_stats();
    }

    /// Like [`SsdTier::save`], but waits for queued writes instead of dropping the
    /// page when the write queue is full (for shutdown).
    pub fn save_wait(&mut self, page: &EvictedPage, data: Vec<u8>) {
        if self.pending_bytes + data.len() > self.cfg.max_pending_bytes {
            self.flush();
        }
        self.save(page, data);
    }

    /// Sends a job without blocking; false when the queue is full or the thread gone.
    fn send(&mut self, job: Job) -> bool {
        match self.jobs.as_ref().map(|j| j.try_send(job)) {
            Some(Ok(())) => true,
            Some(Err(TrySendError::Full(_))) => false,
            _ => false,
        }
    }

    /// Drops a page from the index and deletes its file (after its write, if queued).
    fn remove(&mut self, hash: u64) {
        let Some(e) = self.index.remove(&hash) else {
            return;
        };
        self.lru.remove(&e.tick);
        self.disk_bytes -= e.file_bytes;
        if let State::Writing(d) = &e.state {
            self.pending_bytes -= d.len();
            self.pending_pages -= 1;
        }
        if let Some(j) = &self.jobs {
            // A delete that does not fit the queue leaves an orphan file; the next
            // write of the same hash replaces it, and reads verify the header.
            let _ = j.try_send(Job::Delete { hash });
        }
    }

    /// Starts reading the pages `hashes` (from [`SsdTier::continue_prefix`]); the
    /// result comes from [`SsdTier::poll`] under the returned id. Pages still in the
    /// write queue are served from memory at once.
    pub fn start_load(&mut self, hashes: &[u64]) -> LoadId {
        self.drain_done();
        self.next_load += 1;
        let id = self.next_load;
        let mut load = Load {
            pages: vec![None; hashes.len()],
            failed: vec![false; hashes.len()],
            outstanding: 0,
        };
        for (idx, &h) in hashes.iter().enumerate() {
            self.touch(h);
            let Some(e) = self.index.get(&h) else {
                load.failed[idx] = true;
                continue;
            };
            match &e.state {
                State::Writing(d) => load.pages[idx] = Some(d.clone()),
                State::OnDisk => {
                    let header = Header {
                        model_id: self.model_id,
                        hash: h,
                        parent_hash: e.parent_hash,
                        salt: e.salt,
                        tokens: e.tokens.clone(),
                        payload_len: self.page_bytes as u64,
                    };
                    let job = Job::Read {
                        load: id,
                        idx,
                        header,
                    };
                    // Reads may wait for room in the queue: the writer always drains it.
                    let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
                    if sent {
                        load.outstanding += 1;
                    } else {
                        load.failed[idx] = true;
                    }
                }
            }
        }
        let done = load.outstanding == 0;
        self.loads.insert(id, load);
        if done {
            self.finished.push_back(id);
        }
        id
    }

    /// Forgets a load (its request went away); its data is dropped when it arrives.
    pub fn cancel_load(&mut self, id: LoadId) {
        self.loads.remove(&id);
        self.finished.retain(|&l| l != id);
    }

    /// Whether any load is in flight or finished but not yet polled.
    pub fn has_loads(&self) -> bool {
        !self.loads.is_empty()
    }

    /// Finished loads, without blocking.
    pub fn poll(&mut self) -> Vec<LoadResult> {
        self.drain_done();
        self.take_finished()
    }

    /// Blocks until at least one load is finished (or none is in flight), then
    /// returns the finished ones.
    pub fn wait(&mut self) -> Vec<LoadResult> {
        self.drain_done();
        while self.finished.is_empty() && !self.loads.is_empty() {
            match self.done.recv() {
                Ok(d) => self.handle(d),
                Err(_) => {
                    // The I/O thread is gone: fail everything outstanding.
                    for (&id, l) in self.loads.iter_mut() {
                        for (i, f) in l.failed.iter_mut().enumerate() {
                            if l.pages[i].is_none() {
                                *f = true;
                            }
                        }
                        l.outstanding = 0;
                        self.finished.push_back(id);
                    }
                }
            }
        }
        self.take_finished()
    }

    fn take_finished(&mut self) -> Vec<LoadResult> {
        let mut out = Vec::new();
        while let Some(id) = self.finished.pop_front() {
            if let Some(l) = self.loads.remove(&id) {
                let mut pages = l.pages;
                for (p, failed) in pages.iter_mut().zip(l.failed) {
                    if failed {
                        *p = None;
                    }
                }
                out.push(LoadResult { id, pages });
            }
        }
        out
    }

    fn drain_done(&mut self) {
        while let Ok(d) = self.done.try_recv() {
            self.handle(d);
        }
    }

    fn handle(&mut self, d: Done) {
        match d {
            Done::Written {
                hash,
                gen,
                result,
                secs,
            } => {
                self.stats.write_secs += secs;
                let current = self.index.get(&hash).is_some_and(|e| e.gen == gen);
                match result {
                    Ok(bytes) => {
                        self.stats.write_pages += 1;
                        self.stats.write_bytes += bytes;
                        if current {
                            let e = self.index.get_mut(&hash).expect("current");
                            if let State::Writing(d) = &e.state {
                                self.pending_bytes -= d.len();
                                self.pending_pages -= 1;
                            }
                            e.state = State::OnDisk;
                        }
                    }
                    Err(why) => {
                        self.stats.write_errors += 1;
                        if self.stats.write_errors.is_power_of_two() {
                            tracing::warn!(%why, errors = self.stats.write_errors,
                                "KV SSD tier: page write failed; the page will be recomputed");
                        }
                        if current {
                            self.remove(hash);
                        }
                    }
                }
            }
            Done::Read {
                load,
                idx,
                result,
                secs,
            } => {
                self.stats.read_secs += secs;
                let result = match result {
                    Ok(data) => {
                        self.stats.read_pages += 1;
                        self.stats.read_bytes += data.len() as u64;
                        Ok(data)
                    }
                    Err(why) => {
                        self.stats.read_errors += 1;
                        if self.stats.read_errors.is_power_of_two() {
                            tracing::warn!(%why, errors = self.stats.read_errors,
                                "KV SSD tier: page unusable; recomputing it");
                        }
                        Err(why)
                    }
                };
                if let Some(l) = self.loads.get_mut(&load) {
                    match result {
                        Ok(data) => l.pages[idx] = Some(Arc::new(data)),
                        Err(_) => l.failed[idx] = true,
                    }
                    l.outstanding -= 1;
                    if l.outstanding == 0 {
                        self.finished.push_back(load);
                    }
                }
            }
        }
        self.sync_stats();
    }

    /// A page failed to load: forget it so it is not tried again.
    pub fn forget(&mut self, hash: u64) {
        self.remove(hash);
        self.sync_stats();
    }

    fn sync_stats(&mut self) {
        self.stats.pages = self.index.len();
        self.stats.bytes = self.disk_bytes;
        self.stats.pending_pages = self.pending_pages;
    }

    /// Bytes of one page's KV.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Waits until every queued write and delete is done.
    pub fn flush(&mut self) {
        if let Some(j) = &self.jobs {
            let (tx, rx) = mpsc::channel();
            if j.send(Job::Flush(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
        self.drain_done();
    }

    fn page_path(&self, hash: u64) -> PathBuf {
        page_path(&self.dir, hash)
    }

    fn remove_page_files(&self) {
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "page") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// Index file: magic, model id, page tokens, page bytes, entry count, entries
    /// (hash, parent hash, salt, tokens), then a checksum of everything before it.
    /// Entries are in LRU order, least recently used first.
    fn write_index(&self) -> std::io::Result<()> {
        let mut b = Vec::new();
        b.extend_from_slice(INDEX_MAGIC);
        for x in [
            self.model_id,
            self.page_tokens as u64,
            self.page_bytes as u64,
        ] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        let on_disk: Vec<(u64, &DiskPage)> = self
            .lru
            .values()
            .filter_map(|h| self.index.get(h).map(|e| (*h, e)))
            .filter(|(_, e)| matches!(e.state, State::OnDisk))
            .collect();
        b.extend_from_slice(&(on_disk.len() as u64).to_le_bytes());
        for (h, e) in on_disk {
            for x in [h, e.parent_hash, e.salt] {
                b.extend_from_slice(&x.to_le_bytes());
            }
            for t in e.tokens.iter() {
                b.extend_from_slice(&t.to_le_bytes());
            }
        }
        let sum = checksum(0, &b);
        b.extend_from_slice(&sum.to_le_bytes());
        let tmp = self.dir.join("index.tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&b)?;
        f.sync_all()?;
        fs::rename(tmp, self.dir.join(INDEX_FILE))
    }

    fn load_index(&mut self) -> Result<usize, String> {
        let b = match fs::read(self.dir.join(INDEX_FILE)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("no index".into()),
            Err(e) => return Err(e.to_string()),
        };
        if b.len() < 48 || &b[..8] != INDEX_MAGIC {
            return Err(format!("index of {} bytes is not a Tempo9 index", b.len()));
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if checksum(0, body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err("index checksum mismatch (truncated or corrupt)".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
        let (id, pt, pb, n) = (u64_at(8), u64_at(16), u64_at(24), u64_at(32) as usize);
        if id != self.model_id || pt as usize != self.page_tokens || pb as usize != self.page_bytes
        {
            return Err("index of another model or KV layout".into());
        }
        let entry_len = 24 + 4 * self.page_tokens;
        if body.len() != 40 + n * entry_len {
            return Err("index length does not match its entry count".into());
        }
        let header_len = Header {
            model_id: 0,
            hash: 0,
            parent_hash: 0,
            salt: 0,
            tokens: vec![0; self.page_tokens].into(),
            payload_len: self.page_bytes as u64,
        }
        .file_bytes();
        for i in 0..n {
            let at = 40 + i * entry_len;
            let (h, parent_hash, salt) = (u64_at(at), u64_at(at + 8), u64_at(at + 16));
            let tokens: Box<[TokenId]> = body[at + 24..at + entry_len]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            if self.disk_bytes + header_len > self.cfg.budget_bytes {
                // A smaller budget than last time: keep the most recently used.
                let _ = fs::remove_file(self.page_path(h));
                continue;
            }
            self.tick += 1;
            self.lru.insert(self.tick, h);
            self.index.insert(
                h,
                DiskPage {
                    parent_hash,
                    salt,
                    tokens,
                    state: State::OnDisk,
                    tick: self.tick,
                    gen: 0,
                    file_bytes: header_len,
                },
            );
            self.disk_bytes += header_len;
        }
        Ok(self.index.len())
    }
}

impl Drop for SsdTier {
    fn drop(&mut self) {
        self.flush();
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.cfg.persist {
            if let Err(e) = self.write_index() {
                tracing::warn!(error = %e, "KV SSD tier: could not write the index");
            }
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn page_path(dir: &Path, hash: u64) -> PathBuf {
    dir.join(format!("{hash:016x}.page"))
}

fn io_thread(dir: PathBuf, jobs: Receiver<Job>, done: Sender<Done>, fail_writes: bool) {
    let mut batch: Vec<Job> = Vec::new();
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while let Ok(j) = jobs.try_recv() {
            batch.push(j);
        }
        // Reads first: a request waits on them. Reads only target pages whose write
        // is done, so they never overtake their own page's write.
        let (reads, others): (Vec<Job>, Vec<Job>) =
            batch.drain(..).partition(|j| matches!(j, Job::Read { .. }));
        for job in reads.into_iter().chain(others) {
            match job {
                Job::Read { load, idx, header } => {
                    let t = Instant::now();
                    let result = read_page(&page_path(&dir, header.hash), &header);
                    let secs = t.elapsed().as_secs_f64();
                    if done
                        .send(Done::Read {
                            load,
                            idx,
                            result,
                            secs,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Write {
                    hash,
                    gen,
                    header,
                    data,
                } => {
                    let t = Instant::now();
                    let path = page_path(&dir, hash);
                    let result = if fail_writes {
                        Err("injected write failure (no space left on device)".to_string())
                    } else {
                        write_page(&path, &header, &data)
                    };
                    if result.is_err() {
                        let _ = fs::remove_file(&path);
                    }
                    let secs = t.elapsed().as_secs_f64();
                    if done
                        .send(Done::Written {
                            hash,
                            gen,
                            result,
                            secs,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Delete { hash } => {
                    let _ = fs::remove_file(page_path(&dir, hash));
                }
                Job::Flush(reply) => {
                    let _ = reply.send(());
                }
            }
        }
    }
}

fn write_page(path: &Path, header: &Header, data: &[u8]) -> Result<u64, String> {
    let head = header.bytes();
    let sum = checksum(checksum(0, &head), data);
    let mut f = fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut write = || -> std::io::Result<()> {
        f.write_all(&head)?;
        f.write_all(&sum.to_le_bytes())?;
        f.write_all(data)
    };
    write().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((head.len() + 8 + data.len()) as u64)
}

fn read_page(path: &Path, want: &Header) -> Result<Vec<u8>, String> {
    let head = want.bytes();
    let mut f = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut got = vec![0u8; head.len() + 8];
    f.read_exact(&mut got)
        .map_err(|e| format!("{}: header: {e}", path.display()))?;
    if got[..head.len()] != head[..] {
        return Err(format!(
            "{}: header does not match (foreign or stale page)",
            path.display()
        ));
    }
    let sum = u64::from_le_bytes(got[head.len()..].try_into().expect("8 bytes"));
    let mut data = vec![0u8; want.payload_len as usize];
    f.read_exact(&mut data)
        .map_err(|e| format!("{}: payload: {e}", path.display()))?;
    let mut extra = [0u8; 1];
    if f.read(&mut extra).map_err(|e| e.to_string())? != 0 {
        return Err(format!("{}: trailing bytes", path.display()));
    }
    if checksum(checksum(0, &head), &data) != sum {
        return Err(format!("{}: checksum mismatch", path.display()));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
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
        let n_files = fs::read_dir(t.dir()).unwrap().count();
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
}
