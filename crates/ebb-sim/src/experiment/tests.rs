//! Tests of the expression language, templates, durations and run seeds.

use super::*;

fn metrics() -> RunMetrics {
    let mut runs = RunMetrics::new();
    runs.entry("sata/legacy".into()).or_default().insert("pause_ms_max".into(), 300.0);
    runs.entry("sata/ioless".into()).or_default().insert("pause_ms_mean".into(), 32.0);
    runs.entry("sata/ioless".into()).or_default().insert("pause_ms_stddev".into(), 4.0);
    runs.entry("sata/ioless".into()).or_default().insert("zero".into(), 0.0);
    runs
}

#[test]
fn precedence_and_functions() {
    // Goal: * and / bind tighter than + and -, unary minus, parentheses, min/max/abs.
    let m = metrics();
    let eval = |s: &str| Expr::parse(s).expect(s).eval(&m).expect(s);
    assert_eq!(eval("1 + 2 * 3"), 7.0);
    assert_eq!(eval("(1 + 2) * 3"), 9.0);
    assert_eq!(eval("8 / 4 / 2"), 1.0);
    assert_eq!(eval("-2 - -3"), 1.0);
    assert_eq!(eval("1e-3 * 1000"), 1.0);
    assert_eq!(eval("0.25 * sata/ioless:pause_ms_mean"), 8.0);
    assert_eq!(
        eval("max(sata/legacy:pause_ms_max, 1, 2) / min(4, sata/ioless:pause_ms_stddev)"),
        75.0
    );
    assert_eq!(eval("abs(1 - 3)"), 2.0);
    assert_eq!(eval("sata/legacy:pause_ms_max-sata/ioless:pause_ms_mean"), 268.0);
}

#[test]
fn malformed_expressions_are_refused() {
    // Goal: each mistake gives an error rather than a silent value.
    for bad in [
        "",
        "1 +",
        "(1",
        "1)",
        "foo",
        "sata:x",
        "sata/a:",
        "eval(1)",
        "2x",
        "1 ; 2",
        "abs(1, 2)",
        "max 1",
    ] {
        assert!(Expr::parse(bad).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn evaluation_errors_name_the_cause() {
    // Goal: a missing run, a missing metric and a division by zero are errors.
    let m = metrics();
    let err = |s: &str| Expr::parse(s).expect(s).eval(&m).expect_err(s).0;
    assert!(err("x/y:pause_ms_max").contains("no results for run x/y"));
    assert!(err("sata/legacy:nope").contains("no metric nope"));
    assert!(err("1 / sata/ioless:zero").contains("zero"));
}

#[test]
fn durations() {
    // Goal: the duration units parse to the right numbers (sizes: ebb_core::config::parse_size).
    assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("10").is_err());
    assert!(parse_duration("10h").is_err());
}

#[test]
fn templates_render_values_and_refuse_bad_braces() {
    // Goal: holes are replaced by formatted values; a failing hole shows n/a.
    let m = metrics();
    let t = Template::parse("0 .. {sata/legacy:pause_ms_max} ms, {x/y:z}").expect("parse");
    assert_eq!(t.render(&m), "0 .. 300 ms, n/a");
    assert!(Template::parse("{1").is_err());
    assert!(Template::parse("1}").is_err());
    assert!(Template::parse("{{1}}").is_err());
    assert_eq!(format_number(32.456), "32.5");
    assert_eq!(format_number(1.0345), "1.03");
    assert_eq!(format_number(0.01234), "0.012");
    assert_eq!(format_number(324.4), "324");
}

#[test]
fn run_seeds_depend_on_seed_and_name_only() {
    // Goal: deterministic, distinct per case name and per global seed.
    assert_eq!(run_seed(1, "sata"), run_seed(1, "sata"));
    assert_ne!(run_seed(1, "sata"), run_seed(1, "ssd"));
    assert_ne!(run_seed(1, "sata"), run_seed(2, "sata"));
}

#[test]
fn absurd_sample_intervals_are_refused() {
    // Goal: `sample_interval = "1ns"` ran a machine out of memory; now it names the problem.
    let text = include_str!("../../tests/swarm/fsync-after-brief-outage.toml");
    let with = |interval: &str| {
        let case = format!("time_limit = \"301s\"\nsample_interval = \"{interval}\"");
        Experiment::parse(Path::new("w.toml"), &text.replace("time_limit = \"301s\"", &case))
    };
    with("100ms").expect("the default is fine");
    for (interval, says) in [("1ns", "below the least"), ("100us", "below the least")] {
        let error = with(interval).expect_err(interval).to_string();
        assert!(error.contains("sample_interval") && error.contains(says), "{error}");
    }
    let long = text
        .replace("time_limit = \"301s\"", "time_limit = \"100000s\"\nsample_interval = \"1ms\"");
    let error = Experiment::parse(Path::new("w.toml"), &long).expect_err("1e8 samples").to_string();
    assert!(error.contains("samples per run"), "{error}");
}
