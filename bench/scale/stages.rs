//! The operator's part of the status lag, stage by stage, from its own histograms over the
//! steady load: from an etcd change to the start of the reconciliation that reads it
//! (`podlock_operator_status_trigger_seconds`), and from a status offered to the start of its
//! PATCH (`podlock_operator_status_wait_seconds`). The PATCH itself is the API server's row.

/// The stages, by metric name.
pub const STAGES: [&str; 2] = [
    "podlock_operator_status_trigger_seconds",
    "podlock_operator_status_wait_seconds",
];

/// One histogram as scraped: cumulative buckets (upper bound, count), sum and count.
pub struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    /// The histogram `name` of a Prometheus text scrape (empty if absent).
    pub fn parse(metrics: &str, name: &str) -> Histogram {
        let value = |l: &str| l.split_whitespace().last()?.parse::<f64>().ok();
        let bucket = format!("{name}_bucket{{le=\"");
        let buckets = (metrics.lines())
            .filter_map(|l| {
                let (le, _) = l.strip_prefix(&bucket)?.split_once('"')?;
                Some((le.parse().unwrap_or(f64::INFINITY), value(l)?))
            })
            .collect();
        let series = |suffix: &str| {
            let prefix = format!("{name}_{suffix} ");
            (metrics.lines()).find(|l| l.starts_with(&prefix)).and_then(value)
        };
        Histogram {
            buckets,
            sum: series("sum").unwrap_or(0.0),
            count: series("count").unwrap_or(0.0),
        }
    }

    /// What was observed since `before`.
    pub fn since(&self, before: &Histogram) -> Histogram {
        let earlier = |le: f64| {
            let b = before.buckets.iter().find(|(l, _)| *l == le);
            b.map_or(0.0, |(_, c)| *c)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, c - earlier(*le)))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// "mean 35 ms, p99 ≤ 250 ms": the p99 as the bucket bound it falls under.
    pub fn describe(&self) -> String {
        let mean = 1000.0 * self.sum / self.count.max(1.0);
        let p99 = (self.buckets.iter()).find(|(_, c)| *c >= 0.99 * self.count);
        match p99 {
            Some((le, _)) if le.is_finite() => format!("mean {mean:.0} ms, p99 ≤ {:.0} ms", 1000.0 * le),
            _ => format!("mean {mean:.0} ms, p99 above every bucket"),
        }
    }
}
