//! One experiment's part of the report: its summary.json, the charts of its cases and runs,
//! the evaluated checks and published rows, and its section of report.html.

use super::*;

/// Writes one experiment's summary and charts, evaluates it, and builds its report section.
/// `seeds[i]` are the runs of global seed `global_seeds[i]`; the charts are the first seed's.
pub(super) fn report_experiment(
    experiment: &Experiment,
    seeds: &[Vec<(&RunSpec, RunResult)>],
    global_seeds: &[u64],
    options: &Options,
) -> Result<(ExperimentOutcome, ExperimentSection), ReproduceError> {
    let experiment_dir = options.out_dir.join(&experiment.name);
    let runs = &seeds[0];
    let (metrics_by_seed, metrics, mut summary) =
        summarize_runs(experiment, seeds, global_seeds, options.quick);
    let checks = experiment.evaluate_checks_seeds(&metrics_by_seed);
    let published = experiment.evaluate_published_seeds(&metrics_by_seed, &metrics, &checks);
    summary.published = published.iter().map(published_summary).collect();
    summary.verdicts = count_verdicts(published.iter().map(|row| &row.verdict));
    let summary_path = experiment_dir.join("summary.json");
    summary.write_json(&summary_path)?;

    let mut plots = case_plots(experiment, runs, &experiment_dir)?;
    let verdict_plot = match compare_charts::verdict_chart(&experiment.name, &published) {
        Some(chart) => {
            render_png(&chart, &experiment_dir.join("verdicts.png"), 640, 340)?;
            Some(PlotRef {
                caption: chart.title.clone(),
                path: format!("{}/verdicts.png", experiment.name),
            })
        }
        None => None,
    };
    plots.extend(run_plots(experiment, runs, &experiment_dir)?);
    let section = ExperimentSection {
        name: experiment.name.clone(),
        description: format!(
            "{}\n{}\nReproduces: {}",
            experiment.title,
            experiment.description.trim(),
            experiment.reproduces
        ),
        comparisons: published.iter().map(comparison).collect(),
        tables: metrics_tables(experiment, &metrics)
            .into_iter()
            .chain([checks_table(&checks)])
            .collect(),
        plots,
        verdict_plot,
        reproduces: experiment.reproduces.clone(),
        own: experiment.own,
        shortfall: shortfall(&published),
    };
    let outcome = ExperimentOutcome {
        name: experiment.name.clone(),
        title: experiment.title.clone(),
        own: experiment.own,
        summary_path,
        metrics,
        checks,
        published,
    };
    Ok((outcome, section))
}

/// Each seed's runs' finite metrics (undefined ones, NaN, are left out, as summary.json
/// requires), their means over the seeds (each metric over the seeds that measured it), and the
/// summary of the runs, whose published rows and verdicts are filled in later.
fn summarize_runs(
    experiment: &Experiment,
    seeds: &[Vec<(&RunSpec, RunResult)>],
    global_seeds: &[u64],
    quick: bool,
) -> (Vec<RunMetrics>, RunMetrics, Summary) {
    let metrics_by_seed: Vec<RunMetrics> = seeds
        .iter()
        .map(|runs| {
            runs.iter()
                .map(|(spec, result)| {
                    let finite: BTreeMap<String, f64> = result
                        .metrics
                        .iter()
                        .filter(|(_, value)| value.is_finite())
                        .map(|(name, value)| (name.clone(), *value))
                        .collect();
                    (spec.name.clone(), finite)
                })
                .collect()
        })
        .collect();
    let mut metrics = RunMetrics::new();
    let mut summary = Summary {
        experiment: experiment.name.clone(),
        origin: if experiment.own { "ebb" } else { "posting" }.to_owned(),
        quick,
        seeds: global_seeds.to_vec(),
        runs: Vec::new(),
        published: Vec::new(),
        verdicts: BTreeMap::new(),
    };
    for (spec, _) in &seeds[0] {
        let per_seed: Vec<BTreeMap<String, f64>> = metrics_by_seed
            .iter()
            .map(|seed| seed.get(&spec.name).cloned().unwrap_or_default())
            .collect();
        let mean = mean_metrics(&per_seed);
        metrics.insert(spec.name.clone(), mean.clone());
        summary.runs.push(RunSummary {
            name: spec.name.clone(),
            config: config_json(experiment, spec, quick),
            metrics: mean,
            metrics_by_seed: if per_seed.len() > 1 { per_seed } else { Vec::new() },
        });
    }
    (metrics_by_seed, metrics, summary)
}

