//! The projector file (`mmproj-*.gguf`, architecture `clip`) as llama.cpp's
//! converter writes it: the vision tower's hyper-parameters, its preprocessing
//! constants, and which projector (merger) joins it to the language model.

use std::path::Path;
use std::sync::Arc;

use tempo9_gguf::GgufFile;

use super::resize::Resample;
use super::VisionError;

/// The projector types Tempo9 knows by name (`clip.projector_type` or, in files
/// with several modalities, `clip.vision.projector_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectorType {
    /// Qwen3-VL: ViT with 2-D M-RoPE and learned positions, 2×2 patch merger,
    /// deepstack features from some ViT layers (`qwen3vl_merger`).
    Qwen3Vl,
    /// Gemma 4: ViT with RMS sandwich norms and 2-D NeoX rope, learned x/y
    /// position tables, `n_merge × n_merge` average pooling and a linear
    /// projection (`gemma4v`).
    Gemma4V,
}

impl ProjectorType {
    const ALL: [ProjectorType; 2] = [ProjectorType::Qwen3Vl, ProjectorType::Gemma4V];

    /// The name in the file.
    pub fn name(self) -> &'static str {
        match self {
            ProjectorType::Qwen3Vl => "qwen3vl_merger",
            ProjectorType::Gemma4V => "gemma4v",
        }
    }

    fn from_name(name: &str) -> Option<ProjectorType> {
        ProjectorType::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The ViT feed-forward's activation (llama.cpp: `clip.use_gelu` /
/// `clip.use_silu`, else the quick GELU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// GELU, tanh approximation.
    Gelu,
    /// SiLU.
    Silu,
    /// `x * sigmoid(1.702 x)`.
    GeluQuick,
}

/// Vision-tower hyper-parameters, with the defaults llama.cpp applies per
/// projector type where the file has no key.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionHParams {
    /// Which projector joins the tower to the language model.
    pub projector: ProjectorType,
    /// ViT width.
    pub n_embd: usize,
    /// ViT attention heads.
    pub n_head: usize,
    /// ViT feed-forward width.
    pub n_ff: usize,
    /// ViT blocks.
    pub n_layer: usize,
    /// Width of each embedding the projector hands the language model.
    pub projection_dim: usize,
    /// Layer-norm epsilon.
    pub eps: f32,
    /// Side of a square patch, in pixels.
    pub patch_size: usize,
    /// Side of the square the learned position embeddings were trained on.
    pub image_size: usize,
    /// Patches merged (Qwen3-VL) or pooled (Gemma 4) per side into one
    /// language-model token.
    pub n_merge: usize,
    /// The ViT feed-forward's activation (used by Gemma 4's gated one; Qwen3-VL's
    /// files say GELU).
    pub ffn_act: FfnAct,
    /// Per channel, subtracted from pixels in [0, 1] ...
    pub image_mean: [f32; 3],
    /// ... and divided by this.
    pub image_std: [f32; 3],
    /// Fewest pixels an image is resized to.
    pub min_pixels: u64,
    /// Most pixels an image is resized to.
    pub max_pixels: u64,
    /// Resampling filter of the resize.
    pub resample: Resample,
    /// ViT layers whose output feeds a deepstack merger, ascending.
    pub deepstack_layers: Vec<usize>,
}

impl VisionHParams {
    /// Width of one image token's input to the language model: the merger's
    /// output followed by each deepstack merger's.
    pub fn n_embd_out(&self) -> usize {
        self.projection_dim * (1 + self.deepstack_layers.len())
    }

