//! `loom serve`: the gateway (docs/server.md) with the agents loom.toml
//! describes, its runs in the SQLite store, resumed after a restart.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use loom::Agent;
use loom_server::{AgentFactory, AgentSpec, App, ServerConfig, Service};

use crate::cli::{AgentArgs, PlaceArgs, ServeArgs};
use crate::config::{self, LoadedConfig};
use crate::exit::Failure;
use crate::run::{configure_agent, configured_model, ServerAgent};

/// Builds the gateway's (and a worker's) agents from the flags and loom.toml.
pub(crate) struct ConfiguredAgents {
    pub(crate) args: AgentArgs,
    pub(crate) place: PlaceArgs,
    pub(crate) loaded: LoadedConfig,
    pub(crate) default_model: String,
}

#[loom::async_trait]
impl AgentFactory for ConfiguredAgents {
    fn default_model(&self) -> String {
        self.default_model.clone()
    }

    async fn build(&self, spec: AgentSpec) -> Result<Agent, String> {
        let server = ServerAgent {
            model: spec.model,
            tools: spec.tools,
            mode: spec.mode,
            default_model: self.default_model.clone(),
            store: spec.store,
        };
        configure_agent(&self.args, &self.place, None, &self.loaded, Some(server))
            .await
            .map_err(|err| format!("{err:#}"))
    }
}

pub(crate) async fn serve(args: ServeArgs) -> Result<ExitCode, Failure> {
    if args.print_schema {
        let schema = serde_json::to_string_pretty(&loom_server::protocol::schema())
            .map_err(|err| Failure::Usage(anyhow!("cannot write the schema: {err}")))?;
        println!("{schema}");
        return Ok(ExitCode::SUCCESS);
    }
    let addr: SocketAddr = args.addr.parse().map_err(|err| {
        Failure::Usage(anyhow!(
            "--addr {}: {err} (expected HOST:PORT, e.g. 127.0.0.1:8080)",
            args.addr
        ))
    })?;
    // Only the file named on the command line: a loom.toml in a workspace
    // the gateway serves may have been written by a model.
    let loaded = config::load_explicit(args.agent.config.as_deref()).map_err(Failure::Usage)?;
    if args.agent.config.is_none() {
        // Tokens kept in a file that is no longer read must not be lost
        // quietly (a gateway without them is open to every local process).
        if let Some(own) = config::user_config_file().filter(|own| own.is_file()) {
            return Err(Failure::Usage(anyhow!(
                "loom serve reads only the file named with --config: pass --config {} to use it (its [[server.tokens]] included)",
                own.display()
            )));
        }
        if std::path::Path::new("loom.toml").is_file() {
            say!("loom: warning: ./loom.toml is not read by loom serve (a workspace's file may have been written by a model); name the gateway's own file with --config");
        }
    }
    for note in &loaded.notes {
        say!("loom: note: {note}");
    }
    crate::shell_settings::warn_if_unconfined(&loaded.file);
    // Hidden from every other Loom's commands from now on.
    {
        let loaded = loaded.clone();
        tokio::task::spawn_blocking(move || crate::hidden::own_places(&loaded))
            .await
            .map_err(|err| Failure::Runtime(err.into()))?;
    }
    let settings = loaded.file.server.clone().unwrap_or_default();
    let env_token = std::env::var("LOOM_TOKEN").ok();
    let mut config =
        ServerConfig::from_settings(&settings, env_token.as_deref()).map_err(|err| Failure::Usage(err.into()))?;
    // Every client connection is a descriptor: the soft limit (often
    // 1024) goes up to the hard one, and the connection cap leaves room
    // under it for the store, tools and MCP servers.
    let descriptors = raise_descriptor_limit();
    match (settings.max_connections, descriptors) {
        (None, Some(limit)) => config.max_connections = loom_server::max_connections_for(limit),
        (Some(configured), Some(limit)) => {
            // More connections than descriptors would fail the store and
            // the tools at the limit instead of refusing a connection.
            let bounded = loom_server::bound_max_connections(configured, limit);
            if bounded < configured {
                say!(
                    "loom: note: [server] max_connections = {configured} is more than {limit} open files allow (a quarter, at least 64, stays for the store and tools); using {bounded}"
                );
                config.max_connections = bounded;
            }
        }
        _ => {}
    }
    if !config.may_listen_on(addr) {
        return Err(Failure::Usage(anyhow!(
            "refusing to listen on {addr} without a token: add [[server.tokens]] to the file named with --config or set LOOM_TOKEN (without a token only a loopback address such as 127.0.0.1 is allowed)"
        )));
    }
    let agent_args = served(args.agent);
    let default_model = configured_model(&agent_args, &loaded, None).map_err(Failure::Usage)?;
    let workspace = workspace_of(&args.place)?;
    // The web page's sessions outlive a restart: their key is kept in the
    // workspace's state directory, out of the tools' reach.
    let state_of = workspace.clone();
    let key_dir = tokio::task::spawn_blocking(move || crate::state::workspace_dir(&state_of))
        .await
        .map_err(|err| Failure::Runtime(err.into()))?
        .map_err(Failure::Usage)?;
    // Sign-outs are remembered beside the key, so they survive a restart.
    config.session_revocations = Some(key_dir.join("web-session.revoked"));
    config.session_key = Some(
        tokio::task::spawn_blocking(move || session_key(&key_dir))
            .await
            .map_err(|err| Failure::Runtime(err.into()))?
            .map_err(Failure::Runtime)?,
    );
    if let (Some(db), Some(_)) = (&args.place.db, &loaded.file.cluster) {
        // `--db` wins (docs/cluster.md); said, so that an operator who
        // meant the cluster does not find out from runs that never leave.
        say!(
            "loom serve: note: --db {}: runs are kept in that file and executed here; loom.toml's [cluster] section is not used",
            db.display()
        );
    }
    let redis = crate::store::RedisFrom::pick(args.place.redis.as_deref(), loaded.file.cluster_redis());
    let executes = loaded.file.cluster.as_ref().and_then(|cluster| cluster.execute) == Some(true);
    // On a cluster's Redis without `execute = true`, workers execute the
    // runs and this gateway follows them.
    let on_workers = match redis {
        Some(crate::store::RedisFrom::CommandLine(url) | crate::store::RedisFrom::File(url))
            if args.place.db.is_none() && !executes =>
        {
            if let (Some(crate::store::RedisFrom::File(_)), Some(store)) = (redis, loaded.file.store.as_deref()) {
                return Err(Failure::Usage(anyhow!(
                    "loom.toml sets both store = \"{store}\" and [cluster] redis: keep one"
                )));
            }
            // The cluster's line is bounded by this gateway's max_queued.
            Some(
                crate::store::open_redis(url)
                    .await
                    .map_err(Failure::Usage)?
                    .queueing_for_workers(config.max_queued),
            )
        }
        _ => None,
    };
    let store = match &on_workers {
        Some(redis) => Some(Arc::new(redis.clone()) as Arc<dyn loom::Store>),
        None => crate::store::open(
            args.place.db.as_deref(),
            redis,
            loaded.file.store.as_deref(),
            loaded.dir.as_deref(),
            &workspace,
        )
        .await
        .map_err(Failure::Usage)?,
    };
    let factory = Arc::new(ConfiguredAgents {
        args: agent_args,
        place: PlaceArgs {
            workspace: Some(workspace),
            db: args.place.db,
            redis: args.place.redis,
        },
        loaded,
        default_model,
    });
    // The default agent is built now, so a bad model or config fails here
    // and not at the first run.
    factory
        .build(AgentSpec {
            model: None,
            tools: None,
            mode: loom::Mode::Default,
            store: store.clone(),
        })
        .await
        .map_err(|err| Failure::Usage(anyhow!(err)))?;
    let tokens = config.tokens.clone();
    let service = match (on_workers, store) {
        (Some(redis), Some(store)) => {
            let tail = redis
                .tail()
                .await
                .map_err(|err| Failure::Usage(anyhow!("cannot read the cluster's Redis: {err}")))?;
            let cluster = loom_server::Cluster {
                leases: Arc::new(redis.clone()),
                tail: Arc::new(tail),
                jobs: Arc::new(redis),
            };
            say!("loom serve: runs execute on the cluster's `loom worker` processes");
            Service::on_cluster(config, factory, store, cluster)
        }
        (_, store) => Service::new(config, factory, store),
    };
    // It reads the sign-out list from disk.
    let app = tokio::task::spawn_blocking(move || App::new(service))
        .await
        .map_err(|err| Failure::Runtime(err.into()))?;
    let resumed = app
        .service
        .resume_interrupted()
        .await
        .map_err(|err| Failure::Runtime(anyhow!("resuming interrupted runs: {}", err.message)))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr().context("the listening address")?;
    tracing::info!(addr = %bound, tokens = ?tokens, resumed, "loom serve is listening");
    say!("loom serve: listening on http://{bound} (resumed {resumed} runs left interrupted or queued)");
    app.serve(listener, stop_signal())
        .await
        .map_err(|err| Failure::Runtime(err.into()))?;
    say!("loom serve: stopped");
    Ok(ExitCode::SUCCESS)
}

