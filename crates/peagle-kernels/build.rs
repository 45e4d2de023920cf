//! Writes the kernels' integer constants as Rust (`kernel_constants`), so that the launchers
//! take the kernels' shapes and limits from their sources. With the `cuda` feature, compiles
//! the repository's `kernels/*.cu` to PTX with nvcc, once per virtual architecture in
//! `ARCHES`; the crate embeds them and loads the newest one the GPU runs (the driver
//! JIT-compiles PTX for any newer GPU, a B200 included).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Oldest first. compute_80 serves Ampere; the others let the compiler use what each adds.
const ARCHES: [&str; 3] = ["compute_80", "compute_90", "compute_100"];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let kernels = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../kernels");
    println!("cargo::rerun-if-changed={}", kernels.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .unwrap_or_else(|e| panic!("reading {}: {e}", kernels.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu" || e == "cuh"))
        .collect();
    sources.sort();
    write_constants(&sources, &out.join("kernel_constants.rs"));
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    for source in sources.iter().filter(|p| p.extension().unwrap() == "cu") {
        let stem = source.file_stem().unwrap().to_str().unwrap();
        for arch in ARCHES {
            let ptx = out.join(format!("{stem}.{arch}.ptx"));
            let status = Command::new(&nvcc)
                .args(["-ptx", "-O3", "-std=c++17", &format!("-arch={arch}"), "-o"])
                .arg(&ptx)
                .arg(source)
                .status()
                .unwrap_or_else(|e| {
                    panic!("running {nvcc} (is the CUDA toolkit on PATH? see scripts/build_cuda.sh): {e}")
                });
            assert!(status.success(), "{nvcc} failed on {} for {arch}", source.display());
        }
    }
}

/// Writes each `#define NAME <decimal integer>` of `sources` as `pub const NAME: usize` to
/// `to`. A name with no one value is left out: one defined more than once, or inside an `#if`
/// (which may not hold), or as an expression, or in another base.
fn write_constants(sources: &[PathBuf], to: &Path) {
    let mut defines: Vec<(String, Option<String>, String)> = Vec::new();
    for source in sources {
        let text = std::fs::read_to_string(source).unwrap_or_else(|e| panic!("reading {}: {e}", source.display()));
        let file = source.file_name().unwrap().to_str().unwrap();
        let mut depth = 0usize;
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            let words: Vec<&str> = code.split_whitespace().collect();
            match words.as_slice() {
                [w, ..] if w.starts_with("#if") => depth += 1,
                ["#endif", ..] => depth = depth.saturating_sub(1),
                ["#define", name, rest @ ..] => {
                    let name = name.split('(').next().unwrap_or_default().to_owned();
                    let decimal = match rest {
                        [v] if depth == 0 && is_decimal(v) => Some(v.to_string()),
                        _ => None,
                    };
                    defines.push((name, decimal, file.to_owned()));
                }
                _ => {}
            }
        }
    }
    let mut rust = String::new();
    for (name, value, file) in &defines {
        let once = defines.iter().filter(|(other, ..)| other == name).count() == 1;
        if let Some(value) = value.as_ref().filter(|_| once) {
            rust += &format!("/// `kernels/{file}`.\npub const {name}: usize = {value};\n");
        }
    }
    std::fs::write(to, rust).unwrap_or_else(|e| panic!("writing {}: {e}", to.display()));
}

/// A decimal literal as C and Rust read it alike: digits, with no leading 0 (C's octal).
fn is_decimal(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_digit()) && (value == "0" || !value.starts_with('0')) && !value.is_empty()
}
