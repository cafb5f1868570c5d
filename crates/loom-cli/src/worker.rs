//! `loom worker`: executes the runs a cluster's gateways accept (docs/cluster.md).
//! Its agents are configured as `loom serve`'s are (the same flags and
//! --config file); its runs come from the cluster's Redis.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use loom::stores::RedisStore;
use loom::{RunLeases, Store};
use loom_server::worker::{ConnectLeases, LeaseTiming, Worker, WorkerConfig};
use loom_server::{AgentFactory, AgentSpec};

use crate::cli::{PlaceArgs, WorkerArgs};
use crate::config;
use crate::exit::Failure;
use crate::run::configured_model;
use crate::serve::{served, stop_signal, ConfiguredAgents};

pub(crate) async fn worker(args: WorkerArgs) -> Result<ExitCode, Failure> {
    let addr: Option<SocketAddr> = match &args.addr {
        Some(addr) => Some(addr.parse().map_err(|err| {
            Failure::Usage(anyhow!(
                "--addr {addr}: {err} (expected HOST:PORT, e.g. 127.0.0.1:9090)"
            ))
        })?),
        None => None,
    };
    // As `loom serve`: only the file named on the command line.
    let loaded = config::load_explicit(args.agent.config.as_deref()).map_err(Failure::Usage)?;
    crate::shell_settings::warn_if_unconfined(&loaded.file);
    // Hidden from every other Loom's commands from now on.
    {
        let loaded = loaded.clone();
        tokio::task::spawn_blocking(move || crate::hidden::own_places(&loaded))
            .await
            .map_err(|err| Failure::Runtime(err.into()))?;
    }
    for note in &loaded.notes {
        say!("loom: note: {note}");
    }
    let url = match crate::store::RedisFrom::pick(args.place.redis.as_deref(), loaded.file.cluster_redis()) {
        Some(crate::store::RedisFrom::CommandLine(url) | crate::store::RedisFrom::File(url)) => url.to_string(),
        None => {
            return Err(Failure::Usage(anyhow!(
            "a worker needs the cluster's Redis: --redis URL, LOOM_REDIS_URL or [cluster] redis in the --config file"
        )))
        }
    };
    if loaded.file.store.is_some() {
        return Err(Failure::Usage(anyhow!(
            "the --config file sets store = …: a worker records in the cluster's Redis only"
        )));
    }
    let timing = match loaded.file.cluster.as_ref().and_then(|cluster| cluster.lease_secs) {
        Some(secs) if secs.is_finite() && (1.5..=3600.0).contains(&secs) => {
            let ttl = std::time::Duration::from_secs_f64(secs);
            LeaseTiming {
                ttl,
                renew_every: ttl / 3,
            }
        }
        Some(secs) => {
            return Err(Failure::Usage(anyhow!(
                "[cluster] lease_secs = {secs}: use 1.5 to 3600 seconds"
            )))
        }
        None => LeaseTiming::default(),
    };
    let park_after = match loaded.file.cluster.as_ref().and_then(|cluster| cluster.park_after_secs) {
        Some(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => {
            Some(std::time::Duration::from_secs_f64(secs))
        }
        Some(secs) => {
            return Err(Failure::Usage(anyhow!(
                "[cluster] park_after_secs = {secs}: use 0 to 86400 seconds"
            )))
        }
        None => WorkerConfig::default().park_after,
    };
    let keep_finished = match loaded
        .file
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.keep_finished_days)
    {
        Some(0.0) => None,
        Some(days) if days.is_finite() && days > 0.0 && days <= 36_500.0 => {
            Some(std::time::Duration::from_secs_f64(days * 86_400.0))
        }
        Some(days) => {
            return Err(Failure::Usage(anyhow!(
                "[cluster] keep_finished_days = {days}: use 0 (for ever) or up to 36500 days"
            )))
        }
        None => WorkerConfig::default().keep_finished,
    };
    // The gateways' per-token cap holds across the cluster.
    let per_principal = loaded
        .file
        .server
        .as_ref()
        .and_then(|server| server.max_runs_per_token)
        .unwrap_or(loom_server::ServerConfig::default().max_runs_per_token);
    let redis = crate::store::open_redis(&url).await.map_err(Failure::Usage)?;
    let store: Arc<dyn Store> = Arc::new(redis.clone());
    let jobs: Arc<dyn loom::WorkspaceJobs> = Arc::new(redis.clone());
    let leases: Arc<dyn RunLeases> = Arc::new(redis);
    // The gateways' modes: a run in one they no longer allow is not run.
    let allowed_modes = match loaded
        .file
        .server
        .as_ref()
        .and_then(|server| server.allowed_modes.as_ref())
    {
        Some(names) => names
            .iter()
            .map(|name| {
                name.parse()
                    .map_err(|err| Failure::Usage(anyhow!("[server] allowed_modes: {err}")))
            })
            .collect::<Result<Vec<loom::Mode>, Failure>>()?,
        None => WorkerConfig::default().allowed_modes,
    };
    let agent_args = served(args.agent);
    let default_model = configured_model(&agent_args, &loaded, None).map_err(Failure::Usage)?;
    let workspace = match args.place.workspace {
        Some(dir) => dir,
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let factory = Arc::new(ConfiguredAgents {
        args: agent_args,
        place: PlaceArgs {
            workspace: Some(workspace),
            db: None,
            redis: Some(url.clone()),
        },
        loaded,
        default_model,
    });
    // A bad model or config fails here, not at the first run.
    factory
        .build(AgentSpec {
            model: None,
            tools: None,
            mode: loom::Mode::Default,
            store: Some(store.clone()),
        })
        .await
        .map_err(|err| Failure::Usage(anyhow!(err)))?;
    // The lease keeper's own connection, opened on its own runtime.
    let connect: ConnectLeases = {
        let url = url.clone();
        Arc::new(move || {
            let url = url.clone();
            Box::pin(async move {
                let store = RedisStore::connect(&url).await?;
                Ok(Arc::new(store) as Arc<dyn RunLeases>)
            })
        })
    };
    let config = WorkerConfig {
        max_runs: args.max_runs as usize,
        leases: timing,
        park_after,
        keep_finished,
        per_principal,
        allowed_modes,
        ..WorkerConfig::default()
    };
    let owner = config.owner.clone();
    let worker = Worker::new(config, factory, store, leases, Some(jobs), connect)
        .map_err(|err| Failure::Runtime(anyhow!("cannot start the lease keeper: {err}")))?;
    if let Some(addr) = addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let bound = listener.local_addr().context("the listening address")?;
        say!("loom worker: health and metrics on http://{bound}");
        let routes = worker.clone();
        tokio::spawn(async move {
            if let Err(err) = loom_server::worker::serve_routes(routes, listener).await {
                tracing::error!(error = %err, "the worker's routes stopped");
            }
        });
    }
    tracing::info!(owner, max_runs = args.max_runs, redis = %crate::store::shown_url(&url), "loom worker is taking runs");
    say!(
        "loom worker: taking runs from {} (at most {} at once)",
        crate::store::shown_url(&url),
        args.max_runs
    );
    worker.run(stop_signal()).await;
    say!("loom worker: stopped");
    Ok(ExitCode::SUCCESS)
}
