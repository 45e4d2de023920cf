//! Capturing a forward as a CUDA graph, and the graphs of a forward's shapes: what the
//! target's graphs (`cuda_graphs.rs`) and the drafter's (`drafter_graphs.rs`) share.
//!
//! A capture runs the forward once as usual, which fills candle's cache of the shapes its own
//! kernels upload (none may be uploaded during capture) and leaves the tensors the graph's
//! outputs are copied into, then the same forward under stream capture over the same input
//! tensors. A replay writes new values into those tensors and launches the graph; its outputs
//! land where the first forward's did.
//!
//! A graph frees everything it allocates before it ends, its outputs included once copied out:
//! graphs that hold no allocation between launches can share their memory (CUDA may give
//! graphs that never run at once the same physical pages, but not pages under an allocation
//! still held), where each graph's unfreed outputs would pin pages of its own.

use crate::drafter_graphs::DeviceDrafts;
use crate::target_model::ForwardStates;
use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaStream};
use candle_core::cuda_backend::WrapErr;
use candle_core::{Device, Result, Tensor};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// What a captured forward leaves: tensors a graph copies its own outputs into.
pub(crate) trait GraphOutputs: Sized {
    /// The outputs that replays read, in an order that the same forward keeps.
    fn tensors(&self) -> Vec<&Tensor>;

    /// These outputs without those replays do not read.
    fn for_replays(self) -> Self {
        self
    }
}

impl GraphOutputs for ForwardStates {
    fn tensors(&self) -> Vec<&Tensor> {
        [Some(&self.logit_states), self.aux_hidden.as_ref()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The target's replays return no final states (`cuda_graphs::replay`).
    fn for_replays(self) -> Self {
        Self {
            final_hidden: None,
            ..self
        }
    }
}

impl GraphOutputs for DeviceDrafts {
    fn tensors(&self) -> Vec<&Tensor> {
        vec![&self.ids, &self.hidden]
    }
}

/// One captured forward with the tensors it reads and writes.
pub(crate) struct Captured<I, O> {
    pub inputs: I,
    /// Allocated outside the graph, by the forward before the capture; each launch overwrites
    /// them.
    pub outputs: O,
    graph: CudaGraph,
}

// SAFETY: a graph is launched by one thread at a time (its owner's methods take `&mut self`),
// and each launch binds the graph's context to the launching thread first.
unsafe impl<I, O> Send for Captured<I, O> {}

impl<I, O: GraphOutputs> Captured<I, O> {
    /// Captures `forward` over `inputs`, which become the tensors it reads.
    fn new(device: &Device, inputs: I, forward: impl Fn(&I) -> Result<O>) -> Result<Self> {
        let device = device.as_cuda_device()?;
        let _cached_shapes = device.enable_cuda_graph_htod_cache();
        let outputs = forward(&inputs)?.for_replays();
        load_copy_kernels(&outputs)?;
        let capture = Capture::begin(device.cuda_stream())?;
        // The graph's own outputs are freed here, inside it, once copied.
        let copied = forward(&inputs).and_then(|captured| copy_outputs(&captured, &outputs));
        let graph = capture.end();
        // The forward's error says why a capture failed; the capture's error follows from it.
        copied?;
        match graph? {
            Some(graph) => Ok(Self { inputs, outputs, graph }),
            None => candle_core::bail!("capturing a forward gave no CUDA graph"),
        }
    }

    /// Runs the graph over its inputs as last written, leaving its outputs where it writes
    /// them.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch().w()
    }
}

/// Copies each output onto itself through a copy of it, before the capture, so that the
/// kernel `copy_outputs` launches for its dtype is loaded when the capture launches it: a
/// forward need not have used it.
fn load_copy_kernels<O: GraphOutputs>(outputs: &O) -> Result<()> {
    for t in outputs.tensors() {
        if t.elem_count() > 0 {
            t.slice_set(&t.copy()?, 0, 0)?;
        }
    }
    Ok(())
}

/// Copies each tensor of `from` into its counterpart in `to`, in place.
fn copy_outputs<O: GraphOutputs>(from: &O, to: &O) -> Result<()> {
    let (from, to) = (from.tensors(), to.tensors());
    if from.len() != to.len() {
        candle_core::bail!(
            "a captured forward left {} outputs, the forward before it {}",
            from.len(),
            to.len()
        );
    }
    for (from, to) in from.into_iter().zip(to) {
        if from.dims() != to.dims() {
            candle_core::bail!(
                "a captured forward's output is {:?}, the forward before it {:?}",
                from.dims(),
                to.dims()
            );
        }
        if from.elem_count() > 0 {
            to.slice_set(&from.contiguous()?, 0, 0)?;
        }
    }
    Ok(())
}

/// The graphs of one forward, one per shape `S`; a shape whose capture failed runs without a
/// graph from then on.
pub(crate) struct Graphs<S, I, O> {
    captured: HashMap<S, Option<Captured<I, O>>>,
}

impl<S: Hash + Eq + Copy + std::fmt::Debug, I, O: GraphOutputs> Graphs<S, I, O> {
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
    /// says how many were captured. Each graph is launched once, so that a graph that cannot
    /// run is found now. A shape whose capture or first launch fails is
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
        // A failed capture is kept as None already.
        self.captured.insert(shape, None);
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

    /// Ends the capture and instantiates its graph. The graph frees what it allocates; should
    /// anything it allocated outlive it, each launch frees what the last one left.
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
