//! ggml tensor element types, as stored in GGUF tensor infos.
//!
//! Ids, names, block sizes and block byte sizes are taken from the vendored
//! `ggml/include/ggml.h` (`enum ggml_type`), `ggml/src/ggml.c` (`type_traits`)
//! and `ggml/src/ggml-common.h` (block struct layouts) of llama.cpp as shipped
//! in `llama-cpp-sys-2` 0.1.161.

/// A ggml tensor element type (`enum ggml_type`).
///
/// Removed / deprecated ids (4, 5, 31–33, 36–38) are not representable and are
/// rejected by [`GgmlType::from_u32`].
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32 = 0,
    /// 16-bit IEEE half float.
    F16 = 1,
    /// 4-bit quantization, 32 weights per block, f16 scale.
    Q4_0 = 2,
    /// 4-bit quantization, 32 weights per block, f16 scale and min.
    Q4_1 = 3,
    /// 5-bit quantization, 32 weights per block, f16 scale.
    Q5_0 = 6,
    /// 5-bit quantization, 32 weights per block, f16 scale and min.
    Q5_1 = 7,
    /// 8-bit quantization, 32 weights per block, f16 scale.
    Q8_0 = 8,
    /// 8-bit quantization, 32 weights per block, f16 scale and sum.
    Q8_1 = 9,
    /// 2-bit k-quant, 256 weights per super-block.
    Q2_K = 10,
    /// 3-bit k-quant, 256 weights per super-block.
    Q3_K = 11,
    /// 4-bit k-quant, 256 weights per super-block.
    Q4_K = 12,
    /// 5-bit k-quant, 256 weights per super-block.
    Q5_K = 13,
    /// 6-bit k-quant, 256 weights per super-block.
    Q6_K = 14,
    /// 8-bit k-quant (intermediate type for dot products).
    Q8_K = 15,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS = 16,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS = 17,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS = 18,
    /// i-quant, 1.56 bits per weight.
    IQ1_S = 19,
    /// Non-linear 4-bit quantization, 32 weights per block.
    IQ4_NL = 20,
    /// i-quant, 3.44 bits per weight.
    IQ3_S = 21,
    /// i-quant, 2.5 bits per weight.
    IQ2_S = 22,
    /// Non-linear 4-bit quantization, 256 weights per super-block.
    IQ4_XS = 23,
    /// 8-bit signed integer.
    I8 = 24,
    /// 16-bit signed integer.
    I16 = 25,
    /// 32-bit signed integer.
    I32 = 26,
    /// 64-bit signed integer.
    I64 = 27,
    /// 64-bit IEEE float.
    F64 = 28,
    /// i-quant, 1.75 bits per weight.
    IQ1_M = 29,
    /// bfloat16.
    BF16 = 30,
    /// Ternary quantization, 1.69 bits per weight.
    TQ1_0 = 34,
    /// Ternary quantization, 2.06 bits per weight.
    TQ2_0 = 35,
    /// Microscaling FP4, 32 weights per block with an E8M0 scale.
    MXFP4 = 39,
    /// NVIDIA FP4, 64 weights per block (four E4M3 scales).
    NVFP4 = 40,
    /// 1-bit quantization, 128 weights per block.
    Q1_0 = 41,
    /// 2-bit quantization, 64 weights per block.
    Q2_0 = 42,
}

impl GgmlType {
    /// Every representable type, in id order.
    pub const ALL: &'static [GgmlType] = &[
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type with ggml id `v`, or `None` for unknown or removed ids.
    pub fn from_u32(v: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match v {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            40 => NVFP4,
            41 => Q1_0,
            42 => Q2_0,
            _ => return None,
        })
    }

    /// The ggml id of this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type (`ggml_type_name`), e.g. `"q4_K"`.
    pub fn name(self) -> &'static str {
        self.traits().0
    }

    /// Number of elements per block (`ggml_blck_size`); 1 for plain types.
    pub fn block_size(self) -> u64 {
        self.traits().1
    }

    /// Bytes per block (`ggml_type_size`).
    pub fn type_size(self) -> u64 {
        self.traits().2
    }

    /// Whether this is a block-quantized type (block size > 1).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by a row of `ne0` elements (`ggml_row_size`), or `None`
    /// when `ne0` is not a multiple of the block size or the size overflows.
    pub fn row_bytes(self, ne0: u64) -> Option<u64> {
        let bs = self.block_size();
        if !ne0.is_multiple_of(bs) {
            return None;
        }
        (ne0 / bs).checked_mul(self.type_size())
    }

    /// (name, block size, type size) as in ggml's `type_traits` table.
    fn traits(self) -> (&'static str, u64, u64) {
        use GgmlType::*;
        match self {
            F32 => ("f32", 1, 4),
            F16 => ("f16", 1, 2),
            Q4_0 => ("q4_0", 32, 18),
            Q4_1 => ("q4_1", 32, 20),
            Q5_0 => ("q5_0", 32, 22),
            Q5_1 => ("q5_1", 32, 24),
            Q8_0 => ("q8_0", 32, 34),
            Q8_1 => ("q8_1", 32, 36),
            Q2_K => ("q2_K", 256, 84),
            Q3_K => ("q3_K", 256, 110),
            Q4_K => ("q4_K", 256, 144),
            Q5_K => ("q5_K", 256, 176),
            Q6_K => ("q6_K", 256, 210),
            Q8_K => ("q8_K", 256, 292),
            IQ2_XXS => ("iq2_xxs", 256, 66),
            IQ2_XS => ("iq2_xs", 256, 74),
            IQ3_XXS => ("iq3_xxs", 256, 98),
            IQ1_S => ("iq1_s", 256, 50),
            IQ4_NL => ("iq4_nl", 32, 18),
            IQ3_S => ("iq3_s", 256, 110),
            IQ2_S => ("iq2_s", 256, 82),
            IQ4_XS => ("iq4_xs", 256, 136),
            I8 => ("i8", 1, 1),
            I16 => ("i16", 1, 2),
            I32 => ("i32", 1, 4),
            I64 => ("i64", 1, 8),
            F64 => ("f64", 1, 8),
            IQ1_M => ("iq1_m", 256, 56),
            BF16 => ("bf16", 1, 2),
            TQ1_0 => ("tq1_0", 256, 54),
            TQ2_0 => ("tq2_0", 256, 66),
            MXFP4 => ("mxfp4", 32, 17),
            NVFP4 => ("nvfp4", 64, 36),
            Q1_0 => ("q1_0", 128, 18),
            Q2_0 => ("q2_0", 64, 18),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_gaps_rejected() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_u32(t.id()), Some(t));
        }
        let known: Vec<u32> = GgmlType::ALL.iter().map(|t| t.id()).collect();
        for v in 0..200 {
            assert_eq!(
                GgmlType::from_u32(v).is_some(),
                known.contains(&v),
                "id {v}"
            );
        }
        assert_eq!(GgmlType::from_u32(u32::MAX), None);
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::F32.row_bytes(10), Some(40));
        assert_eq!(GgmlType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(GgmlType::Q4_0.row_bytes(33), None);
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q6_K.row_bytes(0), Some(0));
        assert_eq!(GgmlType::F64.row_bytes(u64::MAX), None);
    }
}
