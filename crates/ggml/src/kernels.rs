//! Which CPU kernels this build of ggml runs: the fingerprint that floating-point
//! fixtures are recorded and selected by.
//!
//! ggml picks its CPU kernels (dot products, tinyBLAS tiles, repacked weight
//! layouts) at compile time from the instruction sets it was built for, so two
//! builds with the same instruction-set features compute bit-identical numbers, and
//! two builds with different ones round differently. llama.cpp prints the same
//! features in its `system_info` log line (`CPU : SSE3 = 1 | AVX = 1 | ...`), which
//! is how the fixture script fingerprints the reference build it records with.

use std::fmt;

/// The features that decide which CPU kernels ggml runs, in llama.cpp's
/// `system_info` spelling, as ggml reports them for this build.
///
/// AMX is left out: Tempo9 never uses ggml's AMX buffer type, and the reference
/// fixtures are recorded with it refused, so AMX hardware does not change numbers.
/// `AVX_VNNI` is left out where `AVX512_VNNI` is present: every x86 kernel that
/// could use the VEX-encoded `vpdpbusd` takes the EVEX one first then (ggml-cpu's
/// `#if __AVX512VNNI__ && __AVX512VL__ ... #elif __AVXVNNI__`), so an Intel
/// Sapphire Rapids (both) and an AMD Zen 4 (only the AVX-512 one) run the same code.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSet {
    /// CPU architecture (`x86_64`, `aarch64`, ...).
    pub arch: &'static str,
    /// Enabled features, in ggml's order (`AVX`, `AVX2`, `FMA`, ...).
    pub features: Vec<&'static str>,
}

impl KernelSet {
    /// The kernel set of the ggml linked into this process.
    pub fn current() -> KernelSet {
        use llama_cpp_sys_2 as s;
        // SAFETY: each query only reads compile-time constants of ggml-cpu.
        let flags: [(&'static str, i32); 24] = unsafe {
            [
                ("SSE3", s::ggml_cpu_has_sse3()),
                ("SSSE3", s::ggml_cpu_has_ssse3()),
                ("AVX", s::ggml_cpu_has_avx()),
                ("AVX_VNNI", s::ggml_cpu_has_avx_vnni()),
                ("AVX2", s::ggml_cpu_has_avx2()),
                ("F16C", s::ggml_cpu_has_f16c()),
                ("FMA", s::ggml_cpu_has_fma()),
                ("BMI2", s::ggml_cpu_has_bmi2()),
                ("AVX512", s::ggml_cpu_has_avx512()),
                ("AVX512_VBMI", s::ggml_cpu_has_avx512_vbmi()),
                ("AVX512_VNNI", s::ggml_cpu_has_avx512_vnni()),
                ("AVX512_BF16", s::ggml_cpu_has_avx512_bf16()),
                ("NEON", s::ggml_cpu_has_neon()),
                ("ARM_FMA", s::ggml_cpu_has_arm_fma()),
                ("FP16_VA", s::ggml_cpu_has_fp16_va()),
                ("MATMUL_INT8", s::ggml_cpu_has_matmul_int8()),
                ("SVE", s::ggml_cpu_has_sve()),
                ("DOTPROD", s::ggml_cpu_has_dotprod()),
                ("SME", s::ggml_cpu_has_sme()),
                ("RISCV_V", s::ggml_cpu_has_riscv_v()),
                ("VSX", s::ggml_cpu_has_vsx()),
                ("VXE", s::ggml_cpu_has_vxe()),
                ("WASM_SIMD", s::ggml_cpu_has_wasm_simd()),
                ("LLAMAFILE", s::ggml_cpu_has_llamafile()),
            ]
        };
        let on: Vec<&'static str> = flags
            .iter()
            .filter(|(_, on)| *on != 0)
            .map(|(name, _)| *name)
            .collect();
        KernelSet {
            arch: std::env::consts::ARCH,
            features: kernel_features(&on),
        }
    }

    /// A short name for file names and logs: the architecture and its widest
    /// vector extension (`x86_64-avx512`, `x86_64-avx2`, `aarch64-neon`). Two
    /// sets may share a name; match on [`KernelSet::fingerprint`].
    pub fn short_name(&self) -> String {
        let widest = [
            "AVX512", "AVX2", "AVX", "SSSE3", "SVE", "NEON", "RISCV_V", "VSX", "VXE",
        ]
        .into_iter()
        .find(|f| self.features.contains(f))
        .unwrap_or("generic");
        format!("{}-{}", self.arch, widest.to_ascii_lowercase())
    }

    /// The exact fingerprint: `arch:FEATURE+FEATURE+...`.
    pub fn fingerprint(&self) -> String {
        format!("{}:{}", self.arch, self.features.join("+"))
    }

    /// The compiler target ggml was built for: `TEMPO9_TARGET_CPU` (scripts/test.sh
    /// builds for it), or what the C compiler resolves `-march=native` to on this
    /// machine ("unknown" when it cannot say). Builds of one kernel set for different
    /// targets round plain C loops differently, so fixtures exact to floating point
    /// record it beside the fingerprint.
    pub fn codegen() -> String {
        match std::env::var("TEMPO9_TARGET_CPU") {
            Ok(cpu) if !cpu.is_empty() && cpu != "native" => cpu,
            _ => std::process::Command::new("cc")
                .args(["-march=native", "-Q", "--help=target"])
                .output()
                .ok()
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                        l.trim()
                            .strip_prefix("-march=")
                            .map(|v| v.trim().to_string())
                    })
                })
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

/// The features among `on` that select kernels: all but `AVX_VNNI` where
/// `AVX512_VNNI` is on (see [`KernelSet`]).
fn kernel_features(on: &[&'static str]) -> Vec<&'static str> {
    let shadowed = on.contains(&"AVX512_VNNI");
    on.iter()
        .copied()
        .filter(|f| !(shadowed && *f == "AVX_VNNI"))
        .collect()
}

impl fmt::Display for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.fingerprint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_names_the_build() {
        let k = KernelSet::current();
        assert_eq!(k.arch, std::env::consts::ARCH);
        assert!(k.fingerprint().starts_with(k.arch));
        if cfg!(target_feature = "avx2") {
            assert!(k.features.contains(&"AVX2"), "{k}");
        }
        assert!(!k.features.contains(&"AMX_INT8"));
        assert!(!(k.features.contains(&"AVX_VNNI") && k.features.contains(&"AVX512_VNNI")));
        eprintln!("{} = {}", k.short_name(), k.fingerprint());
    }

    #[test]
    fn avx_vnni_is_shadowed_by_avx512_vnni() {
        let intel = ["AVX", "AVX_VNNI", "AVX2", "AVX512", "AVX512_VNNI"];
        let amd = ["AVX", "AVX2", "AVX512", "AVX512_VNNI"];
        assert_eq!(kernel_features(&intel), kernel_features(&amd));
        let alder_lake = ["AVX", "AVX_VNNI", "AVX2"];
        assert_eq!(kernel_features(&alder_lake), alder_lake);
    }
}
