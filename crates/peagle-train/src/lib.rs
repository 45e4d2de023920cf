//! Training P-EAGLE drafters and the EAGLE-3 baseline (docs/ARCHITECTURE.md, "File formats"): capture of target
//! states, COD sampling and the multi-depth layout, sequence partitioning, the KL objective,
//! the training loop, and export in the speculators format.

pub mod blueprint;
pub mod capture;
mod checkpoint_files;
pub mod cod;
pub mod error;
pub mod export;
pub mod files;
pub mod layout;
pub mod objective;
pub mod optimizer;
pub mod params;
pub mod partition;
pub mod plot;
pub mod sample;
pub mod step;
pub mod step_bench;
pub mod train_state;
pub mod trainer;
pub mod training_data;
pub mod vocab;
pub mod warm_start;

pub use blueprint::{Algo, DrafterBlueprint};
pub use cod::{CodConfig, CodLayout, Element};
pub use error::TrainError;
pub use layout::TrainingInputs;
pub use sample::Sample;
pub use train_state::{EvalPoint, TrainState};
pub use trainer::{fit, FitOptions};
pub use vocab::DraftVocab;