/// Each metric's mean over the seeds that measured it (one seed: its metrics, unchanged).
fn mean_metrics(per_seed: &[BTreeMap<String, f64>]) -> BTreeMap<String, f64> {
    if let [one] = per_seed {
        return one.clone();
    }
    let mut sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for (name, value) in per_seed.iter().flatten() {
        let entry = sums.entry(name.clone()).or_default();
        entry.0 += value;
        entry.1 += 1;
    }
    sums.into_iter().map(|(name, (sum, count))| (name, sum / f64::from(count))).collect()
}

/// Each run's charts, drawn into its directory under `experiment_dir`.
fn run_plots(
    experiment: &Experiment,
    runs: &[(&RunSpec, RunResult)],
    experiment_dir: &Path,
) -> Result<Vec<PlotRef>, ReproduceError> {
    let mut plots = Vec::new();
    for (spec, result) in runs {
        let run_dir = experiment_dir.join(&spec.name);
        create_dir(&run_dir)?;
        for (file, chart) in charts(result, spec.config.throttle) {
            render_png(&chart, &run_dir.join(file), CHART_WIDTH, CHART_HEIGHT)?;
            plots.push(PlotRef {
                caption: chart.title.clone(),
                path: format!("{}/{}/{file}", experiment.name, spec.name),
            });
        }
    }
    Ok(plots)
}

/// A published row as the report's comparison table shows it.
fn comparison(row: &PublishedOutcome) -> Comparison {
    Comparison {
        claim: row.claim.clone(),
        published: row.published.clone(),
        ours: row.ours.clone(),
        ratio: row.ratio.map_or(String::new(), format_number),
        tolerance: row.tolerance.clone(),
        verdict: row.verdict,
        why: row.why.clone(),
        analysis: row.analysis.clone(),
    }
}

fn published_summary(row: &PublishedOutcome) -> PublishedSummary {
    PublishedSummary {
        claim: row.claim.clone(),
        published: row.published.clone(),
        line: row.line.clone(),
        ours: row.ours.clone(),
        published_value: row.value,
        ours_value: row.ours_value,
        ours_values: row.ours_values.clone(),
        ratio: row.ratio,
        tolerance: row.tolerance.clone(),
        kind: row
            .rule
            .map(|rule| if rule.neutral.is_some() { "change" } else { "level" }.to_owned()),
        neutral: row.rule.and_then(|rule| rule.neutral),
        noise: row.rule.and_then(|rule| rule.noise),
        checks: row.checks.clone(),
        failed_checks: row.failed_checks.clone(),
        verdict: row.verdict,
        why: row.why.clone(),
        analysis: row.analysis.clone(),
    }
}

