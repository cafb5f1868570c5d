//! What `loom eval` reports: every attempt and every case as JSON
//! (`--json`), JUnit XML (`--junit`), a table on stdout, and the change
//! against an earlier `--json` (`--baseline`). The JSON is documented in
//! docs/eval.md; other harnesses write the same shape.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::checks::CheckResult;

/// The whole result of a suite.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    /// Which runtime ran the suite (`loom`; other harnesses name theirs).
    pub runtime: String,
    pub suite: String,
    /// The model given with `--model`, if one was.
    pub model: Option<String>,
    pub started_at: String,
    pub attempts: Vec<AttemptReport>,
    pub cases: Vec<CaseReport>,
}

/// One attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AttemptReport {
    pub case: String,
    /// 1, 2, … within its case.
    pub attempt: u32,
    pub passed: bool,
    pub status: String,
    pub steps: u32,
    pub model_calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub wall_secs: f64,
    /// The run to open with `loom runs show` (with `--db`).
    pub run_id: Option<String>,
    pub answer: Option<String>,
    pub tools_called: Vec<String>,
    /// Why the run ended without an answer, or could not run.
    pub error: Option<String>,
    pub checks: Vec<CheckResult>,
    /// The kept workspace (`--keep`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// A case over its attempts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CaseReport {
    pub case: String,
    pub passed: u32,
    pub attempts: u32,
    pub pass_rate: f64,
    pub min_pass_rate: f64,
    /// Whether the pass rate reached `min_pass_rate`.
    pub ok: bool,
}

impl AttemptReport {
    /// Why it failed, in a few words: the run's status when it did not
    /// end `DONE`, else the kind of the first failed check.
    pub(crate) fn cause(&self) -> Option<String> {
        if self.passed {
            return None;
        }
        if self.status != "DONE" {
            return Some(format!("status {}", self.status));
        }
        Some(
            self.checks
                .iter()
                .find(|check| !check.passed)
                .map_or_else(|| "failed".to_string(), |check| format!("check {}", check.kind)),
        )
    }
}

impl Report {
    /// The summary table: a line per case, then the totals.
    pub(crate) fn table(&self) -> String {
        let width = self.cases.iter().map(|case| case.case.len()).max().unwrap_or(4).max(4);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$}  {:>6}  {:>5}  {:>7}  {:>8}  {:>8}  result",
            "case", "passed", "rate", "steps", "tokens", "secs"
        );
        for case in &self.cases {
            let attempts: Vec<&AttemptReport> = self.attempts.iter().filter(|a| a.case == case.case).collect();
            let _ = writeln!(
                out,
                "{:<width$}  {:>6}  {:>4.0}%  {:>7.1}  {:>8.0}  {:>8.1}  {}",
                case.case,
                format!("{}/{}", case.passed, case.attempts),
                case.pass_rate * 100.0,
                mean(attempts.iter().map(|a| f64::from(a.steps))),
                mean(attempts.iter().map(|a| (a.prompt_tokens + a.completion_tokens) as f64)),
                mean(attempts.iter().map(|a| a.wall_secs)),
                if case.ok {
                    "ok".to_string()
                } else {
                    format!("BELOW {:.0}%", case.min_pass_rate * 100.0)
                }
            );
        }
        let passed = self.attempts.iter().filter(|a| a.passed).count();
        let total = self.attempts.len();
        let _ = writeln!(
            out,
            "{passed} of {total} attempts passed ({:.0}%); {} of {} cases at their minimum pass rate",
            rate(passed, total) * 100.0,
            self.cases.iter().filter(|c| c.ok).count(),
            self.cases.len()
        );
        let mut causes: BTreeMap<String, usize> = BTreeMap::new();
        for cause in self.attempts.iter().filter_map(AttemptReport::cause) {
            *causes.entry(cause).or_default() += 1;
        }
        if !causes.is_empty() {
            let list: Vec<String> = causes.iter().map(|(cause, n)| format!("{cause} ×{n}")).collect();
            let _ = writeln!(out, "failures: {}", list.join(", "));
        }
        out
    }

    /// The change against `earlier`, case by case (cases in both).
    pub(crate) fn compared_with(&self, earlier: &Report) -> String {
        let mut out = String::from("against the baseline:\n");
        for case in &self.cases {
            let Some(before) = earlier.cases.iter().find(|c| c.case == case.case) else {
                let _ = writeln!(out, "  {}: new", case.case);
                continue;
            };
            let change = (case.pass_rate - before.pass_rate) * 100.0;
            let _ = writeln!(
                out,
                "  {}: {:.0}% → {:.0}% ({})",
                case.case,
                before.pass_rate * 100.0,
                case.pass_rate * 100.0,
                signed_points(change)
            );
        }
        let now = overall(&self.attempts);
        let then = overall(&earlier.attempts);
        let _ = writeln!(
            out,
            "  overall: {:.0}% → {:.0}% ({}); prompt tokens per attempt {:.0} → {:.0}",
            then.0 * 100.0,
            now.0 * 100.0,
            signed_points((now.0 - then.0) * 100.0),
            then.1,
            now.1
        );
        out
    }

    /// JUnit XML: a test suite, a test case per attempt.
    pub(crate) fn junit(&self) -> String {
        let failures = self.attempts.iter().filter(|a| !a.passed).count();
        let time: f64 = self.attempts.iter().map(|a| a.wall_secs).sum();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites><testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" time=\"{time:.3}\">",
            xml(&self.suite),
            self.attempts.len()
        );
        for attempt in &self.attempts {
            let _ = write!(
                out,
                "  <testcase classname=\"{}\" name=\"{} #{}\" time=\"{:.3}\">",
                xml(&self.suite),
                xml(&attempt.case),
                attempt.attempt,
                attempt.wall_secs
            );
            if !attempt.passed {
                let failed: Vec<String> = attempt
                    .checks
                    .iter()
                    .filter(|check| !check.passed)
                    .map(|check| format!("{}: {}", check.check, check.detail.as_deref().unwrap_or("failed")))
                    .collect();
                let mut text = format!("status {}", attempt.status);
                if let Some(error) = &attempt.error {
                    text.push_str(&format!(" ({error})"));
                }
                for line in failed {
                    text.push('\n');
                    text.push_str(&line);
                }
                let _ = write!(
                    out,
                    "<failure message=\"{}\">{}</failure>",
                    xml(&attempt.cause().unwrap_or_default()),
                    xml(&text)
                );
            }
            if let Some(run_id) = &attempt.run_id {
                let _ = write!(out, "<system-out>run {}</system-out>", xml(run_id));
            }
            out.push_str("</testcase>\n");
        }
        out.push_str("</testsuite></testsuites>\n");
        out
    }
}

