//! `--plot FILE.svg`: latency by percentile, the way HdrHistogram's plotter
//! draws it: the x axis is 1/(1-percentile) on a log scale, so 90%, 99%,
//! 99.9%, ... are evenly spaced and the tail gets the room it deserves.

use std::path::Path;

use plotters::prelude::*;

use super::histogram::Latency;

const SIZE_PX: (u32, u32) = (1000, 600);
const COLORS: [RGBColor; 3] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44)];
/// The x axis ends at 99.99999% at most.
const X_MAX: f64 = 1e7;

/// Draws each (name, histogram) as one line.
pub fn write_svg(path: &Path, title: &str, series: &[(&str, &Latency)]) -> Result<(), String> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> =
        series.iter().filter(|(_, h)| !h.is_empty()).map(|(name, h)| (*name, points(h))).collect();
    if lines.is_empty() {
        return Err("no latencies were recorded, nothing to plot".into());
    }
    let x_end =
        lines.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)).filter(|x| x.is_finite()).fold(100.0f64, f64::max);
    let x_end = 10f64.powf(x_end.log10().ceil()).min(X_MAX);
    let y_end = lines.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)).fold(0.0f64, f64::max).max(0.001) * 1.1;
    let fail = |e: DrawingAreaErrorKind<_>| e.to_string();
    let root = SVGBackend::new(path, SIZE_PX).into_drawing_area();
    root.fill(&WHITE).map_err(fail)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0..x_end).log_scale(), 0.0..y_end)
        .map_err(fail)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()
        .map_err(fail)?;
    for (index, (name, points)) in lines.into_iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let clipped: Vec<(f64, f64)> = points.into_iter().map(|(x, y)| (x.min(x_end), y)).collect();
        chart
            .draw_series(LineSeries::new(clipped, color.stroke_width(2)))
            .map_err(fail)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(fail)?;
    root.present().map_err(fail)?;
    Ok(())
}

/// (1/(1-quantile), latency ms); the 100% point lies at infinity and is
/// drawn at the right edge.
fn points(latency: &Latency) -> Vec<(f64, f64)> {
    latency
        .percentile_points()
        .into_iter()
        .map(|(quantile, micros)| {
            let x = if quantile < 1.0 { (1.0 / (1.0 - quantile)).min(X_MAX) } else { f64::INFINITY };
            (x, micros as f64 / 1000.0)
        })
        .collect()
}

/// Labels the powers of ten: 1 -> 0%, 10 -> 90%, 100 -> 99%, 1000 -> 99.9%.
fn percentile_label(x: f64) -> String {
    let exponent = x.log10();
    if (exponent - exponent.round()).abs() > 1e-6 {
        return String::new();
    }
    let nines = exponent.round() as usize;
    match nines {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        _ => format!("99.{}%", "9".repeat(nines - 2)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_axis_labels_count_nines() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(1e5), "99.999%");
        assert_eq!(percentile_label(20.0), "");
    }
}
