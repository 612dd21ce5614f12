//! Puts ggml's shared libraries, under their sonames, next to every binary cargo
//! builds (target/<profile>/{., deps, examples}), so binaries find them through
//! their `$ORIGIN` run path and a release directory can be copied as a whole
//! (the GPU machine loads its CUDA backend against this same ggml-base).

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    let Some(cmake_dir) = std::env::var_os("DEP_LLAMA_GGML_CMAKE_DIR") else {
        println!("cargo:warning=llama-cpp-sys-2 did not report its ggml directory; ggml libraries not copied");
        return;
    };
    let lib_dir = Path::new(&cmake_dir)
        .parent()
        .expect("cmake dir has a parent")
        .to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
    let profile_dir = out.ancestors().nth(3).expect("profile dir").to_path_buf();
    // llama-cpp-sys-2 hard-links the unversioned names (symlinks to `*.so.0`) into these
    // directories and panics when it finds one dangling on a later build; libllama is
    // not used by Tempo9, so a link to the build output keeps that symlink valid.
    for dir in [
        profile_dir.clone(),
        profile_dir.join("deps"),
        profile_dir.join("examples"),
    ] {
        let dst = dir.join("libllama.so.0");
        let src = lib_dir.join("libllama.so.0");
        if src.exists() && std::fs::symlink_metadata(&dst).is_err() {
            std::fs::create_dir_all(&dir).expect("create target dir");
            #[cfg(unix)]
            std::os::unix::fs::symlink(&src, &dst).expect("link libllama");
        }
    }
    for name in ["libggml-base.so.0", "libggml.so.0", "libggml-cpu.so.0"] {
        let src = lib_dir.join(name);
        if !src.exists() {
            continue; // static builds or other platforms
        }
        println!("cargo:rerun-if-changed={}", src.display());
        for dir in [
            profile_dir.clone(),
            profile_dir.join("deps"),
            profile_dir.join("examples"),
        ] {
            std::fs::create_dir_all(&dir).expect("create target dir");
            let dst = dir.join(name);
            // Copy to a temporary name and rename, so a running binary never sees half a file.
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::copy(&src, &tmp).expect("copy ggml library");
            std::fs::rename(&tmp, &dst).expect("install ggml library");
        }
    }
}
