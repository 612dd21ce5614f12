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
//! Hybrid models (recurrent layers beside attention) cannot resume a prefix from KV
//! pages alone: they also need the recurrent layers' states as they were after the
//! prefix's last token. The tier therefore holds a second kind of entry, the **state
//! checkpoint**: the bytes of all recurrent layers' states just after the last token
//! of a page, keyed by that page's chained hash (the page itself may or may not be in
//! the tier). Every checkpoint of one tier has the same size
//! ([`SsdTier::open_with_states`]). [`SsdTier::save_state`] stores one and
//! [`SsdTier::start_load_with_state`] reads one back after a run of pages. Apart from
//! their key space, file header and counters, checkpoints are entries like pages:
//! the same write queue, byte budget, LRU, integrity checks and persistence.
//!
//! Models with sliding-window layers (Gemma 3) keep, beside a page's full-attention
//! KV, some pages' sliding-layer KV as a **window** entry: a page's *sidecar*
//! ([`crate::sliding`]), the sliding layers' K/V of that page's tokens, named by the
//! page's chained hash like a checkpoint. A prefix hit at a position needs the window
//! of pages before it in these layers, so the engine saves a sidecar here when it
//! leaves RAM and reads the window a resume needs back with the pages
//! ([`SsdTier::start_load_entries`]). Windows are entries like checkpoints (their own
//! magic and file extension, one size per tier, the same budget, LRU, checks and
//! persistence), and like a checkpoint a window that fails to read is forgotten.
//!
//! Each entry is in one stage: **writing** (queued for the I/O thread; lookups are
//! served from the in-memory copy) or **on disk**. Budget overflow removes the least
//! recently used entries, of every kind alike.
//!
//! Integrity: a page file carries a header with the [model identity](model_identity)
//! (model file and KV layout), its hash, its parent's hash, its salt and tokens, and a
//! 64-bit checksum over header and KV bytes; a checkpoint or window file carries its
//! own magic, the model identity, its page's hash, its length and the same checksum. A read
//! checks all of them against the index entry; a bad, missing or foreign file is
//! reported as a failure and the engine recomputes from that page on (a checkpoint
//! that fails is forgotten at once). Write errors (disk full, I/O errors) drop the
//! entry with a warning: the prefix is recomputed when next needed.
//!
//! All file I/O runs on one I/O thread fed through a bounded queue; it takes jobs in
//! batches, reads before writes, so a waiting request's entries are not stuck behind
//! write-out. Bytes of queued writes are bounded ([`SsdConfig::max_pending_bytes`]);
//! beyond that, evicted pages, windows and new checkpoints are dropped rather than
//! stalling the step loop.
//!
//! A disk page is named by its 64-bit chained hash; a read also checks the page's own
//! tokens and its parent's hash, so a wrong page needs a 64-bit collision of the
//! chained hashes of two different prefixes. A checkpoint has no tokens of its own:
//! the caller asks for it under a hash it has just matched page by page.
//!
//! Persistence ([`SsdConfig::persist`]): the tier's directory is named after the model
//! identity and its index (which records each entry's kind) is written on shutdown;
//! the next start with the same model and layout finds its pages, checkpoints and
//! windows again. A missing, truncated or foreign index starts an empty tier (its entry files
//! are removed). Without persistence the tier lives in a private directory removed on
//! shutdown.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::pages::{EvictedPage, PageHasher, TokenId};

// The tier (this file: entries, budget, LRU, loads), what makes an entry shareable
// (`identity`), its files and index on disk (`index`) and the I/O thread (`io`).
mod files;
mod identity;
mod index;
mod io;
#[cfg(test)]
mod tests;

pub use identity::{checksum, model_identity, KvLayout};
use io::{entry_path, io_thread};

const PAGE_MAGIC: &[u8; 8] = b"T9KVPG01";
const STATE_MAGIC: &[u8; 8] = b"T9KVST01";
const WINDOW_MAGIC: &[u8; 8] = b"T9KVSW01";
/// Version 3 adds window entries (and their size in the header); version 2 recorded
/// each entry's kind; an index of an older version is foreign.
const INDEX_MAGIC: &[u8; 8] = b"T9KVIX03";
const INDEX_FILE: &str = "index.bin";
/// Jobs the I/O queue holds.
const QUEUE_JOBS: usize = 4096;

