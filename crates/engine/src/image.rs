//! Images in a prompt: where each one's tokens sit, the rope positions of every
//! cell of the sequence, the prefix-cache keys of image cells, and which cells
//! can be computed before the encoder has delivered an image's embeddings.
//!
//! A sequence's cells hold one token each, in prompt order, so masks, pages and
//! snapshots stay by cell index; only rope positions part from it after an image
//! (as llama.cpp's `mtmd` assigns M-RoPE positions): image token `i` of an
//! `n_x × n_y` grid starting at position `p` is at `(p, p + i / n_x, p + i % n_x)`
//! (temporal, row, column), and the text after it continues at
//! `p + max(n_x, n_y)`. Without M-RoPE (Gemma 4) an image's tokens take one
//! position each, as text. Where the projector's images are decoded
//! non-causally, an image's cells are computed in one step
//! ([`Images::whole_span`]) and see each other ([`Images::sees_through`]).

use std::sync::Arc;

use tempo9_models::vision::{ImageDecoding, ImageEmbeddings, PixelHash, Preprocessed};

use crate::scheduler::CHUNK_ALIGN;

/// An image in a request's prompt ([`crate::Request::images`]).
#[derive(Debug, Clone)]
pub struct PromptImage {
    /// Index in the prompt of the first of the image's tokens. The image takes
    /// `n_x * n_y` prompt tokens from there (its merged-token grid:
    /// `tempo9_models::vision::Projector::grid`); their ids are not used (the
    /// chat template's image placeholder, by convention).
    pub at: usize,
    /// The image as the encoder takes it.
    pub pixels: Arc<Preprocessed>,
}

/// One image of a sequence, placed.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// First cell.
    pub at: usize,
    /// Merged tokens per row.
    pub n_x: usize,
    /// Rows.
    pub n_y: usize,
    /// Its temporal rope position (the position of its first cell).
    pub pos: i32,
    /// M-RoPE positions ([`ImageDecoding::mrope`]).
    mrope: bool,
    pub pixels: Arc<Preprocessed>,
    /// The encoder's output, once delivered.
    pub embeds: Option<Arc<ImageEmbeddings>>,
}

impl Placed {
    /// One past its last cell.
    pub fn end(&self) -> usize {
        self.at + self.n_x * self.n_y
    }

    pub fn hash(&self) -> PixelHash {
        self.pixels.hash
    }

    /// How far the rope position advances over the image.
    fn advance(&self) -> i32 {
        match self.mrope {
            true => self.n_x.max(self.n_y) as i32,
            false => (self.n_x * self.n_y) as i32,
        }
    }
}

/// A sequence's images, in prompt order (none for a text prompt), and whether
/// each one's cells attend to each other ([`ImageDecoding::non_causal`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Images(Vec<Placed>, bool);

