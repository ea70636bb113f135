//! `report.html`: one self-contained page putting each published result beside ours.
//!
//! The page is rendered by minijinja from `report.html` next to this file (compiled in), with
//! auto-escaping on: minijinja turns it on only for template names ending in `.html`, so the
//! template is registered under [`TEMPLATE_NAME`]. Every string from the input (experiment
//! names, table cells, captions, plot paths) is therefore escaped, and a run name containing
//! `<script>` shows as text.
//!
//! Self-contained means the page loads nothing: the CSS is inline, there is no script and no
//! web font. Plots are PNG files referenced by relative path (written beside the page by
//! [`crate::report::plot`]), so the report directory can be copied or zipped as a whole.
//!
//! Layout: title and intro; an overview table of every comparison with a green check or red
//! cross; then one section per experiment with its description, its comparison table, its
//! other tables (numeric cells right-aligned) and its plots with captions.

use std::path::Path;

use minijinja::{Environment, Value, context};
use serde::Serialize;

use crate::experiment::Verdict;
use crate::report::ReportError;
use crate::report::summary::count_verdicts;

/// The name the template is registered under; it must end in `.html` for auto-escaping.
pub const TEMPLATE_NAME: &str = "report.html";

/// The template's source, kept as a file so it reads as HTML.
const TEMPLATE_SOURCE: &str = include_str!("report.html");

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct ReportPage {
    /// Page title and heading.
    pub title: String,
    /// Opening paragraph (plain text; line breaks are kept).
    pub intro: String,
    /// One section per experiment, in this order.
    pub experiments: Vec<ExperimentSection>,
}

/// One experiment's section of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ExperimentSection {
    /// The experiment's name, also its section anchor.
    pub name: String,
    /// What was run and why (plain text; line breaks are kept).
    pub description: String,
    /// Published results checked against ours.
    pub comparisons: Vec<Comparison>,
    /// Further tables, e.g. every metric of every run.
    pub tables: Vec<Table>,
    /// Charts, shown in this order.
    pub plots: Vec<PlotRef>,
    /// The experiment's verdict chart, shown with the others' at the top of the page.
    pub verdict_plot: Option<PlotRef>,
    /// The posting it reproduces (title, author, date), for the overview.
    pub reproduces: String,
    /// ebb's own experiment: its rows are tallied apart from the postings' numbers.
    pub own: bool,
    /// One line for the overview: what was not reproduced and why (or that nothing failed).
    pub shortfall: String,
}

/// A published result beside ours, with the computed verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// What was published, e.g. "reader p99.99 latency, wbt off -> on".
    pub claim: String,
    /// The published figure, e.g. "91 ms -> 22 ms".
    pub published: String,
    /// Our figure, in the same form.
    pub ours: String,
    /// Ours over the published number, formatted; empty when not compared.
    pub ratio: String,
    /// The tolerance (`x2`, `+-3`); empty when not compared.
    pub tolerance: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, when not reproduced.
    pub why: String,
    /// Where the analysis is (a path in the repository), if anywhere.
    pub analysis: Option<String>,
}

/// A table of text cells.
#[derive(Clone, Debug, Serialize)]
pub struct Table {
    /// Shown above the table.
    pub caption: String,
    /// Header cells.
    pub columns: Vec<String>,
    /// Body rows; cells that read as numbers are right-aligned.
    pub rows: Vec<Vec<String>>,
}

/// A chart image.
#[derive(Clone, Debug, Serialize)]
pub struct PlotRef {
    /// Shown under the image and used as its alternative text.
    pub caption: String,
    /// Image path relative to `report.html`, e.g. `ioless-throttling/dirty.png`.
    pub path: String,
}

/// Renders `page` to an HTML string.
pub fn render_html(page: &ReportPage) -> Result<String, ReportError> {
    let template_error =
        |source| ReportError::Template { template: TEMPLATE_NAME.to_owned(), source };
    let mut environment = Environment::new();
    environment.add_filter("anchor", anchor);
    environment.add_filter("numeric", |text: &str| super::text::is_numeric(text));
    environment.add_filter("code_spans", code_spans);
    environment.add_filter("breakable", breakable);
    environment.add_template(TEMPLATE_NAME, TEMPLATE_SOURCE).map_err(template_error)?;
    let template = environment.get_template(TEMPLATE_NAME).map_err(template_error)?;
    let mut html =
        template.render(context! { page => page_value(page) }).map_err(template_error)?;
    if !html.ends_with('\n') {
        html.push('\n');
    }
    Ok(html)
}

