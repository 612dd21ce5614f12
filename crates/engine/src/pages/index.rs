//! The prefix cache's index: registered pages keyed by (parent page, salt, tokens),
//! found through hash buckets and linked as a tree, and the lookups a prompt makes
//! against it. Apart because the cache's correctness lives here: a match must hold
//! exactly the KV of the looked-up prefix, whatever the hash does.

use super::*;

impl Store {
    /// The registered page with exactly this key, if any.
    pub(super) fn find(
        &self,
        hash: u64,
        parent: Option<PageId>,
        salt: u64,
        tokens: &[TokenId],
    ) -> Option<PageId> {
        let mut p = *self.index.get(&hash)?;
        while p != NIL {
            let e = self.entry(p);
            if e.parent == parent && e.salt == salt && *e.tokens == *tokens {
                return Some(p);
            }
            p = self.page(p).hash_next;
        }
        None
    }

    pub(super) fn register(
        &mut self,
        p: PageId,
        hash: u64,
        parent: Option<PageId>,
        salt: u64,
        tokens: &[TokenId],
        (exact, kind): (usize, u8),
    ) {
        match parent {
            Some(parent) => {
                let e = self.page_mut(parent).entry.as_mut();
                e.expect("parent is registered").children.push(p);
            }
            None => self.roots.push(p),
        }
        let next = self.index.insert(hash, p).unwrap_or(NIL);
        let pg = self.page_mut(p);
        pg.hash_next = next;
        pg.entry = Some(Entry {
            hash,
            parent,
            salt,
            tokens: tokens.into(),
            children: Vec::new(),
            exact: exact.min(tokens.len()) as u32,
            kind,
        });
        self.n_registered += 1;
    }

    pub(super) fn index_remove(&mut self, hash: u64, p: PageId) {
        let next = std::mem::replace(&mut self.page_mut(p).hash_next, NIL);
        let head = self.index[&hash];
        if head == p {
            if next == NIL {
                self.index.remove(&hash);
            } else {
                self.index.insert(hash, next);
            }
            return;
        }
        let mut q = head;
        while self.page(q).hash_next != p {
            q = self.page(q).hash_next;
            assert_ne!(q, NIL, "page {p} missing from its hash bucket");
        }
        self.page_mut(q).hash_next = next;
    }
}

impl PagePool {
    /// Whether `page` is registered in the prefix cache (referenced or not).
    pub fn is_registered(&self, page: PageId) -> bool {
        self.store.page(page).entry.is_some()
    }

    /// While `page` is registered: the number of its registration (which changes
    /// whenever a registration ends) and its tokens; `None` when it is not
    /// registered. A registered page is never written, so an equal number means
    /// unchanged KV.
    pub fn registration(&self, page: PageId) -> Option<(u64, &[TokenId])> {
        let p = self.store.page(page);
        p.entry.as_ref().map(|e| (p.epoch, &e.tokens[..]))
    }

    /// While `page` is registered: the cached page before it in its prompt (`None`
    /// for a first page); `None` when it is not registered.
    pub fn registered_parent(&self, page: PageId) -> Option<Option<PageId>> {
        self.store.page(page).entry.as_ref().map(|e| e.parent)
    }

    /// Registered pages directly under `page` (prompts that continue it differently
    /// once there are two or more); 0 when it is not registered.
    pub fn n_children(&self, page: PageId) -> usize {
        self.store
            .page(page)
            .entry
            .as_ref()
            .map_or(0, |e| e.children.len())
    }

    /// Registered pages under `parent` (`None`: first pages), newest first, at most
    /// `max`, with their kind and the tokens of their leading cells another prompt
    /// may copy (those with none are skipped).
    pub fn copy_candidates(
        &self,
        parent: Option<PageId>,
        max: usize,
    ) -> impl Iterator<Item = (PageId, u8, &[TokenId])> + '_ {
        let st = &self.store;
        let pages: &[PageId] = match parent {
            Some(p) => st.page(p).entry.as_ref().map_or(&[], |e| &e.children[..]),
            None => &st.roots,
        };
        pages.iter().rev().take(max).filter_map(move |&p| {
            let e = st.entry(p);
            (e.exact > 0).then(|| (p, e.kind, &e.tokens[..e.exact as usize]))
        })
    }

    /// The longest run of cached full pages that starts `tokens` under `salt`.
    ///
    /// At most `(tokens.len() - 1) / page_size` pages: the last prompt token is always
    /// left to compute, because the model must run on it to produce the next token's
    /// logits. Does not change the pool; [`PagePool::allocate`] takes the pages.
    pub fn lookup_prefix(&self, tokens: &[TokenId], salt: u64) -> PrefixMatch {
        let max_pages = tokens.len().saturating_sub(1) / self.store.page_size;
        self.cached_run(tokens, salt, max_pages)
    }

    /// The registered pages that the whole pages of `tokens` run through under `salt`
    /// (as [`PagePool::lookup_prefix`], but the last page may end the tokens): where a
    /// sequence's committed pages hang in the cache, its own or an equal twin's.
    pub fn cached_pages(&self, tokens: &[TokenId], salt: u64) -> Vec<PageId> {
        let max_pages = tokens.len() / self.store.page_size;
        self.cached_run(tokens, salt, max_pages).pages
    }

    /// The chained hash of the page that ends `tokens` (whole pages) under `salt`:
    /// its name in every tier, whether or not a page with it is registered.
    pub fn chain_hash(&self, tokens: &[TokenId], salt: u64) -> u64 {
        let ps = self.store.page_size;
        debug_assert!(tokens.len().is_multiple_of(ps));
        tokens
            .chunks_exact(ps)
            .fold(ROOT_HASH, |h, t| (self.store.hasher)(h, salt, t))
    }

    fn cached_run(&self, tokens: &[TokenId], salt: u64, max_pages: usize) -> PrefixMatch {
        let st = &self.store;
        let ps = st.page_size;
        let mut pages = Vec::new();
        let (mut parent, mut hash) = (None, ROOT_HASH);
        for page_tokens in tokens.chunks_exact(ps).take(max_pages) {
            let h = (st.hasher)(hash, salt, page_tokens);
            let Some(p) = st.find(h, parent, salt, page_tokens) else {
                break;
            };
            pages.push(p);
            (parent, hash) = (Some(p), h);
        }
        let n_cached_tokens = pages.len() * ps;
        PrefixMatch {
            pages,
            n_cached_tokens,
        }
    }
}
