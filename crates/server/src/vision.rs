//! Images in chat requests: each API adapter turns its image form (OpenAI
//! `image_url` parts, Anthropic `image` blocks, Ollama `images`) into an OpenAI
//! `image_url` part with a data URL; rendering takes those parts out of the
//! messages (a marker text stands in for each, as llama.cpp's `mtmd` does), decodes
//! and preprocesses the images, and tokenizes the rendered prompt around them: each
//! image becomes the model's image-start tokens, one placeholder per image token,
//! and its image-end tokens, with the pixels carried to the engine
//! ([`tempo9_engine::PromptImage`]).

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{json, Value};
use tempo9_engine::PromptImage;
use tempo9_models::vision::{decode, Preprocessed, ProjectorType, VisionEncoder, VisionError};
use tempo9_tokenizer::Tokenizer;

use crate::error::{ApiError, Family};

/// Most pixels of an image a request may send (width × height, before
/// resizing): a 8192×8192 image decodes to 192 MiB of RGB.
pub const MAX_IMAGE_PIXELS: u64 = tempo9_models::vision::MAX_DECODED_PIXELS;

/// An OpenAI `image_url` part for `data_url`: the form every API's images take
/// on their way to rendering.
pub fn image_part(data_url: String) -> Value {
    json!({"type": "image_url", "image_url": {"url": data_url}})
}

/// A data URL for base64 `data` of `media_type` (Anthropic, Ollama).
pub fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

/// Whether a message holds an image part.
fn has_image(m: &Value) -> bool {
    m["content"]
        .as_array()
        .is_some_and(|parts| parts.iter().any(|p| p["type"] == "image_url"))
}

/// Takes the image parts out of `messages` in order, putting a text part holding
/// `marker` in each one's place; returns their URLs.
pub fn take_image_parts(messages: &mut [Value], marker: &str) -> Vec<Value> {
    let mut urls = Vec::new();
    for m in messages.iter_mut().filter(|m| has_image(m)) {
        let Some(parts) = m["content"].as_array_mut() else {
            continue;
        };
        for p in parts.iter_mut().filter(|p| p["type"] == "image_url") {
            // `image_url` is an object `{url, detail?}`, or a plain string in
            // some clients.
            let url = match &p["image_url"] {
                Value::String(s) => Value::String(s.clone()),
                other => other["url"].clone(),
            };
            urls.push(url);
            *p = json!({"type": "text", "text": marker});
        }
    }
    urls
}

/// A served model's vision: its encoder's preprocessing and the tokens that
/// frame an image in its prompt.
pub struct Vision {
    encoder: Arc<VisionEncoder>,
    /// Tokens before an image's placeholders (Qwen3-VL: `<|vision_start|>`;
    /// Gemma 4: `<|image>`).
    begin: Vec<u32>,
    /// Tokens after them (`<|vision_end|>`; `<image|>`).
    end: Vec<u32>,
    /// The placeholder token (`<|image_pad|>`; `<|image|>`): its id is not used
    /// by the model.
    pad: u32,
}

impl Vision {
    /// The vision of a model served with `encoder`.
    pub fn new(encoder: Arc<VisionEncoder>, tok: &Tokenizer) -> Vision {
        // The framing llama.cpp's mtmd writes for the projector type.
        let (begin, end, pad) = match encoder.projector().hparams().projector {
            ProjectorType::Qwen3Vl => ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"),
            ProjectorType::Gemma4V => ("<|image>", "<image|>", "<|image|>"),
        };
        let special = |s: &str| tok.encode(s, false, true);
        Vision {
            encoder,
            begin: special(begin),
            end: special(end),
            pad: tok.token_id(pad).unwrap_or(0),
        }
    }

