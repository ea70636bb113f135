//! Verdicts on published numbers: each `[[published]]` row that gives a number is compared
//! with ours and judged, never asserted.
//!
//! A row names the posting's number (`value`, one number or a `[low, high]` range), the
//! expression that gives ours (`ours_value`), a tolerance (`"x2"`: within a factor of two;
//! `"+-3"`: within 3 of the value, in its unit) and optionally the neutral point that gives a
//! number its direction (`neutral = 1` for a before/after factor: above 1 means "more"). The
//! verdict is the product brief's:
//!
//! - `reproduced`: ours is within the tolerance of the value (inside the range, or within the
//!   tolerance of its nearest bound), on the same side of the neutral point when one is given,
//!   and every check the row names holds;
//! - `direction-only`: ours is on the same side of the neutral point as the value, but outside
//!   the tolerance (or a named check fails);
//! - `not-reproduced`: neither, or ours has no value;
//! - `not-compared`: the posting gave no number for it.
//!
//! The ratio shown is ours over the value (over the nearest bound of a range, 1 inside it).
//! [`within`] is the one definition of "inside the tolerance"; the test suite re-applies it to
//! every `summary.json` so that no row can claim `reproduced` outside its tolerance.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The posting's number: one value or a range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PublishedValue {
    /// One number.
    Single(f64),
    /// A range, low first.
    Range([f64; 2]),
}

impl PublishedValue {
    /// The value's point nearest to `ours` (ours itself when inside a range).
    pub fn nearest(self, ours: f64) -> f64 {
        match self {
            PublishedValue::Single(value) => value,
            PublishedValue::Range([low, high]) => ours.clamp(low, high),
        }
    }

    fn bounds(self) -> [f64; 2] {
        match self {
            PublishedValue::Single(value) => [value, value],
            PublishedValue::Range(range) => range,
        }
    }
}

impl fmt::Display for PublishedValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishedValue::Single(value) => write!(f, "{}", super::format_number(*value)),
            PublishedValue::Range([low, high]) => {
                write!(f, "{}..{}", super::format_number(*low), super::format_number(*high))
            }
        }
    }
}

/// How far ours may be from the value and still reproduce it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Within this factor (at least 1): `x2`.
    Factor(f64),
    /// Within this distance, in the value's unit: `+-3`.
    Absolute(f64),
}

impl Tolerance {
    /// Parses `x2` (a factor, at least 1) or `+-3` (a distance, at least 0).
    pub fn parse(text: &str) -> Result<Tolerance, String> {
        let text = text.trim();
        let number = |rest: &str| {
            rest.trim().parse::<f64>().ok().filter(|value| value.is_finite() && *value >= 0.0)
        };
        if let Some(rest) = text.strip_prefix('x') {
            return number(rest).filter(|factor| *factor >= 1.0).map(Tolerance::Factor).ok_or_else(
                || format!("{text:?}: a factor is x followed by a number of 1 or more"),
            );
        }
        if let Some(rest) = text.strip_prefix("+-") {
            return number(rest).map(Tolerance::Absolute).ok_or_else(|| {
                format!("{text:?}: a distance is +- followed by a number of 0 or more")
            });
        }
        Err(format!("{text:?}: write a factor (x2) or a distance (+-3)"))
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Factor(factor) => write!(f, "x{}", super::format_number(*factor)),
            Tolerance::Absolute(distance) => write!(f, "+-{}", super::format_number(*distance)),
        }
    }
}

/// A row's verdict (product brief vocabulary).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Direction and size within the tolerance, and the row's checks hold.
    Reproduced,
    /// Same direction, size outside the tolerance.
    DirectionOnly,
    /// Neither.
    NotReproduced,
    /// The posting gave no number.
    NotCompared,
}

impl Verdict {
    /// Every verdict, in report order.
    pub const ALL: [Verdict; 4] =
        [Verdict::Reproduced, Verdict::DirectionOnly, Verdict::NotReproduced, Verdict::NotCompared];

