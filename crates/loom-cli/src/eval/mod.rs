//! `loom eval SUITE`: runs every case of a suite (docs/eval.md) against a
//! model, `--repeat` times each, `-j` attempts at once, judges each
//! attempt by the case's checks, and reports a table, JSON and JUnit XML.
//! It exits 1 when a case's pass rate falls below its `min_pass_rate`.

mod attempt;
mod checks;
mod report;
mod suite;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use futures_util::stream::{self, StreamExt};

use crate::cli::EvalArgs;
use crate::exit::{self, Failure};
use attempt::Bench;
use report::{case_report, AttemptReport, Report};
use suite::{Case, Suite};

pub(crate) async fn eval(args: EvalArgs) -> Result<ExitCode, Failure> {
    let mut suite = Suite::load(&args.suite).map_err(Failure::Usage)?;
    if !args.case.is_empty() {
        if let Some(unknown) = args
            .case
            .iter()
            .find(|name| !suite.cases.iter().any(|c| &c.name == *name))
        {
            return Err(Failure::Usage(anyhow!("the suite has no case '{unknown}'")));
        }
        suite.cases.retain(|case| args.case.contains(&case.name));
    }
    let baseline = match &args.baseline {
        Some(path) => Some(read_report(path).map_err(Failure::Usage)?),
        None => None,
    };
    let bench = Arc::new(bench(&args).await.map_err(Failure::Usage)?);
    let started_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();

    let planned: Vec<(Arc<Case>, u32)> = suite
        .cases
        .iter()
        .cloned()
        .map(Arc::new)
        .flat_map(|case| (1..=args.repeat).map(move |number| (case.clone(), number)))
        .collect();
    let total = planned.len();
    say!(
        "loom eval: {} cases × {} = {total} attempts, {} at a time; runs recorded in {}",
        suite.cases.len(),
        args.repeat,
        args.jobs,
        bench.db.display()
    );
    let mut finished = 0usize;
    let mut attempts: Vec<AttemptReport> = Vec::with_capacity(total);
    let mut results = stream::iter(planned)
        .map(|(case, number)| {
            let bench = bench.clone();
            async move { (run_attempt(&bench, &case, number).await, case, number) }
        })
        .buffer_unordered(usize::try_from(args.jobs).unwrap_or(1));
    while let Some((report, case, number)) = results.next().await {
        finished += 1;
        // One attempt that could not run (a workspace that would not copy,
        // say) is a failed attempt; the others' results are kept.
        let report = report.unwrap_or_else(|err| could_not_run(&case.name, number, &err));
        say!(
            "[{finished}/{total}] {} #{number}: {} ({}, {} steps, {:.0} s){}",
            case.name,
            if report.passed { "pass" } else { "FAIL" },
            report.status,
            report.steps,
            report.wall_secs,
            report.cause().map(|cause| format!(" — {cause}")).unwrap_or_default()
        );
        attempts.push(report);
    }
    // The order of the suite, whatever order the attempts finished in.
    let order = |name: &str| suite.cases.iter().position(|case| case.name == name);
    attempts.sort_by_key(|a| (order(&a.case), a.attempt));
    let cases = suite
        .cases
        .iter()
        .map(|case| case_report(&case.name, case.min_pass_rate, &attempts))
        .collect::<Vec<_>>();
    let report = Report {
        runtime: "loom".to_string(),
        suite: args.suite.display().to_string(),
        model: args.model.clone(),
        started_at,
        attempts,
        cases,
    };
    print!("{}", report.table());
    if let Some(earlier) = &baseline {
        print!("{}", report.compared_with(earlier));
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|err| Failure::Runtime(err.into()))?;
        write(path, &text).map_err(Failure::Runtime)?;
    }
    if let Some(path) = &args.junit {
        write(path, &report.junit()).map_err(Failure::Runtime)?;
    }
    Ok(if report.cases.iter().all(|case| case.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::ERROR)
    })
}

/// What every attempt shares: the configuration (read and trusted once),
/// the model, where runs are recorded.
async fn bench(args: &EvalArgs) -> anyhow::Result<Bench> {
    let loaded = crate::config::load(args.config.as_deref())?;
    for note in &loaded.notes {
        say!("loom: note: {note}");
    }
    let (loaded, trusted) =
        tokio::task::spawn_blocking(move || crate::trust::require(&loaded, true).map(|t| (loaded, t)))
            .await
            .map_err(|err| anyhow!("the trust check failed: {err}"))??;
    if let Some(trusted) = trusted {
        crate::trust_records::audit(trusted).await;
    }
    let db = match &args.db {
        Some(db) => db.clone(),
        None => {
            let here = std::env::current_dir().context("cannot read the current directory")?;
            tokio::task::spawn_blocking(move || crate::state::workspace_dir(&here))
                .await
                .map_err(|err| anyhow!("finding the state directory failed: {err}"))??
                .join("eval.db")
        }
    };
    if let Some(keep) = &args.keep {
        std::fs::create_dir_all(keep).with_context(|| format!("cannot create {}", keep.display()))?;
    }
    Ok(Bench {
        loaded,
        model: args.model.clone(),
        base_url: args.base_url.clone(),
        db,
        keep: args.keep.clone(),
    })
}

async fn run_attempt(bench: &Bench, case: &Case, number: u32) -> anyhow::Result<AttemptReport> {
    let done = attempt::attempt(bench, case, number).await?;
    let verdicts = checks::judge(&case.checks, done.workspace.path(), &done.ran).await;
    let ran = done.ran;
    // A run must end DONE, unless the case says how it must end (a
    // `status` check): a run that stopped may still have left the files.
    let judges_status = case.checks.iter().any(|check| matches!(check, suite::Check::Status(_)));
    let passed = verdicts.iter().all(|verdict| verdict.passed) && (judges_status || ran.status == "DONE");
    Ok(AttemptReport {
        case: case.name.clone(),
        attempt: number,
        passed,
        status: ran.status,
        steps: ran.steps,
        model_calls: ran.model_calls,
        prompt_tokens: ran.prompt_tokens,
        completion_tokens: ran.completion_tokens,
        cost_usd: ran.cost_usd,
        wall_secs: ran.wall_secs,
        run_id: ran.run_id,
        answer: ran.answer,
        tools_called: ran.tools_called,
        error: ran.error,
        checks: verdicts,
        workspace: match &done.workspace {
            attempt::Workspace::Kept(path) => Some(path.display().to_string()),
            attempt::Workspace::Temporary(_) => None,
        },
    })
}

fn could_not_run(case: &str, number: u32, err: &anyhow::Error) -> AttemptReport {
    AttemptReport {
        case: case.to_string(),
        attempt: number,
        passed: false,
        status: "ERROR".to_string(),
        steps: 0,
        model_calls: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        cost_usd: 0.0,
        wall_secs: 0.0,
        run_id: None,
        answer: None,
        tools_called: Vec::new(),
        error: Some(format!("could not run: {err:#}")),
        checks: Vec::new(),
        workspace: None,
    }
}

fn read_report(path: &Path) -> anyhow::Result<Report> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the baseline {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("the baseline {} is not a `loom eval --json` file", path.display()))
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
