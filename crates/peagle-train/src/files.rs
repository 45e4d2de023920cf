//! File writes that an interruption cannot leave half done, and JSON in and out.

use crate::error::TrainError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Runs `write` on a temporary file next to `path`, then renames it over `path`: an
/// interrupted capture or training run never leaves a truncated file behind.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<(), TrainError>) -> Result<(), TrainError> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = Path::new(&partial);
    write(partial)?;
    std::fs::rename(partial, path).map_err(|e| TrainError::io(path, e))
}

/// Pretty JSON with a final newline, written atomically.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), TrainError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| TrainError::io(path, e))? + "\n";
    write_atomically(path, |partial| {
        std::fs::write(partial, text).map_err(|e| TrainError::io(path, e))
    })
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| TrainError::data(path, e.to_string()))
}
