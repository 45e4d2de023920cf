use crate::BenchError;
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
struct Line {
    prompt: String,
}

/// The first `n` prompts of a JSONL file of `{"prompt": ...}` lines, cycling when it has fewer.
pub fn load_prompts(path: &Path, n: usize) -> Result<Vec<String>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::DatasetIo {
        path: path.to_path_buf(),
        source,
    })?;
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let parsed: Line = serde_json::from_str(line).map_err(|e| BenchError::DatasetLine {
            path: path.to_path_buf(),
            line: index + 1,
            reason: e.to_string(),
        })?;
        prompts.push(parsed.prompt);
    }
    if prompts.is_empty() {
        return Err(BenchError::EmptyDataset {
            path: path.to_path_buf(),
        });
    }
    Ok(prompts.into_iter().cycle().take(n).collect())
}
