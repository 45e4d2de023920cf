//! The vector instruction set the kernels run on, one answer per process.
//!
//! Every kernel asks [`Isa::detected`], so every call in a process takes the same path and a
//! value never depends on which kernel variant computed it. Paths of one kernel give the same
//! bits where its documentation says so (softmax, attention sums, matmul); dot products fix
//! their reduction order per instruction set, so those agree within a machine, not across.

use std::sync::OnceLock;

/// An instruction set with its own kernel variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512 F and BW: 16 lanes, 32 registers.
    Avx512,
    /// AVX2 with FMA: 8 lanes, 16 registers.
    Avx2,
    /// Plain Rust, whatever the target compiles it to.
    Portable,
}

impl Isa {
    /// The widest instruction set this CPU has (Portable off x86-64).
    pub(crate) fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| Isa::runnable()[0])
    }

    /// Every instruction set this CPU can run, widest first, Portable last: what tests compare.
    pub(crate) fn runnable() -> Vec<Isa> {
        let mut isas = Vec::with_capacity(3);
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                isas.push(Isa::Avx512);
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                isas.push(Isa::Avx2);
            }
        }
        isas.push(Isa::Portable);
        isas
    }
}
