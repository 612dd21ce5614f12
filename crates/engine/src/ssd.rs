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
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::pages::{EvictedPage, PageHasher, TokenId};

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

/// Layout of the KV a page holds (and of the recurrent state a checkpoint holds):
/// entries are only shared between engines whose identities are equal.
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
    /// Bytes of one state checkpoint (all recurrent layers' states); 0 for a model
    /// without recurrent layers.
    pub state_bytes: usize,
}

/// Identity of the KV a model computes: a hash of the GGUF file's header (metadata
/// and tensor infos), its size and last MiB (weights), and the KV layout.
pub fn model_identity(gguf_bytes: &[u8], data_offset: usize, layout: &KvLayout) -> u64 {
    let head = &gguf_bytes[..data_offset.min(gguf_bytes.len())];
    let tail = &gguf_bytes[gguf_bytes.len().saturating_sub(1 << 20)..];
    let mut desc = format!(
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
    // Only when present, so a model without recurrent state keeps the identity (and
    // directory) it had before checkpoints existed: its old index is then found,
    // judged foreign by its version and its files removed, rather than left behind.
    if layout.state_bytes != 0 {
        desc.push_str(&format!(":state{}", layout.state_bytes));
    }
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
        };
        if tier.cfg.persist {
            match tier.load_index() {
                Ok(()) => {
                    tracing::info!(pages = tier.held[Kind::Page.i()], states = tier.held[Kind::State.i()],
                        windows = tier.held[Kind::Window.i()], dir = %tier.dir.display(),
                        "KV SSD tier: index loaded")
                }
                Err(why) => {
                    if why != "no index" {
                        tracing::warn!(dir = %tier.dir.display(), %why, "KV SSD tier: index unusable; starting empty");
                    }
                    tier.index.clear();
                    tier.lru.clear();
                    tier.held = [0; KINDS];
                    tier.held_bytes = [0; KINDS];
                    tier.remove_entry_files();
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

    #[cfg(test)]
    fn page_path(&self, hash: u64) -> PathBuf {
        entry_path(&self.dir, (Kind::Page, hash))
    }

    #[cfg(test)]
    fn state_path(&self, hash: u64) -> PathBuf {
        entry_path(&self.dir, (Kind::State, hash))
    }

    #[cfg(test)]
    fn window_path(&self, hash: u64) -> PathBuf {
        entry_path(&self.dir, (Kind::Window, hash))
    }

    fn remove_entry_files(&self) {
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let p = e.path();
                let exts = [Kind::Page, Kind::State, Kind::Window].map(Kind::ext);
                if p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)) {
                    let _ = fs::remove_file(p);
                }
            }
        }
    }

    /// Index file: magic, model id, page tokens, page bytes, state bytes, window
    /// bytes, entry count, entries, then a checksum of everything before it. An entry
    /// is its kind (one byte: 0 page, 1 checkpoint, 2 window) and hash, and for a
    /// page its parent hash, salt and tokens. Entries are in LRU order, least
    /// recently used first.
    fn write_index(&self) -> std::io::Result<()> {
        let mut b = Vec::new();
        b.extend_from_slice(INDEX_MAGIC);
        for x in [
            self.model_id,
            self.page_tokens as u64,
            self.page_bytes as u64,
            self.state_bytes as u64,
            self.window_bytes as u64,
        ] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        let on_disk: Vec<&Entry> = self
            .lru
            .values()
            .filter_map(|k| self.index.get(k))
            .filter(|e| matches!(e.stage, Stage::OnDisk))
            .collect();
        b.extend_from_slice(&(on_disk.len() as u64).to_le_bytes());
        for e in on_disk {
            let h = &e.header;
            b.push(h.kind.tag());
            b.extend_from_slice(&h.hash.to_le_bytes());
            if h.kind == Kind::Page {
                for x in [h.parent_hash, h.salt] {
                    b.extend_from_slice(&x.to_le_bytes());
                }
                for t in h.tokens.iter() {
                    b.extend_from_slice(&t.to_le_bytes());
                }
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

    /// Reads the index [`SsdTier::write_index`] left. With a smaller budget than
    /// last time, keeps the most recently used entries that fit and removes the
    /// others' files.
    fn load_index(&mut self) -> Result<(), String> {
        let b = match fs::read(self.dir.join(INDEX_FILE)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("no index".into()),
            Err(e) => return Err(e.to_string()),
        };
        const HEAD: usize = 56;
        if b.len() < HEAD + 8 || &b[..8] != INDEX_MAGIC {
            return Err(format!("index of {} bytes is not a Tempo9 index", b.len()));
        }
        let (body, sum) = b.split_at(b.len() - 8);
        if checksum(0, body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err("index checksum mismatch (truncated or corrupt)".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
        let (id, pt, pb, sb) = (u64_at(8), u64_at(16), u64_at(24), u64_at(32));
        let (wb, n) = (u64_at(40), u64_at(48));
        if id != self.model_id
            || pt as usize != self.page_tokens
            || pb as usize != self.page_bytes
            || sb as usize != self.state_bytes
            || wb as usize != self.window_bytes
        {
            return Err("index of another model or KV layout".into());
        }
        let page_entry = 1 + 24 + 4 * self.page_tokens;
        // A checkpoint or window: its kind and hash.
        let keyed_entry = 1 + 8;
        let mut headers = Vec::new();
        let mut at = HEAD;
        for _ in 0..n {
            let kind = body
                .get(at)
                .and_then(|&t| Kind::from_tag(t))
                .ok_or("index entry of unknown kind")?;
            let len = match kind {
                Kind::Page => page_entry,
                Kind::State | Kind::Window => keyed_entry,
            };
            if at + len > body.len() {
                return Err("index shorter than its entry count".into());
            }
            let hash = u64_at(at + 1);
            headers.push(match kind {
                Kind::Page => Header {
                    kind,
                    model_id: self.model_id,
                    hash,
                    parent_hash: u64_at(at + 9),
                    salt: u64_at(at + 17),
                    tokens: body[at + 25..at + len]
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect(),
                    payload_len: self.page_bytes as u64,
                },
                Kind::State => Header::keyed(kind, self.model_id, hash, self.state_bytes as u64),
                Kind::Window => Header::keyed(kind, self.model_id, hash, self.window_bytes as u64),
            });
            at += len;
        }
        if at != body.len() {
            return Err("index longer than its entry count".into());
        }
        // Most recently used first, so a smaller budget keeps those.
        let mut keep = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut used = 0u64;
        for header in headers.into_iter().rev() {
            if !seen.insert(header.key()) {
                continue;
            }
            let file_bytes = header.file_bytes();
            if used + file_bytes > self.cfg.budget_bytes {
                let _ = fs::remove_file(entry_path(&self.dir, header.key()));
                continue;
            }
            used += file_bytes;
            keep.push(header);
        }
        for header in keep.into_iter().rev() {
            let key = header.key();
            let file_bytes = header.file_bytes();
            self.tick += 1;
            self.lru.insert(self.tick, key);
            self.held[key.0.i()] += 1;
            self.held_bytes[key.0.i()] += file_bytes;
            self.index.insert(
                key,
                Entry {
                    header,
                    stage: Stage::OnDisk,
                    tick: self.tick,
                    gen: 0,
                    file_bytes,
                },
            );
        }
        Ok(())
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

fn entry_path(dir: &Path, (kind, hash): Key) -> PathBuf {
    dir.join(format!("{hash:016x}.{}", kind.ext()))
}

fn io_thread(dir: PathBuf, jobs: Receiver<Job>, done: Sender<Done>, fail_writes: bool) {
    let mut batch: Vec<Job> = Vec::new();
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while let Ok(j) = jobs.try_recv() {
            batch.push(j);
        }
        // Reads first: a request waits on them. Reads only target entries whose write
        // is done, so they never overtake their own entry's write.
        let (reads, others): (Vec<Job>, Vec<Job>) =
            batch.drain(..).partition(|j| matches!(j, Job::Read { .. }));
        for job in reads.into_iter().chain(others) {
            match job {
                Job::Read { load, slot, header } => {
                    let t = Instant::now();
                    let result = read_entry(&entry_path(&dir, header.key()), &header);
                    let secs = t.elapsed().as_secs_f64();
                    if done
                        .send(Done::Read {
                            load,
                            slot,
                            result,
                            secs,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Write { gen, header, data } => {
                    let t = Instant::now();
                    let path = entry_path(&dir, header.key());
                    let result = if fail_writes {
                        Err("injected write failure (no space left on device)".to_string())
                    } else {
                        write_entry(&path, &header, &data)
                    };
                    if result.is_err() {
                        let _ = fs::remove_file(&path);
                    }
                    let secs = t.elapsed().as_secs_f64();
                    if done
                        .send(Done::Written {
                            key: header.key(),
                            gen,
                            result,
                            secs,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Delete { key } => {
                    let _ = fs::remove_file(entry_path(&dir, key));
                }
                Job::Flush(reply) => {
                    let _ = reply.send(());
                }
            }
        }
    }
}

fn write_entry(path: &Path, header: &Header, data: &[u8]) -> Result<u64, String> {
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

fn read_entry(path: &Path, want: &Header) -> Result<Vec<u8>, String> {
    let head = want.bytes();
    let mut f = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut got = vec![0u8; head.len() + 8];
    f.read_exact(&mut got)
        .map_err(|e| format!("{}: header: {e}", path.display()))?;
    if got[..head.len()] != head[..] {
        return Err(format!(
            "{}: header does not match (foreign or stale file)",
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
        let w = t.stats().windows;
        assert_eq!((w.entries, w.pending), (2, 2));
        // From the write queue's copy, then from disk.
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
        let w = t.stats().windows;
        assert_eq!((w.read, w.read_bytes, w.served), (2, 2 * WB as u64, 4));
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
}
