//! The loaded experiment from the file as written: the compared knob and its variants, the
//! cases (`case.rs`), `[quick]`, the checks and the published rows, each checked with the
//! key of the file it came from.

use std::path::Path;

use super::case::{build_case, is_plain_name};
use super::check::{Check, CompareOp, Template};
use super::expr::Expr;
use super::schema::{RawCheck, RawExperiment, RawPublished, RawQuick, RawReference};
use super::units::{duration_value, size_value};
use super::verdict::{PublishedValue, Rule, Tolerance};
use super::{Case, DEFAULT_SEED, Experiment, ExperimentError, Published, Quick, Variant, run_name};
use ebb_core::Duration;
use ebb_core::config;

/// Turns the raw file into an experiment, checking everything that does not need a run.
pub(super) fn build(path: &Path, raw: RawExperiment) -> Result<Experiment, ExperimentError> {
    let name = experiment_name(path, raw.name)?;
    let compare = config::knob(&raw.compare).map_err(|error| {
        ExperimentError::new(path, "compare", format!("{:?}: {}", raw.compare, error.reason))
    })?;
    let variants = build_variants(path, compare, &raw.variants)?;
    if raw.cases.is_empty() {
        return fail(path, "case", "at least one [[case]] is needed".to_owned());
    }
    let mut cases: Vec<Case> = Vec::new();
    for (i, raw_case) in raw.cases.into_iter().enumerate() {
        let case = build_case(path, i, compare, raw_case)?;
        if cases.iter().any(|c| c.name == case.name) {
            let reason = format!("{:?} is used twice", case.name);
            return fail(path, &format!("case[{i}].name"), reason);
        }
        cases.push(case);
    }
    let quick = build_quick(path, raw.quick)?;
    let run_names: Vec<String> = cases
        .iter()
        .flat_map(|case| variants.iter().map(move |v| run_name(&case.name, &v.label)))
        .collect();
    let checks = build_checks(path, raw.checks, &run_names)?;
    let references = build_references(path, raw.references, &run_names)?;
    let mut published = Vec::new();
    for (i, row) in raw.published.into_iter().enumerate() {
        let key = format!("published[{i}]");
        published.push(build_published(path, &key, row, &checks, &run_names)?);
    }
    let own = match raw.origin.as_deref() {
        None | Some("posting") => false,
        Some("ebb") => true,
        Some(other) => {
            return fail(path, "origin", format!("{other:?}: write \"posting\" or \"ebb\""));
        }
    };
    Ok(Experiment {
        path: path.to_owned(),
        own,
        name,
        title: raw.title,
        description: raw.description,
        reproduces: raw.reproduces,
        compare,
        variants,
        seed: raw.seed.unwrap_or(DEFAULT_SEED),
        cases,
        quick,
        published,
        checks,
        references,
    })
}

/// The error of `key` in the experiment file at `path`.
fn fail<T>(path: &Path, key: &str, reason: String) -> Result<T, ExperimentError> {
    Err(ExperimentError::new(path, key, reason))
}

/// The experiment's name: the file stem, which a `name` given must equal.
fn experiment_name(path: &Path, given: Option<String>) -> Result<String, ExperimentError> {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
    let name = match given {
        Some(name) if name != stem => {
            let reason =
                format!("{name:?} differs from the file name {stem:?}; the name is the file stem");
            return fail(path, "name", reason);
        }
        Some(name) => name,
        None => stem,
    };
    if !is_plain_name(&name) {
        let reason = format!("{name:?} is not made of letters, digits, '.', '_' and '-'");
        return fail(path, "name", reason);
    }
    Ok(name)
}

/// The compared knob's values, parsed, at least one and none twice.
fn build_variants(
    path: &Path,
    compare: &'static config::Knob,
    values: &[toml::Value],
) -> Result<Vec<Variant>, ExperimentError> {
    if values.is_empty() {
        return fail(path, "variants", "at least one variant is needed".to_owned());
    }
    let mut variants: Vec<Variant> = Vec::new();
    for (i, value) in values.iter().enumerate() {
        let variant = Variant::parse(compare, value)
            .map_err(|reason| ExperimentError::new(path, format!("variants[{i}]"), reason))?;
        if variants.iter().any(|v| v.label == variant.label) {
            return fail(
                path,
                &format!("variants[{i}]"),
                format!("{} is listed twice", variant.label),
            );
        }
        variants.push(variant);
    }
    Ok(variants)
}

/// The checks, over the runs `run_names`, each `id` used once.
fn build_checks(
    path: &Path,
    raw: Vec<RawCheck>,
    run_names: &[String],
) -> Result<Vec<Check>, ExperimentError> {
    let mut checks: Vec<Check> = Vec::new();
    for (i, raw_check) in raw.into_iter().enumerate() {
        let key = format!("check[{i}]");
        let check = build_check(path, &key, raw_check, run_names)?;
        if let Some(id) = &check.id
            && checks.iter().any(|c| c.id.as_ref() == Some(id))
        {
            return fail(path, &format!("{key}.id"), format!("{id:?} is used twice"));
        }
        checks.push(check);
    }
    Ok(checks)
}

