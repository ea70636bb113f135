//! Checks (`left op right` over run metrics), their outcomes, and the `ours` templates of
//! published rows.

use std::fmt;

use super::RunMetrics;
use super::expr::Expr;

/// A comparison operator of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==` (exact)
    Eq,
    /// `!=`
    Ne,
}

impl CompareOp {
    /// Parses `<`, `<=`, `>`, `>=`, `==`, `!=`.
    pub fn parse(text: &str) -> Option<CompareOp> {
        Some(match text.trim() {
            "<" => CompareOp::Lt,
            "<=" => CompareOp::Le,
            ">" => CompareOp::Gt,
            ">=" => CompareOp::Ge,
            "==" => CompareOp::Eq,
            "!=" => CompareOp::Ne,
            _ => return None,
        })
    }

    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
        }
    }

    /// Whether `left op right`.
    pub fn holds(self, left: f64, right: f64) -> bool {
        match self {
            CompareOp::Lt => left < right,
            CompareOp::Le => left <= right,
            CompareOp::Gt => left > right,
            CompareOp::Ge => left >= right,
            CompareOp::Eq => left == right,
            CompareOp::Ne => left != right,
        }
    }
}

impl fmt::Display for CompareOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// Something that must hold in our results: `left op right`.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// Name for `[[published]]` rows to refer to.
    pub id: Option<String>,
    /// What it means, in words.
    pub what: String,
    /// Left side.
    pub left: Expr,
    /// The comparison.
    pub op: CompareOp,
    /// Right side.
    pub right: Expr,
    /// A level check (`level = true`): a regime figure of ours that the posting's numbers
    /// depend on. Failing, it does not fail the run, but a row that names it cannot be
    /// `reproduced`.
    pub level: bool,
}

/// A check evaluated on results.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOutcome {
    /// The check's id.
    pub id: Option<String>,
    /// What it means.
    pub what: String,
    /// `left op right` as written.
    pub expression: String,
    /// The comparison.
    pub op: CompareOp,
    /// The left side's value, if it has one.
    pub left: Option<f64>,
    /// The right side's value, if it has one.
    pub right: Option<f64>,
    /// Whether it holds; false when a side has no value.
    pub pass: bool,
    /// A level check: reported, but not failing the run.
    pub level: bool,
    /// Why a side has no value.
    pub error: Option<String>,
    /// Seeds it was evaluated on (the sides are their means).
    pub seeds: usize,
    /// Seeds on which it holds; it passes only when it holds on every seed.
    pub seeds_held: usize,
}

impl CheckOutcome {
    /// `left op right` with the values, e.g. `312 > 200`, or the error; over several seeds,
    /// the sides' means and on how many seeds it holds (`312 > 200, 2 of 3 seeds`).
    pub fn values(&self) -> String {
        let text = match (self.left, self.right, &self.error) {
            (Some(left), Some(right), _) => {
                format!("{} {} {}", format_number(left), self.op, format_number(right))
            }
            (_, _, Some(error)) => error.clone(),
            _ => "no value".to_owned(),
        };
        if self.seeds > 1 {
            format!("{text}, {} of {} seeds", self.seeds_held, self.seeds)
        } else {
            text
        }
    }
}

impl Check {
    /// Evaluates both sides on `metrics` and compares them.
    pub fn evaluate(&self, metrics: &RunMetrics) -> CheckOutcome {
        let left = self.left.eval(metrics);
        let right = self.right.eval(metrics);
        let error = match (&left, &right) {
            (Err(error), _) | (_, Err(error)) => Some(error.0.clone()),
            _ => None,
        };
        let left = left.ok();
        let right = right.ok();
        let pass = match (left, right) {
            (Some(l), Some(r)) => self.op.holds(l, r),
            _ => false,
        };
        CheckOutcome {
            id: self.id.clone(),
            what: self.what.clone(),
            expression: format!("{} {} {}", self.left.source(), self.op, self.right.source()),
            op: self.op,
            left,
            right,
            pass,
            level: self.level,
            error,
            seeds: 1,
            seeds_held: usize::from(pass),
        }
    }

    /// Evaluates the check on each seed's metrics: it holds when it holds on every seed; the
    /// sides shown are their means over the seeds (absent when a seed has no value, whose
    /// error is kept).
    pub fn evaluate_seeds(&self, seeds: &[RunMetrics]) -> CheckOutcome {
        let outcomes: Vec<CheckOutcome> =
            seeds.iter().map(|metrics| self.evaluate(metrics)).collect();
        let Some(first) = outcomes.first() else {
            return CheckOutcome {
                seeds: 0,
                seeds_held: 0,
                pass: false,
                ..self.evaluate(&RunMetrics::new())
            };
        };
        let mean = |side: fn(&CheckOutcome) -> Option<f64>| {
            let values: Option<Vec<f64>> = outcomes.iter().map(side).collect();
            values.map(|values| values.iter().sum::<f64>() / values.len() as f64)
        };
        let seeds_held = outcomes.iter().filter(|outcome| outcome.pass).count();
        CheckOutcome {
            left: mean(|outcome| outcome.left),
            right: mean(|outcome| outcome.right),
            pass: seeds_held == outcomes.len(),
            error: outcomes.iter().find_map(|outcome| outcome.error.clone()),
            seeds: outcomes.len(),
            seeds_held,
            ..first.clone()
        }
    }
}

/// Text with `{expression}` holes, e.g. `"{sata/legacy:pause_ms_max} ms"`.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    parts: Vec<TemplatePart>,
}

#[derive(Clone, Debug, PartialEq)]
enum TemplatePart {
    Text(String),
    Expr(Expr),
}

impl Template {
    /// Parses `text`; `{` opens an expression that `}` closes; braces do not nest.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err(format!("unmatched '}}' in {text:?}"));
            }
            if open > 0 {
                parts.push(TemplatePart::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| format!("unclosed '{{' in {text:?}"))?;
            let inner = &after[..close];
            if inner.contains('{') {
                return Err(format!("nested '{{' in {text:?}"));
            }
            parts.push(TemplatePart::Expr(Expr::parse(inner)?));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Text(rest.to_owned()));
        }
        Ok(Template { parts })
    }

    /// Every `(run, metric)` the holes read.
    pub fn references(&self) -> Vec<(&str, &str)> {
        self.parts
            .iter()
            .flat_map(|part| match part {
                TemplatePart::Text(_) => Vec::new(),
                TemplatePart::Expr(expr) => expr.references(),
            })
            .collect()
    }

    /// The text with each hole replaced by its value ([`format_number`]), or `n/a`.
    pub fn render(&self, metrics: &RunMetrics) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                TemplatePart::Text(text) => out.push_str(text),
                TemplatePart::Expr(expr) => match expr.eval(metrics) {
                    Ok(value) => out.push_str(&format_number(value)),
                    Err(_) => out.push_str("n/a"),
                },
            }
        }
        out
    }
}

/// A number for people: integers as integers, otherwise three significant digits at most
/// one decimal place for values of 10 or more.
pub fn format_number(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let magnitude = value.abs();
    let text = if (value.fract() == 0.0 && magnitude < 1e15) || magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else if magnitude >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    };
    if text == "-0" { "0".to_owned() } else { text }
}