/// The charts comparing the variants of each case (read-latency distributions with the
/// posting's points, pause distributions), written under `<experiment>/<case>/`.
fn case_plots(
    experiment: &Experiment,
    runs: &[(&RunSpec, RunResult)],
    experiment_dir: &Path,
) -> Result<Vec<PlotRef>, ReproduceError> {
    let mut plots = Vec::new();
    for case in &experiment.cases {
        let prefix = format!("{}/", case.name);
        let case_runs: Vec<(&str, &RunResult)> = runs
            .iter()
            .filter_map(|(spec, result)| spec.name.strip_prefix(&prefix).map(|v| (v, result)))
            .collect();
        let references: Vec<&crate::experiment::Reference> =
            experiment.references.iter().filter(|r| r.run.starts_with(&prefix)).collect();
        let charts = [
            (
                "read-latency.png",
                compare_charts::latency_cdf_chart(&case.name, &case_runs, &references),
            ),
            ("pauses-hist.png", compare_charts::pause_histogram_chart(&case.name, &case_runs)),
            (
                "writepages-hist.png",
                compare_charts::writepages_histogram_chart(&case.name, &case_runs),
            ),
        ];
        for (file, chart) in charts {
            let Some(chart) = chart else { continue };
            let dir = experiment_dir.join(&case.name);
            create_dir(&dir)?;
            render_png(&chart, &dir.join(file), CHART_WIDTH, CHART_HEIGHT)?;
            plots.push(PlotRef {
                caption: chart.title.clone(),
                path: format!("{}/{}/{file}", experiment.name, case.name),
            });
        }
    }
    Ok(plots)
}

/// The metrics table: one row per run, key metrics and every metric the checks read.
/// One line for the report's overview: how many rows were not reproduced and the reason most
/// of them share (the experiment file's explanation, else the computed reason), in its first
/// sentence; or what held when none failed.
fn shortfall(rows: &[PublishedOutcome]) -> String {
    let missed: Vec<&PublishedOutcome> =
        rows.iter().filter(|row| row.verdict == Verdict::NotReproduced).collect();
    if missed.is_empty() {
        let partly = rows.iter().filter(|row| row.verdict == Verdict::DirectionOnly).count();
        let compared = rows.iter().filter(|row| row.verdict != Verdict::NotCompared).count();
        return match (compared, partly) {
            (0, _) => "nothing compared: no number of the posting has a case of ours".to_owned(),
            (_, 0) => "every compared number reproduced".to_owned(),
            (_, n) => format!("none contradicted; {n} reproduced in direction only"),
        };
    }
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for row in &missed {
        let reason = first_sentence(row.explanation.as_deref().unwrap_or(&row.why));
        match reasons.iter_mut().find(|(known, _)| *known == reason) {
            Some(entry) => entry.1 += 1,
            None => reasons.push((reason, 1)),
        }
    }
    // The most common reason; the first of equals.
    let (reason, count) = reasons
        .iter()
        .fold(None::<&(String, usize)>, |best, entry| match best {
            Some(best) if best.1 >= entry.1 => Some(best),
            _ => Some(entry),
        })
        .map_or((String::new(), 0), |(reason, count)| (reason.clone(), *count));
    match (missed.len(), count) {
        (1, _) => format!("1 not reproduced: {reason}"),
        (all, count) if count == all => format!("{all} not reproduced, all because: {reason}"),
        (all, count) => format!("{all} not reproduced; {count} of them because: {reason}"),
    }
}

/// The first sentence of `text` (up to a full stop followed by a space), at most
/// [`SHORTFALL_CHARS_MAX`] characters (cut at a word, with an ellipsis).
fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let sentence = text.find(". ").map_or(text, |end| &text[..end]).trim_end_matches('.');
    if sentence.chars().count() <= SHORTFALL_CHARS_MAX {
        return sentence.to_owned();
    }
    let cut: String = sentence.chars().take(SHORTFALL_CHARS_MAX).collect();
    let cut = cut.rsplit_once(' ').map_or(cut.as_str(), |(head, _)| head);
    format!("{cut}...")
}

/// The longest reason the overview shows, in characters (two lines of its column at 1400 px).
const SHORTFALL_CHARS_MAX: usize = 160;

/// Metric columns per "Key metrics per run" table: with names wrapping at their underscores,
/// eight numbers and the run name fit the page's 72rem at 1400 px (the single table of up to
/// 20 metrics was 1.5 to 2.7 times as wide and scrolled sideways).
const METRICS_PER_TABLE: usize = 8;

