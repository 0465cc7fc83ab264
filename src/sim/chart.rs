//! `--chart out.svg`: capacity, demand and admitted per lane over time, with
//! the level as a step line on the right axis. SVG only (no fonts needed:
//! text is written as SVG text elements).

use std::path::{Path, PathBuf};

use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;

use super::report::SimReport;

const LANE_COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Why a chart could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// plotters failed to draw.
    #[error(transparent)]
    Draw(#[from] DrawingAreaErrorKind<std::io::Error>),
    /// The SVG could not be written.
    #[error("{}: {source}", .path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Writes the chart of a report to `path`.
pub fn write_svg(r: &SimReport, path: &Path) -> Result<(), ChartError> {
    let mut svg = String::new();
    render_svg(r, &mut svg)?;
    std::fs::write(path, svg).map_err(|source| ChartError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Renders the chart of a report as SVG text.
pub fn render_svg(r: &SimReport, out: &mut String) -> Result<(), ChartError> {
    let n = r.profiles.len().max(1);
    let height = 520 * n as u32;
    {
        let root = SVGBackend::with_string(out, (1200, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let areas = root.split_evenly((n, 1));
        for (area, p) in areas.iter().zip(&r.profiles) {
            let dur = r.duration_seconds.max(1.0);
            let ymax = p
                .series
                .iter()
                .flat_map(|s| {
                    [
                        s.capacity_units_per_second,
                        s.demand_units_per_second,
                        s.served_units_per_second,
                    ]
                })
                .fold(1.0_f64, f64::max)
                * 1.1;
            let max_level = p.series.iter().map(|s| s.level).max().unwrap_or(0).max(
                p.level_timeline
                    .iter()
                    .map(|t| t.to.max(t.from))
                    .max()
                    .unwrap_or(0),
            );
            let title = format!(
                "{}/{}: {} under {} (seed {})",
                p.namespace, p.name, r.scenario, r.policy, r.seed
            );
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .right_y_label_area_size(50)
                .build_cartesian_2d(0f64..dur, 0f64..ymax)?
                .set_secondary_coord(0f64..dur, 0f64..(f64::from(max_level.max(1)) + 0.5));
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_desc("work units/s")
                .light_line_style(WHITE)
                .draw()?;
            chart
                .configure_secondary_axes()
                .y_desc("level")
                .y_labels(max_level.max(1) as usize + 1)
                .draw()?;
            let step = |f: &dyn Fn(&super::report::SeriesPoint) -> Option<f64>| {
                let mut pts = Vec::new();
                for (i, s) in p.series.iter().enumerate() {
                    let Some(v) = f(s) else { continue };
                    let x0 = s.at as f64;
                    let x1 = p.series.get(i + 1).map_or(dur, |n| n.at as f64);
                    pts.push((x0, v));
                    pts.push((x1, v));
                }
                pts
            };
            let cap = step(&|s| Some(s.capacity_units_per_second));
            chart
                .draw_series(LineSeries::new(cap, BLACK.stroke_width(3)))?
                .label("capacity")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3))
                });
            let dem = step(&|s| Some(s.demand_units_per_second));
            let grey = RGBColor(120, 120, 120);
            chart
                .draw_series(LineSeries::new(dem, grey.stroke_width(2)))?
                .label("demand (offered, all lanes)")
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2))
                });
            for (li, l) in p.lanes.iter().enumerate() {
                let color = LANE_COLORS[li % LANE_COLORS.len()];
                let served = step(&|s| s.lanes.get(li).map(|x| x.served));
                chart
                    .draw_series(LineSeries::new(served, color.stroke_width(2)))?
                    .label(format!("{} served", l.name))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                let allowed = step(&|s| s.lanes.get(li).and_then(|x| x.admitted));
                if !allowed.is_empty() {
                    chart.draw_series(DashedLineSeries::new(
                        allowed,
                        6,
                        4,
                        color.stroke_width(1),
                    ))?;
                }
            }
            if r.policy == "lanekeeper" {
                let lvl = step(&|s| Some(f64::from(s.level)));
                let purple = RGBColor(90, 0, 140);
                chart
                    .draw_secondary_series(LineSeries::new(lvl, purple.stroke_width(3)))?
                    .label("level (right axis)")
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], purple.stroke_width(3))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
    }
    Ok(())
}