/// The reference curves, each of a run of `run_names`, with percentiles in (0, 100).
fn build_references(
    path: &Path,
    raw: Vec<RawReference>,
    run_names: &[String],
) -> Result<Vec<super::Reference>, ExperimentError> {
    let mut references = Vec::new();
    for (i, raw_reference) in raw.into_iter().enumerate() {
        let key = format!("reference[{i}]");
        let run = run_name(&raw_reference.case, &raw_reference.variant);
        if !run_names.contains(&run) {
            let reason = format!("unknown run {run:?}; the runs are {}", run_names.join(", "));
            return fail(path, &key, reason);
        }
        let points: Vec<(f64, f64)> =
            raw_reference.read_latency_us.iter().map(|[p, us]| (*p, *us)).collect();
        if points.iter().any(|(p, us)| !(*p > 0.0 && *p < 100.0 && *us >= 0.0)) {
            return fail(
                path,
                &format!("{key}.read_latency_us"),
                "each point is [percentile in (0, 100), microseconds >= 0]".to_owned(),
            );
        }
        references.push(super::Reference {
            run,
            label: raw_reference.label,
            read_latency_us: points,
        });
    }
    Ok(references)
}

pub(super) fn build_quick(path: &Path, raw: Option<RawQuick>) -> Result<Quick, ExperimentError> {
    let Some(raw) = raw else { return Ok(Quick::default()) };
    let fail =
        |field: &str, reason: String| ExperimentError::new(path, format!("quick.{field}"), reason);
    if let Some(scale) = raw.size_scale
        && !(scale > 0.0 && scale <= 1.0)
    {
        return Err(fail("size_scale", format!("{scale} is outside (0, 1]")));
    }
    let memory_bytes = match &raw.memory {
        Some(value) => Some(size_value(value).map_err(|r| fail("memory", r))?),
        None => None,
    };
    let time_limit = match &raw.time_limit {
        Some(value) => Some(duration_value(value).map_err(|r| fail("time_limit", r))?),
        None => None,
    };
    let steady_from = match &raw.steady_from {
        Some(value) => Some(duration_value(value).map_err(|r| fail("steady_from", r))?),
        None => None,
    };
    if time_limit == Some(Duration::ZERO) {
        return Err(fail("time_limit", "must be positive".to_owned()));
    }
    Ok(Quick { size_scale: raw.size_scale, memory_bytes, time_limit, steady_from })
}

fn build_published(
    path: &Path,
    key: &str,
    row: RawPublished,
    checks: &[Check],
    run_names: &[String],
) -> Result<Published, ExperimentError> {
    let fail =
        |field: &str, reason: String| ExperimentError::new(path, format!("{key}.{field}"), reason);
    let ours = Template::parse(&row.ours).map_err(|reason| fail("ours", reason))?;
    check_references(path, &format!("{key}.ours"), ours.references(), run_names)?;
    for (j, id) in row.checks.iter().enumerate() {
        if !checks.iter().any(|c| c.id.as_ref() == Some(id)) {
            return Err(fail(&format!("checks[{j}]"), format!("no check has id {id:?}")));
        }
    }
    let value = match &row.value {
        None => None,
        Some(value) => Some(published_value(value).map_err(|reason| fail("value", reason))?),
    };
    let ours_value = match &row.ours_value {
        None => None,
        Some(value) => {
            let expr = expression(value).map_err(|reason| fail("ours_value", reason))?;
            check_references(path, &format!("{key}.ours_value"), expr.references(), run_names)?;
            Some(expr)
        }
    };
    let tolerance = match &row.tolerance {
        None => None,
        Some(text) => Some(Tolerance::parse(text).map_err(|reason| fail("tolerance", reason))?),
    };
    let rule = match (value, ours_value.is_some()) {
        (None, false) => {
            if row.tolerance.is_some() || row.kind.is_some() || row.neutral.is_some() {
                return Err(fail(
                    "value",
                    "tolerance, kind and neutral judge a value; give the posting's value"
                        .to_owned(),
                ));
            }
            None
        }
        (None, true) => {
            return Err(fail(
                "value",
                "ours_value compares ours with a value; give the posting's value".to_owned(),
            ));
        }
        (Some(_), false) => {
            return Err(fail("ours_value", "a row with a value needs ours_value".to_owned()));
        }
        (Some(value), true) => {
            Some(build_rule(value, tolerance, &row).map_err(|(f, r)| fail(f, r))?)
        }
    };
    Ok(Published {
        line: row.line.clone(),
        claim: row.claim,
        published: row.published,
        ours,
        rule,
        ours_value,
        checks: row.checks,
        why: row.why,
        analysis: row.analysis,
    })
}