/// The key metrics of every run, split into tables of at most [`METRICS_PER_TABLE`] metrics.
fn metrics_tables(experiment: &Experiment, metrics: &RunMetrics) -> Vec<Table> {
    let table = metrics_table(experiment, metrics);
    let names = &table.columns[1..];
    let parts = names.len().div_ceil(METRICS_PER_TABLE).max(1);
    (0..parts)
        .map(|part| {
            let range = part * METRICS_PER_TABLE + 1
                ..((part + 1) * METRICS_PER_TABLE + 1).min(table.columns.len());
            let pick = |row: &Vec<String>| {
                let mut cells = vec![row[0].clone()];
                cells.extend(row[range.clone()].iter().cloned());
                cells
            };
            Table {
                caption: if parts == 1 {
                    table.caption.clone()
                } else {
                    format!("{} ({} of {parts})", table.caption, part + 1)
                },
                columns: pick(&table.columns),
                rows: table.rows.iter().map(pick).collect(),
            }
        })
        .collect()
}

fn metrics_table(experiment: &Experiment, metrics: &RunMetrics) -> Table {
    let mut names: Vec<&str> = KEY_METRICS.to_vec();
    let referenced = experiment
        .checks
        .iter()
        .flat_map(|check| check.left.references().into_iter().chain(check.right.references()))
        .chain(experiment.published.iter().flat_map(|row| row.ours.references()));
    for (_, metric) in referenced {
        if !names.contains(&metric) {
            names.push(metric);
        }
    }
    names.retain(|name| metrics.values().any(|run| run.contains_key(*name)));
    let mut columns = vec!["run".to_owned()];
    columns.extend(names.iter().map(|name| (*name).to_owned()));
    let rows = metrics
        .iter()
        .map(|(run, values)| {
            let mut row = vec![run.clone()];
            row.extend(
                names
                    .iter()
                    .map(|name| values.get(*name).map_or(String::new(), |v| format_number(*v))),
            );
            row
        })
        .collect();
    Table { caption: "Key metrics per run".to_owned(), columns, rows }
}

fn checks_table(checks: &[CheckOutcome]) -> Table {
    let rows = checks
        .iter()
        .map(|check| {
            vec![
                check.what.clone(),
                check.expression.clone(),
                check.values(),
                match (check.pass, check.level) {
                    (true, _) => "pass",
                    (false, false) => "FAIL",
                    (false, true) => "off (level check: rows naming it are not reproduced)",
                }
                .to_owned(),
            ]
        })
        .collect();
    Table {
        caption: "What must hold".to_owned(),
        columns: ["check", "expression", "values", "result"].map(str::to_owned).to_vec(),
        rows,
    }
}

