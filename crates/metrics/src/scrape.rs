//! One scrape: the registry encoded in the format the scraper asked for.
//!
//! OpenMetrics 1.0 is the default and what Prometheus asks for first; the Prometheus text format
//! (0.0.4) is served when the `Accept` header prefers it (`promtool`, older scrapers, `curl -H`).
//!
//! The reference names a few counters without the `_total` suffix (`sandbox_pause_responses`,
//! …): its Go client writes them as named in the Prometheus text format, and with `_total` in
//! OpenMetrics, which requires the suffix. [`REFERENCE_PLAIN_COUNTERS`] lists them, and the
//! Prometheus text encoding here writes them as the reference does.

use prometheus_client::registry::Registry;

/// The `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The reference's counters whose names do not end in `_total`.
pub const REFERENCE_PLAIN_COUNTERS: &[&str] = &[
    "sandbox_pause_responses",
    "sandbox_resume_responses",
    "sandbox_delete_responses",
    "sandbox_recycle_responses",
    "sandbox_claim_creation_responses",
];

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    PrometheusText,
}

impl Format {
    /// The format an `Accept` header prefers (by `q`, the first on a tie), OpenMetrics when it
    /// names neither or is absent.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let mut best: Option<(f32, Format)> = None;
        for range in accept.unwrap_or_default().split(',') {
            let mut parts = range.split(';').map(str::trim);
            let format = match parts.next().unwrap_or_default() {
                "application/openmetrics-text" => Format::OpenMetrics,
                "text/plain" => Format::PrometheusText,
                _ => continue,
            };
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            if best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::OpenMetrics, |(_, f)| f)
    }

    /// The `Content-Type` of a scrape in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS,
            Format::PrometheusText => PROMETHEUS_TEXT,
        }
    }
}

/// `registry` encoded as `format`.
///
/// # Errors
///
/// When a collector fails to encode (a formatting error).
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut text = String::with_capacity(64 * 1024);
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry)?,
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?;
            text = plain_counter_names(&text);
        }
    }
    Ok(text)
}

/// `text` (Prometheus text format) with the `_total` of [`REFERENCE_PLAIN_COUNTERS`] removed.
fn plain_counter_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (prefix, rest) = match line.strip_prefix("# HELP ") {
            Some(rest) => ("# HELP ", rest),
            None => match line.strip_prefix("# TYPE ") {
                Some(rest) => ("# TYPE ", rest),
                None => ("", line),
            },
        };
        let renamed = REFERENCE_PLAIN_COUNTERS.iter().find_map(|name| {
            let after = rest.strip_prefix(name)?.strip_prefix("_total")?;
            after.starts_with([' ', '{']).then_some((name, after))
        });
        match renamed {
            Some((name, after)) => {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str(after);
            }
            None => out.push_str(line),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn accept_headers_choose_the_format() {
        use Format::*;
        assert_eq!(Format::negotiate(None), OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), OpenMetrics);
        assert_eq!(Format::negotiate(Some("text/plain")), PrometheusText);
        assert_eq!(Format::negotiate(Some("text/plain;version=0.0.4")), PrometheusText);
        // Prometheus 2.x.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), OpenMetrics);
        let text_first = "application/openmetrics-text;q=0.2, text/plain;q=0.9";
        assert_eq!(Format::negotiate(Some(text_first)), PrometheusText);
    }

    #[test]
    fn plain_counters_keep_the_reference_name_in_prometheus_text() {
        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        counter.inc();
        registry.register("sandbox_pause_responses", "Pause calls", counter.clone());
        registry.register("sandbox_pause", "Pauses", counter);
        let text = encode(&registry, Format::PrometheusText).expect("encodes");
        assert!(text.contains("# TYPE sandbox_pause_responses counter\n"), "{text}");
        assert!(text.contains("\nsandbox_pause_responses 1\n"), "{text}");
        assert!(text.contains("\nsandbox_pause_total 1\n"), "{text}");
        let open = encode(&registry, Format::OpenMetrics).expect("encodes");
        assert!(open.contains("\nsandbox_pause_responses_total 1\n"), "{open}");
        assert!(open.ends_with("# EOF\n"));
    }
}