    /// Decodes and preprocesses image `i` of a request from its URL: a base64
    /// data URL. Remote URLs are refused (the server fetches nothing), as are
    /// images it cannot decode or larger than [`MAX_IMAGE_PIXELS`].
    pub fn load(
        &self,
        family: Family,
        i: usize,
        url: &Value,
    ) -> Result<Arc<Preprocessed>, ApiError> {
        let bad = |m: String| ApiError::bad_param(family, "messages", format!("image {i}: {m}"));
        let url = url
            .as_str()
            .ok_or_else(|| bad("the image URL must be a string".into()))?;
        let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            return Err(bad(
                "remote image URLs are not fetched; send the image inline as a base64 data: URL"
                    .into(),
            ));
        }
        let rest = url.strip_prefix("data:").ok_or_else(|| {
            bad("the image must be a base64 data: URL (data:image/png;base64,...)".into())
        })?;
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| bad("the data: URL has no ',' before its data".into()))?;
        if !meta.ends_with(";base64") {
            return Err(bad("the data: URL is not base64-encoded (;base64)".into()));
        }
        let bytes = decode_base64(data).map_err(|e| bad(format!("invalid base64 data: {e}")))?;
        let img = decode(&bytes, MAX_IMAGE_PIXELS).map_err(|e| match e {
            VisionError::TooLarge { .. } | VisionError::BadImage(_) => bad(e.to_string()),
            other => bad(other.to_string()),
        })?;
        Ok(Arc::new(self.encoder.projector().preprocess(&img)))
    }

    /// Tokenizes a rendered prompt in which `marker` stands for each of
    /// `images`, in order: the text between them as [`Tokenizer::encode_prompt`]
    /// does (BOS before the first piece only), each image as its framing tokens
    /// around one placeholder per image token.
    pub fn tokenize(
        &self,
        family: Family,
        tok: &Tokenizer,
        text: &str,
        marker: &str,
        images: Vec<Arc<Preprocessed>>,
    ) -> Result<(Vec<u32>, Vec<PromptImage>), ApiError> {
        let pieces: Vec<&str> = text.split(marker).collect();
        if pieces.len() != images.len() + 1 {
            return Err(ApiError::bad_param(
                family,
                "messages",
                format!(
                    "the chat template placed {} of the {} images (images are read in user messages)",
                    pieces.len() - 1,
                    images.len()
                ),
            ));
        }
        let mut ids = Vec::new();
        let mut placed = Vec::with_capacity(images.len());
        for (k, piece) in pieces.iter().enumerate() {
            ids.extend(tok.encode_prompt(piece, k == 0));
            let Some(img) = images.get(k) else {
                break;
            };
            ids.extend_from_slice(&self.begin);
            let (nx, ny) = self.encoder.projector().grid(img);
            placed.push(PromptImage {
                at: ids.len(),
                pixels: img.clone(),
            });
            ids.extend(std::iter::repeat_n(self.pad, nx * ny));
            ids.extend_from_slice(&self.end);
        }
        Ok((ids, placed))
    }
}

/// Decodes standard base64 (whitespace and missing padding allowed).
fn decode_base64(data: &str) -> Result<Vec<u8>, String> {
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(clean.trim_end_matches('='))
        .map_err(|e| e.to_string())
}

/// A fresh marker for one request's images: text a message will not hold.
pub fn marker() -> String {
    format!("<__tempo9_image_{:016x}__>", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_parts_become_markers() {
        let mut m = vec![
            json!({"role": "user", "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
                {"type": "image_url", "image_url": "data:y"}]}),
            json!({"role": "assistant", "content": "b"}),
        ];
        let urls = take_image_parts(&mut m, "<M>");
        assert_eq!(urls, [json!("data:x"), json!("data:y")]);
        assert_eq!(m[0]["content"][1], json!({"type": "text", "text": "<M>"}));
        assert_eq!(m[0]["content"][2], json!({"type": "text", "text": "<M>"}));
        assert_eq!(m[1]["content"], "b");
    }

    #[test]
    fn base64_with_or_without_padding() {
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64("aG\nk=").unwrap(), b"hi");
        assert!(decode_base64("a$b").is_err());
    }
}
