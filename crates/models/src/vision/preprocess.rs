//! An image as the encoder takes it: resized to the patch grid within the
//! projector's pixel budget and normalised with the file's mean and std,
//! following llama.cpp's `mtmd` for the projector type.

use std::hash::{Hash, Hasher};

use super::mmproj::{Projector, ProjectorType};
use super::resize::{resize_padded, smart_resize};
use super::DecodedImage;

/// Identity of an image's pixels (128 bits over its size and RGB bytes): equal
/// for the same picture however it was encoded or sent, so it keys the
/// encoder-output cache and the image's part of a prefix-cache page chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PixelHash(pub u128);

impl PixelHash {
    /// The hash of `img`'s size and pixels.
    pub fn of(img: &DecodedImage) -> PixelHash {
        // Two SipHash passes with different domain prefixes make 128 bits: a
        // different image colliding would let it reuse another image's cache.
        let half = |domain: u8| {
            let mut h = std::hash::DefaultHasher::new();
            domain.hash(&mut h);
            (img.width, img.height).hash(&mut h);
            img.rgb.hash(&mut h);
            h.finish()
        };
        PixelHash((u128::from(half(1)) << 64) | u128::from(half(2)))
    }

    /// 64 bits of the hash, to fold into a page chain's 64-bit key.
    pub fn low64(self) -> u64 {
        self.0 as u64
    }
}

/// The encoder's input for one image.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessed {
    /// Width after resizing: a multiple of patch size × merge.
    pub width: usize,
    /// Height after resizing: a multiple of patch size × merge.
    pub height: usize,
    /// Normalised values, channel-major (`[3][height][width]`): the layout of
    /// the encoder's `[width, height, 3]` input tensor.
    pub planar: Vec<f32>,
    /// The source image's [`PixelHash`].
    pub hash: PixelHash,
}

impl Preprocessed {
    /// Patches per row of the resized image.
    pub fn patches_x(&self, patch_size: usize) -> usize {
        self.width / patch_size
    }

    /// Patches per column of the resized image.
    pub fn patches_y(&self, patch_size: usize) -> usize {
        self.height / patch_size
    }
}

impl Projector {
    /// The merged-token grid `(n_x, n_y)` of a preprocessed image: the image
    /// takes `n_x * n_y` language-model tokens.
    pub fn grid(&self, img: &Preprocessed) -> (usize, usize) {
        let align = self.token_side();
        (img.width / align, img.height / align)
    }

    /// Pixels per side of the square one merged token covers (patch × merge):
    /// a preprocessed image's sides are multiples of it.
    pub fn token_side(&self) -> usize {
        let hp = self.hparams();
        hp.patch_size * hp.n_merge
    }

    /// Resizes and normalises `img` for this projector's encoder.
    pub fn preprocess(&self, img: &DecodedImage) -> Preprocessed {
        let hp = self.hparams();
        let (w, h) = match hp.projector {
            // `mtmd`'s dynamic-size preprocessor for both: smart resize aligned
            // to patch × merge (Gemma 4: × pooling), then a padded
            // (aspect-keeping) resample.
            ProjectorType::Qwen3Vl | ProjectorType::Gemma4V => smart_resize(
                img.width,
                img.height,
                (hp.patch_size * hp.n_merge) as u32,
                hp.min_pixels,
                hp.max_pixels,
            ),
        };
        let resized = resize_padded(img, w, h, hp.resample);
        let n = w as usize * h as usize;
        let mut planar = vec![0f32; 3 * n];
        for (i, px) in resized.rgb.chunks_exact(3).enumerate() {
            for c in 0..3 {
                // As `mtmd`: to [0, 1] by dividing by 255, then (x - mean) / std,
                // in f32.
                let x = f32::from(px[c]) / 255.0;
                planar[c * n + i] = (x - hp.image_mean[c]) / hp.image_std[c];
            }
        }
        Preprocessed {
            width: w as usize,
            height: h as usize,
            planar,
            hash: PixelHash::of(img),
        }
    }
}