    /// Reads and checks the hyper-parameters of a `clip` file.
    pub fn from_file(file: &GgufFile) -> Result<VisionHParams, VisionError> {
        let md = file.metadata();
        let bad = |m: String| VisionError::BadProjector(m);
        let arch = file.architecture().map_err(|e| bad(e.to_string()))?;
        if arch != "clip" {
            return Err(bad(format!(
                "architecture '{arch}' is not a projector (want 'clip': an mmproj file)"
            )));
        }
        let has_vision = md
            .get_bool("clip.has_vision_encoder")
            .map_err(|e| bad(e.to_string()))?
            .unwrap_or(false);
        if !has_vision {
            return Err(bad(
                "the file has no vision encoder (clip.has_vision_encoder)".into(),
            ));
        }
        let ty_name = match md
            .get_str("clip.vision.projector_type")
            .map_err(|e| bad(e.to_string()))?
        {
            Some(t) => t,
            None => md
                .get_str("clip.projector_type")
                .map_err(|e| bad(e.to_string()))?
                .ok_or_else(|| bad("missing clip.projector_type".into()))?,
        };
        let projector = ProjectorType::from_name(ty_name).ok_or_else(|| {
            let names: Vec<_> = ProjectorType::ALL.iter().map(|p| p.name()).collect();
            bad(format!(
                "projector type '{ty_name}' is not supported (supported: {})",
                names.join(", ")
            ))
        })?;
        let u = |k: &str| -> Result<usize, VisionError> {
            let v = md.get_u32(k).map_err(|e| bad(e.to_string()))?;
            let v = v.ok_or_else(|| bad(format!("missing {k}")))?;
            match v {
                0 => Err(bad(format!("{k} is 0"))),
                v => Ok(v as usize),
            }
        };
        let opt_u = |k: &str| md.get_u32(k).map_err(|e| bad(e.to_string()));
        let triple = |k: &str| -> Result<[f32; 3], VisionError> {
            let a = md
                .get_f32_array(k)
                .map_err(|e| bad(e.to_string()))?
                .ok_or_else(|| bad(format!("missing {k}")))?;
            match a {
                [a, b, c, ..] => Ok([*a, *b, *c]),
                _ => Err(bad(format!("{k} has {} values, want 3", a.len()))),
            }
        };
        let n_embd = u("clip.vision.embedding_length")?;
        let n_head = u("clip.vision.attention.head_count")?;
        if !n_embd.is_multiple_of(n_head) || !(n_embd / n_head).is_multiple_of(4) {
            return Err(bad(format!(
                "embedding_length {n_embd} over {n_head} heads: the head size must be a multiple of 4 (2-D rope)"
            )));
        }
        let image_std = triple("clip.vision.image_std")?;
        if image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(bad(format!(
                "clip.vision.image_std {image_std:?} has a zero"
            )));
        }
        let eps = md
            .get_f32("clip.vision.attention.layer_norm_epsilon")
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("missing clip.vision.attention.layer_norm_epsilon".into()))?;
        let n_layer = u("clip.vision.block_count")?;
        let patch_size = u("clip.vision.patch_size")?;
        // llama.cpp's defaults per type (clip.cpp's load_hparams): the merge or
        // pooling side and the token budget of the dyn-size preprocessor.
        let (n_merge, (min_tokens, max_tokens)) = match projector {
            ProjectorType::Qwen3Vl => {
                let n = opt_u("clip.vision.spatial_merge_size")?.unwrap_or(2) as usize;
                if n != 2 {
                    return Err(bad(format!(
                        "spatial_merge_size {n}: the Qwen3-VL merger takes 2x2 patches"
                    )));
                }
                (n, (8, 4096))
            }
            ProjectorType::Gemma4V => {
                let n = opt_u("clip.vision.projector.scale_factor")?.unwrap_or(3) as usize;
                if n == 0 {
                    return Err(bad("clip.vision.projector.scale_factor is 0".into()));
                }
                (n, (70, 1120))
            }
        };
        let flag = |k: &str| -> Result<bool, VisionError> {
            Ok(md
                .get_bool(k)
                .map_err(|e| bad(e.to_string()))?
                .unwrap_or(false))
        };
        let ffn_act = match (flag("clip.use_gelu")?, flag("clip.use_silu")?) {
            (true, true) => return Err(bad("both clip.use_gelu and clip.use_silu are set".into())),
            (true, false) => FfnAct::Gelu,
            (false, true) => FfnAct::Silu,
            (false, false) => FfnAct::GeluQuick,
        };
        let patch_area = (patch_size * patch_size * n_merge * n_merge) as u64;
        let deepstack_layers = (0..n_layer)
            .filter(|il| {
                file.tensor(&format!("v.deepstack.{il}.fc1.weight"))
                    .is_some()
            })
            .collect();
        Ok(VisionHParams {
            projector,
            n_embd,
            n_head,
            n_ff: u("clip.vision.feed_forward_length")?,
            n_layer,
            projection_dim: u("clip.vision.projection_dim")?,
            eps,
            patch_size,
            image_size: u("clip.vision.image_size")?,
            n_merge,
            ffn_act,
            image_mean: triple("clip.vision.image_mean")?,
            image_std,
            min_pixels: min_tokens * patch_area,
            max_pixels: max_tokens * patch_area,
            resample: Resample::Bicubic,
            deepstack_layers,
        })
    }
}

