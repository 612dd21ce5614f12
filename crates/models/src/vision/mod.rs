//! Vision inputs: the projector (`mmproj`) file llama.cpp's converter writes
//! next to a vision-language model, image decoding and preprocessing as
//! llama.cpp's `tools/mtmd` does it, and the vision encoder graphs.
//!
//! The flow for one image: [`decode`] (bytes → RGB pixels, with a pixel limit) →
//! [`Projector::preprocess`] (smart resize, normalise: the encoder's input) →
//! the encoder (a ggml graph per projector type) → embeddings the language model
//! takes at the image's positions. Each step is a pure function of its input, so
//! the encoder can run on its own thread and backend, and its output can be
//! cached under [`PixelHash`].

mod decode;
mod encoder;
mod gemma4v;
mod mmproj;
mod preprocess;
mod qwen3vl;
mod resize;

pub use decode::{decode, DecodedImage, MAX_DECODED_PIXELS};
pub use encoder::{ImageEmbeddings, VisionEncoder};
pub use mmproj::{FfnAct, ImageDecoding, Projector, ProjectorType, VisionHParams};
pub use preprocess::{PixelHash, Preprocessed};
pub use resize::{smart_resize, Resample};

/// Errors from loading a projector file or from preparing an image for it.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// The projector file is invalid or of a kind we do not run.
    #[error("projector file: {0}")]
    BadProjector(String),
    /// The projector does not fit the language model it was loaded with.
    #[error("projector does not match the language model: {0}")]
    Mismatch(String),
    /// The image bytes are not an image we can decode (format or corrupt data).
    #[error("image cannot be decoded: {0}")]
    BadImage(String),
    /// The image has more pixels than allowed.
    #[error("image of {width}x{height} pixels is larger than the limit of {limit} pixels")]
    TooLarge {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// Most pixels allowed.
        limit: u64,
    },
}