impl Images {
    /// Places `images` (checked: ascending, inside the prompt, on the
    /// `token_side`-pixel grid) and computes their rope positions.
    pub fn new(images: Vec<PromptImage>, token_side: usize, decoding: ImageDecoding) -> Images {
        let mut placed: Vec<Placed> = Vec::with_capacity(images.len());
        for img in images {
            // Text between images advances one position per token.
            let pos = match placed.last() {
                Some(p) => p.pos + p.advance() + (img.at - p.end()) as i32,
                None => img.at as i32,
            };
            placed.push(Placed {
                at: img.at,
                n_x: img.pixels.width / token_side,
                n_y: img.pixels.height / token_side,
                pos,
                mrope: decoding.mrope,
                pixels: img.pixels,
                embeds: None,
            });
        }
        Images(placed, decoding.non_causal)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Placed> {
        self.0.iter_mut()
    }

    /// The image covering `cell` and the cell's index in it.
    pub fn at_cell(&self, cell: usize) -> Option<(&Placed, usize)> {
        let i = self.0.partition_point(|p| p.at <= cell).checked_sub(1)?;
        let p = &self.0[i];
        (cell < p.end()).then(|| (p, cell - p.at))
    }

    /// The rope position of `cell` in the sequence: `(temporal, row, column)`,
    /// all three equal for text.
    pub fn position(&self, cell: usize) -> [i32; 3] {
        let i = self.0.partition_point(|p| p.at <= cell);
        let Some(p) = i.checked_sub(1).map(|i| &self.0[i]) else {
            return [cell as i32; 3];
        };
        if cell < p.end() && !p.mrope {
            return [p.pos + (cell - p.at) as i32; 3];
        }
        if cell < p.end() {
            let k = cell - p.at;
            return [
                p.pos,
                p.pos + (k / p.n_x) as i32,
                p.pos + (k % p.n_x) as i32,
            ];
        }
        let t = p.pos + p.advance() + (cell - p.end()) as i32;
        [t; 3]
    }

    /// The cells `(start, end)` of the first image not computed by `n_computed`
    /// when images are decoded non-causally: a step's prompt piece must not end
    /// inside it (its rows see the whole image).
    pub fn whole_span(&self, n_computed: usize) -> Option<(usize, usize)> {
        if !self.1 {
            return None;
        }
        self.0
            .iter()
            .find(|p| p.end() > n_computed)
            .map(|p| (p.at, p.end()))
    }

    /// Cells of the run holding `cell` that llama.cpp decodes as one batch:
    /// with non-causal images, the image or the text between images (of a
    /// prompt of `n_prompt` cells); else the whole prompt. Decides whether a
    /// short piece of it takes ggml's tiled attention kernel, as the run does.
    pub fn run_len(&self, cell: usize, n_prompt: usize) -> usize {
        if !self.1 {
            return n_prompt;
        }
        if let Some((p, _)) = self.at_cell(cell) {
            return p.end() - p.at;
        }
        let i = self.0.partition_point(|p| p.at <= cell);
        let from = i.checked_sub(1).map_or(0, |i| self.0[i].end());
        let to = self.0.get(i).map_or(n_prompt, |p| p.at);
        to.saturating_sub(from)
    }

    /// The last cell the row of `cell` sees on layers that decode images
    /// non-causally: its image's last cell, or `cell` itself (text, or causal
    /// images).
    pub fn sees_through(&self, cell: usize) -> usize {
        match self.1 {
            true => self.at_cell(cell).map_or(cell, |(p, _)| p.end() - 1),
            false => cell,
        }
    }

    /// The first cell from `n_computed` on that cannot be computed yet: the
    /// start of the first image still needed whose embeddings have not arrived,
    /// rounded down to a prompt chunk boundary (so the text before it is
    /// computed in the same aligned pieces as without waiting), but not below
    /// `n_computed`. `usize::MAX` when nothing waits.
    pub fn blocked_at(&self, n_computed: usize) -> usize {
        self.0
            .iter()
            .find(|p| p.end() > n_computed && p.embeds.is_none())
            .map_or(usize::MAX, |p| {
                (p.at / CHUNK_ALIGN * CHUNK_ALIGN).max(n_computed)
            })
    }

    /// Replaces the prompt ids of image cells by prefix-cache keys derived from
    /// the image's pixel hash and the cell's index in it, so the page chain
    /// hashes the image itself: a re-sent identical image hits the cache and a
    /// different one (or the same one at another grid) never does. The keys lie
    /// above every vocabulary (bit 31 set) and are never fed to the model.
    pub fn key_prompt(&self, prompt: &mut [u32]) {
        for p in &self.0 {
            let h = p.hash().0;
            let seed = (h as u64) ^ ((h >> 64) as u64).rotate_left(17);
            for (k, t) in prompt[p.at..p.end()].iter_mut().enumerate() {
                *t = IMAGE_KEY | (mix(seed ^ (k as u64).wrapping_mul(GOLDEN)) as u32 & !IMAGE_KEY);
            }
        }
    }
}

/// Bit set in every image cell's prefix-cache key.
pub(crate) const IMAGE_KEY: u32 = 1 << 31;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's finaliser: spreads every input bit over the output.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-VL's decoding.
    const MROPE: ImageDecoding = ImageDecoding {
        mrope: true,
        non_causal: false,
    };

    fn image(w: usize, h: usize, hash: u128) -> Arc<Preprocessed> {
        Arc::new(Preprocessed {
            width: w,
            height: h,
            planar: Vec::new(),
            hash: PixelHash(hash),
        })
    }

