//! Stage 5 for a batch: consecutive concurrency-safe calls run together (at
//! most `max_concurrency` at once); any other call runs alone, after the
//! calls before it and before the calls after it. Results keep call order.

use std::time::Instant;

use futures_util::future::join_all;
use tokio::sync::Semaphore;

use crate::tool_result::ToolResult;

use super::execute::execute;
use super::{call_clock, micros, BatchEnv, Prepared, Settling, ToolPipeline};

pub(crate) async fn run(pipeline: &ToolPipeline, prepared: Vec<Prepared<'_>>, env: &BatchEnv<'_>) -> Vec<ToolResult> {
    let permits = Semaphore::new(pipeline.config.max_concurrency.max(1));
    let mut results = Vec::with_capacity(prepared.len());
    let mut group: Vec<Prepared<'_>> = Vec::new();
    for item in prepared {
        if is_exclusive(&item) {
            results.extend(run_group(pipeline, std::mem::take(&mut group), &permits, env).await);
            results.extend(run_group(pipeline, vec![item], &permits, env).await);
        } else {
            group.push(item);
        }
    }
    results.extend(run_group(pipeline, group, &permits, env).await);
    results
}

/// A call that must not overlap any other.
fn is_exclusive(item: &Prepared<'_>) -> bool {
    matches!(item, Prepared::Ready { tool, .. } if !tool.tool.concurrency_safe())
}

async fn run_group(
    pipeline: &ToolPipeline,
    group: Vec<Prepared<'_>>,
    permits: &Semaphore,
    env: &BatchEnv<'_>,
) -> Vec<ToolResult> {
    join_all(group.into_iter().map(|item| async move {
        match item {
            Prepared::Settled {
                call,
                result,
                stages,
                prepared_in,
            } => {
                pipeline
                    .finish(call, result, stages, call_clock(prepared_in), env)
                    .await
            }
            Prepared::Ready {
                call,
                tool,
                args,
                mut stages,
                prepared_in,
                decided_by,
            } => {
                // The semaphore is never closed, so acquiring cannot fail.
                let _permit = permits.acquire().await.ok();
                let started = call_clock(prepared_in);
                // Stopped meanwhile: the call never starts, and is not
                // journaled, so a resumed run knows it never ran.
                if env.ctx.is_cancelled() {
                    let mut result = ToolPipeline::cancelled(call);
                    result.metadata.decided_by = Some(decided_by);
                    return pipeline.finish(call, result, stages, started, env).await;
                }
                // A call with side effects is journaled before it runs, so a
                // resumed run never repeats it silently.
                let journal = (!tool.tool.read_only() && env.store.keeps_anything()).then_some(env.store);
                if let Some(store) = journal {
                    if let Err(err) = store.journal_intent(env.ctx.run_id(), call).await {
                        let refused = super::stages::error(
                            call,
                            crate::tool_result::ErrorKind::Journal,
                            format!("Error: the call was not run because it could not be recorded first ({err})."),
                        );
                        let mut refused = refused;
                        refused.metadata.decided_by = Some(decided_by);
                        return pipeline.finish(call, refused, stages, started, env).await;
                    }
                }
                let t = Instant::now();
                let ran_with = args.clone();
                let result = execute(
                    call,
                    tool,
                    args,
                    pipeline.config.timeout_for(&call.name, tool.tool.bounds_own_time()),
                    &pipeline.redactor,
                    env,
                )
                .await;
                stages.execute_us = micros(t);
                let mut result = result;
                result.metadata.decided_by = Some(decided_by);
                let settling = Settling {
                    stages,
                    started,
                    ran_with: Some(ran_with),
                };
                let result = pipeline.settle(call, result, settling, env).await;
                // A resumable call cut short by an interrupt keeps only its
                // intent: the resumed run makes it again, and the tool
                // continues its work (`task` resumes its sub-agent).
                let continues_later = tool.tool.resumable()
                    && matches!(env.ctx.stop_cause(), Some(crate::context::StopCause::Interrupted(_)));
                if let (Some(store), false) = (journal, continues_later) {
                    // Journaled before it is told: a crash between the two
                    // leaves a result a resumed run tells once, never a told
                    // result the journal lacks (which the resume would
                    // report again, as interrupted). The result also reaches
                    // the checkpoint; a failure here only makes a resume
                    // report the call as interrupted.
                    let _ = store.journal_result(env.ctx.run_id(), &result).await;
                }
                ToolPipeline::tell(&result, env);
                result
            }
        }
    }))
    .await
}
