//! Several capture directories read as one dataset: `fit --data A --data B` trains on the
//! samples of both, such as captures made in parallel over shards of one prompt file.

use crate::capture::{sample_path, DataConfig, DATA_CONFIG, TOKEN_FREQ};
use crate::error::TrainError;
use crate::files::read_json;
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};

pub struct TrainingData {
    dirs: Vec<PathBuf>,
    /// The first dataset-wide sample index of each directory, and the total at the end.
    starts: Vec<usize>,
    /// The directories' configs merged: their totals summed.
    pub config: DataConfig,
    /// Summed frequencies of the learned tokens, indexed by target token id.
    pub counts: Vec<i64>,
}

impl TrainingData {
    /// Opens the directories in order; they must come from the same target and layers.
    pub fn open(dirs: &[PathBuf]) -> Result<Self, TrainError> {
        let Some(first) = dirs.first() else {
            return Err(TrainError::Invalid("no capture directory given".into()));
        };
        let mut config: DataConfig = read_json(&first.join(DATA_CONFIG))?;
        let mut counts = read_counts(&first.join(TOKEN_FREQ))?;
        let mut starts = vec![0, config.num_samples];
        for dir in &dirs[1..] {
            let other: DataConfig = read_json(&dir.join(DATA_CONFIG))?;
            config.source.check_same(&other.source, dir)?;
            let freq_path = dir.join(TOKEN_FREQ);
            let more = read_counts(&freq_path)?;
            if more.len() != counts.len() {
                return Err(TrainError::data(&freq_path, "token counts of another vocabulary size"));
            }
            counts.iter_mut().zip(more).for_each(|(c, m)| *c += m);
            config.num_samples += other.num_samples;
            config.num_tokens += other.num_tokens;
            config.num_loss_tokens += other.num_loss_tokens;
            starts.push(config.num_samples);
        }
        Ok(Self {
            dirs: dirs.to_vec(),
            starts,
            config,
            counts,
        })
    }

    /// The file of sample `index` of the whole dataset.
    pub fn sample_path(&self, index: usize) -> PathBuf {
        let dir = self.starts.partition_point(|s| *s <= index) - 1;
        sample_path(&self.dirs[dir], index - self.starts[dir])
    }

    /// The directories, for messages.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        names.join(", ")
    }
}

fn read_counts(path: &Path) -> Result<Vec<i64>, TrainError> {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| TrainError::io(path, e))?;
    let counts = tensors
        .get("counts")
        .ok_or_else(|| TrainError::data(path, "no `counts` tensor"))?;
    Ok(counts.to_dtype(DType::I64)?.to_vec1()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::CaptureSource;
    use crate::files::write_json;
    use candle_core::Tensor;
    use std::collections::HashMap;

    fn capture_dir(root: &Path, name: &str, samples: usize, counts: Vec<i64>, layers: Vec<usize>) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let config = DataConfig {
            source: CaptureSource {
                target: "models/t".into(),
                aux_layer_ids: layers,
                target_hidden_size: 8,
                vocab_size: counts.len(),
            },
            num_samples: samples,
            num_tokens: 10 * samples,
            num_loss_tokens: 5 * samples,
        };
        write_json(&dir.join(DATA_CONFIG), &config).unwrap();
        let n = counts.len();
        let freq = Tensor::from_vec(counts, n, &Device::Cpu).unwrap();
        candle_core::safetensors::save(&HashMap::from([("counts", freq)]), dir.join(TOKEN_FREQ)).unwrap();
        dir
    }

    #[test]
    fn directories_concatenate_in_order_and_sum_their_totals() {
        let root = tempfile::tempdir().unwrap();
        let a = capture_dir(root.path(), "a", 3, vec![1, 0, 2], vec![0, 1]);
        let b = capture_dir(root.path(), "b", 2, vec![0, 5, 1], vec![0, 1]);
        let data = TrainingData::open(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(data.config.num_samples, 5);
        assert_eq!(data.config.num_tokens, 50);
        assert_eq!(data.config.num_loss_tokens, 25);
        assert_eq!(data.counts, [1, 5, 3]);
        assert_eq!(data.sample_path(2), sample_path(&a, 2));
        assert_eq!(data.sample_path(3), sample_path(&b, 0));
        assert_eq!(data.sample_path(4), sample_path(&b, 1));
    }

    #[test]
    fn captures_of_other_layers_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let a = capture_dir(root.path(), "a", 3, vec![1, 0, 2], vec![0, 1]);
        let b = capture_dir(root.path(), "b", 2, vec![0, 5, 1], vec![0, 2]);
        let err = TrainingData::open(&[a, b]).err().unwrap().to_string();
        assert!(err.contains("layers [0, 2]") && err.contains("layers [0, 1]"), "{err}");
    }
}
