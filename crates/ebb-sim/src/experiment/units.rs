//! Values with units in experiment files: sizes (the core's one size parser) and durations.

use ebb_core::{Duration, config};

/// A size: a TOML integer (bytes) or a string with a dd-style unit.
pub(super) fn size_value(value: &toml::Value) -> Result<u64, String> {
    match value {
        toml::Value::Integer(n) => {
            u64::try_from(*n).map_err(|_| format!("{n} is negative; a size must be at least 0"))
        }
        toml::Value::String(text) => config::parse_size(text),
        other => Err(format!(
            "expected a size (bytes, or a string like \"4GiB\"), found {}",
            other.type_str()
        )),
    }
}

pub(super) fn duration_value(value: &toml::Value) -> Result<Duration, String> {
    match value {
        toml::Value::String(text) => parse_duration(text),
        other => Err(format!(
            "expected a duration string with a unit like \"10s\" or \"500ms\", found {}",
            other.type_str()
        )),
    }
}

/// Splits `"1.5GiB"` into `(1.5, "GiB")`.
fn split_number(text: &str) -> Result<(f64, &str), String> {
    let text = text.trim();
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    let value: f64 =
        number.parse().map_err(|_| format!("{text:?} does not start with a number"))?;
    Ok((value, unit.trim()))
}

/// Parses a duration like `10s`, `500ms`, `2min` into a [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (value, unit) = split_number(text)?;
    let nanos_per_unit: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "min" => 60e9,
        "" => return Err(format!("{text:?} has no unit; write e.g. \"10s\" or \"500ms\"")),
        _ => {
            return Err(format!(
                "unknown duration unit {unit:?} in {text:?}; use ns, us, ms, s, min"
            ));
        }
    };
    let nanos = value * nanos_per_unit;
    if !nanos.is_finite() || nanos > 1e18 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}
