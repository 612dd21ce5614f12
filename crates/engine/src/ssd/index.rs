//! The tier's files on disk: entry paths, and the index a persistent tier writes on
//! shutdown and reads at start.

use super::*;

impl SsdTier {
    #[cfg(test)]
    pub(super) fn page_path(&self, hash: u64) -> PathBuf {
        entry_path(&self.dir, (Kind::Page, hash))
    }

    #[cfg(test)]
    pub(super) fn state_path(&self, hash: u64) -> PathBuf {
        entry_path(&self.dir, (Kind::State, hash))
    }

    #[cfg(test)]
    pub(super) fn window_path(&self, hash: u64) -> PathBuf {
        entry_path(&self.dir, (Kind::Window, hash))
    }

    pub(super) fn remove_entry_files(&self) {
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

    /// Rebuilds the index from the entry files' own headers, for a tier whose
    /// index is missing (the process was killed: the index is written only at a
    /// clean shutdown, and removed at start). A file is kept when its header names this model
    /// and layout, its name matches its hash and its length is whole; its payload's
    /// checksum is verified when it is read, as always. Partial writes (`.part`)
    /// and every other entry file are removed. Most recently written entries are
    /// kept first within the budget. Returns (entries kept, files removed).
    pub(super) fn recover_from_files(&mut self) -> (usize, usize) {
        let mut found: Vec<(std::time::SystemTime, Header)> = Vec::new();
        let mut removed = 0;
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        for e in rd.flatten() {
            let path = e.path();
            let Some(ext) = path.extension().and_then(|x| x.to_str()) else {
                continue;
            };
            let kind = [Kind::Page, Kind::State, Kind::Window]
                .into_iter()
                .find(|k| k.ext() == ext);
            if kind.is_none() && ext != "part" {
                continue;
            }
            let header = kind.and_then(|k| self.entry_header(&path, k));
            match header {
                Some(h) => {
                    let mtime = e
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    found.push((mtime, h));
                }
                None => {
                    if fs::remove_file(&path).is_ok() {
                        removed += 1;
                    }
                }
            }
        }
        found.sort_by_key(|(t, h)| (*t, h.hash));
        let mut used = 0u64;
        let mut keep = Vec::new();
        for (_, header) in found.into_iter().rev() {
            let file_bytes = header.file_bytes();
            if used + file_bytes > self.cfg.budget_bytes {
                let _ = fs::remove_file(entry_path(&self.dir, header.key()));
                removed += 1;
                continue;
            }
            used += file_bytes;
            keep.push(header);
        }
        let kept = keep.len();
        for header in keep.into_iter().rev() {
            self.insert_on_disk(header);
        }
        (kept, removed)
    }

    /// The header of the entry file at `path` of kind `kind`, when it is one of
    /// this tier's (model, page size, entry size, name, whole length).
    fn entry_header(&self, path: &Path, kind: Kind) -> Option<Header> {
        let hash = u64::from_str_radix(path.file_stem()?.to_str()?, 16).ok()?;
        let (payload_len, tokens) = match kind {
            Kind::Page => (self.page_bytes as u64, self.page_tokens),
            Kind::State => (self.state_bytes as u64, 0),
            Kind::Window => (self.window_bytes as u64, 0),
        };
        if payload_len == 0 {
            return None;
        }
        let mut f = files::open_read(path).ok()?;
        let len = f.metadata().ok()?.len();
        let mut want = Header {
            kind,
            model_id: self.model_id,
            hash,
            parent_hash: 0,
            salt: 0,
            tokens: vec![0; tokens].into(),
            payload_len,
        };
        let mut head = vec![0u8; want.bytes().len()];
        f.read_exact(&mut head).ok()?;
        let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        if kind == Kind::Page {
            // magic, model, hash, parent, salt, token count, tokens, payload length
            want.parent_hash = u64_at(24);
            want.salt = u64_at(32);
            want.tokens = head[48..48 + 4 * tokens]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
        }
        (head == want.bytes() && len == want.file_bytes()).then_some(want)
    }

    /// Adds an entry whose file is on disk, as the most recently used.
    fn insert_on_disk(&mut self, header: Header) {
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

    /// Index file: magic, model id, page tokens, page bytes, state bytes, window
    /// bytes, entry count, entries, then a checksum of everything before it. An entry
    /// is its kind (one byte: 0 page, 1 checkpoint, 2 window) and hash, and for a
    /// page its parent hash, salt and tokens. Entries are in LRU order, least
    /// recently used first.
    pub(super) fn write_index(&self) -> std::io::Result<()> {
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
        files::write_private(&self.dir.join(INDEX_FILE), &[&b], true)
    }

    /// Reads the index [`SsdTier::write_index`] left. With a smaller budget than
    /// last time, keeps the most recently used entries that fit and removes the
    /// others' files.
    pub(super) fn load_index(&mut self) -> Result<(), String> {
        let b = match files::read_all(&self.dir.join(INDEX_FILE)) {
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
            self.insert_on_disk(header);
        }
        Ok(())
    }
}
