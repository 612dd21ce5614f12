//! Resizing as llama.cpp's `mtmd` does it, so the encoder sees the same pixels:
//! the target size ("smart resize": keep the aspect ratio, align both sides to
//! the patch grid, stay within a pixel budget) and Pillow's separable resampling
//! in 8-bit fixed point, which `mtmd` follows to match the Python processors.

use super::DecodedImage;

/// Resampling filter (Pillow's definitions: bicubic uses a = -0.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    /// Triangle filter, support 1.
    Bilinear,
    /// Cubic convolution, support 2.
    Bicubic,
    /// Lanczos-3, support 3.
    Lanczos,
}

impl Resample {
    fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
            Resample::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Resample::Lanczos => {
                let sinc = |v: f64| match v == 0.0 {
                    true => 1.0,
                    false => (v * std::f64::consts::PI).sin() / (v * std::f64::consts::PI),
                };
                match (-3.0..3.0).contains(&x) {
                    true => sinc(x) * sinc(x / 3.0),
                    false => 0.0,
                }
            }
            Resample::Bilinear => (1.0 - x.abs()).max(0.0),
            Resample::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// The size an image of `width × height` is resized to: both sides multiples of
/// `align`, about the same aspect ratio, and at most `max_pixels` / at least
/// `min_pixels` pixels (0 = no bound). The arithmetic is `mtmd`'s, in `f32`,
/// rounding included, so sizes agree to the pixel.
pub fn smart_resize(
    width: u32,
    height: u32,
    align: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> (u32, u32) {
    let f = align.max(1) as f32;
    let (wf, hf) = (width as f32, height as f32);
    let round = |x: f32| ((x / f).round() * f) as u32;
    let ceil = |x: f32| ((x / f).ceil() * f) as u32;
    let floor = |x: f32| ((x / f).floor() * f) as u32;
    let a = align.max(1);
    let mut w = round(wf).max(a);
    let mut h = round(hf).max(a);
    let area = u64::from(w) * u64::from(h);
    if max_pixels > 0 && area > max_pixels {
        let beta = (hf * wf / max_pixels as f32).sqrt();
        h = floor(hf / beta).max(a);
        w = floor(wf / beta).max(a);
    } else if min_pixels > 0 && area < min_pixels {
        let beta = (min_pixels as f32 / (hf * wf)).sqrt();
        h = ceil(hf * beta);
        w = ceil(wf * beta);
    }
    (w, h)
}

/// Resizes `src` into a `width × height` canvas the way `mtmd` does by default:
/// scaled to fit (the smaller of the two scale factors, sides rounded up), the
/// rest filled with black, the picture centred.
pub fn resize_padded(src: &DecodedImage, width: u32, height: u32, algo: Resample) -> DecodedImage {
    if (src.width, src.height) == (width, height) {
        return src.clone();
    }
    let scale = (width as f32 / src.width as f32).min(height as f32 / src.height as f32);
    let nw = ((src.width as f32 * scale).ceil() as u32).min(width);
    let nh = ((src.height as f32 * scale).ceil() as u32).min(height);
    let scaled = resample(src, nw, nh, algo);
    let (ox, oy) = ((width - nw) / 2, (height - nh) / 2);
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    for y in 0..nh as usize {
        let from = y * nw as usize * 3;
        let to = ((y + oy as usize) * width as usize + ox as usize) * 3;
        rgb[to..to + nw as usize * 3].copy_from_slice(&scaled.rgb[from..from + nw as usize * 3]);
    }
    DecodedImage { width, height, rgb }
}

/// Fixed-point fraction bits of the filter weights (Pillow's: 32 - 8 - 2).
const PRECISION_BITS: u32 = 22;

/// One dimension's filter: per output pixel, the first input pixel and the
/// fixed-point weights of the input pixels from there.
struct Filter {
    taps: Vec<(usize, Vec<i32>)>,
}

impl Filter {
    fn new(in_size: u32, out_size: u32, algo: Resample) -> Filter {
        let scale = f64::from(in_size) / f64::from(out_size);
        // Downsampling widens the filter (anti-aliasing); upsampling keeps it.
        let filter_scale = scale.max(1.0);
        let support = algo.support() * filter_scale;
        let fxp = f64::from(1u32 << PRECISION_BITS);
        let taps = (0..out_size)
            .map(|xx| {
                let center = (f64::from(xx) + 0.5) * scale;
                // Truncation toward zero, as C's int conversion.
                let lo = ((center - support + 0.5) as i64).max(0) as usize;
                let hi = ((center + support + 0.5) as i64).min(i64::from(in_size)) as usize;
                let w: Vec<f64> = (lo..hi)
                    .map(|x| algo.weight((x as f64 - center + 0.5) / filter_scale))
                    .collect();
                let sum: f64 = w.iter().sum();
                let w = w
                    .iter()
                    .map(|&v| {
                        let v = if sum != 0.0 { v / sum } else { v };
                        // Pillow rounds half away from zero, then truncates.
                        (v * fxp + if v < 0.0 { -0.5 } else { 0.5 }) as i32
                    })
                    .collect();
                (lo, w)
            })
            .collect();
        Filter { taps }
    }
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Pillow's separable resample of `src` to `width × height`: horizontal pass,
/// then vertical, each only when that side changes.
pub fn resample(src: &DecodedImage, width: u32, height: u32, algo: Resample) -> DecodedImage {
    let mut cur = src.clone();
    if width != cur.width {
        let f = Filter::new(cur.width, width, algo);
        let (iw, h) = (cur.width as usize, cur.height as usize);
        let mut out = vec![0u8; width as usize * h * 3];
        for y in 0..h {
            let row = &cur.rgb[y * iw * 3..(y + 1) * iw * 3];
            for (xx, (lo, w)) in f.taps.iter().enumerate() {
                let mut acc = [1i32 << (PRECISION_BITS - 1); 3];
                for (k, &wk) in w.iter().enumerate() {
                    let p = &row[(lo + k) * 3..(lo + k) * 3 + 3];
                    for c in 0..3 {
                        acc[c] += i32::from(p[c]) * wk;
                    }
                }
                let o = (y * width as usize + xx) * 3;
                for c in 0..3 {
                    out[o + c] = clip8(acc[c]);
                }
            }
        }
        cur = DecodedImage {
            width,
            height: cur.height,
            rgb: out,
        };
    }
    if height != cur.height {
        let f = Filter::new(cur.height, height, algo);
        let row_len = cur.width as usize * 3;
        let mut out = vec![0u8; row_len * height as usize];
        let mut acc = vec![0i32; row_len];
        for (yy, (lo, w)) in f.taps.iter().enumerate() {
            acc.fill(1 << (PRECISION_BITS - 1));
            for (k, &wk) in w.iter().enumerate() {
                let row = &cur.rgb[(lo + k) * row_len..(lo + k + 1) * row_len];
                for (a, &p) in acc.iter_mut().zip(row) {
                    *a += i32::from(p) * wk;
                }
            }
            for (o, &a) in out[yy * row_len..(yy + 1) * row_len].iter_mut().zip(&acc) {
                *o = clip8(a);
            }
        }
        cur = DecodedImage {
            width: cur.width,
            height,
            rgb: out,
        };
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_aligns_and_keeps_the_budget() {
        // Qwen3-VL: patch 16, merge 2 → align 32; 8..4096 merged tokens of 32×32.
        let (min, max) = (8 * 1024, 4096 * 1024);
        // Rounds each side to the nearest multiple ...
        assert_eq!(smart_resize(100, 50, 32, 0, max), (96, 64));
        // ... then, under the minimum (6144 < 8192), scales up, rounding up.
        assert_eq!(smart_resize(100, 50, 32, min, max), (128, 64));
        // Tiny images grow to the minimum, aspect kept, sides rounded up.
        assert_eq!(smart_resize(10, 10, 32, min, max), (96, 96));
        // Huge images shrink under the maximum, sides rounded down.
        let (w, h) = smart_resize(4000, 3000, 32, min, max);
        assert!(u64::from(w) * u64::from(h) <= max, "{w}x{h}");
        assert_eq!((w % 32, h % 32), (0, 0));
        assert_eq!((w, h), (2336, 1760));
        // An extreme aspect ratio never gets a side below one aligned unit.
        assert_eq!(smart_resize(5000, 1, 32, 0, max).1, 32);
    }

    #[test]
    fn filters_sum_to_one_and_identity_is_a_copy() {
        for algo in [Resample::Bilinear, Resample::Bicubic, Resample::Lanczos] {
            for (i, o) in [(7, 3), (3, 7), (64, 64), (100, 33)] {
                for (_, w) in Filter::new(i, o, algo).taps {
                    let s: i64 = w.iter().map(|&v| i64::from(v)).sum();
                    assert!(
                        (s - (1 << PRECISION_BITS)).abs() <= w.len() as i64,
                        "{algo:?} {s}"
                    );
                }
            }
        }
        // A flat image stays flat at any size (weights sum to one, rounding exact).
        let flat = DecodedImage::from_rgb(9, 5, [10u8, 200, 77].repeat(45)).unwrap();
        let r = resample(&flat, 4, 13, Resample::Bicubic);
        assert!(r.rgb.chunks(3).all(|p| p == [10, 200, 77]));
    }

    #[test]
    fn fixed_point_follows_the_float_filter() {
        // A ramp shrunk 6 → 3 (cubic widened to support 4, edge taps
        // renormalised) and grown 6 → 11: the 22-bit fixed point lands within
        // one level of the same filter computed in floating point.
        let values = [0u8, 50, 100, 150, 200, 250];
        let ramp: Vec<u8> = values.iter().flat_map(|&v| [v, v, v]).collect();
        let img = DecodedImage::from_rgb(6, 1, ramp).unwrap();
        for out in [3u32, 11] {
            let r = resample(&img, out, 1, Resample::Bicubic);
            let got: Vec<u8> = r.rgb.chunks(3).map(|p| p[0]).collect();
            let want = float_resample(&values, out);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (f64::from(*g) - w).abs() <= 1.0,
                    "{out}: {got:?} vs {want:?}"
                );
            }
        }
    }

    fn float_resample(input: &[u8], out: u32) -> Vec<f64> {
        let scale = input.len() as f64 / f64::from(out);
        let fs = scale.max(1.0);
        (0..out)
            .map(|xx| {
                let center = (f64::from(xx) + 0.5) * scale;
                let (mut acc, mut sum) = (0.0, 0.0);
                for (x, &v) in input.iter().enumerate() {
                    let w = Resample::Bicubic.weight((x as f64 + 0.5 - center) / fs);
                    acc += w * f64::from(v);
                    sum += w;
                }
                (acc / sum).clamp(0.0, 255.0)
            })
            .collect()
    }

    #[test]
    fn padded_resize_centres_the_picture() {
        // 4×2 white into 8×8: scale 2, picture 8×4 in rows 2..6, black around.
        let white = DecodedImage::from_rgb(4, 2, vec![255; 24]).unwrap();
        let r = resize_padded(&white, 8, 8, Resample::Bicubic);
        for y in 0..8 {
            let row = &r.rgb[y * 24..(y + 1) * 24];
            let want = if (2..6).contains(&y) { 255 } else { 0 };
            assert!(row.iter().all(|&v| v == want), "row {y}: {row:?}");
        }
    }
}