    #[test]
    fn positions_follow_mtmd() {
        // Text 0..5, a 3×2 image at cells 5..11, text, a 2×4 image at 14..22.
        let imgs = Images::new(
            vec![
                PromptImage {
                    at: 5,
                    pixels: image(24, 16, 1),
                },
                PromptImage {
                    at: 14,
                    pixels: image(16, 32, 2),
                },
            ],
            8,
            MROPE,
        );
        assert_eq!(imgs.position(4), [4; 3]);
        // The first image: (5, 5 + row, 5 + column).
        assert_eq!(imgs.position(5), [5, 5, 5]);
        assert_eq!(imgs.position(7), [5, 5, 7]);
        assert_eq!(imgs.position(8), [5, 6, 5]);
        assert_eq!(imgs.position(10), [5, 6, 7]);
        // Text after it continues at 5 + max(3, 2).
        assert_eq!(imgs.position(11), [8; 3]);
        assert_eq!(imgs.position(13), [10; 3]);
        // The second image starts at 11 and the text after it at 11 + 4.
        assert_eq!(imgs.position(14), [11; 3]);
        assert_eq!(imgs.position(21), [11, 14, 12]);
        assert_eq!(imgs.position(22), [15; 3]);
        assert_eq!(imgs.at_cell(9).map(|(p, k)| (p.at, k)), Some((5, 4)));
        assert!(imgs.at_cell(11).is_none() && imgs.at_cell(4).is_none());
    }

    #[test]
    fn gemma4_images_take_one_position_a_token_and_are_computed_whole() {
        // Text 0..5, a 3×2 image at cells 5..11, text, a 2×2 image at 14..18.
        let imgs = Images::new(
            vec![
                PromptImage {
                    at: 5,
                    pixels: image(24, 16, 1),
                },
                PromptImage {
                    at: 14,
                    pixels: image(16, 16, 2),
                },
            ],
            8,
            ImageDecoding {
                mrope: false,
                non_causal: true,
            },
        );
        for cell in 0..20 {
            assert_eq!(imgs.position(cell), [cell as i32; 3], "cell {cell}");
        }
        assert_eq!(imgs.whole_span(0), Some((5, 11)));
        assert_eq!(imgs.whole_span(7), Some((5, 11)));
        assert_eq!(imgs.whole_span(11), Some((14, 18)));
        assert_eq!(imgs.whole_span(18), None);
        assert_eq!((imgs.sees_through(4), imgs.sees_through(5)), (4, 10));
        assert_eq!((imgs.sees_through(10), imgs.sees_through(12)), (10, 12));
        // Runs: text 0..5, the image 5..11, text 11..14, the image, text 18..30.
        let runs: Vec<usize> = [0, 4, 5, 10, 11, 13, 14, 18, 29]
            .iter()
            .map(|&c| imgs.run_len(c, 30))
            .collect();
        assert_eq!(runs, [5, 5, 6, 6, 3, 3, 4, 12, 12]);
        // Qwen3-VL's images are causal: no span, each cell sees itself last.
        let q = Images::new(
            vec![PromptImage {
                at: 5,
                pixels: image(24, 16, 1),
            }],
            8,
            MROPE,
        );
        assert_eq!((q.whole_span(0), q.sees_through(5)), (None, 5));
        assert_eq!(q.run_len(7, 30), 30);
    }

    #[test]
    fn waits_before_an_image_without_embeddings() {
        let mut imgs = Images::new(
            vec![PromptImage {
                at: 100,
                pixels: image(16, 16, 3),
            }],
            8,
            MROPE,
        );
        // Text up to the chunk boundary before the image goes ahead.
        assert_eq!(imgs.blocked_at(0), 64);
        assert_eq!(imgs.blocked_at(64), 64);
        // A cached prefix into the image: from there.
        assert_eq!(imgs.blocked_at(102), 102);
        // Past the image, or once it is encoded: nothing waits.
        assert_eq!(imgs.blocked_at(104), usize::MAX);
        imgs.iter_mut().for_each(|p| {
            p.embeds = Some(Arc::new(ImageEmbeddings {
                hash: p.hash(),
                n_x: 2,
                n_y: 2,
                n_embd: 1,
                data: vec![0.0; 4],
            }))
        });
        assert_eq!(imgs.blocked_at(0), usize::MAX);
    }

    #[test]
    fn image_cells_key_the_cache_by_pixels() {
        let keyed = |hash: u128, at: usize| {
            let mut prompt = vec![7u32; 12];
            Images::new(
                vec![PromptImage {
                    at,
                    pixels: image(16, 16, hash),
                }],
                8,
                MROPE,
            )
            .key_prompt(&mut prompt);
            prompt
        };
        let a = keyed(0xabc, 2);
        assert_eq!(a, keyed(0xabc, 2));
        assert_ne!(a[2..6], keyed(0xabd, 2)[2..6]);
        assert!(a[2..6].iter().all(|&t| t & IMAGE_KEY != 0));
        // Every cell of an image has its own key; text is left alone.
        let mut cells = a[2..6].to_vec();
        cells.dedup();
        assert_eq!(cells.len(), 4);
        assert_eq!((a[0], a[1], a[6]), (7, 7, 7));
    }
}
