//! Plots of a comparison as SVG text (with `plotters`): one line per system against
//! the shape var (DietCode Fig. 10/12) and bars of tuning time per system (Fig. 9).
//! Writing them is the report's (`out.rs`).
//!
//! Text needs a TrueType font: the first of [`FONTS`] that exists is registered once
//! (Debian's `fonts-dejavu-core`, which `scripts/setup.sh` installs).
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::sync::OnceLock;

/// Where a sans-serif TrueType font is looked for, in order.
pub const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Why a plot was not drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No font to draw text with.
    #[error("no TrueType font for the plots (looked for {0}; install fonts-dejavu-core)")]
    NoFont(String),
    /// Nothing to draw.
    #[error("nothing to plot: {0}")]
    Empty(String),
    /// The drawing backend failed.
    #[error("drawing {title}: {message}")]
    Draw {
        /// The plot's title.
        title: String,
        /// The backend's error.
        message: String,
    },
}

/// One system's points `(x, y)`.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in any order (sorted by x for drawing).
    pub points: Vec<(f64, f64)>,
}

/// Register the font once per process.
fn font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        for path in FONTS {
            if let Ok(bytes) = std::fs::read(path) {
                // Plotters keeps fonts for the whole process: leak the bytes once.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(FONTS.join(", "))
    })
    .clone()
    .map_err(PlotError::NoFont)
}

fn draw_err(title: &str) -> impl Fn(String) -> PlotError + '_ {
    move |message| PlotError::Draw {
        title: title.to_string(),
        message,
    }
}

/// A line plot of `series` against x, as SVG; with `log_y` a logarithmic y axis where
/// the values span a decade or more (plotters labels only powers of ten on a log
/// axis), else a linear one around them; the y description says which.
pub fn lines_svg(
    title: &str,
    (x_label, y_label): (&str, &str),
    log_y: bool,
    series: &[Series],
) -> Result<String, PlotError> {
    font()?;
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all().filter(|p| p.1.is_finite() && (!log_y || p.1 > 0.0)) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return Err(PlotError::Empty(title.into()));
    }
    let zoom = log_y && y1 < 10.0 * y0;
    let log_y = log_y && !zoom;
    let y_label = &format!("{y_label}{}", if log_y { " (log scale)" } else { "" });
    let err = draw_err(title);
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    let x_range = x0..x1.max(x0 + 1.0);
    let colour = |i: usize| Palette99::pick(i).to_rgba();
    // The two axis kinds have different types: one drawing routine for both.
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(|e| err(e.to_string()))?;
            for (i, s) in series.iter().enumerate() {
                let mut pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|p| p.1.is_finite() && (!log_y || p.1 > 0.0))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let c = colour(i);
                let style = ShapeStyle::from(c).stroke_width(2);
                let line = if pts.len() > 1 {
                    chart.draw_series(LineSeries::new(pts, style))
                } else {
                    chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))
                };
                line.map_err(|e| err(e.to_string()))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 18, y)], ShapeStyle::from(c).stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| err(e.to_string()))?;
        }};
    }
    if log_y {
        let c = builder
            .build_cartesian_2d(x_range, (y0 * 0.8..y1 * 1.25).log_scale())
            .map_err(|e| err(e.to_string()))?;
        draw!(c);
    } else {
        let bottom = if zoom { y0 * 0.95 } else { 0.0 };
        let c = builder
            .build_cartesian_2d(x_range, bottom..y1 * 1.1)
            .map_err(|e| err(e.to_string()))?;
        draw!(c);
    }
    root.present().map_err(|e| err(e.to_string()))?;
    drop(root);
    Ok(svg)
}

/// A bar per `(label, value)`, e.g. tuning seconds per system, as SVG.
pub fn bars_svg(title: &str, y_label: &str, bars: &[(String, f64)]) -> Result<String, PlotError> {
    font()?;
    let top = bars.iter().map(|b| b.1).fold(0.0, f64::max);
    if bars.is_empty() || top <= 0.0 {
        return Err(PlotError::Empty(title.into()));
    }
    let err = draw_err(title);
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (720, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // A discrete range includes its end: `0..n - 1` holds the n bars (one bar gets
        // an empty slot beside it, or it would have no width).
        .build_cartesian_2d((0..n.max(2) - 1).into_segmented(), 0.0..top * 1.15)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_labels(n)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => bars.get(*i).map_or(String::new(), |b| b.0.clone()),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let style = Palette99::pick(i).filled();
            Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), *v),
                ],
                style,
            )
        }))
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            Text::new(
                format!("{v:.0} s"),
                (SegmentValue::CenterOf(i), v + top * 0.03),
                ("sans-serif", 14),
            )
        }))
        .map_err(|e| err(e.to_string()))?;
    drop(chart);
    root.present().map_err(|e| err(e.to_string()))?;
    drop(root);
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_svg_or_says_why_not() {
        let series = vec![
            Series {
                name: "a".into(),
                points: vec![(1.0, 2.0), (3.0, 1.0), (2.0, 4.0)],
            },
            Series {
                name: "b".into(),
                points: vec![(2.0, 3.0)],
            },
        ];
        let first = match lines_svg("t", ("T", "ms"), true, &series) {
            Err(PlotError::NoFont(f)) => {
                eprintln!("skipping: no font ({f})");
                return;
            }
            r => r.unwrap(),
        };
        let svgs = [
            first,
            lines_svg("t", ("T", "GFLOP/s"), false, &series).unwrap(),
            bars_svg("tuning", "s", &[("x".into(), 3.0), ("y".into(), 9.0)]).unwrap(),
            bars_svg("one", "s", &[("x".into(), 3.0)]).unwrap(),
        ];
        for svg in svgs {
            assert!(svg.starts_with("<svg") && svg.contains("<text"), "{svg}");
        }
        assert!(matches!(
            lines_svg("t", ("T", "ms"), true, &[]),
            Err(PlotError::Empty(_))
        ));
        // A log axis only where the values span a decade (plotters labels only powers
        // of ten on one): a narrower span gets a linear axis with its values labelled.
        let within = |lo: f64, hi: f64| {
            let s = Series {
                name: "s".into(),
                points: vec![(1.0, lo), (2.0, hi)],
            };
            lines_svg("t", ("T", "ms"), true, &[s]).unwrap()
        };
        let narrow = within(40.0, 50.0);
        assert!(
            !narrow.contains("log scale") && narrow.contains("\n46.0\n"),
            "{narrow}"
        );
        assert!(within(1.0, 100.0).contains("ms (log scale)"));
        assert!(matches!(bars_svg("t", "s", &[]), Err(PlotError::Empty(_))));
    }
}
