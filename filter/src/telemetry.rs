//! Envoy's log and stats as the filter's logic sees them: two small traits
//! the proxy glue implements with host calls and tests implement in memory,
//! and named metric sets (an enum per set, never a bare index). Depends on
//! nothing else in the crate.

use std::marker::PhantomData;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

pub trait Logger {
    fn log(&mut self, level: Level, message: &str);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// Envoy stats (`define_metric` & co).
pub trait MetricsSink {
    /// The metric's id, or `None` if the host refused to define it.
    fn define(&mut self, name: &str, kind: MetricKind) -> Option<u32>;
    fn add(&mut self, id: u32, delta: u64);
    fn set(&mut self, id: u32, value: u64);
}

/// Every metric name starts so; Envoy shows it as `wasmcustom.adaptive_hedge.*`.
pub const METRIC_PREFIX: &str = "adaptive_hedge";

/// A set of metrics, one enum variant each (see `metric_set!`).
pub trait Metric: Copy + 'static {
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
    fn kind(self) -> MetricKind;
    fn index(self) -> usize;
}

/// Declares an enum whose variants are metrics: `Variant = ("name", Counter)`.
macro_rules! metric_set {
    ($(#[$meta:meta])* $vis:vis enum $set:ident {
        $($(#[$vmeta:meta])* $variant:ident = ($name:literal, $kind:ident),)*
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $set {
            $($(#[$vmeta])* $variant,)*
        }

        impl $crate::telemetry::Metric for $set {
            const ALL: &'static [Self] = &[$($set::$variant,)*];
            fn name(self) -> &'static str {
                match self {
                    $($set::$variant => $name,)*
                }
            }
            fn kind(self) -> $crate::telemetry::MetricKind {
                match self {
                    $($set::$variant => $crate::telemetry::MetricKind::$kind,)*
                }
            }
            fn index(self) -> usize {
                self as usize
            }
        }
    };
}
pub(crate) use metric_set;

/// Counter deltas since the last flush and the ids the host gave the set's
/// metrics (defined on the first flush, retried on the next if refused).
#[derive(Debug)]
pub struct MetricTable<M: Metric> {
    deltas: Vec<u64>,
    ids: Option<Vec<u32>>,
    set: PhantomData<M>,
}

impl<M: Metric> Default for MetricTable<M> {
    fn default() -> Self {
        MetricTable {
            deltas: vec![0; M::ALL.len()],
            ids: None,
            set: PhantomData,
        }
    }
}

impl<M: Metric> MetricTable<M> {
    pub fn add(&mut self, metric: M, n: u64) {
        if let Some(d) = self.deltas.get_mut(metric.index()) {
            *d = d.saturating_add(n);
        }
    }

    /// Whether the metrics were defined (flushed once).
    pub fn defined(&self) -> bool {
        self.ids.is_some()
    }

    /// The delta not yet flushed.
    pub fn pending(&self, metric: M) -> u64 {
        self.deltas.get(metric.index()).copied().unwrap_or(0)
    }

    /// Pushes counter deltas, and each gauge `gauge` gives a value for, to
    /// the sink. Names: `adaptive_hedge.<metric>` or, with a `label`,
    /// `adaptive_hedge.<metric>.<label>` (the configs' `stats_tags` turn the
    /// suffix into an `envoy_cluster_name` label).
    pub fn flush(
        &mut self,
        sink: &mut dyn MetricsSink,
        label: Option<&str>,
        gauge: impl Fn(M) -> Option<u64>,
    ) {
        if self.ids.is_none() {
            self.ids = M::ALL
                .iter()
                .map(|m| {
                    let name = match label {
                        Some(l) => format!("{METRIC_PREFIX}.{}.{l}", m.name()),
                        None => format!("{METRIC_PREFIX}.{}", m.name()),
                    };
                    sink.define(&name, m.kind())
                })
                .collect();
        }
        let Some(ids) = &self.ids else { return };
        for ((metric, id), delta) in M::ALL.iter().zip(ids).zip(self.deltas.iter_mut()) {
            match metric.kind() {
                MetricKind::Counter if *delta > 0 => sink.add(*id, std::mem::take(delta)),
                MetricKind::Counter => {}
                MetricKind::Gauge => {
                    if let Some(value) = gauge(*metric) {
                        sink.set(*id, value);
                    }
                }
            }
        }
    }
}

/// In-memory log and stats for tests.
#[cfg(test)]
pub mod memory {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    pub struct Lines(pub Vec<String>);

    impl Logger for Lines {
        fn log(&mut self, _: Level, message: &str) {
            self.0.push(message.to_string());
        }
    }

    #[derive(Default)]
    pub struct Stats {
        pub names: Vec<String>,
        pub values: HashMap<u32, u64>,
        /// Refuse definitions while set (a host that says no).
        pub refuse: bool,
    }

    impl MetricsSink for Stats {
        fn define(&mut self, name: &str, _: MetricKind) -> Option<u32> {
            if self.refuse {
                return None;
            }
            if let Some(i) = self.names.iter().position(|n| n == name) {
                return Some(i as u32);
            }
            self.names.push(name.to_string());
            Some(self.names.len() as u32 - 1)
        }
        fn add(&mut self, id: u32, delta: u64) {
            *self.values.entry(id).or_default() += delta;
        }
        fn set(&mut self, id: u32, value: u64) {
            self.values.insert(id, value);
        }
    }

    impl Stats {
        /// A metric's value; `None` if it was never defined.
        pub fn get(&self, name: &str) -> Option<u64> {
            let id = self.names.iter().position(|n| n == name)? as u32;
            Some(self.values.get(&id).copied().unwrap_or(0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory::Stats;
    use super::*;

    metric_set! {
        enum Demo {
            Hits = ("hits_total", Counter),
            Level = ("level", Gauge),
        }
    }

    #[test]
    fn counters_flush_as_deltas_and_gauges_as_values() {
        let mut table = MetricTable::<Demo>::default();
        let mut sink = Stats::default();
        table.add(Demo::Hits, 3);
        assert_eq!(table.pending(Demo::Hits), 3);
        table.flush(&mut sink, Some("c"), |_| Some(7));
        table.add(Demo::Hits, 1);
        table.flush(&mut sink, Some("c"), |_| None);
        assert_eq!(sink.get("adaptive_hedge.hits_total.c"), Some(4));
        assert_eq!(sink.get("adaptive_hedge.level.c"), Some(7));
        assert_eq!(table.pending(Demo::Hits), 0);
    }

    #[test]
    fn a_refused_definition_keeps_the_deltas_for_the_next_flush() {
        let mut table = MetricTable::<Demo>::default();
        let mut sink = Stats {
            refuse: true,
            ..Default::default()
        };
        table.add(Demo::Hits, 2);
        table.flush(&mut sink, None, |_| None);
        assert_eq!(sink.get("adaptive_hedge.hits_total"), None);
        sink.refuse = false;
        table.flush(&mut sink, None, |_| None);
        assert_eq!(sink.get("adaptive_hedge.hits_total"), Some(2));
    }
}
