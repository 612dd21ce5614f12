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
    // Swift imports plain C: no variadic functions.
    assert!(!generated.contains("..."));
}
