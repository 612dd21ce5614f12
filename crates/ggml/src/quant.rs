//! Quantization of F32 data into ggml's storage types (what llama.cpp's quantizer
//! writes), for tools that produce model files.

use llama_cpp_sys_2 as sys;

use crate::{DType, GgmlError};

fn quant_err(dtype: DType, what: String) -> GgmlError {
    GgmlError::TensorData {
        name: format!("quantize to {}", dtype.name()),
        what,
    }
}

/// Quantizes `src`, a row-major matrix of rows of `n_per_row` values, into `dtype`
/// (any type ggml can quantize to without an importance matrix, plus F16/BF16/F32).
/// Returns `rows * dtype.row_size(n_per_row)` bytes, laid out as in a GGUF file.
///
/// Thread-safe: callers may quantize different chunks on several threads.
pub fn quantize_rows(dtype: DType, src: &[f32], n_per_row: usize) -> Result<Vec<u8>, GgmlError> {
    let blck = dtype.block_size();
    if n_per_row == 0 || !n_per_row.is_multiple_of(blck) {
        return Err(quant_err(
            dtype,
            format!("row length {n_per_row} is not a multiple of the block size {blck}"),
        ));
    }
    if !src.len().is_multiple_of(n_per_row) {
        return Err(quant_err(
            dtype,
            format!("{} values are not whole rows of {n_per_row}", src.len()),
        ));
    }
    // SAFETY: pure query on a valid type id.
    if unsafe { sys::ggml_quantize_requires_imatrix(dtype.raw()) } {
        return Err(quant_err(dtype, "needs an importance matrix".into()));
    }
    let rows = src.len() / n_per_row;
    let row_bytes = dtype.row_size(n_per_row as i64);
    let mut out = vec![0u8; rows * row_bytes];
    if rows == 0 {
        return Ok(out);
    }
    // SAFETY: `src` holds rows * n_per_row floats and `out` rows * row_bytes bytes, the
    // exact amount ggml writes for these arguments; no importance matrix (checked above
    // that the type does not need one). ggml_quantize_init (called inside) is guarded
    // by a mutex, so concurrent calls are fine.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            dtype.raw(),
            src.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    if written != out.len() {
        return Err(quant_err(
            dtype,
            format!("ggml wrote {written} bytes, expected {}", out.len()),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16_bits_to_f32;

    #[test]
    fn quantize_sizes_and_errors() {
        let src: Vec<f32> = (0..2 * 256)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        for (t, per_block) in [
            (DType::Q4_K, 144),
            (DType::Q6_K, 210),
            (DType::Q8_0, 8 * 34),
            (DType::F16, 512),
        ] {
            let q = quantize_rows(t, &src, 256).unwrap();
            assert_eq!(q.len(), 2 * per_block, "{}", t.name());
        }
        assert!(quantize_rows(DType::Q4_K, &src[..100], 100).is_err());
        assert!(quantize_rows(DType::Q8_0, &src[..100], 64).is_err());
    }

    #[test]
    fn q8_0_round_trips_closely() {
        let src: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
        let q = quantize_rows(DType::Q8_0, &src, 64).unwrap();
        // Block layout: f16 scale, then 32 int8 values.
        let d = f16_bits_to_f32(u16::from_le_bytes([q[0], q[1]]));
        let x5 = q[2 + 5] as i8 as f32 * d;
        assert!((x5 - src[5]).abs() < 0.02, "{x5} vs {}", src[5]);
    }
}