/// Settings of the SSD tier.
#[derive(Debug, Clone, PartialEq)]
pub struct SsdConfig {
    /// Directory for page files (created if missing); the tier uses a subdirectory.
    pub dir: PathBuf,
    /// Most bytes of page, state checkpoint and window files together; the least
    /// recently used entries are removed beyond it. 0 writes nothing.
    pub budget_bytes: u64,
    /// Keep the pages and their index across restarts.
    pub persist: bool,
    /// Most bytes of entries queued for writing; more are dropped (recomputed when
    /// needed) rather than stalling the step loop.
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

/// Counters of the SSD tier. The page counters count pages only; the `*state*`
/// counters count state checkpoints, and `windows` the sliding-window entries. The
/// budget bounds `bytes + state_bytes + windows.bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SsdStats {
    /// Pages in the tier (on disk or being written).
    pub pages: usize,
    /// Bytes of those pages' files.
    pub bytes: u64,
    /// Pages queued for writing.
    pub pending_pages: usize,
    /// The byte budget (every kind of entry together).
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
    /// State checkpoints in the tier (on disk or being written).
    pub states: usize,
    /// Bytes of those checkpoints' files.
    pub state_bytes: u64,
    /// State checkpoints queued for writing.
    pub pending_states: usize,
    /// State checkpoints handed out by finished loads (from disk or the write queue).
    pub served_states: u64,
    /// State checkpoint files read and verified.
    pub read_states: u64,
    /// Bytes of checkpoint data read and verified.
    pub read_state_bytes: u64,
    /// Seconds the I/O thread spent reading checkpoints.
    pub state_read_secs: f64,
    /// State checkpoint files written.
    pub write_states: u64,
    /// Bytes of checkpoint files written.
    pub write_state_bytes: u64,
    /// Seconds the I/O thread spent writing checkpoints.
    pub state_write_secs: f64,
    /// Checkpoint reads that failed (missing, truncated, corrupt or foreign file);
    /// the checkpoint is forgotten.
    pub state_read_errors: u64,
    /// Checkpoint writes that failed (disk full, I/O error); the checkpoint is dropped.
    pub state_write_errors: u64,
    /// Checkpoints not written: wrong size, write queue full, or budget too small.
    pub state_writes_dropped: u64,
    /// Checkpoints removed to stay within the budget.
    pub evicted_states: u64,
    /// Sliding-window entries (pages' sidecars).
    pub windows: SsdEntryStats,
}

/// Counters of one kind of SSD entry that is keyed by a page's hash but is not the
/// page itself (sliding-window sidecars).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SsdEntryStats {
    /// Entries in the tier (on disk or being written).
    pub entries: usize,
    /// Bytes of their files.
    pub bytes: u64,
    /// Entries queued for writing.
    pub pending: usize,
    /// Entries handed out by finished loads (from disk or the write queue).
    pub served: u64,
    /// Files read and verified.
    pub read: u64,
    /// Payload bytes read and verified.
    pub read_bytes: u64,
    /// Seconds the I/O thread spent reading them.
    pub read_secs: f64,
    /// Files written.
    pub written: u64,
    /// Bytes of files written.
    pub write_bytes: u64,
    /// Seconds the I/O thread spent writing them.
    pub write_secs: f64,
    /// Reads that failed (missing, truncated, corrupt or foreign file); the entry is
    /// forgotten.
    pub read_errors: u64,
    /// Writes that failed (disk full, I/O error); the entry is dropped.
    pub write_errors: u64,
    /// Entries not written: wrong size, write queue full, or budget too small.
    pub writes_dropped: u64,
    /// Entries removed to stay within the budget.
    pub evicted: u64,
}

/// Payload bytes of each kind of entry a tier stores (0: it stores none of that
/// kind). Fixed at opening: a persistent index's entries are sized by them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryBytes {
    /// One page's KV (the full-attention layers' K and V).
    pub page: usize,
    /// One recurrent-state checkpoint (every recurrent layer's states).
    pub state: usize,
    /// One page's window entry (every sliding-window layer's K and V of its tokens).
    pub window: usize,
}

/// Identifies a load started by [`SsdTier::start_load`].
pub type LoadId = u64;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// One page's KV.
    Page,
    /// The recurrent layers' states after a page's last token.
    State,
    /// A page's sliding-window layers' KV (its sidecar).
    Window,
}

/// Number of entry kinds (size of per-kind arrays).
const KINDS: usize = 3;

impl Kind {
    /// Index into per-kind counters.
    fn i(self) -> usize {
        self as usize
    }

    /// Tag in the index file.
    fn tag(self) -> u8 {
        self as u8
    }

