//! Printing objects: an aligned table for people, YAML or JSON for programs.

use serde::Serialize;

use crate::error::Error;
use crate::table;

/// How objects are printed.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// An aligned table (or a description, for one object).
    Table,
    /// The objects as YAML.
    Yaml,
    /// The objects as JSON.
    Json,
}

/// `value` as YAML or JSON text; `None` for [`Output::Table`].
pub fn encode<T: Serialize>(output: Output, value: &T) -> Result<Option<String>, Error> {
    let format = |e: String| Error::Format {
        what: "cannot print the objects".into(),
        message: e,
    };
    match output {
        Output::Table => Ok(None),
        Output::Yaml => serde_norway::to_string(value)
            .map(Some)
            .map_err(|e| format(e.to_string())),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|s| Some(s + "\n"))
            .map_err(|e| format(e.to_string())),
    }
}

/// Print `items` as a table of `row`s under `header`, or as YAML/JSON.
pub fn list<T: Serialize>(
    output: Output,
    items: &[T],
    row: fn(&T) -> Vec<String>,
    header: &[&str],
) -> Result<(), Error> {
    match encode(output, &items)? {
        Some(text) => print!("{text}"),
        None => print!(
            "{}",
            table::render(header, &items.iter().map(row).collect::<Vec<_>>())
        ),
    }
    Ok(())
}

/// Print one object with `describe` for tables, or as YAML/JSON.
pub fn one<T: Serialize>(
    output: Output,
    item: &T,
    describe: fn(&T) -> String,
) -> Result<(), Error> {
    match encode(output, item)? {
        Some(text) => print!("{text}"),
        None => print!("{}", describe(item)),
    }
    Ok(())
}

/// `-` for a missing value, as kubectl prints it.
pub fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".into())
}
