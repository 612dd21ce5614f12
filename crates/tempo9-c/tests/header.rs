//! `include/tempo9.h` is what cbindgen generates from the source now.
//! Regenerate: `TEMPO9_WRITE_HEADER=1 cargo test --release -p tempo9-c --test header`.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut out);
    let generated = String::from_utf8(out).unwrap();
    let path = dir.join("include/tempo9.h");
    if std::env::var_os("TEMPO9_WRITE_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/tempo9.h is stale: TEMPO9_WRITE_HEADER=1 cargo test --release -p tempo9-c --test header"
    );
    // Swift imports plain C: no variadic functions (`, ...)` in a prototype).
    assert!(!generated.contains("...)"));
}

/// `include/module.modulemap` makes the header a Clang module, as Swift and
/// Objective-C import it: `@import Tempo9;` compiles (Objective-C, syntax only;
/// clang is installed by scripts/deps.sh).
#[test]
fn module_imports_in_objective_c() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = std::env::temp_dir().join(format!("tempo9-modulemap-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let src = tmp.join("import.m");
    std::fs::write(
        &src,
        "@import Tempo9;\n\
         int f(void) {\n\
           Tempo9Model *m = 0; Tempo9Stream *s = 0; Tempo9EventCallback cb = 0;\n\
           (void)m; (void)s; (void)cb;\n\
           return (int)TEMPO9_OK + (tempo9_version() != 0);\n\
         }\n",
    )
    .unwrap();
    let out = std::process::Command::new("clang")
        .args(["-fmodules", "-fsyntax-only", "-x", "objective-c"])
        .arg(format!(
            "-fmodules-cache-path={}",
            tmp.join("cache").display()
        ))
        .arg("-I")
        .arg(dir.join("include"))
        .arg(&src)
        .output()
        .expect("clang (scripts/deps.sh installs it)");
    std::fs::remove_dir_all(&tmp).ok();
    assert!(
        out.status.success(),
        "@import Tempo9 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