    fn from_tag(t: u8) -> Option<Kind> {
        match t {
            0 => Some(Kind::Page),
            1 => Some(Kind::State),
            2 => Some(Kind::Window),
            _ => None,
        }
    }

    /// First bytes of its files.
    fn magic(self) -> &'static [u8; 8] {
        match self {
            Kind::Page => PAGE_MAGIC,
            Kind::State => STATE_MAGIC,
            Kind::Window => WINDOW_MAGIC,
        }
    }

    /// File name extension.
    fn ext(self) -> &'static str {
        match self {
            Kind::Page => "page",
            Kind::State => "state",
            Kind::Window => "window",
        }
    }
}

/// A page, the checkpoint after it and its window share a hash; the kind keeps them
/// apart.
type Key = (Kind, u64);

/// Where an entry is.
#[derive(Debug)]
enum Stage {
    /// Queued for the I/O thread; lookups use this copy.
    Writing(Arc<Vec<u8>>),
    OnDisk,
}

#[derive(Debug)]
struct Entry {
    /// What its file must hold; a read checks it.
    header: Header,
    stage: Stage,
    /// LRU position (key in `SsdTier::lru`).
    tick: u64,
    /// Distinguishes this entry from an earlier one of the same key.
    gen: u64,
    file_bytes: u64,
}

/// What an entry's file must hold. Checkpoints and windows have no parent, salt or
/// tokens (all zero or empty) and are told apart from pages and each other by their
/// magic.
#[derive(Debug, Clone)]
struct Header {
    kind: Kind,
    model_id: u64,
    hash: u64,
    parent_hash: u64,
    salt: u64,
    tokens: Box<[TokenId]>,
    payload_len: u64,
}

impl Header {
    /// The header of a checkpoint or window entry.
    fn keyed(kind: Kind, model_id: u64, hash: u64, payload_len: u64) -> Header {
        debug_assert!(kind != Kind::Page, "a page has tokens");
        Header {
            kind,
            model_id,
            hash,
            parent_hash: 0,
            salt: 0,
            tokens: Box::new([]),
            payload_len,
        }
    }

