//! Go-style durations (`90s`, `1h30m`, `8760h`), the format Kubernetes users
//! already write in specs, parsed once for every kind that has them.

use std::time::Duration;

/// A duration string that is not `<number><unit>…` with units ns, us, ms, s, m, h.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {0:?}: use a number and a unit (ns, us, ms, s, m, h), for example 90s, 15m or 8760h"
)]
pub struct InvalidDuration(pub String);

/// Parse a Go-style duration. Fractions are allowed (`1.5h`).
pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let bad = || InvalidDuration(text.to_string());
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("8760h"), Ok(Duration::from_secs(8760 * 3600)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in ["", "10", "h", "1 year", "5d", "1h-5m"] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
