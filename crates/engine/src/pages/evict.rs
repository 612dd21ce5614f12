//! Eviction and the second tier: a cached page leaving the index with its descendants,
//! and the log and dump through which the SSD tier copies KV out of RAM. Apart because
//! this is the one way pages leave the RAM cache, and what another tier may rely on
//! about them (full keys, parents before children, no partial entries) is decided here.

use super::*;

impl Store {
    /// Drops the cache entries of `root` and all its descendants; unreferenced ones
    /// move from the LRU to the free list.
    pub(super) fn uncache_subtree(&mut self, root: PageId) {
        let siblings = match self.entry(root).parent {
            Some(parent) => {
                let e = self.page_mut(parent).entry.as_mut();
                &mut e.expect("parent is registered").children
            }
            None => &mut self.roots,
        };
        let i = siblings.iter().position(|&c| c == root);
        siblings.remove(i.expect("child is linked"));
        let root_parent_hash = self
            .entry(root)
            .parent
            .map_or(ROOT_HASH, |q| self.entry(q).hash);
        let mut stack = vec![(root, root_parent_hash)];
        while let Some((p, parent_hash)) = stack.pop() {
            let entry = self.page_mut(p).entry.take().expect("page is registered");
            self.index_remove(entry.hash, p);
            self.page_mut(p).epoch += 1;
            self.n_registered -= 1;
            stack.extend(entry.children.iter().map(|&c| (c, entry.hash)));
            if self.page(p).refs == 0 {
                self.lru_remove(p);
                self.free_push(p);
                self.evicted += 1;
                // A partial entry has no name in another tier: it is only dropped.
                let whole = entry.tokens.len() == self.page_size;
                if let Some(log) = self.evicted_log.as_mut().filter(|_| whole) {
                    log.push(EvictedPage {
                        page: p,
                        hash: entry.hash,
                        parent_hash,
                        salt: entry.salt,
                        tokens: entry.tokens,
                    });
                }
            }
        }
    }
}

impl PagePool {
    /// Turns the eviction log on or off (off by default; turning it off clears it).
    /// While on, every evicted unreferenced page is kept for [`PagePool::take_evicted`].
    pub fn set_eviction_log(&mut self, on: bool) {
        self.store.evicted_log = on.then(Vec::new);
    }

    /// The pages evicted since the last call, oldest first. Their cells keep their KV
    /// until the pages are written again, which only a model step does: copy them out
    /// before the next step.
    pub fn take_evicted(&mut self) -> Vec<EvictedPage> {
        self.store
            .evicted_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether evicted pages wait in the log (their KV not yet copied out).
    pub fn has_pending_evictions(&self) -> bool {
        self.store
            .evicted_log
            .as_ref()
            .is_some_and(|l| !l.is_empty())
    }

    /// Every registered whole page (in use or cached) with its full cache key, parents
    /// before children (partial entries are left out); used to write the RAM cache to
    /// a persistent tier on shutdown.
    pub fn registered_pages(&self) -> Vec<EvictedPage> {
        let st = &self.store;
        let mut out = Vec::with_capacity(st.n_registered);
        let mut stack: Vec<(PageId, u64)> = st
            .pages
            .iter()
            .enumerate()
            .filter(|(_, pg)| pg.entry.as_ref().is_some_and(|e| e.parent.is_none()))
            .map(|(p, _)| (p as PageId, ROOT_HASH))
            .collect();
        while let Some((p, parent_hash)) = stack.pop() {
            let e = st.entry(p);
            if e.tokens.len() < st.page_size {
                continue; // a partial entry (a leaf): RAM only
            }
            out.push(EvictedPage {
                page: p,
                hash: e.hash,
                parent_hash,
                salt: e.salt,
                tokens: e.tokens.clone(),
            });
            stack.extend(e.children.iter().map(|&c| (c, e.hash)));
        }
        out
    }

    /// The chained hash of the cached page `page` (the name a second tier stores it
    /// under), or `None` when it is not registered.
    pub fn page_hash_of(&self, page: PageId) -> Option<u64> {
        self.store.page(page).entry.as_ref().map(|e| e.hash)
    }
}