    /// The name used in summary.json and the report.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::DirectionOnly => "direction-only",
            Verdict::NotReproduced => "not-reproduced",
            Verdict::NotCompared => "not-compared",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `ours` is within `tolerance` of `value`: inside a range, or within the factor or
/// distance of the value's nearest point. A factor needs both on the same side of zero (a
/// published 0 is matched only by 0).
pub fn within(value: PublishedValue, ours: f64, tolerance: Tolerance) -> bool {
    if !ours.is_finite() {
        return false;
    }
    let nearest = value.nearest(ours);
    match tolerance {
        Tolerance::Absolute(distance) => (ours - nearest).abs() <= distance,
        Tolerance::Factor(factor) => {
            if nearest == 0.0 || ours == 0.0 {
                return nearest == ours;
            }
            let ratio = ours / nearest;
            ratio > 0.0 && ratio <= factor && 1.0 / ratio <= factor
        }
    }
}

/// Ours over the value's nearest point, when that is not zero.
pub fn ratio(value: PublishedValue, ours: f64) -> Option<f64> {
    let nearest = value.nearest(ours);
    (nearest != 0.0 && ours.is_finite()).then(|| ours / nearest)
}

/// Whether ours lies on the same side of `neutral` as the whole value; `None` when the value
/// itself straddles or touches the neutral point (it then has no direction).
pub fn same_direction(value: PublishedValue, ours: f64, neutral: f64) -> Option<bool> {
    let [low, high] = value.bounds();
    let side = if low > neutral {
        1.0
    } else if high < neutral {
        -1.0
    } else {
        return None;
    };
    Some((ours - neutral) * side > 0.0)
}

/// What a row's comparison gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// The verdict.
    pub verdict: Verdict,
    /// Ours over the value, when defined.
    pub ratio: Option<f64>,
    /// Why, computed from the numbers (empty for `reproduced`).
    pub reason: String,
}

/// Judges ours against the value; `failed_checks` are the ids of the row's checks that do not
/// hold. `ours` is `Err` with the reason when our number could not be computed.
pub fn judge(
    value: Option<PublishedValue>,
    ours: Result<f64, String>,
    tolerance: Tolerance,
    neutral: Option<f64>,
    failed_checks: &[String],
) -> Judgement {
    let Some(value) = value else {
        return Judgement {
            verdict: Verdict::NotCompared,
            ratio: None,
            reason: "the posting gives no number".to_owned(),
        };
    };
    let ours = match ours {
        Ok(ours) if ours.is_finite() => ours,
        Ok(_) => return not_reproduced(None, "ours has no finite value".to_owned()),
        Err(reason) => return not_reproduced(None, format!("ours has no value: {reason}")),
    };
    let ratio = ratio(value, ours);
    let inside = within(value, ours, tolerance);
    let direction = neutral.and_then(|neutral| same_direction(value, ours, neutral));
    let size = match (ratio, tolerance) {
        (Some(ratio), Tolerance::Factor(_)) => format!("ours is {}x the posting's", fmt(ratio)),
        _ => format!("ours {} against the posting's {value}", super::format_number(ours)),
    };
    if !failed_checks.is_empty() {
        let checks = failed_checks.join(", ");
        let verdict =
            if direction == Some(true) { Verdict::DirectionOnly } else { Verdict::NotReproduced };
        return Judgement { verdict, ratio, reason: format!("check {checks} fails; {size}") };
    }
    if inside && direction != Some(false) {
        return Judgement { verdict: Verdict::Reproduced, ratio, reason: String::new() };
    }
    match direction {
        Some(true) => Judgement {
            verdict: Verdict::DirectionOnly,
            ratio,
            reason: format!("same direction, size outside {tolerance}: {size}"),
        },
        Some(false) if Some(ours) == neutral => {
            not_reproduced(ratio, format!("ours shows no change: {size}"))
        }
        Some(false) => not_reproduced(ratio, format!("opposite direction: {size}")),
        None => not_reproduced(ratio, format!("outside {tolerance}: {size}")),
    }
}

