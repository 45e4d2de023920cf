//! Line charts as PNG files: training curves (`peagle-train`) and benchmark comparisons
//! (`peagle-bench`). The font is embedded, so a chart renders the same on a bare machine.

use plotters::prelude::*;
use std::error::Error;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;
use thiserror::Error;

/// Width and height of every chart, in pixels.
pub const SIZE: (u32, u32) = (900, 560);

#[derive(Debug, Error)]
#[error("{path}: {reason}")]
pub struct PlotError {
    pub path: String,
    pub reason: String,
}

/// One named line.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Titles and axes of a chart.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    /// Space the x values by their logarithm (concurrency 1, 4, 16), labelled with the values.
    pub x_log: bool,
    /// None: from 0 to a little above the largest value.
    pub y_range: Option<Range<f64>>,
}

/// Draws `series` as lines with a marker at each point, and a legend.
pub fn line_chart(path: &Path, chart: &Chart, series: &[Series]) -> Result<(), PlotError> {
    let error = |reason: String| PlotError {
        path: path.display().to_string(),
        reason,
    };
    if series.iter().all(|s| s.points.is_empty()) {
        return Err(error("no points to plot".into()));
    }
    register_font().map_err(error)?;
    draw(path, chart, series).map_err(|e| error(e.to_string()))
}

/// With the `ab_glyph` backend plotters knows no fonts at all (it never looks at the system's):
/// text needs the embedded font registered under the family plotters asks for by default.
fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR).is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| "the embedded font failed to load".into())
}

fn draw(path: &Path, chart: &Chart, series: &[Series]) -> Result<(), Box<dyn Error>> {
    let to_x = |x: f64| if chart.x_log { x.log2() } else { x };
    let points = || series.iter().flat_map(|s| s.points.iter().copied());
    let (x_min, x_max) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| {
        (lo.min(to_x(x)), hi.max(to_x(x)))
    });
    // A single x value would otherwise give an empty range.
    let pad = ((x_max - x_min) * 0.05).max(0.5);
    let y_range = chart.y_range.clone().unwrap_or_else(|| {
        let top = points().map(|(_, y)| y).filter(|y| y.is_finite()).fold(0.0, f64::max);
        0.0..(top * 1.1).max(1e-9)
    });

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut plot = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((x_min - pad)..(x_max + pad), y_range)?;
    let x_label = |x: &f64| {
        let value = if chart.x_log { x.exp2() } else { *x };
        format!("{}", (value * 100.0).round() / 100.0)
    };
    // On a log axis, one label per power of two (1, 2, 4, ...): the values a sweep uses.
    let x_labels = if chart.x_log {
        (x_max - x_min).ceil() as usize + 1
    } else {
        10
    };
    plot.configure_mesh()
        .x_labels(x_labels)
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .x_label_formatter(&x_label)
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 13))
        .draw()?;

    for (i, s) in series.iter().enumerate() {
        let style = Palette99::pick(i).stroke_width(2);
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(_, y)| y.is_finite())
            .map(|(x, y)| (to_x(*x), *y))
            .collect();
        // Markers show where the measurements are, and keep a one-point series visible.
        plot.draw_series(line.iter().map(|p| Circle::new(*p, 3, style.filled())))?;
        plot.draw_series(LineSeries::new(line, style))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    plot.configure_series_labels()
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

    fn chart(x_log: bool) -> Chart<'static> {
        Chart {
            title: "test",
            x_desc: "x",
            y_desc: "y",
            x_log,
            y_range: None,
        }
    }

    #[test]
    fn writes_a_png_of_the_chart_size() {
        let series = [
            Series {
                name: "a".into(),
                points: vec![(1.0, 300.0), (4.0, 700.0), (16.0, 900.0)],
            },
            Series {
                name: "b".into(),
                points: vec![(1.0, 450.0)],
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        for x_log in [false, true] {
            let path = dir.path().join(format!("chart-{x_log}.png"));
            line_chart(&path, &chart(x_log), &series).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let image = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).unwrap();
            assert_eq!((image.width(), image.height()), SIZE);
        }
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.png");
        let err = line_chart(&path, &chart(false), &[]).unwrap_err();
        assert!(err.to_string().contains("no points"), "{err}");
        assert!(!path.exists());
    }
}
