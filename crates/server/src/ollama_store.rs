//! Resolving `NAME[:TAG]` to a GGUF blob in Ollama's local model store.
//!
//! Layout (Ollama's): `$OLLAMA_MODELS` or `~/.ollama/models`, with
//! `manifests/HOST/NAMESPACE/NAME/TAG` (JSON; the layer whose `mediaType` is
//! `application/vnd.ollama.image.model` is the GGUF) and blobs at
//! `blobs/sha256-HEX`. Short names default to `registry.ollama.ai/library` and
//! tag `latest`.

use std::path::{Path, PathBuf};

use serde_json::Value;

const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const DEFAULT_TAG: &str = "latest";
const MODEL_MEDIA_TYPE: &str = "application/vnd.ollama.image.model";
/// Longest host, namespace, name or tag.
const MAX_PART_LEN: usize = 128;

/// A model found in the store.
#[derive(Debug, Clone, PartialEq)]
pub struct OllamaModel {
    /// The name as Ollama shows it (`qwen2.5-coder:0.5b`, `user/name:tag`).
    pub name: String,
    /// The GGUF blob.
    pub gguf: PathBuf,
    /// The blob's digest (`sha256:…`).
    pub digest: String,
    /// The chat template layer's text, when the manifest has one.
    pub template: Option<String>,
}

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The name is not `[HOST/][NAMESPACE/]NAME[:TAG]` or has path tricks in it.
    #[error("invalid model name '{0}'")]
    InvalidName(String),
    /// No manifest for the name.
    #[error("model '{name}' not found in the Ollama store at {root} (pull it with `ollama pull {name}`)")]
    NotFound {
        /// The requested name.
        name: String,
        /// The store root searched.
        root: String,
    },
    /// The manifest is unreadable or has no model layer, or the blob is missing.
    #[error("bad Ollama manifest {path}: {why}")]
    BadManifest {
        /// The manifest path.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// The store root: `$OLLAMA_MODELS`, else `~/.ollama/models`.
pub fn default_root() -> PathBuf {
    if let Some(p) = std::env::var_os("OLLAMA_MODELS").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".ollama").join("models")
}

/// Splits `[HOST/][NAMESPACE/]NAME[:TAG]` into its four parts.
fn parse_name(name: &str) -> Result<[String; 4], StoreError> {
    let bad = || StoreError::InvalidName(name.to_string());
    let (path, tag) = match name.rsplit_once(':') {
        // A colon inside the host part (host:port/…) is not a tag.
        Some((p, t)) if !t.contains('/') => (p, t),
        _ => (name, DEFAULT_TAG),
    };
    let parts: Vec<&str> = path.split('/').collect();
    let (host, ns, model) = match parts.as_slice() {
        [m] => (DEFAULT_HOST, DEFAULT_NAMESPACE, *m),
        [n, m] => (DEFAULT_HOST, *n, *m),
        [h, n, m] => (*h, *n, *m),
        _ => return Err(bad()),
    };
    // Each part becomes a path component: no separators, no `.`/`..`, no
    // leading dot or dash, a length a file system takes.
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_PART_LEN
            && !s.starts_with(['.', '-'])
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-:".contains(c))
    };
    if ![host, ns, model, tag].iter().all(|s| ok(s)) || tag.contains(':') {
        return Err(bad());
    }
    Ok([host, ns, model, tag].map(str::to_string))
}

