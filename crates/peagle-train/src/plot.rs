//! A PNG chart of per-depth validation accuracy over a training run.

use std::path::Path;

use peagle_plot::{line_chart, Chart, Series};

use crate::error::TrainError;
use crate::train_state::EvalPoint;

/// Draws one line per drafter depth (`depth 0` first) of `val_accuracy` against `step`.
pub fn accuracy_plot(history: &[EvalPoint], title: &str, path: &Path) -> Result<(), TrainError> {
    if history.is_empty() {
        return Err(TrainError::Plot(format!(
            "{}: no evaluation points to plot",
            path.display()
        )));
    }
    let depths = history.iter().map(|p| p.val_accuracy.len()).max().unwrap_or(0);
    let series: Vec<Series> = (0..depths)
        .map(|depth| Series {
            name: format!("depth {depth}"),
            points: history
                .iter()
                .filter_map(|p| Some((p.step as f64, *p.val_accuracy.get(depth)?)))
                .collect(),
        })
        .collect();
    let chart = Chart {
        title,
        x_desc: "step",
        y_desc: "validation accuracy",
        x_log: false,
        y_range: Some(0.0..1.0),
    };
    line_chart(path, &chart, &series).map_err(|e| TrainError::Plot(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: usize, val_accuracy: Vec<f64>) -> EvalPoint {
        EvalPoint {
            step,
            lr: 1e-4,
            train_loss: 1.0,
            val_loss: 1.0,
            val_accuracy,
        }
    }

    #[test]
    fn writes_a_900_by_560_png() {
        let history = [
            point(0, vec![0.10, 0.05, 0.02, 0.01]),
            point(500, vec![0.55, 0.40, 0.30, 0.20]),
            point(1000, vec![0.70, 0.55, 0.42, 0.33]),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("accuracy.png");
        accuracy_plot(&history, "test run", &path).unwrap();

        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let image = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).unwrap();
        assert_eq!((image.width(), image.height()), peagle_plot::SIZE);
    }

    #[test]
    fn empty_history_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("accuracy.png");
        let err = accuracy_plot(&[], "empty", &path).unwrap_err();
        assert!(err.to_string().contains("no evaluation points"), "{err}");
        assert!(!path.exists());
    }
}
