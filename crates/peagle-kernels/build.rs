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
/// `to`. A name defined more than once (under an `#if`) is left out: it has no one value.
fn write_constants(sources: &[PathBuf], to: &Path) {
    let mut found: Vec<(String, String, String)> = Vec::new();
    for source in sources {
        let text = std::fs::read_to_string(source).unwrap_or_else(|e| panic!("reading {}: {e}", source.display()));
        let file = source.file_name().unwrap().to_str().unwrap();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some("#define"), Some(name), Some(value), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                continue;
            };
            if value.bytes().all(|b| b.is_ascii_digit()) {
                found.push((name.to_owned(), value.to_owned(), file.to_owned()));
            }
        }
    }
    let mut rust = String::new();
    for (name, value, file) in &found {
        if found.iter().filter(|(other, ..)| other == name).count() == 1 {
            rust += &format!("/// `kernels/{file}`.\npub const {name}: usize = {value};\n");
        }
    }
    std::fs::write(to, rust).unwrap_or_else(|e| panic!("writing {}: {e}", to.display()));
}
