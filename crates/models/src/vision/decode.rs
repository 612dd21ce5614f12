//! Image bytes → 8-bit RGB pixels, with the `image` crate (PNG, JPEG, WebP and
//! the first frame of a GIF), refusing anything larger than a pixel limit before
//! it is decoded.

use std::io::Cursor;

use image::{ImageFormat, ImageReader};

use super::VisionError;

/// Most pixels of an image we decode (8192 × 8192): the resize that follows
/// shrinks anything larger than the encoder's budget anyway, and this bounds the
/// memory a request can make us allocate (3 bytes a pixel).
pub const MAX_DECODED_PIXELS: u64 = 8192 * 8192;

/// A decoded image: `width × height` pixels, row-major, 3 bytes (R, G, B) each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub rgb: Vec<u8>,
}

impl DecodedImage {
    /// An image from raw RGB bytes (`width * height * 3` of them).
    pub fn from_rgb(width: u32, height: u32, rgb: Vec<u8>) -> Result<DecodedImage, VisionError> {
        if width == 0 || height == 0 || rgb.len() != width as usize * height as usize * 3 {
            return Err(VisionError::BadImage(format!(
                "{} bytes are not {width}x{height} RGB pixels",
                rgb.len()
            )));
        }
        Ok(DecodedImage { width, height, rgb })
    }
}

/// Decodes `bytes` (PNG, JPEG, WebP, or a GIF's first frame) to RGB, dropping any
/// alpha channel as llama.cpp's loader does. Images over `max_pixels` are refused
/// from their header, before any pixel is decoded.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<DecodedImage, VisionError> {
    let reader = |what: &str| {
        ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| VisionError::BadImage(format!("{what}: {e}")))
    };
    let format = reader("reading")?.format().ok_or_else(|| {
        VisionError::BadImage("unknown format (PNG, JPEG, WebP and GIF are supported)".into())
    })?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif
    ) {
        return Err(VisionError::BadImage(format!(
            "{format:?} images are not supported (PNG, JPEG, WebP and GIF are)"
        )));
    }
    let (width, height) = reader("reading")?
        .into_dimensions()
        .map_err(|e| VisionError::BadImage(format!("{format:?} header: {e}")))?;
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(VisionError::TooLarge {
            width,
            height,
            limit: max_pixels,
        });
    }
    if width == 0 || height == 0 {
        return Err(VisionError::BadImage(format!(
            "{format:?} image of {width}x{height} pixels"
        )));
    }
    let img = reader("reading")?
        .decode()
        .map_err(|e| VisionError::BadImage(format!("{format:?} data: {e}")))?;
    let rgb = img.to_rgb8();
    DecodedImage::from_rgb(rgb.width(), rgb.height(), rgb.into_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbaImage::from_fn(w, h, |x, y| image::Rgba([x as u8, y as u8, 7, 128]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn decodes_png_dropping_alpha() {
        let d = decode(&png(5, 3), MAX_DECODED_PIXELS).unwrap();
        assert_eq!((d.width, d.height), (5, 3));
        // Pixel (4, 2): R = x, G = y, B = 7; the alpha is gone, not blended.
        let i = (2 * 5 + 4) * 3;
        assert_eq!(&d.rgb[i..i + 3], &[4, 2, 7]);
    }

    #[test]
    fn refuses_over_the_pixel_limit_from_the_header() {
        match decode(&png(20, 10), 199) {
            Err(VisionError::TooLarge {
                width: 20,
                height: 10,
                limit: 199,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn corrupt_and_unknown_data_are_clear_errors() {
        let mut cut = png(8, 8);
        cut.truncate(cut.len() / 2);
        let e = decode(&cut, MAX_DECODED_PIXELS).unwrap_err().to_string();
        assert!(e.contains("Png"), "{e}");
        let e = decode(b"plain text, no image", MAX_DECODED_PIXELS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown format"), "{e}");
        // A BMP header: a known format we do not take.
        let e = decode(b"BM\0\0\0\0\0\0\0\0\0\0\0\0", MAX_DECODED_PIXELS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not supported") || e.contains("unknown"), "{e}");
    }
}
