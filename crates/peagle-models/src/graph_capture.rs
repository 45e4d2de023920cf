//! Capturing a forward as a CUDA graph, and the graphs of a forward's shapes: what the
//! target's graphs (`cuda_graphs.rs`) and the drafter's (`drafter_graphs.rs`) share.
//!
//! A capture runs the forward once as usual, which fills candle's cache of the shapes its own
//! kernels upload (none may be uploaded during capture), then the same forward under stream
//! capture over the same input tensors. A replay writes new values into those tensors and
//! launches the graph; its outputs land where the capture's did.

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaStream};
use candle_core::cuda_backend::WrapErr;
use candle_core::{Device, Result};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// One captured forward with the tensors it reads and writes. Fields drop in order: the
/// outputs, which the graph allocated, are freed before the graph is destroyed.
pub(crate) struct Captured<I, O> {
    pub inputs: I,
    pub outputs: O,
    graph: CudaGraph,
}

// SAFETY: a graph is launched by one thread at a time (its owner's methods take `&mut self`),
// and each launch binds the graph's context to the launching thread first.
unsafe impl<I, O> Send for Captured<I, O> {}

impl<I, O> Captured<I, O> {
    /// Captures `forward` over `inputs`, which become the tensors it reads.
    fn new(device: &Device, inputs: I, forward: impl Fn(&I) -> Result<O>) -> Result<Self> {
        let device = device.as_cuda_device()?;
        let _cached_shapes = device.enable_cuda_graph_htod_cache();
        forward(&inputs)?;
        let capture = Capture::begin(device.cuda_stream())?;
        let outputs = forward(&inputs);
        let graph = capture.end();
        // The forward's error says why a capture failed; the capture's error follows from it.
        let outputs = outputs?;
        match graph {
            Ok(Some(graph)) => Ok(Self { inputs, outputs, graph }),
            failed => {
                // The outputs' addresses were the graph's, which is gone: freeing them now
                // would fail, and the failure would surface at some later call.
                std::mem::forget(outputs);
                match failed {
                    Err(e) => Err(e),
                    _ => candle_core::bail!("capturing a forward gave no CUDA graph"),
                }
            }
        }
    }

    /// Runs the graph over its inputs as last written, leaving its outputs where it writes
    /// them.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch().w()
    }
}

/// The graphs of one forward, one per shape `S`; a shape whose capture failed runs without a
/// graph from then on.
pub(crate) struct Graphs<S, I, O> {
    captured: HashMap<S, Option<Captured<I, O>>>,
}

impl<S: Hash + Eq + Copy + std::fmt::Debug, I, O> Graphs<S, I, O> {
    /// None yet, for forwards on `device`, which must be a GPU.
    pub fn new(device: &Device) -> Result<Self> {
        if !device.is_cuda() {
            candle_core::bail!("CUDA graphs need a CUDA device");
        }
        Ok(Self {
            captured: HashMap::new(),
        })
    }

    /// Shapes that have a graph.
    pub fn count(&self) -> usize {
        self.captured.values().filter(|g| g.is_some()).count()
    }