fn not_reproduced(ratio: Option<f64>, reason: String) -> Judgement {
    Judgement { verdict: Verdict::NotReproduced, ratio, reason }
}

fn fmt(ratio: f64) -> String {
    super::format_number(ratio)
}

#[cfg(test)]
mod tests {
    use super::*;

    const X2: Tolerance = Tolerance::Factor(2.0);

    #[test]
    fn tolerance_parses_factors_and_distances() {
        // Goal: the two written forms, and clear refusals.
        assert_eq!(Tolerance::parse("x2"), Ok(Tolerance::Factor(2.0)));
        assert_eq!(Tolerance::parse(" +-3.5 "), Ok(Tolerance::Absolute(3.5)));
        for bad in ["2", "x0.5", "x", "+-", "+--1", "xNaN", "within 2"] {
            assert!(Tolerance::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn within_a_factor_and_a_range() {
        // Goal: factor bounds are inclusive both ways, ranges count as exact inside.
        let single = PublishedValue::Single(324.0);
        assert!(within(single, 648.0, X2));
        assert!(within(single, 162.0, X2));
        assert!(!within(single, 649.0, X2));
        assert!(!within(single, -324.0, X2));
        let range = PublishedValue::Range([2000.0, 10000.0]);
        assert!(within(range, 5000.0, Tolerance::Factor(1.0)));
        assert!(within(range, 1000.0, X2));
        assert!(!within(range, 999.0, X2));
        assert_eq!(ratio(range, 1000.0), Some(0.5));
        assert_eq!(ratio(range, 3000.0), Some(1.0));
        assert!(within(PublishedValue::Single(0.0), 0.0, X2));
        assert!(!within(PublishedValue::Single(0.0), 0.1, X2));
        assert!(within(PublishedValue::Single(4.3), 1.3, Tolerance::Absolute(3.0)));
        assert!(!within(PublishedValue::Single(4.3), 1.2, Tolerance::Absolute(3.0)));
    }

    #[test]
    fn verdicts_follow_size_direction_and_checks() {
        // Goal: each verdict from the numbers alone.
        let factor = PublishedValue::Single(4.05);
        let judge1 = |ours: f64| judge(Some(factor), Ok(ours), X2, Some(1.0), &[]);
        assert_eq!(judge1(3.0).verdict, Verdict::Reproduced);
        assert_eq!(judge1(15.0).verdict, Verdict::DirectionOnly);
        assert_eq!(judge1(0.5).verdict, Verdict::NotReproduced);
        assert_eq!(judge(None, Ok(1.0), X2, None, &[]).verdict, Verdict::NotCompared);
        let failed = ["tail".to_owned()];
        let with_failed_check = judge(Some(factor), Ok(4.0), X2, Some(1.0), &failed);
        assert_eq!(with_failed_check.verdict, Verdict::DirectionOnly);
        assert!(with_failed_check.reason.contains("tail"));
        let no_direction = judge(Some(PublishedValue::Single(324.0)), Ok(1219.0), X2, None, &[]);
        assert_eq!(no_direction.verdict, Verdict::NotReproduced);
        assert!(no_direction.reason.contains("3.76x"), "{}", no_direction.reason);
        let missing = judge(Some(factor), Err("no such metric".to_owned()), X2, None, &[]);
        assert_eq!(missing.verdict, Verdict::NotReproduced);
    }

    #[test]
    fn a_value_on_the_neutral_point_has_no_direction() {
        // Goal: a range that spans the neutral point cannot give direction-only.
        let range = PublishedValue::Range([-2.6, 0.3]);
        assert_eq!(same_direction(range, 1.0, 0.0), None);
        let outside = judge(Some(range), Ok(5.0), Tolerance::Absolute(1.0), Some(0.0), &[]);
        assert_eq!(outside.verdict, Verdict::NotReproduced);
    }
}
