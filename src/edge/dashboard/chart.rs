//! The operator page's chart: durations counted into fixed buckets and drawn as an inline SVG
//! histogram (stacked bars, totals, round axis ticks, a legend). Pure: counts in, markup out.

use maud::{Markup, html};

/// The chart's buckets: label and exclusive upper bound in seconds.
pub const BUCKETS: [(&str, f64); 6] = [
    ("<1s", 1.0),
    ("1-5s", 5.0),
    ("5-30s", 30.0),
    ("30s-5m", 300.0),
    ("5m-1h", 3600.0),
    (">1h", f64::INFINITY),
];

/// The bucket (index into [`BUCKETS`]) of a duration in seconds. Negative durations (clock
/// rounding) count as the shortest.
pub fn bucket(seconds: f64) -> usize {
    BUCKETS
        .iter()
        .position(|(_, upper)| seconds < *upper)
        .unwrap_or(BUCKETS.len() - 1)
}

/// Counts durations (seconds) per bucket.
pub fn histogram(seconds: impl IntoIterator<Item = f64>) -> [u64; 6] {
    let mut counts = [0u64; 6];
    for s in seconds {
        counts[bucket(s)] += 1;
    }
    counts
}

/// One stacked series of a histogram.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    /// Legend text.
    pub name: &'a str,
    /// Fill colour (`#rrggbb`).
    pub color: &'a str,
    /// Count per bucket of [`BUCKETS`].
    pub counts: [u64; 6],
}

/// A round step for an axis going up to `max` in about four steps (1, 2 or 5 × 10ⁿ).
pub(super) fn nice_step(max: u64) -> u64 {
    let rough = (max as f64 / 4.0).max(1.0);
    let mut pow = 1u64;
    while (pow as f64) * 10.0 <= rough {
        pow *= 10;
    }
    [1, 2, 5, 10]
        .into_iter()
        .map(|m| m * pow)
        .find(|s| *s as f64 >= rough)
        .unwrap_or(10 * pow)
}

/// A coordinate with one decimal, as SVG attributes take it.
fn at(v: f64) -> String {
    format!("{v:.1}")
}

const W: f64 = 600.0;
const H: f64 = 280.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 50.0;

/// A histogram over [`BUCKETS`] as an inline SVG: stacked bars, the total above each bar,
/// bucket labels under the x axis, a y axis with round ticks, and a legend.
///
/// Every SVG element is written with a closing tag: inside `<svg>` an HTML parser does not
/// close `<rect>` by itself, so a bare `<rect>` would swallow the elements after it.
pub fn histogram_svg(aria_label: &str, x_title: &str, series: &[Series<'_>]) -> Markup {
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let totals: Vec<u64> = (0..BUCKETS.len())
        .map(|i| series.iter().map(|s| s.counts[i]).sum())
        .collect();
    let max = totals.iter().copied().max().unwrap_or(0);
    let step = nice_step(max);
    let top = (max.div_ceil(step)).max(1) * step;
    let y = |v: f64| TOP + plot_h - v / top as f64 * plot_h;
    // Legend entries sit side by side, each as wide as its text.
    let mut legend = Vec::new();
    let mut lx = LEFT;
    for s in series {
        legend.push((lx, s));
        lx += 17.0 + 7.6 * s.name.chars().count() as f64 + 22.0;
    }
    let ticks: Vec<u64> = (0..=top / step).map(|k| k * step).collect();
    let slot = plot_w / BUCKETS.len() as f64;
    let bw = slot * 0.62;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (W) " " (H) } role="img"
            aria-label=(aria_label) font-size="13" fill="#374151" {
            @for (lx, s) in legend {
                rect x=(lx) y="10" width="12" height="12" rx="2" fill=(s.color) {}
                text x=(lx + 17.0) y="20.5" { (s.name) }
            }
            @for t in ticks {
                @let yy = y(t as f64);
                line x1=(LEFT) x2=(W - RIGHT) y1=(at(yy)) y2=(at(yy))
                    stroke=(if t == 0 { "#9ca3af" } else { "#e5e7eb" }) {}
                text x=(LEFT - 8.0) y=(at(yy + 4.5)) text-anchor="end" fill="#6b7280" { (t) }
            }
            @for (i, &(label, _)) in BUCKETS.iter().enumerate() {
                @let x = LEFT + i as f64 * slot + (slot - bw) / 2.0;
                @for (s, base) in stacked(series, i) {
                    @let n = s.counts[i];
                    @let (y0, y1) = (y(base as f64), y((base + n) as f64));
                    rect x=(at(x)) y=(at(y1)) width=(at(bw)) height=(at((y0 - y1).max(0.5)))
                        fill=(s.color) {
                        title { (s.name) ": " (n) " (" (label) ")" }
                    }
                }
                @let cx = x + bw / 2.0;
                text x=(at(cx)) y=(at(y(totals[i] as f64) - 6.0)) text-anchor="middle"
                    font-weight="700" fill=(if totals[i] == 0 { "#9ca3af" } else { "#111827" }) {
                    (totals[i])
                }
                text x=(at(cx)) y=(at(TOP + plot_h + 19.0)) text-anchor="middle" { (label) }
            }
            text x=(at(LEFT + plot_w / 2.0)) y=(at(H - 8.0)) text-anchor="middle" fill="#6b7280" {
                (x_title)
            }
        }
    }
}

/// The series with a bar in bucket `i`, each with the count stacked below it.
fn stacked<'s, 'a>(series: &'s [Series<'a>], i: usize) -> Vec<(&'s Series<'a>, u64)> {
    let mut base = 0;
    let mut out = Vec::new();
    for s in series.iter().filter(|s| s.counts[i] > 0) {
        out.push((s, base));
        base += s.counts[i];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::dashboard::escape;

    #[test]
    fn buckets_split_at_their_bounds() {
        assert_eq!(bucket(-0.01), 0);
        assert_eq!(bucket(0.999), 0);
        assert_eq!(bucket(1.0), 1);
        assert_eq!(bucket(4.99), 1);
        assert_eq!(bucket(5.0), 2);
        assert_eq!(bucket(30.0), 3);
        assert_eq!(bucket(299.0), 3);
        assert_eq!(bucket(300.0), 4);
        assert_eq!(bucket(3600.0), 5);
        assert_eq!(bucket(1e12), 5);
        assert_eq!(histogram([0.1, 0.2, 2.0, 40.0, 9000.0]), [2, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn the_chart_labels_buckets_and_counts() {
        let svg = histogram_svg(
            "x",
            "receive → complete",
            &[Series {
                name: "completed",
                color: "#0f766e",
                counts: [12, 3, 0, 1, 0, 0],
            }],
        )
        .into_string();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        for (label, _) in BUCKETS {
            assert!(
                svg.contains(&format!(">{}</text>", escape(label))),
                "{label}"
            );
        }
        assert!(svg.contains(">12</text>") && svg.contains(">3</text>"));
        assert!(svg.contains("receive → complete"));
        assert_eq!(svg.matches("<rect").count(), 1 + 3, "legend and three bars");
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(0), 1);
        assert_eq!(nice_step(3), 1);
        assert_eq!(nice_step(12), 5);
        assert_eq!(nice_step(40), 10);
        assert_eq!(nice_step(1234), 500);
    }
}