/// A case's report from its attempts.
pub(crate) fn case_report(case: &str, min_pass_rate: f64, attempts: &[AttemptReport]) -> CaseReport {
    let mine: Vec<&AttemptReport> = attempts.iter().filter(|a| a.case == case).collect();
    let passed = mine.iter().filter(|a| a.passed).count();
    let pass_rate = rate(passed, mine.len());
    CaseReport {
        case: case.to_string(),
        passed: passed as u32,
        attempts: mine.len() as u32,
        pass_rate,
        min_pass_rate,
        // Both are the nearest f64 to the same fraction when the suite
        // writes the rate the counts make (2/3 as 0.6666666666666666).
        ok: pass_rate >= min_pass_rate,
    }
}

/// (pass rate, prompt tokens per attempt).
fn overall(attempts: &[AttemptReport]) -> (f64, f64) {
    let passed = attempts.iter().filter(|a| a.passed).count();
    (
        rate(passed, attempts.len()),
        mean(attempts.iter().map(|a| a.prompt_tokens as f64)),
    )
}

fn rate(passed: usize, total: usize) -> f64 {
    if total == 0 {
        0.0
    } else {
        passed as f64 / total as f64
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(sum, count), value| (sum + value, count + 1));
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

fn signed_points(points: f64) -> String {
    if points.abs() < 0.5 {
        "no change".to_string()
    } else {
        format!("{points:+.0} points")
    }
}

/// Text for an XML attribute or element.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 cannot hold at all.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(case: &str, number: u32, passed: bool) -> AttemptReport {
        AttemptReport {
            case: case.into(),
            attempt: number,
            passed,
            status: if passed { "DONE" } else { "MAX_STEPS" }.into(),
            steps: 2,
            model_calls: 3,
            prompt_tokens: 1000,
            completion_tokens: 50,
            cost_usd: 0.0,
            wall_secs: 1.5,
            run_id: Some("r<1>".into()),
            answer: None,
            tools_called: vec![],
            error: None,
            checks: vec![],
            workspace: None,
        }
    }

    fn report(results: &[(&str, bool)], min: f64) -> Report {
        let attempts: Vec<AttemptReport> = results
            .iter()
            .enumerate()
            .map(|(i, (case, passed))| attempt(case, i as u32 + 1, *passed))
            .collect();
        let mut names: Vec<&str> = results.iter().map(|(case, _)| *case).collect();
        names.dedup();
        Report {
            runtime: "loom".into(),
            suite: "s&s.toml".into(),
            model: None,
            started_at: "now".into(),
            cases: names.iter().map(|name| case_report(name, min, &attempts)).collect(),
            attempts,
        }
    }

    #[test]
    fn pass_rates_the_table_and_the_baseline() {
        let now = report(&[("a", true), ("a", true), ("a", false), ("b", false)], 0.66);
        assert!(now.cases[0].ok, "2 of 3 reaches 0.66");
        let exact = report(&[("a", true), ("a", true), ("a", false)], 2.0 / 3.0);
        assert!(exact.cases[0].ok, "2 of 3 reaches 2/3");
        let above = report(&[("a", true), ("a", true), ("a", false)], 0.67);
        assert!(!above.cases[0].ok, "2 of 3 does not reach 0.67");
        assert!(!now.cases[1].ok);
        let table = now.table();
        assert!(table.contains("2/3"), "{table}");
        assert!(table.contains("BELOW 66%"), "{table}");
        assert!(table.contains("2 of 4 attempts passed (50%)"), "{table}");
        assert!(table.contains("status MAX_STEPS ×2"), "{table}");
        let before = report(&[("a", false), ("b", false)], 0.66);
        let change = now.compared_with(&before);
        assert!(change.contains("a: 0% → 67% (+67 points)"), "{change}");
        assert!(change.contains("b: 0% → 0% (no change)"), "{change}");
    }

    #[test]
    fn junit_is_escaped_and_counts_failures() {
        let xml = report(&[("x<y", true), ("x<y", false)], 1.0).junit();
        assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
        assert!(xml.contains("name=\"x&lt;y #2\""), "{xml}");
        assert!(xml.contains("name=\"s&amp;s.toml\""), "{xml}");
        assert!(xml.contains("<system-out>run r&lt;1&gt;</system-out>"), "{xml}");
        assert_eq!(xml.matches("<failure").count(), 1);
    }
}
