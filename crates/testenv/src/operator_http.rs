//! Reaching an operator process started by a test or a benchmark: the address
//! it logged for its HTTP endpoint (`--http-address=127.0.0.1:0` binds a free
//! port and logs it), plain HTTP/1.1 requests to it, and its Prometheus
//! metrics.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// The port the operator logged it serves HTTP on, once it did. Reads text
/// logs (coloured or not) and JSON logs.
pub fn logged_port(log: &Path) -> Option<u16> {
    let log = std::fs::read_to_string(log).ok()?;
    let plain = strip_ansi(&log);
    let line = plain.lines().find(|l| l.contains("serving /healthz"))?;
    let address = if let Ok(json) = serde_json::from_str::<serde_json::Value>(line) {
        json["address"].as_str()?.to_string()
    } else {
        line.split("address=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .to_string()
    };
    address.rsplit(':').next()?.parse().ok()
}

/// `text` without terminal colour sequences (`ESC [ … final-byte`), which the
/// operators emit when their output is a terminal.
pub fn strip_ansi(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            plain.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    plain
}

/// One HTTP/1.1 request to 127.0.0.1; the status and body, or `None` when
/// nothing listens (yet).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Every sample of a Prometheus text exposition: `name{labels}` -> value.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples whose series starts with `prefix`.
pub fn sum(metrics: &BTreeMap<String, f64>, prefix: &str) -> f64 {
    metrics
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

/// The operator's metrics, scraped from `/metrics` on `port`.
pub fn scrape(port: u16) -> Option<BTreeMap<String, f64>> {
    let (status, body) = http(port, "GET", "/metrics", "")?;
    (status == 200).then(|| parse_metrics(&body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_from_text_and_json_logs() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text.log");
        std::fs::write(
            &text,
            "x\n\u{1b}[2m2026\u{1b}[0m INFO serving /healthz, /readyz address=\u{1b}[3m127.0.0.1:4312\u{1b}[0m\n",
        )
        .unwrap();
        assert_eq!(logged_port(&text), Some(4312));
        let json = dir.path().join("json.log");
        std::fs::write(
            &json,
            "{\"message\":\"serving /healthz, /readyz, /metrics\",\"address\":\"127.0.0.1:39001\"}\n",
        )
        .unwrap();
        assert_eq!(logged_port(&json), Some(39001));
        assert_eq!(logged_port(&dir.path().join("missing.log")), None);
    }

    #[test]
    fn samples_are_parsed_and_summed() {
        let m = parse_metrics(
            "# HELP kok_reconciles Reconciles.\nkok_reconciles_total{controller=\"cluster\",result=\"ok\"} 7\nkok_reconciles_total{controller=\"cluster\",result=\"error\"} 2\nkok_reconciles_total{controller=\"machine\"} 5\n",
        );
        assert_eq!(sum(&m, "kok_reconciles_total{controller=\"cluster\""), 9.0);
        assert_eq!(sum(&m, "kok_reconciles_total"), 14.0);
    }
}
