//! Where callers run the kernels.

/// Runs `f` on a thread of rayon's pool, or in place when already on one.
///
/// Every kernel splits its work over the pool, and a model forward runs a few hundred of them,
/// each a few microseconds long at decode sizes. Called from any other thread, every kernel
/// hands its work over and puts the caller to sleep until it is done: on 2 cores that doubled
/// the time of a plain decode step.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}