/// Finds `name` in the store at `root`.
pub fn resolve(root: &Path, name: &str) -> Result<OllamaModel, StoreError> {
    let [host, ns, model, tag] = parse_name(name.trim())?;
    let manifest = root
        .join("manifests")
        .join(&host)
        .join(&ns)
        .join(&model)
        .join(&tag);
    let bad = |why: String| StoreError::BadManifest {
        path: manifest.display().to_string(),
        why,
    };
    let text = match std::fs::read_to_string(&manifest) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::NotFound {
                name: name.to_string(),
                root: root.display().to_string(),
            })
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let layers = v["layers"]
        .as_array()
        .ok_or_else(|| bad("no layers".into()))?;
    let blob = |digest: &str| -> Result<PathBuf, StoreError> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
            .ok_or_else(|| bad(format!("bad digest '{digest}'")))?;
        Ok(root.join("blobs").join(format!("sha256-{hex}")))
    };
    let layer = |media: &str| {
        layers
            .iter()
            .find(|l| l["mediaType"] == media)
            .and_then(|l| l["digest"].as_str())
    };
    let digest = layer(MODEL_MEDIA_TYPE).ok_or_else(|| bad("no model layer".into()))?;
    let gguf = blob(digest)?;
    if !gguf.is_file() {
        return Err(bad(format!("blob {} is missing", gguf.display())));
    }
    let template = match layer("application/vnd.ollama.image.template") {
        Some(d) => std::fs::read_to_string(blob(d)?).ok(),
        None => None,
    };
    let short = match (host.as_str(), ns.as_str()) {
        (DEFAULT_HOST, DEFAULT_NAMESPACE) => model,
        (DEFAULT_HOST, _) => format!("{ns}/{model}"),
        _ => format!("{host}/{ns}/{model}"),
    };
    Ok(OllamaModel {
        name: format!("{short}:{tag}"),
        gguf,
        digest: digest.to_string(),
        template,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_store(root: &Path, dir: &[&str], digest_hex: &str, with_blob: bool) {
        let mut m = root.join("manifests");
        for d in &dir[..dir.len() - 1] {
            m = m.join(d);
        }
        std::fs::create_dir_all(&m).unwrap();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": "sha256:00", "size": 1},
            "layers": [
                {"mediaType": "application/vnd.ollama.image.model",
                 "digest": format!("sha256:{digest_hex}"), "size": 4},
                {"mediaType": "application/vnd.ollama.image.template",
                 "digest": format!("sha256:{}", hex("abcd")), "size": 3}
            ]
        });
        std::fs::write(m.join(dir[dir.len() - 1]), manifest.to_string()).unwrap();
        std::fs::create_dir_all(root.join("blobs")).unwrap();
        if with_blob {
            std::fs::write(
                root.join("blobs").join(format!("sha256-{digest_hex}")),
                b"GGUF",
            )
            .unwrap();
        }
        std::fs::write(
            root.join("blobs").join(format!("sha256-{}", hex("abcd"))),
            "{{ .Prompt }}",
        )
        .unwrap();
    }

    /// A 64-digit digest ending in `tail`.
    fn hex(tail: &str) -> String {
        format!("{tail:0>64}")
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tempo9-ollama-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn resolves_library_user_and_host_names() {
        let root = tmp("names");
        fake_store(
            &root,
            &["registry.ollama.ai", "library", "qwen2.5-coder", "0.5b"],
            &hex("11aa"),
            true,
        );
        fake_store(
            &root,
            &["registry.ollama.ai", "library", "smollm2", "latest"],
            &hex("22bb"),
            true,
        );
        fake_store(
            &root,
            &["registry.ollama.ai", "me", "tiny", "q4"],
            &hex("33cc"),
            true,
        );
        fake_store(
            &root,
            &["hf.co", "org", "repo", "Q4_K_M"],
            &hex("44dd"),
            true,
        );

        let m = resolve(&root, "qwen2.5-coder:0.5b").unwrap();
        assert_eq!(m.gguf, root.join(format!("blobs/sha256-{}", hex("11aa"))));
        assert_eq!(m.name, "qwen2.5-coder:0.5b");
        assert_eq!(m.digest, format!("sha256:{}", hex("11aa")));
        assert_eq!(m.template.as_deref(), Some("{{ .Prompt }}"));
        assert_eq!(resolve(&root, "smollm2").unwrap().name, "smollm2:latest");
        assert_eq!(
            resolve(&root, "me/tiny:q4").unwrap().gguf,
            root.join(format!("blobs/sha256-{}", hex("33cc")))
        );
        assert_eq!(
            resolve(&root, "hf.co/org/repo:Q4_K_M").unwrap().name,
            "hf.co/org/repo:Q4_K_M"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn errors_are_specific() {
        let root = tmp("errors");
        fake_store(
            &root,
            &["registry.ollama.ai", "library", "noblob", "latest"],
            &hex("55ee"),
            false,
        );
        assert!(matches!(
            resolve(&root, "missing:1b"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            resolve(&root, "noblob"),
            Err(StoreError::BadManifest { .. })
        ));
        for bad in [
            "../etc:passwd",
            "a/b/c/d",
            "",
            "x:..",
            "a b",
            "..",
            "registry.ollama.ai/../x",
            "/etc/passwd",
            "a/../../b:c",
            "a\\..\\b",
            "%2e%2e/x",
            ".hidden",
            "-rf",
            "x:.",
            "name:tag/../../x",
            "a\0b",
        ] {
            assert!(
                matches!(resolve(&root, bad), Err(StoreError::InvalidName(_))),
                "{bad}"
            );
        }
        let long = "a".repeat(MAX_PART_LEN + 1);
        assert!(matches!(
            resolve(&root, &long),
            Err(StoreError::InvalidName(_))
        ));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn manifest_digests_cannot_escape_the_blob_directory() {
        let root = tmp("digests");
        let dir = root.join("manifests/registry.ollama.ai/library/evil");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(root.join("blobs")).unwrap();
        std::fs::write(root.join("secret"), "GGUF").unwrap();
        for digest in [
            "sha256:../secret",
            "sha256:",
            "sha256:abc",
            "md5:00",
            "../../secret",
        ] {
            let m = serde_json::json!({"layers": [
                {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]});
            std::fs::write(dir.join("latest"), m.to_string()).unwrap();
            match resolve(&root, "evil") {
                Err(StoreError::BadManifest { why, .. }) => {
                    assert!(why.contains("bad digest"), "{digest}: {why}")
                }
                other => panic!("{digest}: {other:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
