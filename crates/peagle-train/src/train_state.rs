//! A training run's progress: saved with every checkpoint and written as the final report.

use serde::{Deserialize, Serialize};

/// One validation point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalPoint {
    pub step: usize,
    pub lr: f64,
    pub train_loss: f64,
    pub val_loss: f64,
    pub val_accuracy: Vec<f64>,
}

/// Saved with every checkpoint and written as the final report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainState {
    pub algo: String,
    pub step: usize,
    pub total_steps: usize,
    pub seconds: f64,
    pub train_samples: usize,
    pub val_samples: usize,
    pub num_parameters: usize,
    pub history: Vec<EvalPoint>,
}
