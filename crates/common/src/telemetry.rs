//! Logging set-up shared by every binary: structured `tracing` output, as text
//! for people or JSON for log pipelines.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging flags shared by the operators.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "KOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter in `tracing` EnvFilter syntax, e.g. `info` or
    /// `info,kube_on_kube_operator=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_level: String,
}

impl LogArgs {
    /// Install the global subscriber. Call once, first thing in `main`.
    pub fn init(&self) {
        let filter = EnvFilter::try_new(&self.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt().with_env_filter(filter);
        match self.log_format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().flatten_event(true).init(),
        }
    }
}
