//! Logging set-up shared by every binary: structured `tracing` output, as text
//! for people or JSON for log pipelines, with a filter that can be changed
//! while the process runs (`PUT /debug/loglevel` on the HTTP endpoint).

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

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
    /// `info,kube_on_kube_operator=debug`. Change it while running with
    /// `curl -X PUT --data debug http://<http-address>/debug/loglevel`
    /// (`GET` shows the current one).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_level: String,
}

/// The live filter: its reload handle and the text it was built from.
struct Live {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

static LIVE: OnceLock<Live> = OnceLock::new();

impl LogArgs {
    /// Install the global subscriber. Call once, first thing in `main`.
    pub fn init(&self) {
        let (level, filter) = match EnvFilter::try_new(&self.log_level) {
            Ok(filter) => (self.log_level.clone(), filter),
            Err(_) => ("info".to_string(), EnvFilter::new("info")),
        };
        let (filter, handle) = reload::Layer::new(filter);
        let output = match self.log_format {
            LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .boxed(),
        };
        tracing_subscriber::registry()
            .with(filter)
            .with(output)
            .init();
        let _ = LIVE.set(Live {
            handle,
            current: Mutex::new(level),
        });
    }
}

/// The log filter in effect, if logging was set up with [`LogArgs::init`].
pub fn log_level() -> Option<String> {
    let live = LIVE.get()?;
    Some(
        live.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
    )
}

/// Replace the log filter of the running process.
pub fn set_log_level(level: &str) -> Result<(), String> {
    let level = level.trim();
    let filter =
        EnvFilter::try_new(level).map_err(|e| format!("invalid log filter {level:?}: {e}"))?;
    let live = LIVE
        .get()
        .ok_or_else(|| "logging was not set up with a reloadable filter".to_string())?;
    live.handle
        .reload(filter)
        .map_err(|e| format!("cannot replace the log filter: {e}"))?;
    *live.current.lock().unwrap_or_else(|e| e.into_inner()) = level.to_string();
    tracing::info!(filter = level, "log filter changed");
    Ok(())
}
