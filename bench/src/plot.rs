//! A small SVG line chart, for results where a curve says more than a
//! number (how per-Cluster cost moves as the fleet grows). One chart holds
//! series of the same unit; the x axis is logarithmic when the values span a
//! decade or more, as fleet sizes do.

use std::fmt::Write as _;

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart: a title, axis labels and its series.
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" upper bound for the y axis: 1, 2 or 5 times a power of ten.
fn nice_max(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * magnitude)
}

impl Chart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .filter(|x| x.is_finite())
            .collect();
        let ys = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|y| y.is_finite());
        let (x_min, x_max) = xs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(*x), hi.max(*x))
            });
        let (x_min, x_max) = if x_min < x_max {
            (x_min, x_max)
        } else {
            (x_min - 1.0, x_min + 1.0)
        };
        let log = x_min > 0.0 && x_max / x_min >= 10.0;
        let fx = |x: f64| if log { x.log10() } else { x };
        let y_max = nice_max(ys.fold(0.0, f64::max));
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let px = |x: f64| LEFT + (fx(x) - fx(x_min)) / (fx(x_max) - fx(x_min)) * plot_w;
        let py = |y: f64| TOP + plot_h - y / y_max * plot_h;

        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="14" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            escape(&self.title)
        );
        // Axes, y grid with five steps, one x tick per distinct x.
        for i in 0..=5 {
            let y = y_max * f64::from(i) / 5.0;
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                LEFT - 6.0,
                py(y) + 4.0,
                format_number(y),
                py = py(y),
            );
        }
        let mut ticks = xs.clone();
        ticks.sort_by(f64::total_cmp);
        ticks.dedup();
        for x in ticks {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                px(x),
                TOP + plot_h + 18.0,
                format_number(x)
            );
        }
        let _ = writeln!(
            out,
            r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="black"/><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="black"/>"#,
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h,
            TOP + plot_h
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 12.0,
            escape(&self.x_label),
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path = points
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                out,
                r#"<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>"#
            );
            for (x, y) in &points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}: {}</title></circle>"#,
                    px(*x),
                    py(*y),
                    format_number(*x),
                    format_number(*y)
                );
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let _ = writeln!(
                out,
                r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
                LEFT + plot_w + 12.0,
                LEFT + plot_w + 32.0,
                LEFT + plot_w + 38.0,
                ly + 4.0,
                escape(&s.label)
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

/// A number as an axis shows it: no more digits than it needs.
fn format_number(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_bounds() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(0.7), 1.0);
        assert_eq!(nice_max(1.3), 2.0);
        assert_eq!(nice_max(42.0), 50.0);
        assert_eq!(nice_max(100.0), 100.0);
    }

    #[test]
    fn every_point_is_drawn_inside_the_plot() {
        let chart = Chart {
            title: "cost <per> Cluster".into(),
            x_label: "Clusters".into(),
            y_label: "ms".into(),
            series: vec![Series {
                label: "CPU".into(),
                points: vec![(10.0, 5.0), (300.0, 4.0), (100.0, 4.5)],
            }],
        };
        let svg = chart.svg();
        assert!(svg.contains("cost &lt;per&gt; Cluster"));
        assert_eq!(svg.matches("<circle").count(), 3);
        for circle in svg.split("<circle").skip(1) {
            let attr = |name: &str| -> f64 {
                let rest = &circle[circle.find(&format!("{name}=\"")).unwrap() + name.len() + 2..];
                rest[..rest.find('"').unwrap()].parse().unwrap()
            };
            assert!((LEFT..=WIDTH - RIGHT).contains(&attr("cx")));
            assert!((TOP..=HEIGHT - BOTTOM).contains(&attr("cy")));
        }
        // Log scale: 100 sits two thirds of the way from 10 to 300 or so.
        assert!(svg.contains(">100</text>"));
    }
}