/// The agent options of served runs (a gateway's or a worker's): the
/// command line's common ones; budgets come from loom.toml, and nobody is
/// at a terminal to say yes.
pub(crate) fn served(common: crate::cli::CommonAgentArgs) -> AgentArgs {
    AgentArgs {
        common,
        record: None,
        max_tokens: None,
        max_cost: None,
        tools: Vec::new(),
        yes: false,
        verbose: false,
        mode: loom::Mode::Default,
    }
}

/// `--workspace`, else the current directory.
pub(crate) fn workspace_of(place: &PlaceArgs) -> Result<std::path::PathBuf, Failure> {
    match &place.workspace {
        Some(dir) => Ok(dir.clone()),
        None => Ok(std::env::current_dir().context("cannot read the current directory")?),
    }
}

/// SIGTERM or SIGINT.
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Raises the soft limit on open descriptors to the hard limit; the limit
/// in force after, if it can be read.
#[cfg(unix)]
fn raise_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct. It fails (and the soft
        // limit stays) where the hard one is unlimited or above what the
        // kernel allows; then the soft limit is what there is.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    #[allow(clippy::useless_conversion)] // rlim_t is u64 on Linux, not everywhere
    Some(u64::from(limit.rlim_cur))
}

#[cfg(not(unix))]
fn raise_descriptor_limit() -> Option<u64> {
    None
}

/// The key that signs the web page's session cookies: read from
/// `DIR/web-session.key`, or drawn and written there (owner-only) the
/// first time.
fn session_key(dir: &std::path::Path) -> anyhow::Result<[u8; 32]> {
    use std::io::Write;
    let path = dir.join("web-session.key");
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice()) {
            return Ok(key);
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let key = loom_server::random_key();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(&key)?;
    Ok(key)
}
