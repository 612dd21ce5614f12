//! The full consistency check of the pool's bookkeeping. Apart because it restates
//! every invariant independently of the code that maintains them (for tests and debug
//! builds): it reads all the private state and changes none.

use std::collections::HashSet;

use super::*;

impl PagePool {
    /// Checks every bookkeeping invariant in O(pages + page-table entries + cached
    /// tokens); returns the first violation. Meant for tests and debug builds.
    ///
    /// - every page is in exactly one of {free, in use, cached}; the counters agree;
    /// - a page's ref count equals the number of page tables holding it;
    /// - a page table covers exactly its sequence's tokens, and every page not yet
    ///   final (the one being written, at least) is private: one reference, not cached;
    /// - cache entries form a forest: parents are registered and list each child
    ///   once, hashes chain from [`ROOT_HASH`], no two entries share a key, and the
    ///   hash index holds exactly the registered pages.
    pub fn check_invariants(&self) -> Result<(), String> {
        macro_rules! ensure {
            ($cond:expr, $($msg:tt)*) => {
                if !$cond {
                    return Err(format!($($msg)*));
                }
            };
        }
        let st = &self.store;
        let n = st.pages.len();
        let ps = st.page_size;

        let mut refs = vec![0u32; n];
        for (&id, s) in &self.seqs {
            ensure!(
                s.pages.len() == s.n_tokens.div_ceil(ps),
                "seq {id}: {} pages for {} tokens",
                s.pages.len(),
                s.n_tokens
            );
            ensure!(
                s.n_final * ps <= s.n_tokens,
                "seq {id}: {} final pages but {} tokens",
                s.n_final,
                s.n_tokens
            );
            for (i, &p) in s.pages.iter().enumerate() {
                ensure!((p as usize) < n, "seq {id}: page {p} out of range");
                refs[p as usize] += 1;
                let pg = st.page(p);
                ensure!(
                    i < s.n_final || (pg.refs == 1 && pg.entry.is_none()),
                    "seq {id}: page {p} at index {i} is still written but not private"
                );
            }
        }
        for (p, pg) in st.pages.iter().enumerate() {
            ensure!(
                pg.refs == refs[p],
                "page {p}: ref count {} but {} page tables hold it",
                pg.refs,
                refs[p]
            );
        }

        // 1 = on the free list, 2 = in the LRU; pages with references are in neither.
        let mut listed = vec![0u8; n];
        for &p in &st.free {
            ensure!((p as usize) < n, "free page {p} out of range");
            ensure!(listed[p as usize] == 0, "page {p} twice on the free list");
            listed[p as usize] = 1;
            let pg = st.page(p);
            ensure!(
                pg.refs == 0 && pg.entry.is_none(),
                "free page {p} is referenced or registered"
            );
        }
        for (i, &p) in st.free.iter().enumerate() {
            ensure!(
                st.free_pos[p as usize] as usize == i,
                "free page {p}: position index is stale"
            );
        }
        ensure!(
            st.free_pos.iter().filter(|&&i| i != NIL).count() == st.free.len(),
            "position index lists pages that are not free"
        );
        let (mut prev, mut p, mut n_lru) = (NIL, st.lru_head, 0);
        while p != NIL {
            ensure!((p as usize) < n, "LRU page {p} out of range");
            ensure!(
                listed[p as usize] == 0,
                "LRU page {p} also listed elsewhere"
            );
            listed[p as usize] = 2;
            let pg = st.page(p);
            ensure!(pg.prev == prev, "LRU page {p}: broken back link");
            ensure!(
                pg.refs == 0 && pg.entry.is_some(),
                "LRU page {p} is referenced or unregistered"
            );
            n_lru += 1;
            (prev, p) = (p, pg.next);
        }
        ensure!(
            st.lru_tail == prev,
            "LRU tail is {} not {prev}",
            st.lru_tail
        );
        ensure!(
            n_lru == st.n_cached,
            "{n_lru} pages in the LRU, counter says {}",
            st.n_cached
        );
        for (p, pg) in st.pages.iter().enumerate() {
            ensure!(
                pg.refs > 0 || listed[p] != 0,
                "page {p} is unreferenced but neither free nor cached"
            );
        }

        let mut n_registered = 0;
        let mut n_with_parent = 0;
        let mut is_child = vec![false; n];
        let mut keys = HashSet::new();
        for (p, pg) in st.pages.iter().enumerate() {
            let Some(e) = &pg.entry else { continue };
            n_registered += 1;
            let partial = !e.tokens.is_empty() && e.tokens.len() < ps;
            ensure!(
                e.tokens.len() == ps || (partial && e.children.is_empty() && pg.refs == 0),
                "page {p}: entry of {} tokens ({} children, {} refs)",
                e.tokens.len(),
                e.children.len(),
                pg.refs
            );
            let parent_hash = match e.parent {
                None => ROOT_HASH,
                Some(q) => {
                    n_with_parent += 1;
                    let Some(pe) = st.pages.get(q as usize).and_then(|x| x.entry.as_ref()) else {
                        return Err(format!("page {p}: parent {q} is not registered"));
                    };
                    pe.hash
                }
            };
            ensure!(
                e.hash == (st.hasher)(parent_hash, e.salt, &e.tokens),
                "page {p}: hash does not chain from its parent"
            );
            ensure!(
                keys.insert((e.parent, e.salt, &e.tokens[..])),
                "page {p}: another cached page has the same key"
            );
            for &c in &e.children {
                let ce = st.pages.get(c as usize).and_then(|x| x.entry.as_ref());
                ensure!(
                    ce.is_some_and(|ce| ce.parent == Some(p as PageId)),
                    "page {p}: child {c} is not registered under it"
                );
                ensure!(!is_child[c as usize], "page {c} listed twice as a child");
                is_child[c as usize] = true;
            }
        }
        let n_children = is_child.iter().filter(|&&c| c).count();
        ensure!(
            n_children == n_with_parent,
            "{n_with_parent} entries have a parent but {n_children} are linked as children"
        );
        for &r in &st.roots {
            let re = st.pages.get(r as usize).and_then(|x| x.entry.as_ref());
            ensure!(
                re.is_some_and(|re| re.parent.is_none()),
                "root {r} is not a registered first page"
            );
            ensure!(!is_child[r as usize], "page {r} listed twice as a root");
            is_child[r as usize] = true;
        }
        ensure!(
            st.roots.len() == n_registered - n_with_parent,
            "{} first pages registered but {} listed as roots",
            n_registered - n_with_parent,
            st.roots.len()
        );
        ensure!(
            n_registered == st.n_registered,
            "{n_registered} registered pages, counter says {}",
            st.n_registered
        );

        let mut indexed = vec![false; n];
        let mut n_indexed = 0;
        for (&h, &head) in &st.index {
            let mut q = head;
            ensure!(q != NIL, "empty bucket for hash {h:#x}");
            while q != NIL {
                ensure!((q as usize) < n, "indexed page {q} out of range");
                ensure!(!indexed[q as usize], "page {q} indexed twice");
                indexed[q as usize] = true;
                let e = st.page(q).entry.as_ref();
                ensure!(
                    e.is_some_and(|e| e.hash == h),
                    "page {q} in bucket {h:#x} is not registered with that hash"
                );
                n_indexed += 1;
                q = st.page(q).hash_next;
            }
        }
        ensure!(
            n_indexed == n_registered,
            "{n_indexed} indexed pages but {n_registered} registered"
        );
        Ok(())
    }
}