    fn key(&self) -> Key {
        (self.kind, self.hash)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(56 + 4 * self.tokens.len());
        b.extend_from_slice(self.kind.magic());
        match self.kind {
            Kind::Page => {
                for x in [self.model_id, self.hash, self.parent_hash, self.salt] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
                b.extend_from_slice(&(self.tokens.len() as u64).to_le_bytes());
                for t in self.tokens.iter() {
                    b.extend_from_slice(&t.to_le_bytes());
                }
            }
            Kind::State | Kind::Window => {
                for x in [self.model_id, self.hash] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        b.extend_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Size of the whole file: header, checksum, payload.
    fn file_bytes(&self) -> u64 {
        self.bytes().len() as u64 + 8 + self.payload_len
    }
}

/// Where a read's data goes in its load.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// The load's `idx`th page.
    Page(usize),
    /// The load's checkpoint, entry `gen` of `hash` (forgotten if the read fails).
    State { hash: u64, gen: u64 },
    /// The load's `idx`th window, entry `gen` of `hash` (forgotten if the read fails).
    Window { idx: usize, hash: u64, gen: u64 },
}

impl Slot {
    /// The entry a failed read forgets (checkpoints and windows: a page that fails is
    /// forgotten by the caller, which knows which pages it still needs).
    fn forgotten(self) -> Option<(Key, u64)> {
        match self {
            Slot::Page(_) => None,
            Slot::State { hash, gen } => Some(((Kind::State, hash), gen)),
            Slot::Window { hash, gen, .. } => Some(((Kind::Window, hash), gen)),
        }
    }
}

enum Job {
    Write {
        gen: u64,
        header: Header,
        data: Arc<Vec<u8>>,
    },
    Read {
        load: LoadId,
        slot: Slot,
        header: Header,
    },
    Delete {
        key: Key,
    },
    /// Reply once every earlier job is done.
    Flush(Sender<()>),
}

enum Done {
    Written {
        key: Key,
        gen: u64,
        result: Result<u64, String>,
        secs: f64,
    },
    Read {
        load: LoadId,
        slot: Slot,
        result: Result<Vec<u8>, String>,
        secs: f64,
    },
}

struct Load {
    pages: Vec<Option<Arc<Vec<u8>>>>,
    failed: Vec<bool>,
    state: Option<Arc<Vec<u8>>>,
    windows: Vec<Option<Arc<Vec<u8>>>>,
    outstanding: usize,
}

/// A finished load: for each requested page in order, its KV bytes, or `None` when
/// it could not be used (the caller recomputes from the first `None` on); and the
/// requested state checkpoint, if any.
pub struct LoadResult {
    /// The load.
    pub id: LoadId,
    /// Page data in request order.
    pub pages: Vec<Option<Arc<Vec<u8>>>>,
    /// The checkpoint asked for with [`SsdTier::start_load_with_state`], verified;
    /// `None` when not asked for, not in the tier, or unreadable (then forgotten).
    /// It is delivered whether or not the pages loaded: it belongs to the hash it
    /// was asked under, and only the caller knows whether it can use it.
    pub state: Option<Arc<Vec<u8>>>,
    /// The windows asked for with [`SsdTier::start_load_entries`], in request order,
    /// verified; `None` where not in the tier or unreadable (then forgotten).
    pub windows: Vec<Option<Arc<Vec<u8>>>>,
}

impl LoadResult {
    /// Leading pages that loaded.
    pub fn n_ok(&self) -> usize {
        self.pages.iter().take_while(|p| p.is_some()).count()
    }

    /// Whether every page and window asked for loaded.
    pub fn complete(&self) -> bool {
        self.pages.iter().chain(&self.windows).all(Option::is_some)
    }
}

/// What [`SsdTier::fetch`] did with one entry of a load.
enum Fetch {
    /// Served from the write queue's copy.
    Ready(Arc<Vec<u8>>),
    /// A read is queued.
    Queued,
    /// Not in the tier, or the I/O thread is gone.
    Failed,
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// The SSD tier of one engine. See the module docs.
pub struct SsdTier {
    cfg: SsdConfig,
    model_id: u64,
    page_tokens: usize,
    page_bytes: usize,
    state_bytes: usize,
    window_bytes: usize,
    hasher: PageHasher,
    dir: PathBuf,
    index: HashMap<Key, Entry>,
    /// tick -> key, least recently used first.
    lru: BTreeMap<u64, Key>,
    tick: u64,
    gen: u64,
    /// Entries, by kind.
    held: [usize; KINDS],
    /// Bytes of entries' files, by kind.
    held_bytes: [u64; KINDS],
    /// Payload bytes of queued writes, every kind.
    pending_bytes: usize,
    /// Queued writes, by kind.
    pending: [usize; KINDS],
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    loads: HashMap<LoadId, Load>,
    /// Loads whose every entry is in; handed out by `poll`.
    finished: VecDeque<LoadId>,
    next_load: LoadId,
    stats: SsdStats,
    /// Held while open: no other process uses this directory.
    _lock: files::DirLock,
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
    /// pool's), without state checkpoints. With persistence, loads the index a
    /// previous run left.
    pub fn open(
        cfg: SsdConfig,
        model_id: u64,
        page_tokens: usize,
        page_bytes: usize,
        hasher: PageHasher,
    ) -> std::io::Result<SsdTier> {
        SsdTier::open_with_states(cfg, model_id, page_tokens, page_bytes, 0, hasher)
    }

    /// Like [`SsdTier::open`], for a model whose state checkpoints are `state_bytes`
    /// bytes each (0: none; [`SsdTier::save_state`] then stores nothing). The size is
    /// fixed at opening because a persistent index's entries are sized by it.
    pub fn open_with_states(
        cfg: SsdConfig,
        model_id: u64,
        page_tokens: usize,
        page_bytes: usize,
        state_bytes: usize,
        hasher: PageHasher,
    ) -> std::io::Result<SsdTier> {
        let bytes = EntryBytes {
            page: page_bytes,
            state: state_bytes,
            window: 0,
        };
        SsdTier::open_sized(cfg, model_id, page_tokens, bytes, hasher)
    }

    /// Like [`SsdTier::open`], with every entry kind's size (see [`EntryBytes`]).
    pub fn open_sized(
        cfg: SsdConfig,
        model_id: u64,
        page_tokens: usize,
        bytes: EntryBytes,
        hasher: PageHasher,
    ) -> std::io::Result<SsdTier> {
        let EntryBytes {
            page: page_bytes,
            state: state_bytes,
            window: window_bytes,
        } = bytes;
        files::create_private_dir(&cfg.dir)?;
        files::sweep_stale(&cfg.dir);
        let dir = if cfg.persist {
            cfg.dir.join(format!("{model_id:016x}"))
        } else {
            let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
            cfg.dir.join(format!(
                "{}{}-{n}-{model_id:016x}",
                files::TMP_PREFIX,
                std::process::id()
            ))
        };
        if !cfg.persist && dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        files::create_private_dir(&dir)?;
        let lock = files::DirLock::acquire(&dir)?;
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
            state_bytes,
            window_bytes,
            hasher,
            dir,
            index: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            gen: 0,
            held: [0; KINDS],
            held_bytes: [0; KINDS],
            pending_bytes: 0,
            pending: [0; KINDS],
            jobs: Some(jobs_tx),
            done: done_rx,
            thread: Some(thread),
            loads: HashMap::new(),
            finished: VecDeque::new(),
            next_load: 0,
            _lock: lock,
        };
        if tier.cfg.persist {
            match tier.load_index() {
                Ok(()) => {
                    tracing::info!(pages = tier.held[Kind::Page.i()], states = tier.held[Kind::State.i()],
                        windows = tier.held[Kind::Window.i()], dir = %tier.dir.display(),
                        "KV SSD tier: index loaded")
                }
                Err(why) => {
                    tier.index.clear();
                    tier.lru.clear();
                    tier.held = [0; KINDS];
                    tier.held_bytes = [0; KINDS];
                    if why == "no index" {
                        // The last run was killed (or never stopped cleanly): the
                        // files describe themselves; keep the whole ones of this model.
                        let (kept, removed) = tier.recover_from_files();
                        if kept + removed > 0 {
                            tracing::warn!(dir = %tier.dir.display(), kept, removed,
                                "KV SSD tier: no index (the last run did not stop cleanly); entries recovered from their files");
                        }
                    } else {
                        // A corrupt or foreign index: trust none of it.
                        tracing::warn!(dir = %tier.dir.display(), %why, "KV SSD tier: index unusable; starting empty");
                        tier.remove_entry_files();
                    }
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
        self.index.contains_key(&(Kind::Page, hash))
    }

    /// Whether a state checkpoint after the page of this hash is in the tier.
    pub fn contains_state(&self, page_hash: u64) -> bool {
        self.index.contains_key(&(Kind::State, page_hash))
    }

    /// Whether the window entry (sliding layers' KV) of the page of this hash is in
    /// the tier.
    pub fn contains_window(&self, page_hash: u64) -> bool {
        self.index.contains_key(&(Kind::Window, page_hash))
    }

    fn touch(&mut self, key: Key) {
        if let Some(e) = self.index.get_mut(&key) {
            self.lru.remove(&e.tick);
            self.tick += 1;
            e.tick = self.tick;
            self.lru.insert(self.tick, key);
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
            match self.index.get(&(Kind::Page, h)).map(|e| &e.header) {
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
        let header = Header {
            kind: Kind::Page,
            model_id: self.model_id,
            hash: page.hash,
            parent_hash: page.parent_hash,
            salt: page.salt,
            tokens: page.tokens.clone(),
            payload_len: data.len() as u64,
        };
        self.store(header, data, self.page_bytes);
    }

    /// Like [`SsdTier::save`], but waits for queued writes instead of dropping the
    /// page when the write queue is full (for shutdown).
    pub fn save_wait(&mut self, page: &EvictedPage, data: Vec<u8>) {
        if self.pending_bytes + data.len() > self.cfg.max_pending_bytes {
            self.flush();
        }
        self.save(page, data);
    }

    /// Stores the recurrent layers' states as they were just after the last token of
    /// the page of hash `page_hash` (`data`, [`SsdTier::state_bytes`] bytes). Drops
    /// it (counted) when its size is wrong, the budget cannot hold it or the write
    /// queue is full. A checkpoint already held under `page_hash` is kept (and made
    /// most recently used): the same prefix gives the same state.
    pub fn save_state(&mut self, page_hash: u64, data: Vec<u8>) {
        let header = Header::keyed(Kind::State, self.model_id, page_hash, data.len() as u64);
        self.store(header, data, self.state_bytes);
    }

    /// Like [`SsdTier::save_state`], but waits for queued writes instead of dropping
    /// the checkpoint when the write queue is full (for shutdown).
    pub fn save_state_wait(&mut self, page_hash: u64, data: Vec<u8>) {
        if self.pending_bytes + data.len() > self.cfg.max_pending_bytes {
            self.flush();
        }
        self.save_state(page_hash, data);
    }

    /// Stores the sliding-window layers' KV of the page of hash `page_hash` (its
    /// sidecar: `data`, [`SsdTier::window_bytes`] bytes). Drops it (counted) when its
    /// size is wrong, the budget cannot hold it or the write queue is full. A window
    /// already held under `page_hash` is kept (and made most recently used).
    pub fn save_window(&mut self, page_hash: u64, data: Vec<u8>) {
        let header = Header::keyed(Kind::Window, self.model_id, page_hash, data.len() as u64);
        self.store(header, data, self.window_bytes);
    }

    /// Like [`SsdTier::save_window`], but waits for queued writes instead of dropping
    /// the window when the write queue is full (for shutdown).
    pub fn save_window_wait(&mut self, page_hash: u64, data: Vec<u8>) {
        if self.pending_bytes + data.len() > self.cfg.max_pending_bytes {
            self.flush();
        }
        self.save_window(page_hash, data);
    }

    /// Queues `data` for writing under `header` (its payload must be `want_len`
    /// bytes), removing least recently used entries to make room.
    fn store(&mut self, header: Header, data: Vec<u8>, want_len: usize) {
        self.drain_done();
        let key = header.key();
        if self.index.contains_key(&key) {
            self.touch(key);
            return;
        }
        let file_bytes = header.file_bytes();
        if want_len == 0
            || data.len() != want_len
            || file_bytes > self.cfg.budget_bytes
            || self.pending_bytes + data.len() > self.cfg.max_pending_bytes
        {
            self.count_dropped(key.0);
            return;
        }
        while self.used_bytes() + file_bytes > self.cfg.budget_bytes {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            self.remove(victim);
            match victim.0 {
                Kind::Page => self.stats.evicted_pages += 1,
                Kind::State => self.stats.evicted_states += 1,
                Kind::Window => self.stats.windows.evicted += 1,
            }
        }
        let data = Arc::new(data);
        self.gen += 1;
        let job = Job::Write {
            gen: self.gen,
            header: header.clone(),
            data: data.clone(),
        };
        if !self.send(job) {
            self.count_dropped(key.0);
            self.sync_stats();
            return;
        }
        self.pending_bytes += data.len();
        self.pending[key.0.i()] += 1;
        self.tick += 1;
        self.index.insert(
            key,
            Entry {
                header,
                stage: Stage::Writing(data),
                tick: self.tick,
                gen: self.gen,
                file_bytes,
            },
        );
        self.lru.insert(self.tick, key);
        self.held[key.0.i()] += 1;
        self.held_bytes[key.0.i()] += file_bytes;
        self.sync_stats();
    }

    fn count_dropped(&mut self, kind: Kind) {
        match kind {
            Kind::Page => self.stats.writes_dropped += 1,
            Kind::State => self.stats.state_writes_dropped += 1,
            Kind::Window => self.stats.windows.writes_dropped += 1,
        }
    }

    /// Bytes of all entries' files, the quantity the budget bounds.
    fn used_bytes(&self) -> u64 {
        self.held_bytes.iter().sum()
    }

    /// Sends a job without blocking; false when the queue is full or the thread gone.
    fn send(&mut self, job: Job) -> bool {
        match self.jobs.as_ref().map(|j| j.try_send(job)) {
            Some(Ok(())) => true,
            Some(Err(TrySendError::Full(_))) => false,
            _ => false,
        }
    }

    /// Drops an entry from the index and deletes its file (after its write, if
    /// queued).
    fn remove(&mut self, key: Key) {
        let Some(e) = self.index.remove(&key) else {
            return;
        };
        self.lru.remove(&e.tick);
        self.held[key.0.i()] -= 1;
        self.held_bytes[key.0.i()] -= e.file_bytes;
        if let Stage::Writing(d) = &e.stage {
            self.pending_bytes -= d.len();
            self.pending[key.0.i()] -= 1;
        }
        if let Some(j) = &self.jobs {
            // A delete that does not fit the queue leaves an orphan file; the next
            // write of the same key replaces it, and reads verify the header.
            let _ = j.try_send(Job::Delete { key });
        }
    }

    /// Starts reading the pages `hashes` (from [`SsdTier::continue_prefix`]); the
    /// result comes from [`SsdTier::poll`] under the returned id. Pages still in the
    /// write queue are served from memory at once.
    pub fn start_load(&mut self, hashes: &[u64]) -> LoadId {
        self.start_load_with_state(hashes, None)
    }

    /// Like [`SsdTier::start_load`], and also reads the state checkpoint kept under
    /// `state` (normally the last of `hashes`; `hashes` may be empty for a
    /// checkpoint alone) into [`LoadResult::state`]. The checkpoint is read after the
    /// pages and is delivered whether or not they load; a checkpoint not in the tier
    /// gives `None` and no read error.
    pub fn start_load_with_state(&mut self, hashes: &[u64], state: Option<u64>) -> LoadId {
        self.start_load_entries(hashes, state, &[])
    }

    /// Like [`SsdTier::start_load_with_state`], and also reads the window entries
    /// kept under `windows` (page hashes) into [`LoadResult::windows`], in order,
    /// after the pages. A window not in the tier gives `None` and no read error.
    pub fn start_load_entries(
        &mut self,
        hashes: &[u64],
        state: Option<u64>,
        windows: &[u64],
    ) -> LoadId {
        self.drain_done();
        self.next_load += 1;
        let id = self.next_load;
        let mut load = Load {
            pages: vec![None; hashes.len()],
            failed: vec![false; hashes.len()],
            state: None,
            windows: vec![None; windows.len()],
            outstanding: 0,
        };
        for (idx, &h) in hashes.iter().enumerate() {
            match self.fetch(id, (Kind::Page, h), idx) {
                Fetch::Ready(d) => load.pages[idx] = Some(d),
                Fetch::Queued => load.outstanding += 1,
                Fetch::Failed => load.failed[idx] = true,
            }
        }
        if let Some(h) = state {
            match self.fetch(id, (Kind::State, h), 0) {
                Fetch::Ready(d) => load.state = Some(d),
                Fetch::Queued => load.outstanding += 1,
                Fetch::Failed => {}
            }
        }
        for (idx, &h) in windows.iter().enumerate() {
            match self.fetch(id, (Kind::Window, h), idx) {
                Fetch::Ready(d) => load.windows[idx] = Some(d),
                Fetch::Queued => load.outstanding += 1,
                Fetch::Failed => {}
            }
        }
        let done = load.outstanding == 0;
        self.loads.insert(id, load);
        if done {
            self.finished.push_back(id);
        }
        id
    }

    /// Makes entry `key` most recently used and serves it to load `load` (as its
    /// `idx`th page or window, or its checkpoint): from the write queue's copy, or by
    /// queueing a read.
    fn fetch(&mut self, load: LoadId, key: Key, idx: usize) -> Fetch {
        self.touch(key);
        let Some(e) = self.index.get(&key) else {
            return Fetch::Failed;
        };
        let header = match &e.stage {
            Stage::Writing(d) => return Fetch::Ready(d.clone()),
            Stage::OnDisk => e.header.clone(),
        };
        let (hash, gen) = (key.1, e.gen);
        let slot = match key.0 {
            Kind::Page => Slot::Page(idx),
            Kind::State => Slot::State { hash, gen },
            Kind::Window => Slot::Window { idx, hash, gen },
        };
        let job = Job::Read { load, slot, header };
        // Reads may wait for room in the queue: the writer always drains it.
        if self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok()) {
            Fetch::Queued
        } else {
            Fetch::Failed
        }
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
                if l.state.is_some() {
                    self.stats.served_states += 1;
                }
                self.stats.windows.served += l.windows.iter().flatten().count() as u64;
                out.push(LoadResult {
                    id,
                    pages,
                    state: l.state,
                    windows: l.windows,
                });
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
                key,
                gen,
                result,
                secs,
            } => {
                let current = self.index.get(&key).is_some_and(|e| e.gen == gen);
                match key.0 {
                    Kind::Page => self.stats.write_secs += secs,
                    Kind::State => self.stats.state_write_secs += secs,
                    Kind::Window => self.stats.windows.write_secs += secs,
                }
                match result {
                    Ok(bytes) => {
                        match key.0 {
                            Kind::Page => {
                                self.stats.write_pages += 1;
                                self.stats.write_bytes += bytes;
                            }
                            Kind::State => {
                                self.stats.write_states += 1;
                                self.stats.write_state_bytes += bytes;
                            }
                            Kind::Window => {
                                self.stats.windows.written += 1;
                                self.stats.windows.write_bytes += bytes;
                            }
                        }
                        if current {
                            let e = self.index.get_mut(&key).expect("current");
                            if let Stage::Writing(d) = &e.stage {
                                self.pending_bytes -= d.len();
                                self.pending[key.0.i()] -= 1;
                            }
                            e.stage = Stage::OnDisk;
                        }
                    }
                    Err(why) => {
                        let errors = match key.0 {
                            Kind::Page => &mut self.stats.write_errors,
                            Kind::State => &mut self.stats.state_write_errors,
                            Kind::Window => &mut self.stats.windows.write_errors,
                        };
                        *errors += 1;
                        if errors.is_power_of_two() {
                            tracing::warn!(%why, errors = *errors, kind = key.0.ext(),
                                "KV SSD tier: write failed; the prefix will be recomputed");
                        }
                        if current {
                            self.remove(key);
                        }
                    }
                }
            }
            Done::Read {
                load,
                slot,
                result,
                secs,
            } => {
                match (slot, &result) {
                    (Slot::Page(_), Ok(data)) => {
                        self.stats.read_secs += secs;
                        self.stats.read_pages += 1;
                        self.stats.read_bytes += data.len() as u64;
                    }
                    (Slot::State { .. }, Ok(data)) => {
                        self.stats.state_read_secs += secs;
                        self.stats.read_states += 1;
                        self.stats.read_state_bytes += data.len() as u64;
                    }
                    (Slot::Page(_), Err(why)) => {
                        self.stats.read_secs += secs;
                        self.stats.read_errors += 1;
                        if self.stats.read_errors.is_power_of_two() {
                            tracing::warn!(%why, errors = self.stats.read_errors,
                                "KV SSD tier: page unusable; recomputing it");
                        }
                    }
                    (Slot::State { .. }, Err(why)) => {
                        self.stats.state_read_secs += secs;
                        self.stats.state_read_errors += 1;
                        if self.stats.state_read_errors.is_power_of_two() {
                            tracing::warn!(%why, errors = self.stats.state_read_errors,
                                "KV SSD tier: state checkpoint unusable; recomputing it");
                        }
                    }
                    (Slot::Window { .. }, Ok(data)) => {
                        let w = &mut self.stats.windows;
                        w.read_secs += secs;
                        w.read += 1;
                        w.read_bytes += data.len() as u64;
                    }
                    (Slot::Window { .. }, Err(why)) => {
                        let w = &mut self.stats.windows;
                        w.read_secs += secs;
                        w.read_errors += 1;
                        if w.read_errors.is_power_of_two() {
                            tracing::warn!(%why, errors = w.read_errors,
                                "KV SSD tier: sliding window unusable; recomputing it");
                        }
                    }
                }
                if let (Some((key, gen)), Err(_)) = (slot.forgotten(), &result) {
                    // Forgotten here, not by the caller: it may have gone away, and a
                    // replacement saved since the read began is kept.
                    if self.index.get(&key).is_some_and(|e| e.gen == gen) {
                        self.remove(key);
                    }
                }
                if let Some(l) = self.loads.get_mut(&load) {
                    let data = result.ok().map(Arc::new);
                    match slot {
                        Slot::Page(idx) => match data {
                            Some(d) => l.pages[idx] = Some(d),
                            None => l.failed[idx] = true,
                        },
                        Slot::State { .. } => l.state = data,
                        Slot::Window { idx, .. } => l.windows[idx] = data,
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
        self.remove((Kind::Page, hash));
        self.sync_stats();
    }

    /// Forgets the state checkpoint kept under `page_hash` (e.g. the caller found it
    /// unusable); its file is deleted.
    pub fn forget_state(&mut self, page_hash: u64) {
        self.remove((Kind::State, page_hash));
        self.sync_stats();
    }

    /// Forgets the window entry kept under `page_hash`; its file is deleted.
    pub fn forget_window(&mut self, page_hash: u64) {
        self.remove((Kind::Window, page_hash));
        self.sync_stats();
    }

    fn sync_stats(&mut self) {
        let (p, s, w) = (Kind::Page.i(), Kind::State.i(), Kind::Window.i());
        self.stats.pages = self.held[p];
        self.stats.bytes = self.held_bytes[p];
        self.stats.pending_pages = self.pending[p];
        self.stats.states = self.held[s];
        self.stats.state_bytes = self.held_bytes[s];
        self.stats.pending_states = self.pending[s];
        self.stats.windows.entries = self.held[w];
        self.stats.windows.bytes = self.held_bytes[w];
        self.stats.windows.pending = self.pending[w];
    }

    /// Bytes of one page's KV.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Bytes of one state checkpoint (0: the tier keeps none).
    pub fn state_bytes(&self) -> usize {
        self.state_bytes
    }

    /// Bytes of one window entry (0: the tier keeps none).
    pub fn window_bytes(&self) -> usize {
        self.window_bytes
    }

    /// Whether writes are queued or in flight whose completion this tier has not
    /// taken in yet (its counters still show them pending).
    pub fn has_pending_writes(&self) -> bool {
        self.pending.iter().any(|&n| n > 0)
    }

    /// Takes in the writes the I/O thread finished, without waiting: an idle engine
    /// calls it so the counters (pending pages, bytes) come back to rest.
    pub fn poll_writes(&mut self) {
        self.drain_done();
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