/// The rule of a compared row: its kind (a change needs `neutral`, a level refuses it), its
/// tolerance (a range is its own; `noise` replaces the tolerance). Errors name the field.
fn build_rule(
    value: PublishedValue,
    tolerance: Option<Tolerance>,
    row: &RawPublished,
) -> Result<Rule, (&'static str, String)> {
    let neutral = match (row.kind.as_deref(), row.neutral) {
        (Some("change"), Some(neutral)) if neutral.is_finite() => Some(neutral),
        (Some("change"), Some(_)) => return Err(("neutral", "must be a finite number".to_owned())),
        (Some("change"), None) => {
            return Err((
                "neutral",
                "a change row needs neutral (1 for a before/after factor, 0 for a change), \
                 so that its direction is checked"
                    .to_owned(),
            ));
        }
        (Some("level"), None) => None,
        (Some("level"), Some(_)) => {
            return Err((
                "neutral",
                "a level row has no direction; make it kind = \"change\" or drop neutral"
                    .to_owned(),
            ));
        }
        (Some(other), _) => {
            return Err(("kind", format!("{other:?}: write \"change\" or \"level\"")));
        }
        (None, _) => {
            return Err((
                "kind",
                "a row with a value needs kind = \"change\" (with neutral) or \"level\"".to_owned(),
            ));
        }
    };
    let noise = match row.noise {
        Some(noise) if !(noise.is_finite() && noise > 0.0) => {
            return Err(("noise", "must be a positive number".to_owned()));
        }
        noise => noise,
    };
    let tolerance = match (value, tolerance, noise) {
        (_, Some(_), Some(_)) => {
            return Err((
                "tolerance",
                "a row with noise is judged within +-noise; drop tolerance".to_owned(),
            ));
        }
        (_, None, Some(noise)) => Tolerance::Absolute(noise),
        (PublishedValue::Range(_), None | Some(Tolerance::Range), None) => Tolerance::Range,
        (PublishedValue::Range(_), Some(_), None) => {
            return Err((
                "tolerance",
                "a range is its own tolerance (ours must be inside it); drop tolerance".to_owned(),
            ));
        }
        (PublishedValue::Single(_), Some(Tolerance::Range), None) => {
            return Err(("tolerance", "range needs a [low, high] value".to_owned()));
        }
        (PublishedValue::Single(_), Some(tolerance), None) => tolerance,
        (PublishedValue::Single(_), None, None) => {
            return Err(("tolerance", "a row with a value needs a tolerance".to_owned()));
        }
    };
    Ok(Rule { value, tolerance, neutral, noise })
}

/// A published value: a number or a `[low, high]` array of two numbers, low first.
fn published_value(value: &toml::Value) -> Result<PublishedValue, String> {
    let number = |value: &toml::Value| match value {
        toml::Value::Integer(n) => Some(*n as f64),
        toml::Value::Float(x) if x.is_finite() => Some(*x),
        _ => None,
    };
    if let Some(single) = number(value) {
        return Ok(PublishedValue::Single(single));
    }
    if let toml::Value::Array(items) = value
        && let [low, high] = items.as_slice()
        && let (Some(low), Some(high)) = (number(low), number(high))
        && low <= high
    {
        return Ok(PublishedValue::Range([low, high]));
    }
    Err("expected a number or [low, high] with low <= high".to_owned())
}

/// An expression written as a string or a number.
fn expression(value: &toml::Value) -> Result<Expr, String> {
    let source = match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(x) => x.to_string(),
        other => {
            return Err(format!(
                "expected an expression (string) or a number, found {}",
                other.type_str()
            ));
        }
    };
    Expr::parse(&source)
}

pub(super) fn build_check(
    path: &Path,
    key: &str,
    raw: RawCheck,
    run_names: &[String],
) -> Result<Check, ExperimentError> {
    let fail =
        |field: &str, reason: String| ExperimentError::new(path, format!("{key}.{field}"), reason);
    if let Some(id) = &raw.id
        && !is_plain_name(id)
    {
        return Err(fail("id", format!("{id:?} is not made of letters, digits, '.', '_' and '-'")));
    }
    let op = CompareOp::parse(&raw.op).ok_or_else(|| {
        fail("op", format!("unknown operator {:?}; expected <, <=, >, >=, == or !=", raw.op))
    })?;
    let expr = |field: &str, value: &toml::Value| -> Result<Expr, ExperimentError> {
        let expr = expression(value).map_err(|reason| fail(field, reason))?;
        check_references(path, &format!("{key}.{field}"), expr.references(), run_names)?;
        Ok(expr)
    };
    let left = expr("left", &raw.left)?;
    let right = expr("right", &raw.right)?;
    let level = raw.level.unwrap_or(false);
    if level && raw.id.is_none() {
        return Err(fail("id", "a level check needs an id for rows to name".to_owned()));
    }
    Ok(Check { id: raw.id, what: raw.what, left, op, right, level })
}

pub(super) fn check_references<'a>(
    path: &Path,
    key: &str,
    references: impl IntoIterator<Item = (&'a str, &'a str)>,
    run_names: &[String],
) -> Result<(), ExperimentError> {
    for (run, _metric) in references {
        if !run_names.iter().any(|name| name == run) {
            return Err(ExperimentError::new(
                path,
                key,
                format!("unknown run {run:?}; the runs are {}", run_names.join(", ")),
            ));
        }
    }
    Ok(())
}
