//! `docs/manual/cli.md` is the `--help` output of `tempo9` and of each of its
//! commands. This test builds the same text from the built binary and fails when
//! the file differs; with `TEMPO9_WRITE_CLI_REFERENCE=1` it writes the file instead:
//!
//! ```sh
//! TEMPO9_WRITE_CLI_REFERENCE=1 cargo test --release -p tempo9-cli --test cli_reference
//! ```
//!
//! The help is taken with the environment variables it can show (`TEMPO9_*`, which
//! clap prints as `[env: NAME=VALUE]`) removed, and with `COLUMNS` and
//! `CLICOLOR_FORCE` removed, so the text does not depend on the machine or the
//! shell. Trailing spaces are trimmed from every line. No default in the help is
//! computed from the machine (core count and memory defaults are described in words).

use std::path::PathBuf;
use std::process::Command;

/// The commands documented, in order (`None`: `tempo9` itself).
const COMMANDS: &[Option<&str>] = &[
    None,
    Some("serve"),
    Some("run"),
    Some("bench"),
    Some("synth-gguf"),
    Some("check-device"),
    Some("kernels"),
];

const ENV_VAR: &str = "TEMPO9_WRITE_CLI_REFERENCE";
const REGENERATE: &str =
    "TEMPO9_WRITE_CLI_REFERENCE=1 cargo test --release -p tempo9-cli --test cli_reference";

/// `tempo9 [CMD] --help`, normalised.
fn help(cmd: Option<&str>) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tempo9"));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("TEMPO9_") || k == "COLUMNS" || k == "CLICOLOR_FORCE" {
            c.env_remove(&k);
        }
    }
    if let Some(cmd) = cmd {
        c.arg(cmd);
    }
    let out = c.arg("--help").output().expect("run the tempo9 binary");
    assert!(
        out.status.success(),
        "tempo9 {} --help failed: {}",
        cmd.unwrap_or(""),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    while lines.last() == Some(&"") {
        lines.pop();
    }
    lines.join("\n")
}

/// The whole reference page.
fn reference() -> String {
    let mut s = String::from("# CLI reference\n\n");
    s.push_str(
        "Generated from the `--help` output of `tempo9` and of each command by \
         `crates/cli/tests/cli_reference.rs`; do not edit by hand. Regenerate with \
         `",
    );
    s.push_str(REGENERATE);
    s.push_str(
        "`. The help is taken with the `TEMPO9_*` environment variables unset (clap \
         would show their values) and trailing spaces trimmed; no default below \
         depends on the machine (those that do, such as threads and KV budget, are \
         described in words).\n",
    );
    for cmd in COMMANDS {
        let title = match cmd {
            None => "tempo9".to_string(),
            Some(c) => format!("tempo9 {c}"),
        };
        s.push_str(&format!("\n## {title}\n\n```text\n{}\n```\n", help(*cmd)));
    }
    s
}

#[test]
fn cli_reference_matches_help() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/manual/cli.md");
    let want = reference();
    if std::env::var_os(ENV_VAR).is_some_and(|v| !v.is_empty() && v != "0") {
        std::fs::write(&path, &want).expect("write docs/manual/cli.md");
        eprintln!("wrote {}", path.display());
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/manual/cli.md differs from the binary's --help output (first at line {}:\n  file: {:?}\n  help: {:?}).\nRegenerate it with:\n  {REGENERATE}",
            first + 1,
            have.lines().nth(first).unwrap_or("<end of file>"),
            want.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}
