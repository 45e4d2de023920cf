//! With the `cuda` feature, compiles the repository's `kernels/*.cu` to PTX with nvcc, once per
//! virtual architecture in `ARCHES`; the crate embeds them and loads the newest one the GPU
//! runs (the driver JIT-compiles PTX for any newer GPU, a B200 included).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Oldest first. compute_80 serves Ampere; the others let the compiler use what each adds.
const ARCHES: [&str; 3] = ["compute_80", "compute_90", "compute_100"];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let kernels = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../kernels");
    println!("cargo::rerun-if-changed={}", kernels.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let nvcc = env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .unwrap_or_else(|e| panic!("reading {}: {e}", kernels.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu" || e == "cuh"))
        .collect();
    sources.sort();
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