/// The knobs of a run that matter, for `summary.json`.
fn config_json(experiment: &Experiment, spec: &RunSpec, quick: bool) -> Value {
    let config: &Config = &spec.config;
    let backends: Vec<Value> = config
        .backends
        .iter()
        .zip(&spec.devices)
        .map(|(backend, device)| {
            json!({
                "name": backend.name,
                "device": device.model,
                "device_overrides": serde_json::to_value(&device.overrides).unwrap_or(Value::Null),
                "min_ratio": backend.min_ratio,
                "max_ratio": backend.max_ratio,
                "strict_limit": backend.strict_limit,
                "queue_depth": backend.queue_depth,
                "max_write_pages": backend.max_write_pages,
                "rotational": backend.rotational,
                "write_cache": backend.write_cache,
                "wbt": backend.wbt.name(),
                "wbt_lat_usec": backend.wbt_target_usec(),
                "wbt_window_usec": backend.wbt_window_usec,
            })
        })
        .collect();
    let workloads: Vec<Value> = spec
        .workloads
        .iter()
        .map(|workload| match workload {
            Workload::Dd { backend, size_bytes, bs_bytes, start, fsync, think, .. } => json!({
                "kind": "dd",
                "backend": config.backends[*backend].name,
                "size_bytes": size_bytes,
                "bs_bytes": bs_bytes,
                "start_s": start.as_secs_f64(),
                "fsync": fsync,
                "think_s": think.as_secs_f64(),
            }),
            Workload::Cp { backend, size_bytes, bs_bytes, start } => json!({
                "kind": "cp",
                "backend": config.backends[*backend].name,
                "size_bytes": size_bytes,
                "bs_bytes": bs_bytes,
                "start_s": start.as_secs_f64(),
            }),
            Workload::RandomReader { backend, size_bytes, bs_bytes, start } => json!({
                "kind": "randread",
                "backend": config.backends[*backend].name,
                "size_bytes": size_bytes,
                "bs_bytes": bs_bytes,
                "start_s": start.as_secs_f64(),
            }),
            Workload::Memory(memory) => memory.to_json(config),
        })
        .collect();
    json!({
        "compare": experiment.compare.name,
        "memory_bytes": config.memory_bytes,
        "hz": config.hz,
        "nr_cpus": config.nr_cpus,
        "dirty_ratio": config.dirty_ratio,
        "dirty_bytes": config.dirty_bytes,
        "dirty_background_ratio": config.dirty_background_ratio,
        "dirty_background_bytes": config.dirty_background_bytes,
        "dirty_expire_centisecs": config.dirty_expire_centisecs,
        "dirty_writeback_centisecs": config.dirty_writeback_centisecs,
        "throttle": config.throttle.name(),
        "reclaim": config.reclaim.name(),
        "swap_backend": config.swap_backend.map(|b| config.backends[b].name.clone()),
        "unstable_accounting": config.unstable_accounting.name(),
        "backends": backends,
        "workloads": workloads,
        "seed": spec.seed,
        "quick": quick,
        "time_limit_s": spec.time_limit.as_secs_f64(),
        "steady_from_s": spec.steady_from.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(verdict: Verdict, why: &str, explanation: Option<&str>) -> PublishedOutcome {
        PublishedOutcome {
            claim: "c".to_owned(),
            published: String::new(),
            line: None,
            ours: String::new(),
            value: None,
            ours_value: None,
            ours_values: Vec::new(),
            ratio: None,
            tolerance: String::new(),
            rule: None,
            checks: Vec::new(),
            failed_checks: Vec::new(),
            verdict,
            why: why.to_owned(),
            explanation: explanation.map(str::to_owned),
            analysis: None,
        }
    }

    #[test]
    fn the_shortfall_names_the_commonest_reason_in_one_sentence() {
        // Goal: the overview's line counts what failed and gives the reason most rows share,
        // the file's explanation before the computed one, cut to its first sentence.
        let model = "An absolute figure: ours is a model. The box differs.";
        let rows = [
            row(Verdict::NotReproduced, "outside x2: ours is 3x. X.", Some("A counter is free.")),
            row(Verdict::NotReproduced, "outside x2: ours is 9x", Some(model)),
            row(Verdict::NotReproduced, "outside x2: ours is 7x", Some(model)),
            row(Verdict::Reproduced, "", None),
        ];
        assert_eq!(
            shortfall(&rows),
            "3 not reproduced; 2 of them because: An absolute figure: ours is a model"
        );
        assert_eq!(shortfall(&rows[1..2]), "1 not reproduced: An absolute figure: ours is a model");
        let computed = [row(Verdict::NotReproduced, "opposite direction. More.", None)];
        assert_eq!(shortfall(&computed), "1 not reproduced: opposite direction");
        assert_eq!(shortfall(&rows[3..]), "every compared number reproduced");
        let none = [row(Verdict::NotCompared, "the posting gives no number", None)];
        assert!(shortfall(&none).starts_with("nothing compared"));
        let long = "word ".repeat(100);
        let cut = first_sentence(&long);
        assert!(
            cut.chars().count() <= SHORTFALL_CHARS_MAX + 3 && cut.ends_with("word..."),
            "{cut}"
        );
    }
}
