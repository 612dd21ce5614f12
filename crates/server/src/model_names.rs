//! Which model a request's `model` field means.
//!
//! The server runs one model. Agents send their own vendor's names
//! (`claude-…`, `gpt-…`), so by default every name is answered by the served
//! model, and the mapping is logged (at `warn`, shown by default) once per name. Two exceptions: with
//! `--strict-model-names` only the served name and its aliases are answered,
//! and a name that is another model on this machine (an Ollama store entry, or
//! a GGUF file beside the served one) stays a 404, since answering it with a
//! different model would hide the user's mistake.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{ApiError, ErrorKind, Family};
use crate::ollama_store;

/// Names remembered (and logged) at most: bounds the memory a client sending
/// ever new names can take; later new names are resolved but not logged.
const MAX_REMEMBERED: usize = 256;

/// Longest name quoted in the log or an error (longer ones are cut).
const MAX_SHOWN: usize = 80;

/// Where other local models live, so their names are not answered by the
/// served one.
#[derive(Debug, Clone, Default)]
pub struct LocalModels {
    /// An Ollama store (`~/.ollama/models`): names it resolves are other models.
    pub ollama_root: Option<PathBuf>,
    /// A directory of GGUF files (the served file's): `NAME.gguf` there is
    /// another model named `NAME`.
    pub gguf_dir: Option<PathBuf>,
}

/// What a name means to this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Absent, the served name or an alias.
    Served,
    /// An unknown name, answered by the served model.
    Mapped,
    /// Unknown, refused (`--strict-model-names`).
    Unknown,
    /// Another model on this machine, refused.
    OtherLocal,
}

/// Resolves request model names against the served model (see the module doc).
#[derive(Debug)]
pub struct ModelNames {
    served: String,
    aliases: Vec<String>,
    strict: bool,
    any: bool,
    local: LocalModels,
    served_path: Option<PathBuf>,
    seen: Mutex<HashMap<String, Resolution>>,
}