/// Renders `page` and writes it to `path` (usually `<out>/report.html`), replacing the file.
pub fn write_html(page: &ReportPage, path: &Path) -> Result<(), ReportError> {
    let html = render_html(page)?;
    std::fs::write(path, html)
        .map_err(|source| ReportError::Write { path: path.to_owned(), source })
}

/// The page as a template value. minijinja is built without its `serde` feature, so the
/// structs are converted field by field; a field missing here would render as empty.
fn page_value(page: &ReportPage) -> Value {
    Value::from_pairs([
        ("title", Value::from(page.title.as_str())),
        ("intro", Value::from(page.intro.as_str())),
        ("experiments", page.experiments.iter().map(experiment_value).collect()),
        (
            "has_comparisons",
            Value::from(page.experiments.iter().any(|e| !e.comparisons.is_empty())),
        ),
        ("verdicts", verdicts_value(comparisons(page, false))),
        ("own_verdicts", verdicts_value(comparisons(page, true))),
        ("posting_rows", Value::from(comparisons(page, false).count())),
        ("own_rows", Value::from(comparisons(page, true).count())),
    ])
}

/// The rows of the postings' experiments (`own` false) or of ebb's own.
fn comparisons(page: &ReportPage, own: bool) -> impl Iterator<Item = &Comparison> {
    page.experiments.iter().filter(move |e| e.own == own).flat_map(|e| &e.comparisons)
}

/// `[{name, count}]` for every verdict, in report order.
fn verdicts_value<'a>(comparisons: impl Iterator<Item = &'a Comparison>) -> Value {
    let counts = count_verdicts(comparisons.map(|comparison| &comparison.verdict));
    Verdict::ALL
        .iter()
        .map(|verdict| {
            Value::from_pairs([
                ("name", Value::from(verdict.name())),
                ("count", Value::from(counts.get(verdict).copied().unwrap_or(0))),
            ])
        })
        .collect()
}

/// The text of a row's why in the table: a reason the row above gives word for word is not
/// repeated (one experiment's 21 rows of a column no case of ours runs share one reason).
fn shown_why<'a>(why: &'a str, above: Option<&str>) -> &'a str {
    if !why.is_empty() && above == Some(why) { "same reason as the row above" } else { why }
}

fn experiment_value(experiment: &ExperimentSection) -> Value {
    let above = |index: usize| index.checked_sub(1).map(|i| experiment.comparisons[i].why.as_str());
    let comparisons = experiment.comparisons.iter().enumerate().map(|(index, comparison)| {
        Value::from_pairs([
            ("claim", Value::from(comparison.claim.as_str())),
            ("published", Value::from(comparison.published.as_str())),
            ("ours", Value::from(comparison.ours.as_str())),
            ("ratio", Value::from(comparison.ratio.as_str())),
            ("tolerance", Value::from(comparison.tolerance.as_str())),
            ("verdict", Value::from(comparison.verdict.name())),
            ("why", Value::from(shown_why(&comparison.why, above(index)))),
            ("analysis", Value::from(comparison.analysis.clone().unwrap_or_default())),
        ])
    });
    let tables = experiment.tables.iter().map(|table| {
        let rows = table.rows.iter().map(|row| strings_value(row));
        Value::from_pairs([
            ("caption", Value::from(table.caption.as_str())),
            ("columns", strings_value(&table.columns)),
            ("rows", rows.collect()),
        ])
    });
    let plots = experiment.plots.iter().map(|plot| {
        Value::from_pairs([
            ("caption", Value::from(plot.caption.as_str())),
            ("path", Value::from(plot.path.as_str())),
        ])
    });
    Value::from_pairs([
        ("name", Value::from(experiment.name.as_str())),
        ("description", Value::from(experiment.description.as_str())),
        ("comparisons", comparisons.collect()),
        ("tables", tables.collect()),
        ("plots", plots.collect()),
        ("reproduces", Value::from(experiment.reproduces.as_str())),
        ("own", Value::from(experiment.own)),
        ("shortfall", Value::from(experiment.shortfall.as_str())),
        ("verdict_counts", {
            let counts = count_verdicts(experiment.comparisons.iter().map(|c| &c.verdict));
            Verdict::ALL.iter().map(|v| counts.get(v).copied().unwrap_or(0)).collect()
        }),
        (
            "verdict_plot",
            experiment.verdict_plot.as_ref().map_or(Value::from(()), |plot| {
                Value::from_pairs([
                    ("caption", Value::from(plot.caption.as_str())),
                    ("path", Value::from(plot.path.as_str())),
                ])
            }),
        ),
    ])
}