    /// `shape`'s graph with this step's inputs written into its own by `write`; captured now
    /// over `inputs()` by `forward` if it has none yet; None, writing nothing, where its
    /// capture failed before. A capture that fails now is this call's error, and its shape
    /// runs without a graph from then on.
    pub fn get_or_capture(
        &mut self,
        shape: S,
        device: &Device,
        inputs: impl FnOnce() -> Result<I>,
        write: impl FnOnce(&I) -> Result<()>,
        forward: impl Fn(&I) -> Result<O>,
    ) -> Result<Option<&Captured<I, O>>> {
        if self.captured.contains_key(&shape) {
            let Some(graph) = self.captured.get(&shape).and_then(Option::as_ref) else {
                return Ok(None);
            };
            write(&graph.inputs)?;
            return Ok(Some(graph));
        }
        let inputs = inputs()?;
        tracing::debug!(?shape, "capturing a CUDA graph");
        // candle unwraps some allocations, which a capture gone invalid refuses: that panic
        // fails this shape's capture (the capture is ended as it unwinds), not the engine.
        let captured =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Captured::new(device, inputs, forward)))
                .unwrap_or_else(|_| candle_core::bail!("capturing a forward panicked"));
        match captured {
            Ok(captured) => Ok(Some(self.captured.entry(shape).or_default().insert(captured))),
            Err(e) => {
                self.captured.insert(shape, None);
                Err(e)
            }
        }
    }

    /// Captures the shape of every step of `steps` that has one (`shape_of`) and no graph
    /// yet, over the inputs `inputs_of` makes for it, so that no request waits on a capture;
    /// says how many were captured. Each graph is launched once, so that its outputs are
    /// allocated before anything frees them. A shape whose capture or first launch fails is
    /// logged and runs without a graph. Returns once the device has run every launch, so that
    /// a step on another thread's stream follows them.
    pub fn capture_at_startup<T>(
        &mut self,
        device: &Device,
        steps: impl IntoIterator<Item = T>,
        shape_of: impl Fn(&T) -> Option<S>,
        inputs_of: impl Fn(&T, S) -> Result<I>,
        forward: impl Fn(&I) -> Result<O>,
    ) -> Result<usize> {
        let mut captured = 0;
        for step in steps {
            let Some(shape) = shape_of(&step) else {
                continue;
            };
            if self.captured.contains_key(&shape) {
                continue;
            }
            let inputs = inputs_of(&step, shape)?;
            captured += usize::from(self.capture_one(shape, device, inputs, &forward));
        }
        device.synchronize()?;
        Ok(captured)
    }

    /// Captures `shape` over `inputs` and launches it once; says whether it now has a graph.
    fn capture_one(&mut self, shape: S, device: &Device, inputs: I, forward: &impl Fn(&I) -> Result<O>) -> bool {
        let launched = match self.get_or_capture(shape, device, || Ok(inputs), |_| Ok(()), forward) {
            Ok(Some(graph)) => graph.launch(),
            Ok(None) => return false,
            Err(e) => Err(e),
        };
        let Err(e) = launched else {
            return true;
        };
        // A failed capture is kept as None already. A graph whose launch failed never
        // allocated its outputs, and freeing them would fail a later call: it is left as it is.
        if let Some(Some(graph)) = self.captured.insert(shape, None) {
            std::mem::forget(graph);
        }
        tracing::warn!(?shape, "this step shape runs without a CUDA graph: {e}");
        false
    }
}

/// A capture in progress on a stream, ended on every path: a stream left capturing fails
/// every later launch of its thread.
struct Capture {
    stream: Arc<CudaStream>,
    open: bool,
}

impl Capture {
    fn begin(stream: Arc<CudaStream>) -> Result<Self> {
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .w()?;
        Ok(Self { stream, open: true })
    }

    /// Ends the capture and instantiates its graph, whose every launch frees what the graph
    /// allocated and the last launch left: the outputs, which keep their addresses.
    fn end(mut self) -> Result<Option<CudaGraph>> {
        self.open = false;
        Self::forget_stale_error(&self.stream);
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        self.stream.end_capture(flags).w()
    }

    /// Drops the error cudarc kept from a call that could not return one, such as a free
    /// refused by a capture gone invalid: it would otherwise fail the next call, ending the
    /// capture included, before that call runs. Errors kept before the capture failed its
    /// beginning, so this one is the capture's own.
    fn forget_stale_error(stream: &CudaStream) {
        if let Err(e) = stream.context().check_err() {
            tracing::debug!("an error recorded during a CUDA graph capture: {e}");
        }
    }
}

impl Drop for Capture {
    /// Ends a capture a panic left open; its graph is dropped.
    fn drop(&mut self) {
        if self.open {
            Self::forget_stale_error(&self.stream);
            let _ = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        }
    }
}