/// How the language model takes an image's tokens, as llama.cpp's `mtmd`
/// decodes them for the projector type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImageDecoding {
    /// M-RoPE positions: image token `i` of an `n_x × n_y` grid from position
    /// `p` at `(p, p + i / n_x, p + i % n_x)`, the text after it from
    /// `p + max(n_x, n_y)` (Qwen3-VL). Else one position per token, as text.
    pub mrope: bool,
    /// The image's tokens attend to each other both ways, decoded in one
    /// batch (`mtmd_decode_use_non_causal`; Gemma 4 applies it to its sliding
    /// layers only). An image's tokens must then be computed in one step.
    pub non_causal: bool,
}

/// A projector file: its hyper-parameters and the file (the encoder's weights
/// load from it onto the encoder's device).
pub struct Projector {
    hp: VisionHParams,
    file: Arc<GgufFile>,
}

impl Projector {
    /// Opens and checks a projector file.
    pub fn open(path: impl AsRef<Path>) -> Result<Projector, VisionError> {
        let path = path.as_ref();
        let file = GgufFile::open(path)
            .map_err(|e| VisionError::BadProjector(format!("{}: {e}", path.display())))?;
        Projector::from_file(Arc::new(file))
    }

    /// Checks an opened projector file.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Projector, VisionError> {
        let hp = VisionHParams::from_file(&file)?;
        Ok(Projector { hp, file })
    }

    /// The vision tower's hyper-parameters.
    pub fn hparams(&self) -> &VisionHParams {
        &self.hp
    }

    /// How its images' tokens are decoded by the language model.
    pub fn decoding(&self) -> ImageDecoding {
        match self.hp.projector {
            ProjectorType::Qwen3Vl => ImageDecoding {
                mrope: true,
                non_causal: false,
            },
            // llama.cpp keeps Gemma 4 E2B and E4B (2560 and 1536 wide) causal.
            ProjectorType::Gemma4V => ImageDecoding {
                mrope: false,
                non_causal: !matches!(self.hp.projection_dim, 1536 | 2560),
            },
        }
    }

    /// The file the weights come from.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Checks that this projector feeds a language model of architecture `arch`
    /// with embedding width `n_embd` taking `n_deepstack` deepstack inputs: the
    /// merger must produce `n_embd`-wide embeddings, one deepstack feature per
    /// deepstack input, and the architecture must be the projector's family.
    pub fn check_language_model(
        &self,
        arch: &str,
        n_embd: usize,
        n_deepstack: usize,
    ) -> Result<(), VisionError> {
        let hp = &self.hp;
        let mismatch = |m: String| Err(VisionError::Mismatch(m));
        let family: &[&str] = match hp.projector {
            ProjectorType::Qwen3Vl => &["qwen3vl", "qwen3vlmoe"],
            // The dense and the MoE Gemma 4 share the architecture name.
            ProjectorType::Gemma4V => &["gemma4"],
        };
        if !family.contains(&arch) {
            return mismatch(format!(
                "a {} projector goes with {} language models, not '{arch}'",
                hp.projector.name(),
                family.join(" or ")
            ));
        }
        if hp.projection_dim != n_embd {
            return mismatch(format!(
                "the projector makes {}-wide embeddings, the language model's width is {n_embd}",
                hp.projection_dim
            ));
        }
        if hp.deepstack_layers.len() != n_deepstack {
            return mismatch(format!(
                "the projector has {} deepstack layers, the language model takes {n_deepstack}",
                hp.deepstack_layers.len()
            ));
        }
        Ok(())
    }
}
