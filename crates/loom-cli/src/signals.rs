//! The signals that stop a run: Ctrl-C (SIGINT) cancels it; SIGTERM and
//! SIGHUP — the system or the terminal going away — interrupt it, leaving
//! it resumable. Each is received from one stream kept as long as it is
//! needed, so a signal that arrives between two waits is not lost (a fresh
//! `tokio::signal::ctrl_c()` per wait only sees later ones).

/// A signal that stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGINT (Ctrl-C): a person cancels.
    Interrupt,
    /// SIGTERM: the process is asked to end (shutdown, `kill`).
    Terminate,
    /// SIGHUP: the terminal went away.
    Hangup,
}

impl Signal {
    /// Its name, as people know it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
            Self::Hangup => "SIGHUP",
        }
    }

    /// The exit code of a process ended by it: 128 + its number.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Self::Interrupt => 130,
            Self::Terminate => 143,
            Self::Hangup => 129,
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP as one stream. From `listen` on, none of
/// them kills the process.
pub(crate) struct Signals {
    #[cfg(unix)]
    streams: [(Signal, tokio::signal::unix::Signal); 3],
}

impl Signals {
    /// Starts listening.
    pub(crate) fn listen() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                streams: [
                    (Signal::Interrupt, signal(SignalKind::interrupt())?),
                    (Signal::Terminate, signal(SignalKind::terminate())?),
                    (Signal::Hangup, signal(SignalKind::hangup())?),
                ],
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Signal {
        #[cfg(unix)]
        {
            let [(a, first), (b, second), (c, third)] = &mut self.streams;
            let got = tokio::select! {
                got = first.recv() => got.map(|()| *a),
                got = second.recv() => got.map(|()| *b),
                got = third.recv() => got.map(|()| *c),
            };
            match got {
                Some(signal) => signal,
                // The signal driver is gone: no more signals will come.
                None => std::future::pending().await,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            Signal::Interrupt
        }
    }
}