/// `name` without Ollama's default `:latest` tag.
fn strip_latest(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// `name` for a log line or an error: control characters escaped, cut short.
fn shown(name: &str) -> String {
    let cut: String = name.chars().take(MAX_SHOWN).collect();
    let more = if cut.len() < name.len() { "…" } else { "" };
    format!("{}{more}", cut.escape_debug())
}

impl ModelNames {
    /// Names for a server serving `served` (with `aliases`). `strict` refuses
    /// unknown names; `any` answers every name, other local models included.
    pub fn new(served: &str, aliases: &[String], strict: bool, any: bool) -> ModelNames {
        ModelNames {
            served: served.to_string(),
            aliases: aliases.to_vec(),
            strict,
            any,
            local: LocalModels::default(),
            served_path: None,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Also refuses names of the models in `local` other than the file at
    /// `served_path`.
    pub fn with_local(mut self, local: LocalModels, served_path: &Path) -> ModelNames {
        self.local = local;
        self.served_path = std::fs::canonicalize(served_path).ok();
        self
    }

    /// What `model` (a request's field; `None` when absent) means.
    pub fn resolve(&self, model: Option<&str>) -> Resolution {
        let Some(m) = model.map(str::trim).filter(|m| !m.is_empty()) else {
            return Resolution::Served;
        };
        let m = strip_latest(m);
        if strip_latest(&self.served) == m || self.aliases.iter().any(|a| strip_latest(a) == m) {
            return Resolution::Served;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = seen.get(m) {
            return *r;
        }
        let r = if self.any {
            Resolution::Mapped
        } else if self.strict {
            Resolution::Unknown
        } else if self.is_other_local(m) {
            Resolution::OtherLocal
        } else {
            Resolution::Mapped
        };
        if seen.len() < MAX_REMEMBERED {
            seen.insert(m.to_string(), r);
            if r == Resolution::Mapped {
                // Warn: the default log level, so a user sees it once per name.
                tracing::warn!(
                    "requests for model \"{}\" are answered by '{}' (--strict-model-names refuses them)",
                    shown(m),
                    self.served
                );
            }
        }
        r
    }

    /// [`Self::resolve`] as a handler's check: a 404 in `family`'s shape for
    /// names this server refuses.
    pub fn check(&self, family: Family, model: Option<&str>) -> Result<(), ApiError> {
        let why = match self.resolve(model) {
            Resolution::Served | Resolution::Mapped => return Ok(()),
            Resolution::Unknown => "--strict-model-names is set",
            Resolution::OtherLocal => {
                "it is another model on this machine; start a second tempo9 for it"
            }
        };
        let m = shown(strip_latest(model.unwrap_or("").trim()));
        Err(ApiError::new(
            family,
            ErrorKind::NotFound,
            format!(
                "model '{m}' not found; this server serves '{}' ({why})",
                self.served
            ),
        ))
    }

    /// Whether `name` is a local model other than the served one.
    fn is_other_local(&self, name: &str) -> bool {
        let other = |path: &Path| {
            let p = std::fs::canonicalize(path).ok();
            p.is_some() && p != self.served_path
        };
        if let Some(root) = &self.local.ollama_root {
            if let Ok(m) = ollama_store::resolve(root, name) {
                if other(&m.gguf) {
                    return true;
                }
            }
        }
        // A plain file name only: no separators or `..` reaching elsewhere.
        let plain = !name.contains(['/', '\\']) && !name.starts_with('.');
        if let (Some(dir), true) = (&self.local.gguf_dir, plain) {
            let p = dir.join(format!("{name}.gguf"));
            if p.is_file() && other(&p) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(strict: bool, any: bool) -> ModelNames {
        ModelNames::new("qwen", &["q".to_string()], strict, any)
    }

    #[test]
    fn served_names_and_aliases() {
        for strict in [false, true] {
            let n = names(strict, false);
            for m in [
                None,
                Some(""),
                Some("qwen"),
                Some("qwen:latest"),
                Some(" q "),
            ] {
                assert_eq!(n.resolve(m), Resolution::Served, "{m:?}");
            }
        }
    }

    #[test]
    fn unknown_names_are_mapped_unless_strict() {
        assert_eq!(
            names(false, false).resolve(Some("claude-sonnet-4-5")),
            Resolution::Mapped
        );
        let strict = names(true, false);
        assert_eq!(strict.resolve(Some("gpt-5")), Resolution::Unknown);
        let e = strict.check(Family::OpenAi, Some("gpt-5")).unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::NOT_FOUND);
        assert_eq!(names(true, true).resolve(Some("gpt-5")), Resolution::Mapped);
    }

    #[test]
    fn other_local_gguf_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("tempo9-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let served = dir.join("qwen.gguf");
        std::fs::write(&served, b"x").unwrap();
        std::fs::write(dir.join("llama.gguf"), b"y").unwrap();
        let local = LocalModels {
            ollama_root: None,
            gguf_dir: Some(dir.clone()),
        };
        let n = names(false, false).with_local(local.clone(), &served);
        assert_eq!(n.resolve(Some("llama")), Resolution::OtherLocal);
        assert_eq!(n.resolve(Some("llama:latest")), Resolution::OtherLocal);
        assert_eq!(n.resolve(Some("../qwen")), Resolution::Mapped);
        assert_eq!(n.resolve(Some("gpt-4o")), Resolution::Mapped);
        // `--any-model` answers every name.
        let any = names(false, true).with_local(local, &served);
        assert_eq!(any.resolve(Some("llama")), Resolution::Mapped);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn remembered_names_are_bounded() {
        let n = names(false, false);
        for i in 0..MAX_REMEMBERED + 10 {
            assert_eq!(n.resolve(Some(&format!("m{i}"))), Resolution::Mapped);
        }
        assert_eq!(n.seen.lock().unwrap().len(), MAX_REMEMBERED);
        assert_eq!(shown(&"x".repeat(200)).chars().count(), MAX_SHOWN + 1);
        assert_eq!(shown("a\nb"), "a\\nb");
    }
}