fn strings_value(strings: &[String]) -> Value {
    strings.iter().map(String::as_str).collect()
}

/// `text` escaped, with each `` `span` `` (Markdown's inline code, as the experiment files
/// write names) set as `<code>span</code>`; an unpaired backtick stays as it is.
fn code_spans(text: &str) -> Value {
    let parts: Vec<&str> = text.split('`').collect();
    let mut html = String::with_capacity(text.len() + 16);
    for (index, part) in parts.iter().enumerate() {
        let escaped = minijinja::HtmlEscape(part).to_string();
        let closed = index + 1 < parts.len();
        match (index % 2, closed) {
            (1, true) => html.push_str(&format!("<code>{escaped}</code>")),
            (1, false) => html.push_str(&format!("`{escaped}")),
            _ => html.push_str(&escaped),
        }
    }
    Value::from_safe_string(html)
}

/// `text` escaped, with a line-break opportunity (`<wbr>`) after each `_` and `/`, so that
/// metric names (`direct_reclaim_pages_written`) and run names (`case/variant`) wrap in a
/// narrow column instead of widening the table past the page.
fn breakable(text: &str) -> Value {
    let escaped = minijinja::HtmlEscape(text).to_string();
    Value::from_safe_string(escaped.replace('_', "_<wbr>").replace("&#x2f;", "&#x2f;<wbr>"))
}

