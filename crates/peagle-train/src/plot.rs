//! A PNG chart of per-depth validation accuracy over a training run.

use std::error::Error;
use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::error::TrainError;
use crate::trainer::EvalPoint;

const SIZE: (u32, u32) = (900, 560);

/// Draws one line per drafter depth (`depth 0` first) of `val_accuracy` against `step`.
pub fn accuracy_plot(history: &[EvalPoint], title: &str, path: &Path) -> Result<(), TrainError> {
    if history.is_empty() {
        return Err(TrainError::Plot(format!(
            "{}: no evaluation points to plot",
            path.display()
        )));
    }
    register_font()?;
    draw(history, title, path).map_err(|e| TrainError::Plot(format!("{}: {e}", path.display())))
}

/// With the `ab_glyph` backend plotters knows no fonts at all (it never looks at the system's,
/// so plots render the same on a bare machine): text needs the embedded font registered under
/// the family plotters asks for by default.
fn register_font() -> Result<(), TrainError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(TrainError::Plot("the embedded font failed to load".into()))
    }
}

fn draw(history: &[EvalPoint], title: &str, path: &Path) -> Result<(), Box<dyn Error>> {
    let first = history[0].step;
    let last = history.iter().map(|p| p.step).max().unwrap_or(first);
    let depths = history.iter().map(|p| p.val_accuracy.len()).max().unwrap_or(0);

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        // A single evaluation would otherwise give an empty x range.
        .build_cartesian_2d(first..last.max(first + 1), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("validation accuracy")
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 13))
        .draw()?;

    for depth in 0..depths {
        let style = Palette99::pick(depth).stroke_width(2);
        let points = history
            .iter()
            .filter_map(|p| Some((p.step, *p.val_accuracy.get(depth)?)))
            .filter(|(_, acc)| acc.is_finite());
        // Markers show where the evaluations were, and keep a one-point history visible.
        chart.draw_series(points.clone().map(|p| Circle::new(p, 3, style.filled())))?;
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(format!("depth {depth}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    // Accuracy starts low, so the upper left is the corner least likely to hide a line.
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
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
        assert_eq!((image.width(), image.height()), SIZE);
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
