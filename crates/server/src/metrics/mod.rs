//! Metrics for Prometheus, served over HTTP (`baton serve --metrics-listen`).
//!
//! The hot path only adds to atomics: counters per operation and result,
//! and fixed-bucket histograms (`Histogram`). A scrape reads them and the
//! state's sizes and encodes everything with `prometheus-client`, in the
//! OpenMetrics text format that Prometheus reads.
//!
//! - `instruments.rs`: what the hot path adds to (depends on nothing);
//! - `scrape.rs`: reads and encodes everything at a scrape;
//! - `http.rs`: serves the scrape over HTTP.

mod http;
mod instruments;
mod scrape;

pub use http::serve;
pub(crate) use instruments::Metrics;
pub use scrape::render;
