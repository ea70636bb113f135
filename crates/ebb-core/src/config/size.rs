//! Sizes in bytes as people write them: the one parser every knob, experiment file and command
//! line option uses.
//!
//! The convention is coreutils' (`dd`, `head -c`), which agrees with the kernel's `memparse`
//! for K, M, G and T: a bare number is bytes (`B` may follow it); `K`, `M`, `G`, `T`, in either
//! case and optionally followed by `iB` (`64M`, `64m`, `64MiB`), are powers of 1024; `KB`,
//! `MB`, `GB`, `TB` (also `kB`) are powers of 1000. So `64M` and `64MiB` are 67,108,864 bytes
//! and `64MB` is 64,000,000. A decimal fraction is accepted when the result is a whole number
//! of bytes (`1.5GiB`, `0.5K`). Anything else (`64mb`, `64Mb`, `64MBs`) is refused with an
//! error that states the convention, rather than guessed.

/// The convention, for error messages and help texts.
pub const SIZE_UNITS: &str = "a byte count, or a number with a unit: K, M, G, T (either case, \
                              optionally followed by iB) are powers of 1024; KB (or kB), MB, GB, \
                              TB are powers of 1000";

/// Parses a size such as `4096`, `64M`, `64m`, `64MiB`, `1MB`, `1.5GiB` into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let number_end =
        trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_end);
    let unit = unit.trim_start();
    let refuse = || format!("{text:?} is not a size; write {SIZE_UNITS}");
    let Some(factor) = unit_factor(unit) else { return Err(refuse()) };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(refuse());
    }
    let too_large = || format!("{text:?} does not fit in 64 bits");
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| too_large())? };
    let mut bytes = whole.checked_mul(factor).ok_or_else(too_large)?;
    if !fraction.is_empty() {
        // Exact decimal arithmetic: fraction digits times the factor, divided by 10^digits.
        let digits = u32::try_from(fraction.len()).map_err(|_| refuse())?;
        let scale = 10u128.checked_pow(digits).ok_or_else(refuse)?;
        let numerator = fraction.parse::<u128>().map_err(|_| refuse())? * u128::from(factor);
        if numerator % scale != 0 {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        let extra = u64::try_from(numerator / scale).map_err(|_| too_large())?;
        bytes = bytes.checked_add(extra).ok_or_else(too_large)?;
    }
    Ok(bytes)
}

/// Bytes per unit, or `None` for a unit outside the convention.
fn unit_factor(unit: &str) -> Option<u64> {
    const KIB: u64 = 1 << 10;
    let binary = |letter: char| match letter.to_ascii_uppercase() {
        'K' => Some(KIB),
        'M' => Some(KIB.pow(2)),
        'G' => Some(KIB.pow(3)),
        'T' => Some(KIB.pow(4)),
        _ => None,
    };
    match unit {
        "" | "B" => Some(1),
        "kB" | "KB" => Some(1_000),
        "MB" => Some(1_000_000),
        "GB" => Some(1_000_000_000),
        "TB" => Some(1_000_000_000_000),
        _ => {
            let mut chars = unit.chars();
            let letter = chars.next()?;
            match chars.as_str() {
                "" | "iB" => binary(letter),
                _ => None,
            }
        }
    }
}

/// A byte count for people: in the largest binary unit that divides it exactly when that
/// takes at most four digits (`64MiB`, `1536KiB`), else in bytes (`64000000`). [`parse_size`]
/// reads it back to the same number.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            let count = bytes >> shift;
            if count < 10_000 {
                return format!("{count}{unit}");
            }
            break;
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decided convention: K/M/G/T (either case, optional iB) are binary, KB/MB/GB/TB
    /// (and kB) decimal, a bare number is bytes. "64MB" was 64 MiB for the runtime's knobs and
    /// 64,000,000 for the simulator's files before both used this parser.
    #[test]
    fn units_follow_the_coreutils_convention() {
        for (text, bytes) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("64M", 64 << 20),
            ("64m", 64 << 20),
            ("64MiB", 64 << 20),
            ("64miB", 64 << 20),
            ("64MB", 64_000_000),
            ("1kB", 1000),
            ("1KB", 1000),
            ("1k", 1024),
            ("2G", 2 << 30),
            ("2GB", 2_000_000_000),
            ("1T", 1 << 40),
            ("1TB", 1_000_000_000_000),
            ("1.5GiB", 3 << 29),
            ("0.5K", 512),
            (" 10 GiB ", 10 << 30),
            ("1000MB", 1_000_000_000),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text:?}");
        }
    }

    /// Units outside the convention, fractions of a byte and overflow are refused, and the
    /// message states the convention.
    #[test]
    fn bad_sizes_are_refused_with_the_convention() {
        for text in ["", "GiB", "64mb", "64Mb", "64MBs", "10 GiBs", "5Q", "1.2.3K", "0.3B", "-1"] {
            assert!(parse_size(text).is_err(), "{text:?} parsed");
        }
        let err = parse_size("64mb").unwrap_err();
        assert!(err.contains("powers of 1024") && err.contains("powers of 1000"), "{err}");
        assert!(parse_size("16777216T").unwrap_err().contains("64 bits"));
        assert!(parse_size("0.3K").unwrap_err().contains("whole number"));
    }

    #[test]
    fn formatted_sizes_parse_back() {
        for bytes in [0, 1, 4096, 64 << 20, 3 << 29, 1 << 40, 1_000_000, u64::MAX] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes), "{bytes}");
        }
        assert_eq!(format_size(64 << 20), "64MiB");
    }
}