/// A fragment identifier for a section: lowercase ASCII letters and digits, other runs of
/// characters replaced by one `-`.
fn anchor(name: &str) -> String {
    let mut id = String::with_capacity(name.len());
    for character in name.chars() {
        if character.is_ascii_alphanumeric() {
            id.push(character.to_ascii_lowercase());
        } else if !id.ends_with('-') {
            id.push('-');
        }
    }
    let id = id.trim_matches('-');
    if id.is_empty() { "experiment".to_owned() } else { format!("experiment-{id}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_repeated_word_for_word_is_shown_once() {
        assert_eq!(shown_why("no case runs 16X", None), "no case runs 16X");
        assert_eq!(
            shown_why("no case runs 16X", Some("no case runs 16X")),
            "same reason as the row above"
        );
        assert_eq!(shown_why("other", Some("no case runs 16X")), "other");
        assert_eq!(shown_why("", Some("")), "");
    }

    fn example() -> ReportPage {
        ReportPage {
            title: "ebb: published results reproduced".to_owned(),
            intro: "Device models are ours.\nDirections must hold.".to_owned(),
            experiments: vec![
                ExperimentSection {
                    name: "wbt-read-latency".to_owned(),
                    description: "A random reader beside a streaming writer.".to_owned(),
                    comparisons: vec![
                        Comparison {
                            claim: "reader p99.99, wbt off -> on".to_owned(),
                            published: "91 ms -> 22 ms".to_owned(),
                            ours: "80 ms -> 9 ms".to_owned(),
                            ratio: "2.2".to_owned(),
                            tolerance: "x2".to_owned(),
                            verdict: Verdict::DirectionOnly,
                            why: "size outside x2".to_owned(),
                            analysis: Some("docs/wbt.md#tail".to_owned()),
                        },
                        Comparison {
                            claim: "write throughput".to_owned(),
                            published: "+4%".to_owned(),
                            ours: "-7%".to_owned(),
                            ratio: String::new(),
                            tolerance: "+-3".to_owned(),
                            verdict: Verdict::NotReproduced,
                            why: "opposite direction".to_owned(),
                            analysis: None,
                        },
                    ],
                    tables: vec![Table {
                        caption: "All metrics".to_owned(),
                        columns: vec!["run".to_owned(), "read_lat_us_p99_99".to_owned()],
                        rows: vec![
                            vec!["laptop-ssd/wbt-on".to_owned(), "9000".to_owned()],
                            vec!["laptop-ssd/wbt-off".to_owned(), "80000".to_owned()],
                        ],
                    }],
                    plots: vec![
                        PlotRef {
                            caption: "Read latency over time".to_owned(),
                            path: "wbt-read-latency/read-latency.png".to_owned(),
                        },
                        PlotRef {
                            caption: "In-flight background writes".to_owned(),
                            path: "wbt-read-latency/inflight.png".to_owned(),
                        },
                    ],
                    verdict_plot: None,
                    reproduces: String::new(),
                    own: false,
                    shortfall: String::new(),
                },
                ExperimentSection {
                    name: "<script>alert(1)</script>".to_owned(),
                    description: "a & b < c".to_owned(),
                    comparisons: Vec::new(),
                    tables: Vec::new(),
                    plots: vec![PlotRef {
                        caption: "\"quoted\" caption".to_owned(),
                        path: "x/\"><script>.png".to_owned(),
                    }],
                    verdict_plot: None,
                    reproduces: String::new(),
                    own: false,
                    shortfall: String::new(),
                },
            ],
        }
    }

    #[test]
    fn names_are_escaped() {
        // Goal: markup in any input string is shown as text, never interpreted; the only
        // <script> would come from the input, since the template has none.
        let html = render_html(&example()).expect("render");
        assert!(!html.contains("<script>"), "unescaped script tag");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"));
        assert!(html.contains("a &amp; b &lt; c"));
        assert!(html.contains("&quot;quoted&quot; caption"));
        assert!(html.contains("id=\"experiment-script-alert-1-script\""));
    }

    #[test]
    fn every_plot_and_comparison_appears() {
        // Goal: each PlotRef becomes an <img> with its (escaped) path and a caption, and each
        // comparison shows its mark in the experiment table and the overview.
        let page = example();
        let html = render_html(&page).expect("render");
        for plot in page.experiments.iter().flat_map(|e| &e.plots) {
            let escaped = plot
                .path
                .replace('&', "&amp;")
                .replace('"', "&quot;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('/', "&#x2f;");
            assert!(html.contains(&format!("<img src=\"{escaped}\"")), "missing {}", plot.path);
        }
        assert_eq!(html.matches("<img ").count(), 3);
        assert_eq!(html.matches("<figcaption>").count(), 3);
        assert!(html.contains("<figcaption>Read latency over time</figcaption>"));
        assert_eq!(html.matches("class=\"verdict direction-only\"").count(), 1);
        assert_eq!(html.matches("class=\"verdict not-reproduced\"").count(), 1);
        assert!(html.contains("<li><b>1</b> direction-only</li>"), "counts at the top");
        assert!(html.contains("<li><b>0</b> reproduced</li>"), "zero counts are shown");
        assert!(html.contains("<td class=\"num\">80000</td>"));
        assert!(html.contains("<td>laptop-ssd&#x2f;<wbr>wbt-off</td>"));
        assert!(html.contains("<th>read_<wbr>lat_<wbr>us_<wbr>p99_<wbr>99</th>"));
        let mut no_comparisons = page.clone();
        no_comparisons.experiments.iter_mut().for_each(|e| e.comparisons.clear());
        let html = render_html(&no_comparisons).expect("render");
        assert!(!html.contains("class=\"overview\""), "empty overview table");
    }

    #[test]
    fn the_overview_says_what_failed_and_why_before_the_charts() {
        // Goal: the top of the page has, per experiment, its one-line shortfall, above the
        // verdict charts; Markdown code spans in intro and descriptions become <code>.
        let mut page = example();
        page.experiments[0].shortfall = "1 not reproduced: opposite direction".to_owned();
        page.experiments[0].description = "Knob `dirty_ratio` & an odd ` tick".to_owned();
        page.intro = "Run `ebb reproduce`.".to_owned();
        let html = render_html(&page).expect("render");
        let overview = html.find("class=\"overview\"").expect("overview");
        let shortfall = html.find("1 not reproduced: opposite direction").expect("shortfall");
        let charts = html.find("class=\"verdict-help\"").expect("charts");
        assert!(overview < shortfall && shortfall < charts, "order");
        assert!(html.contains("Run <code>ebb reproduce</code>."), "intro");
        assert!(html.contains("Knob <code>dirty_ratio</code> &amp; an odd ` tick"), "description");
        assert!(!code_spans("a `<b>` c").to_string().contains("<b>"), "escaped inside code");
    }

    #[test]
    fn page_is_self_contained() {
        // Goal: the page loads nothing from elsewhere: no external stylesheet, script, font or
        // image (links to the postings' archives are followed only when clicked).
        let html = render_html(&example()).expect("render");
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<style>"));
        for forbidden in ["<link", "<script", "@import", "url(", "src=\"http"] {
            assert!(!html.contains(forbidden), "page contains {forbidden}");
        }
    }

    #[test]
    fn write_html_writes_the_file() {
        // Goal: write_html puts the rendered page at the path, and reports the path on failure.
        let dir = crate::report::test_dir("html-write");
        let path = dir.join("report.html");
        write_html(&example(), &path).expect("write");
        let written = std::fs::read_to_string(&path).expect("read back");
        assert_eq!(written, render_html(&example()).expect("render"));
        let bad = dir.join("missing-dir").join("report.html");
        let error = write_html(&example(), &bad).expect_err("missing directory");
        assert!(error.to_string().contains("missing-dir"), "{error}");
    }
}
