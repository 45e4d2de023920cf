//! Training P-EAGLE drafters (DESIGN.md section 5). So far: Conditional Drop-token (COD)
//! sampling, the flat multi-depth training layout with its attention rule, and its inputs.

pub mod cod;
pub mod layout;

pub use cod::{CodConfig, CodLayout, Element};
pub use layout::TrainingInputs;
